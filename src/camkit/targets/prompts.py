"""Text prompts as targets of a dual encoder (CLIP, SigLIP): where the image matches a text.

:class:`PromptTarget` holds the text embeddings of ``K`` prompts, computed once by the model's
text tower (no gradient) when the target is made, and scores an image embedding by the model's
own similarity: CLIP's ``exp(t) cos(image, text)`` (Radford et al., "Learning transferable
visual models from natural language supervision", ICML 2021, fig. 3), SigLIP's
``exp(t) cos(image, text) + b`` (Zhai et al., "Sigmoid loss for language image pre-training",
ICCV 2023, algorithm 1): the ``logits_per_image`` the model itself returns. ``K`` prompts are
``K`` targets of one backward pass; a contrast subtracts another prompt's similarity ("a cat"
against "a dog": where the image is more cat than dog). Tokenizers are read from local folders.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from camkit.errors import TargetError
from camkit.targets.base import Target
from camkit.targets.outputs import describe, field

Texts = str | Sequence[str]
# a dual encoder's text side: HuggingFace (CLIP, SigLIP) and OpenCLIP (Ilharco et al., 2021)
TEXT_TOWERS = ("get_text_features", "encode_text")
# the files a saved tokenizer is made of (one is enough); without any, transformers 5 builds an
# empty tokenizer of the config's class that maps every word to one unknown id
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "spiece.model",
    "vocab.json",
    "vocab.txt",
)


def load_tokenizer(folder: str | Path) -> Any:
    """The tokenizer ``save_pretrained`` wrote in a local folder, read without any download; a
    :class:`~camkit.errors.TargetError` when the folder holds none."""
    folder = Path(folder)
    if not folder.is_dir():
        raise TargetError(f"the tokenizer folder {str(folder)!r} does not exist")
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise TargetError(
            f"the folder {str(folder)!r} holds no tokenizer (none of {', '.join(TOKENIZER_FILES)});"
            " save one there with tokenizer.save_pretrained(folder)"
        )
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError, TypeError, KeyError) as err:
        raise TargetError(
            f"the folder {str(folder)!r} holds no tokenizer camkit can read ({err}); save one "
            "there with tokenizer.save_pretrained(folder) (tokenizer.json, tokenizer_config.json)"
        ) from None


def _dual_encoder(model: nn.Module) -> nn.Module:
    """The dual encoder inside camkit's wrappers, checked to have a text tower."""
    inner = model
    while getattr(inner, "wraps_model", False):
        inner = inner.module
    if getattr(getattr(inner, "config", None), "model_type", None) == "xclip":
        raise TargetError(
            "X-CLIP's text embeddings depend on the video (its prompt generator reads the "
            "frames), so no prompt embedding can be computed once: explain the model's own "
            "logits_per_video, camkit.InputLayout(camkit.VideoPrompts(model, input_ids), "
            '"BTCHW"), with target the prompt\'s index'
        )
    if not any(callable(getattr(inner, name, None)) for name in TEXT_TOWERS):
        raise TargetError(
            f"a prompt needs a model with a text tower (a dual encoder with get_text_features: "
            f"HuggingFace CLIPModel, SiglipModel; or encode_text: OpenCLIP), but "
            f"{type(inner).__name__} has none; for a generative vision-language model use "
            "camkit.targets.TokenTarget"
        )
    return inner


class PromptTarget(Target):
    """The similarity of an image to ``K`` text prompts: ``(B, D) image embeddings -> (B, K)``
    (``(B,)`` for one prompt given as a string or 1-D ids). The output explained is the image
    embedding (explain ``camkit.ImageTower(model)``: the text tower never runs again) or one
    with ``image_embeds``.

    Args:
        model: a dual encoder (HuggingFace ``CLIPModel``, ``SiglipModel``; OpenCLIP), or one of
            camkit's wrappers around it.
        texts: one prompt or ``K``, tokenized by ``tokenizer`` (an object or its local folder);
            or ``input_ids`` ``(K, L)`` (with ``attention_mask``).
        contrast: prompts (or ``input_ids``) subtracted, one for all or one each: the score is
            ``s(text_k) - s(contrast_k)``.
    """

    def __init__(
        self,
        model: nn.Module,
        texts: Texts | None = None,
        *,
        tokenizer: Any = None,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        contrast: Texts | Tensor | None = None,
    ):
        encoder = _dual_encoder(model)
        # one prompt given alone (a string, 1-D ids) scores (B,): maps without a target axis
        self.single = isinstance(texts, str) or (input_ids is not None and input_ids.ndim == 1)
        self.texts, self.embeddings = _text_embeddings(
            encoder, texts, input_ids, tokenizer, attention_mask
        )
        self.against = None
        if contrast is not None:
            ids = contrast if isinstance(contrast, Tensor) else None
            _, against = _text_embeddings(
                encoder, None if ids is not None else contrast, ids, tokenizer
            )
            if against.shape[0] not in (1, self.embeddings.shape[0]):
                raise TargetError(
                    f"contrast needs one prompt or one per prompt ({self.embeddings.shape[0]}), "
                    f"got {against.shape[0]}"
                )
            self.against = against.expand_as(self.embeddings)
        self.constant_norm = False  # True in the form LRP scores (for_relevance)
        self.scale = encoder.logit_scale.detach().exp().reshape(())
        bias = getattr(encoder, "logit_bias", None)
        self.bias = None if bias is None else bias.detach().reshape(())

    @property
    def count(self) -> int:
        """``K``: the number of prompts (targets per image)."""
        return self.embeddings.shape[0]

    def for_relevance(self) -> PromptTarget:
        """The same scores, the image embedding's norm a constant (AttnLRP's identity rule on a
        normalisation; lxt's ``normalize``): the embedding's relevance then sums to the score,
        where the cosine's gradient, orthogonal to the embedding, would give it none."""
        twin = copy.copy(self)
        twin.constant_norm = True
        return twin

    def similarities(self, image: Tensor, texts: Tensor) -> Tensor:
        """``(B, D), (K, D) -> (B, K)``: the model's image-text logits."""
        norm = (image.detach() if self.constant_norm else image).norm(dim=-1, keepdim=True)
        texts = F.normalize(texts.to(image.device, image.dtype), dim=-1)
        cosine = (image / norm.clamp_min(1e-12)) @ texts.T
        logits = cosine * self.scale.to(image.device, image.dtype)
        return logits if self.bias is None else logits + self.bias.to(image.device, image.dtype)

    def __call__(self, output: Any) -> Tensor:
        image = output if isinstance(output, Tensor) else field(output, "image_embeds")
        if not isinstance(image, Tensor) or image.ndim != 2:
            raise TargetError(
                f"PromptTarget needs (B, {self.embeddings.shape[1]}) image embeddings (explain "
                f"camkit.ImageTower(model)), got {describe(output)}"
            )
        if image.shape[1] != self.embeddings.shape[1]:
            raise TargetError(
                f"the image embeddings have {image.shape[1]} features but the prompts' text "
                f"embeddings {self.embeddings.shape[1]}: the target was made with another model"
            )
        scores = self.similarities(image, self.embeddings)
        if self.against is not None:
            scores = scores - self.similarities(image, self.against)
        return scores[:, 0] if self.single else scores

    def __repr__(self) -> str:
        contrast = "" if self.against is None else ", contrast"
        return f"PromptTarget({self.texts!r}{contrast})"


def _prompts(texts: Texts | None, input_ids: Tensor | None) -> list[str] | None:
    """The prompts as a list of texts (None for token ids), checked: exactly one source."""
    if (texts is None) == (input_ids is None):
        raise TargetError("give the prompts as texts or as input_ids (one of them)")
    if texts is None:
        return None
    texts = [texts] if isinstance(texts, str) else list(texts)
    if not texts or not all(isinstance(text, str) and text.strip() for text in texts):
        raise TargetError(f"prompts must be non-empty strings, got {texts!r}")
    return texts


def _text_embeddings(
    encoder: nn.Module,
    texts: Texts | None,
    input_ids: Tensor | None,
    tokenizer: Any,
    attention_mask: Tensor | None = None,
) -> tuple[list[str] | None, Tensor]:
    """The prompts and their ``(K, D)`` text embeddings: the text tower once, without gradient."""
    texts = _prompts(texts, input_ids)
    open_clip = not callable(getattr(encoder, "get_text_features", None))  # encode_text only
    if open_clip:  # its vocab_size and context_length
        vocabulary, positions = int(encoder.vocab_size), getattr(encoder, "context_length", None)
    else:
        text = encoder.config.text_config
        vocabulary, positions = text.vocab_size, getattr(text, "max_position_embeddings", None)
    if attention_mask is not None and open_clip:
        raise TargetError(
            "an OpenCLIP text tower takes no attention_mask (it reads the end-of-text token): "
            "give input_ids padded with 0, as its tokenizer does"
        )
    if texts is not None:
        if tokenizer is None:
            raise TargetError(
                "prompts given as texts need tokenizer= (a tokenizer or its folder; for OpenCLIP "
                "open_clip.get_tokenizer(name))"
            )
        tokenizer = load_tokenizer(tokenizer) if isinstance(tokenizer, str | Path) else tokenizer
        if open_clip:  # OpenCLIP's tokenizers pad to the context length, ids only
            encoded = {"input_ids": torch.as_tensor(tokenizer(texts))}
        else:
            # as trained: SigLIP pads to its full length (its text tower pools the last
            # position), CLIP to the longest (it pools the end-of-text token, padding masked)
            options: dict[str, Any] = {"padding": True}
            if "siglip" in encoder.config.model_type:
                options = {"padding": "max_length", "max_length": positions, "truncation": True}
            encoded = tokenizer(texts, return_tensors="pt", **options)
            encoded = {k: encoded[k] for k in ("input_ids", "attention_mask") if k in encoded}
    else:
        ids = torch.as_tensor(input_ids)
        ids = ids[None] if ids.ndim == 1 else ids
        if ids.ndim != 2 or ids.is_floating_point() or ids.numel() == 0:
            raise TargetError(f"input_ids must be (K, L) token ids, got {tuple(ids.shape)}")
        if int(ids.min()) < 0 or int(ids.max()) >= vocabulary:
            raise TargetError(f"input_ids must be in 0..{vocabulary - 1}, the text vocabulary")
        encoded = {"input_ids": ids}
        if attention_mask is not None:
            encoded["attention_mask"] = torch.as_tensor(attention_mask)
    length = encoded["input_ids"].shape[-1]
    if positions is not None and length > positions:
        raise TargetError(
            f"a prompt is {length} tokens long, more than the {positions} positions of the "
            "model's text tower: shorten it"
        )
    device = next(encoder.parameters()).device
    encoded = {k: v.to(device) for k, v in encoded.items()}
    with torch.no_grad():
        if open_clip:
            features = encoder.encode_text(encoded["input_ids"])
        else:
            features = encoder.get_text_features(**encoded)
    features = features if isinstance(features, Tensor) else features.pooler_output
    return texts, features.detach()


__all__ = ["PromptTarget", "load_tokenizer"]

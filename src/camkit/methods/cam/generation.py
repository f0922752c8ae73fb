"""Every token a vision-language model generated, explained from one forward pass: for each
token a map over the image (a gradient CAM at the vision layer) and the relevance of each
token of the sequence before it (gradient x input on the input embeddings, Shrikumar et al.,
"Not just a black box", 2016; the token relevance of Li et al., "Visualizing and understanding
neural models in NLP", NAACL 2016, summed over the embedding's features). The tokens are ``K``
targets whose gradients come from backward passes of ``token_batch`` targets each, so memory
does not grow with the answer's length.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from camkit.core.call import Call, chunks
from camkit.core.engine import Capture, layer_gradients
from camkit.core.finish import Finishing
from camkit.core.inputs import as_batch, positive_int
from camkit.core.layers import find_layer, single_call
from camkit.core.state import model_guarded
from camkit.core.wrappers import image_inputs
from camkit.errors import ArgumentError, InputError
from camkit.methods.cam.base import BaseCAM
from camkit.models.vlm import LoadedVLM
from camkit.targets.base import TargetSpec
from camkit.targets.resolver import resolve
from camkit.targets.tokens import TokenTarget


@dataclass(frozen=True)
class TokenExplanation:
    """What :func:`explain_tokens` gives for ``B`` images and ``K`` explained tokens.

    ``maps``: ``(B, K, H, W)`` the CAM's finished maps; ``token_relevance``: ``(B, K, T)``
    gradient x input on the input embeddings, summed over their features (0 at the image
    tokens, whose embeddings the vision features replace, and from the explained token on for a
    causal model); ``scores``: ``(B, K)``; ``layer`` and ``embeddings``: the layers read.
    """

    maps: Tensor
    token_relevance: Tensor
    scores: Tensor
    layer: str
    embeddings: str


@dataclass(frozen=True)
class Answer:
    """A generated answer explained token by token: ``tokens`` the whole sequence as text,
    ``positions`` the generated tokens' positions in it, ``explanation`` theirs."""

    tokens: list[str]
    positions: list[int]
    explanation: TokenExplanation


def embedding_layer(model: nn.Module) -> tuple[str, nn.Module]:
    """``(name, module)`` of the input embeddings of a (wrapped) HuggingFace model."""
    inner = model
    while getattr(inner, "wraps_model", False):
        inner = inner.module
    get = getattr(inner, "get_input_embeddings", None)
    embeddings = get() if callable(get) else None
    if not isinstance(embeddings, nn.Module):
        raise ArgumentError(
            f"{type(inner).__name__} has no get_input_embeddings(): explain_tokens needs a "
            "HuggingFace language or vision-language model"
        )
    return find_layer(model, embeddings)


def explain_tokens(
    cam: BaseCAM,
    pixel_values: Tensor,
    input_ids: Tensor,
    target: TargetSpec = None,
    *,
    prompt_length: int | None = None,
    token_batch: int | None = 16,
    relu: bool = True,
    upsample: bool = True,
    normalize: bool = True,
    **inputs: Any,
) -> TokenExplanation:
    """Explain tokens of ``input_ids`` ``(B, T)`` (e.g. a ``generate()`` output) for images
    ``pixel_values`` ``(B, C, H, W)`` in one forward pass.

    ``cam``: a gradient CAM on ``camkit.KeywordInput(model, "pixel_values")``. ``target``: the
    tokens (a :class:`~camkit.targets.tokens.TokenTarget`); None with ``prompt_length``: every
    token after the prompt. ``token_batch``: targets per backward pass (None: all at once).
    ``inputs``: the model's other keyword inputs (``attention_mask``...). The maps equal the
    CAM's own call with each token's target.
    """
    if not isinstance(cam, BaseCAM) or not cam.shares_one_pass():
        raise ArgumentError(
            "explain_tokens takes a gradient CAM that weighs its layer from one pass (GradCAM, "
            f"HiResCAM, LayerCAM...), got {type(cam).__name__}"
        )
    cam.check_autograd()
    token_batch = positive_int("token_batch", token_batch, optional=True)
    batch, _ = as_batch(pixel_values, cam.model)
    if target is None:
        if prompt_length is None:
            raise ArgumentError("give the tokens to explain: target= or prompt_length=")
        target = TokenTarget.generated(input_ids, prompt_length)
    call = Call.of(batch, {"input_ids": input_ids, **inputs})
    with model_guarded(cam.model):
        cam.capture.resolve(batch, call)
        embeddings = embedding_layer(cam.model)
        capture = Capture(cam.model, [*cam.capture.names, embeddings[0]])
        output, taps = capture.forward(batch, call, start_graph=True, dtype=cam.dtype)
        acts = single_call(taps)
        scorer = resolve(target, batch.shape[0], batch.device)
        with torch.enable_grad():
            scores = scorer(output, torch.arange(batch.shape[0]))
        count = scores.shape[1]
        parts = [
            layer_gradients(scores[:, rows], acts, capture.names, retain_graph=True)
            for rows in chunks(count, token_batch, scores.device)
        ]
    grads = [torch.cat([part[i] for part in parts], dim=1) for i in range(len(acts))]
    vision = [act.detach().unsqueeze(1) for act in acts[:-1]]
    size = tuple(batch.shape[2:])
    raw = cam.maps_from(vision, grads[:-1], count, size, batch=batch.shape[0])
    maps = Finishing(relu, upsample, normalize)(raw, size)
    relevance = (grads[-1] * acts[-1].detach().unsqueeze(1)).sum(dim=-1)
    return TokenExplanation(
        maps.detach(), relevance.float(), scores.detach(), cam.capture.names[0], embeddings[0]
    )


def explain_answer(
    vlm: LoadedVLM, cam: BaseCAM, pixel_values: Tensor, prompt: str, max_new_tokens: int
) -> Answer:
    """A generative model's greedy answer to ``prompt`` about one image (never generating its
    image placeholders), every generated token explained by ``cam`` (:func:`explain_tokens`)."""
    ids = vlm.prompt_ids(prompt, pixel_values).to(pixel_values.device)
    with torch.no_grad():
        sequence = vlm.model.generate(
            input_ids=ids,
            **image_inputs(vlm.model, pixel_values, ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            suppress_tokens=vlm.placeholders,
        )
    if sequence.shape[1] == ids.shape[1]:
        raise InputError("the model generated no token")
    result = explain_tokens(cam, pixel_values, sequence, prompt_length=ids.shape[1])
    ids_list = sequence[0].tolist()
    tokens = [
        text if text is not None else f"[{token}]"  # an id the tokenizer has no text for
        for token, text in zip(ids_list, vlm.tokenizer.convert_ids_to_tokens(ids_list), strict=True)
    ]
    return Answer(tokens, list(range(ids.shape[1], sequence.shape[1])), result)


__all__ = ["Answer", "TokenExplanation", "embedding_layer", "explain_answer", "explain_tokens"]

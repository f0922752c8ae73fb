"""Vision-language models from a local HuggingFace folder, read without any download: dual
encoders (CLIP, SigLIP; OpenCLIP) and generative models (LLaVA, PaliGemma, Gemma 3, InternVL,
Qwen2-VL and their kin)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from camkit.core.wrappers import ImageInput, ImageTower, image_inputs
from camkit.errors import ArgumentError, UnknownModelError
from camkit.models.preprocess import INTERPOLATIONS, Preprocess
from camkit.targets.prompts import load_tokenizer

PROCESSOR_FILE = "preprocessor_config.json"
OPEN_CLIP_CONFIG = "open_clip_config.json"
# OpenCLIP's resize modes as camkit's crops: the shorter side then a centre crop, the longer
# side then padding, or straight to the size
OPEN_CLIP_RESIZE = {"shortest": "center", "longest": "pad", "squash": "squash"}
# the config fields naming a generative model's image and video placeholder tokens
PLACEHOLDER_IDS = ("image_token_id", "video_token_id")
HF_PREFIX = "hf:"
"""How a model name says "a local HuggingFace folder": ``hf:FOLDER`` (the CLI, the notebook)."""


@dataclass
class LoadedVLM:
    """A vision-language model ready to explain: ``model`` (eval mode), ``preprocess`` (its
    image processor's size, mean, std and crop), and :attr:`explained`, what the methods run:
    :class:`~camkit.core.wrappers.ImageTower` for a dual encoder (targets:
    :class:`~camkit.targets.PromptTarget`), :class:`~camkit.core.wrappers.ImageInput` for a
    generative model (images as it reads them; targets: :class:`~camkit.targets.TokenTarget`).
    """

    folder: Path
    model: nn.Module
    tokenizer: Any
    preprocess: Preprocess
    generative: bool

    @property
    def explained(self) -> nn.Module:
        return ImageInput(self.model) if self.generative else ImageTower(self.model)

    @property
    def placeholders(self) -> list[int]:
        """The ids standing for image (or video) features in a generative model's input: never
        generated (the model reads the answer again, and each would take an image's place)."""
        ids = (getattr(self.model.config, key, None) for key in PLACEHOLDER_IDS)
        return [int(i) for i in ids if isinstance(i, int) and not isinstance(i, bool)]

    def prompt_ids(self, text: str, pixel_values: Tensor) -> Tensor:
        """``(1, T)`` ids of ``text`` with :func:`image_token_count` image tokens after the
        beginning-of-text token: a question to a generative model."""
        ids = self.tokenizer(text, return_tensors="pt")["input_ids"][0].tolist()
        image = [self.model.config.image_token_id] * image_token_count(self.model, pixel_values)
        start = 1 if ids and ids[0] == self.tokenizer.bos_token_id else 0
        return torch.tensor([ids[:start] + image + ids[start:]])


def image_token_count(model: nn.Module, pixel_values: Tensor) -> int:
    """How many image tokens a generative model's prompt holds for one image: the features its
    ``get_image_features`` makes (LLaVA's patches, Gemma 3's pooled tokens, the merged patches
    of InternVL, Aya Vision and Qwen2-VL)."""
    with torch.no_grad():
        features = model.get_image_features(**image_inputs(model, pixel_values[:1]))
    features = features if isinstance(features, Tensor | list | tuple) else features.pooler_output
    return int(features[0].shape[0])


def _preprocess(folder: Path, config: Any) -> Preprocess:
    path = folder / PROCESSOR_FILE
    if not path.is_file():
        raise UnknownModelError(
            f"the folder {str(folder)!r} has no {PROCESSOR_FILE}: camkit needs the image "
            "processor's settings (size, mean, std); save them with "
            "image_processor.save_pretrained(folder)"
        )
    settings = json.loads(path.read_text())
    vision = getattr(config, "vision_config", config)
    size = getattr(vision, "image_size", 224)  # InternVL: [height, width]
    pinpoints = getattr(config, "image_grid_pinpoints", None)
    size = pinpoints[0] if pinpoints else size  # a tiled model reads images at its resolutions
    crop = "center" if settings.get("do_center_crop") else "squash"
    return Preprocess(
        size=size,
        mean=tuple(settings.get("image_mean", (0.5, 0.5, 0.5))),
        std=tuple(settings.get("image_std", (0.5, 0.5, 0.5))),
        crop_pct=1.0,
        interpolation="bicubic" if settings.get("resample") == 3 else "bilinear",
        crop_mode=crop,
    )


def _open_clip(folder: Path) -> LoadedVLM:
    """An OpenCLIP model in the layout of its HuggingFace hub folders (``open_clip_config.json``,
    the weights), read with OpenCLIP's ``local-dir:`` schema with its own tokenizer and its
    ``preprocess_cfg`` (size, mean, std, interpolation, ``resize_mode``)."""
    try:
        import open_clip
    except ImportError:
        raise UnknownModelError(
            f"{str(folder)!r} holds an OpenCLIP model ({OPEN_CLIP_CONFIG}): pip install "
            "open_clip_torch to read it"
        ) from None
    if not any(any(folder.glob(pattern)) for pattern in ("*.safetensors", "*.bin", "*.pth")):
        raise UnknownModelError(
            f"the OpenCLIP folder {str(folder)!r} holds no weights (open_clip_model.safetensors "
            "or open_clip_pytorch_model.bin); OpenCLIP would build a random model"
        )
    name = f"local-dir:{folder}"
    try:
        model = open_clip.create_model(name).eval()
        tokenizer = open_clip.get_tokenizer(name)
    except (ValueError, KeyError, RuntimeError) as error:
        raise UnknownModelError(f"OpenCLIP cannot read {str(folder)!r}: {error}") from None
    settings = model.visual.preprocess_cfg
    interpolation = settings.get("interpolation", "bicubic")
    preprocess = Preprocess(
        size=tuple(settings["size"]),
        mean=tuple(settings["mean"]),
        std=tuple(settings["std"]),
        crop_pct=1.0,
        interpolation=interpolation if interpolation in INTERPOLATIONS else "bicubic",
        crop_mode=OPEN_CLIP_RESIZE[settings.get("resize_mode", "shortest")],
    )
    return LoadedVLM(folder, model, tokenizer, preprocess, generative=False)


def load_vlm(folder: str | Path) -> LoadedVLM:
    """The model saved in a local HuggingFace ``folder`` (``config.json`` naming its class, the
    weights, the tokenizer, ``preprocessor_config.json``; or OpenCLIP's hub layout), with a
    clear error for a folder that lacks one of them."""
    folder = Path(folder)
    if (folder / OPEN_CLIP_CONFIG).is_file():
        return _open_clip(folder)
    if not (folder / "config.json").is_file():
        raise UnknownModelError(
            f"{str(folder)!r} is not a HuggingFace model folder (no config.json)"
        )
    import transformers

    config = transformers.AutoConfig.from_pretrained(folder, local_files_only=True)
    names = getattr(config, "architectures", None) or []
    cls = getattr(transformers, names[0], None) if names else None
    if cls is None:
        raise UnknownModelError(
            f"the config in {str(folder)!r} names no transformers model class (architectures: "
            f"{names}); save the model with model.save_pretrained(folder)"
        )
    generative = hasattr(cls, "generate") and hasattr(config, "image_token_id")
    if not generative and not hasattr(cls, "get_text_features"):
        raise ArgumentError(
            f"{cls.__name__} is neither a dual encoder with a text tower (CLIP, SigLIP) nor a "
            "generative vision-language model: a prompt cannot be explained on it"
        )
    tokenizer = load_tokenizer(folder)
    preprocess = _preprocess(folder, config)
    model = cls.from_pretrained(folder, local_files_only=True).eval()
    return LoadedVLM(folder, model, tokenizer, preprocess, generative)


__all__ = ["HF_PREFIX", "LoadedVLM", "image_token_count", "load_vlm"]

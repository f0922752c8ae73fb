"""Wrappers that let camkit explain a model whose input is not one ``(B, C, ...)`` tensor in
first position: :class:`InputLayout` (5-D clips in another axis order), :class:`KeywordInput`
(the explained input is a keyword argument), :class:`ImageInput` (images given as flattened
patches) and :class:`ImageTower` (a dual encoder's image side). All are ``nn.Module`` s the
user wraps the model in; layer names stay those of the wrapped model."""

from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from camkit.core.architecture import PatchRows, Tiles, image_tiles, patch_rows
from camkit.errors import ArgumentError, InputError


class InputLayout(nn.Module):
    """A model that takes 5-D clips in another layout, declared: ``InputLayout(model, "BTCHW")``
    is called with ``(B, C, T, H, W)`` (camkit's reading of a 5-D input) and calls ``model``
    with the axes in the declared order (``"BTCHW"``: VideoMAE, frame-wise models).

    Layer names are those of ``model`` (``"blocks.3"``; ``"module.blocks.3"`` works too). CAMs
    map ``(B, C, T, H, W) -> (B, T, H, W)``; pixel methods attribute the ``(B, C, T, H, W)``
    input. A frame-wise model (TSN, TSM, a 2-D backbone run per frame) folds the frames into its
    batch, so its layers have ``B * T`` rows (row ``b * T + t``): declare it with
    ``frame_wise=True`` and CAMs read such layers as ``(B, T, h, w)``, the default layer being
    the last frame-wise map; undeclared, CAMs refuse them by name (X-CLIP needs no declaration:
    its frames are read from its config, :mod:`camkit.core.spacetime`).
    """

    wraps_model = True
    CANONICAL = "BCTHW"

    def __init__(self, model: nn.Module, layout: str, *, frame_wise: bool = False):
        super().__init__()
        order = layout.upper().replace("D", "T") if isinstance(layout, str) else None
        if order is None or sorted(order) != sorted(self.CANONICAL):
            raise ArgumentError(
                f'layout must order the letters B, C, T (or D), H, W, e.g. "BTCHW", got {layout!r}'
            )
        self.module = model
        self.layout = order
        self.frame_wise = bool(frame_wise)
        self.permutation = [self.CANONICAL.index(axis) for axis in order]

    def forward(self, x: Tensor, *args: object, **kwargs: object) -> object:
        """``(B, C, T, H, W)`` -> the model's output on ``x`` permuted to the declared layout."""
        if x.ndim != 5:
            raise InputError(f"InputLayout takes (B, C, T, H, W) clips, got {tuple(x.shape)}")
        return self.module(x.permute(self.permutation), *args, **kwargs)


class KeywordInput(nn.Module):
    """A model whose explained input is a keyword argument: ``KeywordInput(model,
    "pixel_values")`` is called as ``wrapped(x, *args, **kwargs)`` and calls
    ``model(*args, pixel_values=x, **kwargs)`` (HuggingFace models; CLIP's first positional
    argument is ``input_ids``). The other inputs come through the methods'
    ``additional_forward_args``, by keyword as a dict (per-sample tensors follow their samples):
    a model taking a dict of inputs is explained for the key named here. Layer names are those
    of ``model``.
    """

    wraps_model = True

    def __init__(self, model: nn.Module, key: str):
        super().__init__()
        if not isinstance(key, str) or not key.isidentifier():
            raise ArgumentError(f"key must be the name of a keyword argument, got {key!r}")
        if key == "pixel_values" and image_inputs_differ(model):
            raise ArgumentError(
                f"{type(model).__name__} does not read images as pixel_values alone (flattened "
                "patches with image_grid_thw, or tiles with image_sizes, from its config): "
                "explain camkit.ImageInput(model), which lays images out as it reads them"
            )
        self.module = model
        self.key = key

    def forward(self, x: Tensor, *args: object, **kwargs: object) -> object:
        """``model(*args, **{key: x}, **kwargs)``."""
        if self.key in kwargs:
            raise ArgumentError(f"{self.key!r} is the explained input; do not pass it again")
        return self.module(*args, **{self.key: x}, **kwargs)


class ImageInput(nn.Module):
    """A generative vision-language model given images ``x`` ``(B, C, H, W)`` as it reads them
    (:func:`image_inputs`): ``ImageInput(model)(x, input_ids=...)`` calls ``model`` with
    ``pixel_values=x`` (LLaVA, PaliGemma...), or the flattened patches and ``image_grid_thw`` of
    a model that reads them (Qwen2-VL, Wang et al. 2024), or the views and ``image_sizes`` of a
    model that tiles its images (LLaVA-NeXt's anyres, Liu et al. 2024), laid out as its image
    processor does, from its config. CAMs read the vision layers' rows (``(B * h * w, C)``
    patches, ``(B * views, N, C)`` views) as one map per image; pixel methods attribute ``x``.
    Layer names are those of ``model``.
    """

    wraps_model = True

    def __init__(self, model: nn.Module):
        super().__init__()
        self.module = model

    def forward(self, x: Tensor, *args: object, **kwargs: object) -> object:
        """``model(*args, **image_inputs(model, x, input_ids), **kwargs)``."""
        ids = kwargs.get("input_ids")
        inputs = image_inputs(self.module, x, ids if isinstance(ids, Tensor) else None)
        return self.module(*args, **{**inputs, **kwargs})


def image_inputs(model: nn.Module, x: Tensor, input_ids: Tensor | None = None) -> dict[str, Tensor]:
    """The keyword inputs that give images ``x`` ``(B, C, H, W)`` to a generative model:

    * ``pixel_values=x`` for a model that reads whole images;
    * for a model that reads flattened patches (Qwen2-VL,
      :func:`~camkit.core.architecture.patch_rows`), the patches as its image processor lays
      them out (merge window by merge window, each patch repeated over its ``t`` frames,
      flattened to ``C * t * p * p``) with ``image_grid_thw`` ``(B, 3)``: ``(1, h, w)`` per
      image; with ``input_ids``, a model whose forward takes ``mm_token_type_ids`` (M-RoPE's
      positions: 1 at the image tokens, ``config.image_token_id``, 0 elsewhere) gets them, as
      its processor gives them;
    * for a model that tiles its images (LLaVA-NeXt, :func:`~camkit.core.architecture.
      image_tiles`), images at one of its ``image_grid_pinpoints``: per image the whole image
      resized to the tile side (bicubic, antialiased) and its tiles row by row, stacked as
      ``pixel_values`` ``(B * views, C, side, side)``, with ``image_sizes`` ``(B, 2)``."""
    layout, tiles = patch_rows(model), image_tiles(model)
    if tiles is not None:
        return _tiles(model, x, tiles)
    if layout is None:
        return {"pixel_values": x}
    inputs = _flat_patches(model, x, layout)
    takes = inspect.signature(model.forward).parameters
    if input_ids is not None and "mm_token_type_ids" in takes:
        image = getattr(model.config, "image_token_id", None)
        inputs["mm_token_type_ids"] = (input_ids == image).int()
    return inputs


def image_inputs_differ(model: nn.Module) -> bool:
    """Whether a model takes images other than as ``pixel_values`` alone (:func:`image_inputs`:
    flattened patches, tiles)."""
    return patch_rows(model) is not None or image_tiles(model) is not None


def _tiles(model: nn.Module, x: Tensor, tiles: Tiles) -> dict[str, Tensor]:
    """``pixel_values`` (the views) and ``image_sizes`` of images ``x`` (see
    :func:`image_inputs`)."""
    grid = tiles.grid(x.shape) if x.ndim == 4 else None
    if grid is None:
        sizes = ", ".join(f"{h}x{w}" for h, w in tiles.pinpoints)
        raise InputError(
            f"{type(model).__name__} tiles its images (config.image_grid_pinpoints): camkit lays "
            f"out images (B, C, H, W) at one of its resolutions ({sizes}), got "
            f"{tuple(x.shape)}: resize them to one"
        )
    side, (rows, columns) = tiles.side, grid
    whole = F.interpolate(x, size=(side, side), mode="bicubic", antialias=True)
    parts = x.unflatten(2, (rows, side)).unflatten(4, (columns, side))  # (B, C, r, s, c, s)
    parts = parts.permute(0, 2, 4, 1, 3, 5).flatten(1, 2)  # (B, r * c, C, s, s)
    views = torch.cat([whole[:, None], parts], dim=1).flatten(0, 1)
    sizes = torch.tensor([list(x.shape[2:])] * x.shape[0], device=x.device)
    return {"pixel_values": views, "image_sizes": sizes}


def _flat_patches(model: nn.Module, x: Tensor, layout: PatchRows) -> dict[str, Tensor]:
    """``pixel_values`` and ``image_grid_thw`` of images ``x`` (see :func:`image_inputs`)."""
    side = layout.patch * layout.merge
    if x.ndim != 4 or x.shape[1] != layout.channels or x.shape[2] % side or x.shape[3] % side:
        raise InputError(
            f"{type(model).__name__} reads images (B, {layout.channels}, H, W) whose sides are "
            f"multiples of {side} (patch_size {layout.patch} x spatial_merge_size "
            f"{layout.merge}, from its vision config), got {tuple(x.shape)}: resize them"
        )
    (b, c, height, width), (p, m, t) = x.shape, (layout.patch, layout.merge, layout.temporal)
    h, w = height // p, width // p
    windows = x.reshape(b, c, h // m, m, p, w // m, m, p).permute(0, 2, 5, 3, 6, 1, 4, 7)
    frames = windows.unsqueeze(6).expand(*windows.shape[:6], t, p, p)
    grid = torch.tensor([[1, h, w]] * b, device=x.device)
    return {"pixel_values": frames.reshape(b * h * w, c * t * p * p), "image_grid_thw": grid}


# a dual encoder's image side: HuggingFace (CLIP, SigLIP) and OpenCLIP
IMAGE_TOWERS = ("get_image_features", "encode_image")


class ImageTower(nn.Module):
    """The image side of a dual encoder (HuggingFace CLIP, SigLIP and the models built like
    them; OpenCLIP): ``ImageTower(model)(pixel_values)`` is ``model.get_image_features(
    pixel_values)``'s ``(B, D)`` image embedding (before normalisation; OpenCLIP's
    ``encode_image``), so the text tower does not run; the texts are a
    :class:`camkit.targets.PromptTarget`, whose text embeddings are computed once. Layer names
    are those of ``model`` (``"vision_model.encoder.layers.1"``).
    """

    wraps_model = True

    def __init__(self, model: nn.Module):
        super().__init__()
        if not any(callable(getattr(model, name, None)) for name in IMAGE_TOWERS):
            raise ArgumentError(
                f"ImageTower needs a dual encoder with get_image_features (HuggingFace CLIPModel, "
                f"SiglipModel) or encode_image (OpenCLIP), got {type(model).__name__}"
            )
        self.module = model

    def forward(self, x: Tensor, **kwargs: object) -> Tensor:
        """``(B, C, H, W) -> (B, D)``: the projected image embedding."""
        if not callable(getattr(self.module, "get_image_features", None)):
            return self.module.encode_image(x, **kwargs)
        features = self.module.get_image_features(pixel_values=x, **kwargs)
        return features if isinstance(features, Tensor) else features.pooler_output


class VideoPrompts(nn.Module):
    """A video-text model whose text side depends on the video (HuggingFace ``XCLIPModel``: its
    prompt generator conditions the text embeddings on the frames' patch features, Ni et al.,
    ECCV 2022), with its ``K`` prompts held: ``VideoPrompts(model, input_ids)(pixel_values)`` is
    the model's own ``(B, K)`` ``logits_per_video`` for ``pixel_values (B, T, C, H, W)``; target
    ``k`` explains prompt ``k``. Wrap it for camkit's clips: ``camkit.InputLayout(VideoPrompts(
    model, ids), "BTCHW")``. The prompts stay fixed whatever the batch (extra inputs with a
    first axis of ``B`` would be taken per sample). Layer names are those of ``model``.
    """

    wraps_model = True

    def __init__(self, model: nn.Module, input_ids: Tensor, attention_mask: Tensor | None = None):
        super().__init__()
        if getattr(getattr(model, "config", None), "model_type", None) != "xclip":
            raise ArgumentError(
                f"VideoPrompts takes a HuggingFace XCLIPModel, got {type(model).__name__}; for "
                "an image-text dual encoder use camkit.ImageTower and a PromptTarget"
            )
        ids = input_ids
        if isinstance(ids, Tensor) and ids.ndim == 1:
            ids = ids[None]
        if not isinstance(ids, Tensor) or ids.ndim != 2 or ids.is_floating_point():
            raise ArgumentError(f"input_ids must be (K, L) token ids, got {ids!r}")
        self.module = model
        self.input_ids, self.attention_mask = ids, attention_mask

    def forward(self, pixel_values: Tensor) -> Tensor:
        """``(B, T, C, H, W) -> (B, K)``: the model's ``logits_per_video``."""
        texts = {"input_ids": self.input_ids.to(pixel_values.device)}
        if self.attention_mask is not None:
            texts["attention_mask"] = self.attention_mask.to(pixel_values.device)
        return self.module(pixel_values=pixel_values, **texts).logits_per_video


__all__ = [
    "ImageInput",
    "ImageTower",
    "InputLayout",
    "KeywordInput",
    "VideoPrompts",
    "image_inputs",
]

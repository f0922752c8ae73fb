"""Wrappers (``nn.Module`` s) that let camkit explain a model whose input is not one
``(B, C, ...)`` tensor in first position; layer names stay those of the wrapped model."""

from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from camkit.core.architecture import PatchRows, Tiles, image_tiles, patch_rows
from camkit.errors import ArgumentError, InputError


class _Wrapper(nn.Module):
    """A wrapper of the user's ``model`` (``.module``), whose layer names stay ``model``'s."""

    wraps_model = True

    def __init__(self, model: nn.Module):
        super().__init__()
        self.module = model


class InputLayout(_Wrapper):
    """A model that takes 5-D clips in another layout, declared: ``InputLayout(model, "BTCHW")``
    is called with ``(B, C, T, H, W)`` (camkit's reading) and calls ``model`` with the axes in
    the declared order (VideoMAE, frame-wise models). CAMs map ``(B, C, T, H, W) -> (B, T, H,
    W)``. ``frame_wise=True`` declares a model that folds the frames into its batch (TSN, TSM, a
    2-D backbone per frame: layers of ``B * T`` rows, row ``b * T + t``), read as ``(B, T, h,
    w)``; undeclared, CAMs refuse such layers by name.
    """

    CANONICAL = "BCTHW"

    def __init__(self, model: nn.Module, layout: str, *, frame_wise: bool = False):
        super().__init__(model)
        order = layout.upper().replace("D", "T") if isinstance(layout, str) else None
        if order is None or sorted(order) != sorted(self.CANONICAL):
            raise ArgumentError(
                f'layout must order the letters B, C, T (or D), H, W, e.g. "BTCHW", got {layout!r}'
            )
        self.layout = order
        self.frame_wise = bool(frame_wise)
        self.permutation = [self.CANONICAL.index(axis) for axis in order]

    def forward(self, x: Tensor, *args: object, **kwargs: object) -> object:
        """``(B, C, T, H, W)`` -> the model's output on ``x`` permuted to the declared layout."""
        if x.ndim != 5:
            raise InputError(f"InputLayout takes (B, C, T, H, W) clips, got {tuple(x.shape)}")
        return self.module(x.permute(self.permutation), *args, **kwargs)


class KeywordInput(_Wrapper):
    """A model whose explained input is a keyword argument: ``KeywordInput(model,
    "pixel_values")(x, *args, **kwargs)`` calls ``model(*args, pixel_values=x, **kwargs)``
    (HuggingFace models). The other inputs come as the methods' ``additional_forward_args``.
    """

    def __init__(self, model: nn.Module, key: str):
        super().__init__(model)
        if not isinstance(key, str) or not key.isidentifier():
            raise ArgumentError(f"key must be the name of a keyword argument, got {key!r}")
        if key == "pixel_values" and (patch_rows(model) or image_tiles(model)):
            raise ArgumentError(
                f"{type(model).__name__} does not read images as pixel_values alone (flattened "
                "patches with image_grid_thw, or tiles with image_sizes, from its config): "
                "explain camkit.ImageInput(model), which lays images out as it reads them"
            )
        self.key = key

    def forward(self, x: Tensor, *args: object, **kwargs: object) -> object:
        """``model(*args, **{key: x}, **kwargs)``."""
        if self.key in kwargs:
            raise ArgumentError(f"{self.key!r} is the explained input; do not pass it again")
        return self.module(*args, **{self.key: x}, **kwargs)


class ImageInput(_Wrapper):
    """A generative vision-language model given images ``x`` ``(B, C, H, W)`` as it reads them:
    ``ImageInput(model)(x, input_ids=...)`` calls ``model`` with :func:`image_inputs`. CAMs
    read the vision layers' rows (patches, views) as one map per image.
    """

    def forward(self, x: Tensor, *args: object, **kwargs: object) -> object:
        """``model(*args, **image_inputs(model, x, input_ids), **kwargs)``."""
        ids = kwargs.get("input_ids")
        inputs = image_inputs(self.module, x, ids if isinstance(ids, Tensor) else None)
        return self.module(*args, **{**inputs, **kwargs})


def image_inputs(model: nn.Module, x: Tensor, input_ids: Tensor | None = None) -> dict[str, Tensor]:
    """The keyword inputs that give images ``x`` ``(B, C, H, W)`` to a generative model, laid
    out as its image processor does:

    * ``pixel_values=x`` for a model that reads whole images (LLaVA, PaliGemma);
    * flattened patches (Qwen2-VL, Wang et al. 2024): merge window by merge window, each patch
      repeated over its ``t`` frames, with ``image_grid_thw`` ``(B, 3)``, and, given
      ``input_ids``, ``mm_token_type_ids`` (1 at ``config.image_token_id``) where it takes them;
    * tiles (LLaVA-NeXt's anyres, Liu et al. 2024), for images at a pinpoint: the image resized
      to the tile side (bicubic, antialiased), then its tiles row by row, as ``pixel_values``
      ``(B * views, C, side, side)``, with ``image_sizes`` ``(B, 2)``."""
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


def _tiles(model: nn.Module, x: Tensor, tiles: Tiles) -> dict[str, Tensor]:
    """``pixel_values`` (the views) and ``image_sizes`` of images ``x``."""
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
    """``pixel_values`` and ``image_grid_thw`` of images ``x``."""
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


class ImageTower(_Wrapper):
    """The image side of a dual encoder (HuggingFace CLIP, SigLIP; OpenCLIP):
    ``ImageTower(model)(pixel_values)`` is ``model.get_image_features``'s ``(B, D)`` embedding
    (OpenCLIP's ``encode_image``), so the text tower does not run; the texts are a
    :class:`camkit.targets.PromptTarget`.
    """

    def __init__(self, model: nn.Module):
        super().__init__(model)
        towers = (getattr(model, name, None) for name in ("get_image_features", "encode_image"))
        if not any(map(callable, towers)):
            raise ArgumentError(
                f"ImageTower needs a dual encoder with get_image_features (HuggingFace CLIPModel, "
                f"SiglipModel) or encode_image (OpenCLIP), got {type(model).__name__}"
            )

    def forward(self, x: Tensor, **kwargs: object) -> Tensor:
        """``(B, C, H, W) -> (B, D)``: the projected image embedding."""
        if not callable(getattr(self.module, "get_image_features", None)):
            return self.module.encode_image(x, **kwargs)
        features = self.module.get_image_features(pixel_values=x, **kwargs)
        return features if isinstance(features, Tensor) else features.pooler_output


class VideoPrompts(_Wrapper):
    """A video-text model whose text side depends on the video (HuggingFace ``XCLIPModel``,
    Ni et al., ECCV 2022), with its ``K`` prompts held (as extra inputs they would follow the
    samples): ``VideoPrompts(model, input_ids)(pixel_values (B, T, C, H, W))`` is the model's
    ``(B, K)`` ``logits_per_video``; target ``k`` explains prompt ``k``. Use as
    ``camkit.InputLayout(VideoPrompts(model, ids), "BTCHW")``.
    """

    def __init__(self, model: nn.Module, input_ids: Tensor, attention_mask: Tensor | None = None):
        super().__init__(model)
        if getattr(getattr(model, "config", None), "model_type", None) != "xclip":
            raise ArgumentError(
                f"VideoPrompts takes a HuggingFace XCLIPModel, got {type(model).__name__}; for "
                "an image-text dual encoder use camkit.ImageTower and a PromptTarget"
            )
        one = isinstance(input_ids, Tensor) and input_ids.ndim == 1
        ids = input_ids[None] if one else input_ids
        if not isinstance(ids, Tensor) or ids.ndim != 2 or ids.is_floating_point():
            raise ArgumentError(f"input_ids must be (K, L) token ids, got {ids!r}")
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

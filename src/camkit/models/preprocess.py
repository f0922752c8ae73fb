"""Preprocessing: an image becomes the normalised tensor a model expects."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import warnings
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor, nn

from camkit.core.inputs import as_size
from camkit.core.layers import explained_module
from camkit.errors import ArgumentError
from camkit.io import rgb_pixels, to_rgb_uint8

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
INTERPOLATIONS = ("bilinear", "bicubic", "nearest")  # torchvision InterpolationMode values
#: How a photo becomes the model's input size, the one choice of every front end (``--crop``):
#: the model's own ``center`` crop, ``squash`` (aspect ratio lost), ``pad`` (letterboxed).
CROPS = ("center", "squash", "pad")


@dataclass(frozen=True)
class Preprocess:
    """Image (what :func:`camkit.viz.to_rgb_uint8` accepts) -> normalised model input ``(3, H,
    W)`` float32, the usual evaluation transform; ``size`` may be an int for a square input.

    ``crop_mode="center"``: resize (keeping the aspect ratio, antialiased) so the image covers
    ``floor(size / crop_pct)`` on both sides, then center-crop ``size``; ``"squash"``: resize
    straight to ``size``; ``"pad"``: resize so the whole image fits ``size``, centred on the mean
    colour (0 once normalised). Then ``(x - mean) / std`` with ``x`` in [0, 1].
    :meth:`photo_region` says where the input lies on the photo.
    """

    size: tuple[int, int] = (224, 224)
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    crop_pct: float = 0.875
    interpolation: Literal["bilinear", "bicubic", "nearest"] = "bilinear"
    crop_mode: Literal["center", "squash", "pad"] = "center"

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", as_size(self.size))
        object.__setattr__(self, "mean", tuple(float(value) for value in self.mean))
        object.__setattr__(self, "std", tuple(float(value) for value in self.std))
        if min(self.size) < 1:
            raise ArgumentError(f"expected size (H, W) with positive sides, got {self.size}")
        if len(self.mean) != 3 or len(self.std) != 3 or min(self.std) <= 0:
            raise ArgumentError(
                f"expected 3 means and 3 positive stds, got mean={self.mean} std={self.std}"
            )
        if not 0.0 < self.crop_pct <= 1.0:
            raise ArgumentError(f"expected crop_pct in (0, 1], got {self.crop_pct}")
        for name, allowed in (("interpolation", INTERPOLATIONS), ("crop_mode", CROPS)):
            if getattr(self, name) not in allowed:
                raise ArgumentError(f"expected {name} in {allowed}, got {getattr(self, name)!r}")

    def resized_size(self, height: int, width: int) -> tuple[int, int]:
        """The size a ``height x width`` photo is resized to before the crop or the padding."""
        if self.crop_mode == "squash":
            return self.size
        if self.crop_mode == "pad":
            scale = min(self.size[0] / height, self.size[1] / width)
            return (
                min(self.size[0], max(1, round(height * scale))),
                min(self.size[1], max(1, round(width * scale))),
            )
        cover_h, cover_w = (math.floor(side / self.crop_pct) for side in self.size)
        if cover_h / height >= cover_w / width:  # height binds: torchvision's shorter-side rule
            return cover_h, max(cover_w, int(cover_h * width / height))
        return max(cover_h, int(cover_w * height / width)), cover_w

    def photo_region(self, height: int, width: int) -> tuple[float, float, float, float]:
        """Where the model's input lies on a ``height x width`` photo: ``(top, left, bottom,
        right)`` in its pixels; the crop window for ``center``, beyond the photo for ``pad``."""
        new_h, new_w = self.resized_size(height, width)
        size_h, size_w = self.size
        if self.crop_mode == "pad":  # the resized photo's offsets on the canvas, negated
            top, left = (-offset for offset in self._pad_offsets(new_h, new_w))
        else:  # torchvision's center_crop: int(round(excess / 2))
            top, left = int(round((new_h - size_h) / 2)), int(round((new_w - size_w) / 2))
        scale_h, scale_w = height / new_h, width / new_w
        return top * scale_h, left * scale_w, (top + size_h) * scale_h, (left + size_w) * scale_w

    def box_on_photo(
        self, box: tuple[float, float, float, float], height: int, width: int
    ) -> tuple[int, int, int, int]:
        """A ``(top, left, bottom, right)`` box in the model input's pixels -> the same box in
        a ``height x width`` photo's pixels (through :meth:`photo_region`), clipped to the
        photo and at least one pixel wide."""
        region_top, region_left, region_bottom, region_right = self.photo_region(height, width)
        scale_y = (region_bottom - region_top) / self.size[0]
        scale_x = (region_right - region_left) / self.size[1]
        top = min(max(int(region_top + box[0] * scale_y), 0), height - 1)
        left = min(max(int(region_left + box[1] * scale_x), 0), width - 1)
        bottom = min(max(int(round(region_top + box[2] * scale_y)), top + 1), height)
        right = min(max(int(round(region_left + box[3] * scale_x)), left + 1), width)
        return top, left, bottom, right

    def _pad_offsets(self, height: int, width: int) -> tuple[int, int]:
        """``(top, left)`` of a resized photo on ``pad``'s canvas: half the margins (floor)."""
        return (self.size[0] - height) // 2, (self.size[1] - width) // 2

    def _resize_crop_float(self, image: object, fill: tuple[float, ...] | None = None) -> Tensor:
        from torchvision.transforms.v2 import functional as TF

        array = rgb_pixels(image)
        if not array.flags.writeable:  # torch takes writable arrays only (a PIL image's view)
            array = array.copy()
        pixels = torch.from_numpy(array).permute(2, 0, 1)
        new_size = list(self.resized_size(*pixels.shape[1:]))
        resized = _resize(pixels, new_size, self.interpolation).clamp_(0, 1)
        if self.crop_mode != "pad":
            return TF.center_crop(resized, list(self.size))  # clamped: bicubic overshoots
        fill = self.mean if fill is None else fill
        canvas = torch.tensor(fill, dtype=resized.dtype).view(3, 1, 1).repeat(1, *self.size)
        top, left = self._pad_offsets(*new_size)
        canvas[:, top : top + new_size[0], left : left + new_size[1]] = resized
        return canvas

    def resize_crop(
        self, image: object, *, fill: tuple[float, float, float] | None = None
    ) -> np.ndarray:
        """The image as the model sees it (resized and cropped or padded, not normalised):
        ``HxWx3`` uint8, the background of overlays; ``fill``: the padding's colour in [0, 1]
        (default: the mean)."""
        return to_rgb_uint8(self._resize_crop_float(image, fill))

    def __call__(self, image: object) -> Tensor:
        """Image -> ``(3, H, W)`` float32 normalised tensor on the CPU."""
        from torchvision.transforms.v2 import functional as TF

        return TF.normalize(self._resize_crop_float(image), list(self.mean), list(self.std))

    def clip(self, frames: object) -> Tensor:
        """Frames ``(T, H, W, 3)`` uint8 -> a video model's input ``(3, T, h, w)`` (channels,
        then time): each frame preprocessed as an image is."""
        return torch.stack([self(frame) for frame in frames], dim=1)


STRIP_PIXELS = 1 << 20  # a photo is made float this many pixels at a time (4 MB per channel)


def _resize(pixels: Tensor, size: list[int], interpolation: str) -> Tensor:
    """``(3, H, W)`` uint8 or float [0, 1] -> ``(3, *size)`` float32, antialiased, without a
    float copy of the whole photo: :data:`STRIP_PIXELS` at a time made float and resized across,
    then down the columns; separable, so the one-step resize's result within float32 rounding
    (tested against a float64 reference)."""
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms.v2 import functional as TF

    mode = InterpolationMode(interpolation)
    height, width = pixels.shape[1:]
    rows = max(1, STRIP_PIXELS // width)
    strips = []
    for top in range(0, height, rows):
        strip = pixels[:, top : top + rows]
        strip = strip.float() / 255 if strip.dtype == torch.uint8 else strip.float()
        if width != size[1]:
            strip = TF.resize(strip, [strip.shape[1], size[1]], interpolation=mode, antialias=True)
        strips.append(strip)
    across = torch.cat(strips, dim=1) if len(strips) > 1 else strips[0]
    if height == size[0]:
        return across
    return TF.resize(across, size, interpolation=mode, antialias=True)


def preprocess(
    image: object,
    size: int | tuple[int, int] = 224,
    *,
    mean: tuple[float, float, float] = IMAGENET_MEAN,
    std: tuple[float, float, float] = IMAGENET_STD,
    crop_pct: float = 0.875,
    interpolation: Literal["bilinear", "bicubic", "nearest"] = "bilinear",
) -> Tensor:
    """Image -> normalised ``(3, H, W)`` float32 tensor; see :class:`Preprocess` for the steps."""
    return Preprocess(size, mean, std, crop_pct, interpolation)(image)


class AssumedPreprocessWarning(UserWarning):
    """A module that does not say how its input is prepared (no timm ``pretrained_cfg``, no
    HuggingFace ``preprocessor_config.json``): camkit assumed the defaults the message names."""


_PIL_RESAMPLING = {0: "nearest", 2: "bilinear", 3: "bicubic"}  # PIL.Image.Resampling values
_WARNED: weakref.WeakSet[nn.Module] = weakref.WeakSet()  # one warning per module


def preprocess_of(model: nn.Module, size: int | tuple[int, int] | None = None) -> Preprocess:
    """The preprocessing a module carries, the one reader wherever camkit is given a bare
    module: a timm-style ``pretrained_cfg`` (every timm model's; :func:`camkit.models.load`
    attaches one to the torchvision models it builds), else a HuggingFace model's
    ``preprocessor_config.json`` in the local folder its ``config`` was read from. Wrappers are
    looked through (``DataParallel``, ``torch.compile``, :class:`KeywordInput`,
    :class:`InputLayout`). Where nothing says, :class:`Preprocess`'s ImageNet defaults and one
    :class:`AssumedPreprocessWarning` per module. ``size``: instead of the model's own.
    """
    carried = carried_preprocess(model, size)
    if carried is not None:
        return carried
    assumed = Preprocess(224 if size is None else size)
    if model not in _WARNED:
        _WARNED.add(model)
        warnings.warn(
            f"{type(model).__name__} does not say how its input is prepared (no timm "
            "pretrained_cfg, no HuggingFace preprocessor_config.json): camkit assumes "
            f"{assumed.size[0]}x{assumed.size[1]} inputs, ImageNet's mean {assumed.mean} and "
            f"std {assumed.std}, {assumed.interpolation} resizing and a center crop of "
            f"{assumed.crop_pct}. Give a camkit.models.LoadedModel with its own Preprocess, "
            "or set model.pretrained_cfg = {'mean': ..., 'std': ..., 'interpolation': ..., "
            "'crop_pct': ..., 'input_size': (3, H, W)} as timm does",
            AssumedPreprocessWarning,
            stacklevel=3,
        )
    return assumed


def carried_preprocess(
    model: nn.Module, size: int | tuple[int, int] | None = None
) -> Preprocess | None:
    """The preprocessing ``model`` carries (see :func:`preprocess_of`), at ``size`` when given;
    None when it carries none (no default, no warning)."""
    found = (_from_pretrained_cfg(m) or _from_huggingface_folder(m) for m in _unwrapped(model))
    settings = next(filter(None, found), None)
    if settings is None:
        return None
    return Preprocess(**(settings if size is None else settings | {"size": size}))


def _unwrapped(model: nn.Module) -> Iterator[nn.Module]:
    """``model``, then each module it wraps (parallel, compiled, camkit's input wrappers)."""
    seen: list[nn.Module] = []
    while isinstance(model, nn.Module) and not any(model is known for known in seen):
        seen.append(model)
        yield model
        inner = explained_module(model)
        if inner is model:
            inner = model.module if getattr(model, "wraps_model", False) else None
        model = inner


def _from_pretrained_cfg(module: nn.Module) -> dict[str, Any] | None:
    """timm's ``pretrained_cfg`` (a dict; a dataclass in some timm versions) -> settings."""
    config = getattr(module, "pretrained_cfg", None)
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        config = dataclasses.asdict(config)
    if not isinstance(config, Mapping) or config.get("mean") is None or config.get("std") is None:
        return None
    settings: dict[str, Any] = {"mean": config["mean"], "std": config["std"]}
    if config.get("input_size"):
        settings["size"] = tuple(config["input_size"][-2:])
    if config.get("crop_pct"):
        settings["crop_pct"] = min(1.0, float(config["crop_pct"]))
    interpolation = config.get("interpolation")
    settings["interpolation"] = interpolation if interpolation in INTERPOLATIONS else "bilinear"
    settings["crop_mode"] = "squash" if config.get("crop_mode") == "squash" else "center"
    return settings


def _from_huggingface_folder(module: nn.Module) -> dict[str, Any] | None:
    """A local HuggingFace model's ``preprocessor_config.json`` -> settings, resizing as its
    image processor does (ViT: to ``size``; ConvNeXT: the shorter side to ``shortest_edge /
    crop_pct``, then a center crop; CLIP: the shorter side to ``size``, crop ``crop_size``)."""
    config = getattr(module, "config", None)
    folder = getattr(config, "_name_or_path", None) or getattr(config, "name_or_path", None)
    if not isinstance(folder, (str, os.PathLike)) or not os.path.isdir(folder):
        return None
    path = Path(folder) / "preprocessor_config.json"
    if not path.is_file():
        return None
    spec = json.loads(path.read_text())
    mean, std = spec.get("image_mean"), spec.get("image_std")
    if spec.get("do_normalize") is False:
        mean, std = (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)
    if mean is None or std is None or spec.get("size") is None:
        return None
    settings: dict[str, Any] = {"mean": mean, "std": std}
    settings["interpolation"] = _PIL_RESAMPLING.get(spec.get("resample"), "bilinear")
    size, crop = spec["size"], spec.get("crop_size")
    shortest = size.get("shortest_edge") if isinstance(size, Mapping) else None
    if spec.get("do_center_crop") and crop:
        settings["size"] = _sides(crop)
        resized = shortest or _sides(size)[0]
        settings["crop_pct"] = min(1.0, settings["size"][0] / resized)
    elif shortest is not None and shortest < 384:  # ConvNeXT's rule below 384
        settings["size"] = (shortest, shortest)
        settings["crop_pct"] = min(1.0, float(spec.get("crop_pct") or 1.0))
    else:
        settings["size"] = _sides(size)
        settings["crop_mode"] = "squash"
    return settings


def _sides(size: int | Mapping[str, int]) -> tuple[int, int]:
    """A HuggingFace size (an int, ``{"height", "width"}`` or ``{"shortest_edge"}``)."""
    if isinstance(size, Mapping) and "height" in size and "width" in size:
        return int(size["height"]), int(size["width"])
    side = int(size["shortest_edge"] if isinstance(size, Mapping) else size)
    return side, side

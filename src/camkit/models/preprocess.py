"""Preprocessing: an image becomes the normalised tensor a model expects."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from camkit.core.inputs import as_size
from camkit.errors import ArgumentError
from camkit.io import to_rgb_float, to_rgb_uint8

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
INTERPOLATIONS = ("bilinear", "bicubic", "nearest")  # torchvision InterpolationMode values
#: How a photo becomes the model's input size, the one choice of every front end (``--crop``):
#: ``center`` (the model's own evaluation transform), ``squash`` (resized to the input size, the
#: aspect ratio changes), ``pad`` (the whole photo, letterboxed with the mean colour).
CROPS = ("center", "squash", "pad")


@dataclass(frozen=True)
class Preprocess:
    """Image -> normalised model input ``(3, H, W)`` float32, the usual evaluation transform.

    ``crop_mode="center"``: resize (keeping the aspect ratio, antialiased) so the image covers
    ``floor(size / crop_pct)`` on both sides, i.e. the shorter side for a square ``size``, then
    center-crop ``size``. ``crop_mode="squash"``: resize straight to ``size`` (no crop; the
    aspect ratio changes, ``crop_pct`` is ignored). ``crop_mode="pad"``: resize (keeping the
    aspect ratio) so the whole image fits ``size``, centred on the mean colour (0 once
    normalised; ``crop_pct`` is ignored). :meth:`photo_region` says where the input lies on
    the photo, so a map can be drawn on the full photo. Then
    ``(x - mean) / std`` with ``x`` in [0, 1]. Accepts what :func:`camkit.viz.to_rgb_uint8` accepts.
    ``size`` may be given as an int for a square input.
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
        if self.interpolation not in INTERPOLATIONS:
            raise ArgumentError(
                f"expected interpolation in {INTERPOLATIONS}, got {self.interpolation!r}"
            )
        if self.crop_mode not in CROPS:
            raise ArgumentError(f"expected crop_mode in {CROPS}, got {self.crop_mode!r}")

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
        right)`` in the photo's pixels. The whole photo for ``squash``; the crop window for
        ``center`` (inside the photo: the model did not see the rest); beyond the photo for
        ``pad`` (the letterbox)."""
        new_h, new_w = self.resized_size(height, width)
        size_h, size_w = self.size
        if self.crop_mode == "pad":  # the resized photo's offsets on the canvas, negated
            top, left = (-offset for offset in self._pad_offsets(new_h, new_w))
        else:  # torchvision's center_crop: int(round(excess / 2))
            top, left = int(round((new_h - size_h) / 2)), int(round((new_w - size_w) / 2))
        scale_h, scale_w = height / new_h, width / new_w
        return (
            top * scale_h,
            left * scale_w,
            (top + size_h) * scale_h,
            (left + size_w) * scale_w,
        )

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
        """Where ``pad`` puts a photo resized to ``height x width`` on the input-size canvas:
        its ``(top, left)``, half the margin on each side (rounded down)."""
        return (self.size[0] - height) // 2, (self.size[1] - width) // 2

    def _resize_crop_float(self, image: object, fill: tuple[float, ...] | None = None) -> Tensor:
        from torchvision.transforms import InterpolationMode
        from torchvision.transforms.v2 import functional as TF

        pixels = torch.from_numpy(to_rgb_float(image)).permute(2, 0, 1)
        new_size = list(self.resized_size(*pixels.shape[1:]))
        mode = InterpolationMode(self.interpolation)
        resized = TF.resize(pixels, new_size, interpolation=mode, antialias=True).clamp_(0, 1)
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
        ``HxWx3`` uint8; ``fill`` is the padding's colour in [0, 1] (default: the mean).

        Use it as the background of overlays so a heatmap lines up with the pixels it is about.
        """
        pixels = self._resize_crop_float(image, fill)
        return to_rgb_uint8(pixels)

    def __call__(self, image: object) -> Tensor:
        """Image -> ``(3, H, W)`` float32 normalised tensor on the CPU."""
        from torchvision.transforms.v2 import functional as TF

        pixels = self._resize_crop_float(image)
        return TF.normalize(pixels, list(self.mean), list(self.std))


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
    transform = Preprocess(size, mean, std, crop_pct, interpolation)
    return transform(image)

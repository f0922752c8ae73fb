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


@dataclass(frozen=True)
class Preprocess:
    """Image -> normalised model input ``(3, H, W)`` float32, the usual evaluation transform.

    ``crop_mode="center"``: resize (keeping the aspect ratio, antialiased) so the image covers
    ``floor(size / crop_pct)`` on both sides, i.e. the shorter side for a square ``size``, then
    center-crop ``size``. ``crop_mode="squash"``: resize straight to ``size`` (no crop; the
    aspect ratio changes, ``crop_pct`` is ignored). Then
    ``(x - mean) / std`` with ``x`` in [0, 1]. Accepts what :func:`camkit.viz.to_rgb_uint8` accepts.
    ``size`` may be given as an int for a square input.
    """

    size: tuple[int, int] = (224, 224)
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    crop_pct: float = 0.875
    interpolation: Literal["bilinear", "bicubic", "nearest"] = "bilinear"
    crop_mode: Literal["center", "squash"] = "center"

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
        if self.crop_mode not in ("center", "squash"):
            raise ArgumentError(f"expected crop_mode 'center' or 'squash', got {self.crop_mode!r}")

    def _resize_crop_float(self, image: object) -> Tensor:
        from torchvision.transforms import InterpolationMode
        from torchvision.transforms.v2 import functional as TF

        pixels = torch.from_numpy(to_rgb_float(image)).permute(2, 0, 1)
        height, width = pixels.shape[1:]
        cover_h, cover_w = (math.floor(side / self.crop_pct) for side in self.size)
        if self.crop_mode == "squash":
            new_size = list(self.size)
        elif cover_h / height >= cover_w / width:  # height binds: torchvision's shorter-side rule
            new_size = [cover_h, max(cover_w, int(cover_h * width / height))]
        else:
            new_size = [max(cover_h, int(cover_w * height / width)), cover_w]
        mode = InterpolationMode(self.interpolation)
        resized = TF.resize(pixels, new_size, interpolation=mode, antialias=True)
        return TF.center_crop(resized.clamp_(0.0, 1.0), list(self.size))  # bicubic overshoots

    def resize_crop(self, image: object) -> np.ndarray:
        """The image as the model sees it (resized and cropped, not normalised): ``HxWx3`` uint8.

        Use it as the background of overlays so a heatmap lines up with the pixels it is about.
        """
        pixels = self._resize_crop_float(image)
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

"""Image conversion: any image (PIL, numpy, torch; uint8, uint16, bool or float) to checked
``HxWx3`` RGB uint8 or float, and thumbnails."""

from __future__ import annotations

import cv2
import numpy as np
import torch
from PIL import Image

from camkit.errors import ArgumentError

_CHANNEL_COUNTS = (1, 3, 4)
FLOAT_TOLERANCE = 1e-3  # float images may stray this far outside [0, 1] (rounding) before clipping


def describe(value: object) -> str:
    if isinstance(value, (np.ndarray, torch.Tensor)):
        return f"{type(value).__name__} of shape {tuple(value.shape)} and dtype {value.dtype}"
    return type(value).__name__


def as_numpy(array: np.ndarray | torch.Tensor) -> np.ndarray:
    if isinstance(array, torch.Tensor):
        array = array.detach().cpu()
        if array.dtype == torch.bfloat16:
            array = array.float()
        return array.numpy()
    return np.asarray(array)


def _image_rgb(image: object) -> np.ndarray:
    """Any supported image -> numpy ``HxWx3`` (gray repeated, alpha dropped), dtype unchanged."""
    if isinstance(image, Image.Image):
        return np.asarray(image.convert("RGB"))
    if not isinstance(image, (torch.Tensor, np.ndarray)):
        raise ArgumentError(
            f"expected an image as a PIL image, numpy array or torch tensor, got {describe(image)}"
        )
    channels_first = isinstance(image, torch.Tensor)
    if channels_first and image.ndim == 4 and image.shape[0] == 1:
        image = image[0]
    array = as_numpy(image)
    if array.ndim == 2:
        array = array[:, :, None]
    elif array.ndim == 3:
        first_ok, last_ok = array.shape[0] in _CHANNEL_COUNTS, array.shape[2] in _CHANNEL_COUNTS
        if first_ok and (channels_first or not last_ok):
            array = np.moveaxis(array, 0, 2)
        elif not last_ok:
            raise ArgumentError(
                "expected an image with 1, 3 or 4 channels (HxWxC array or CxHxW tensor), "
                f"got {describe(image)}"
            )
    else:
        raise ArgumentError(
            f"expected a 2-D (gray) or 3-D (color) image, got {describe(image)} "
            f"with {array.ndim} dimensions"
        )
    if array.shape[0] == 0 or array.shape[1] == 0:
        raise ArgumentError(f"the image is empty: {describe(image)}")
    return np.repeat(array, 3, axis=2) if array.shape[2] == 1 else array[:, :, :3]


def _check_unit_range(array: np.ndarray) -> np.ndarray:
    """Float image -> float32 clipped to [0, 1]; refuses NaN/inf and values far outside [0, 1]."""
    array = array.astype(np.float32, copy=False)
    if not np.isfinite(array).all():
        raise ArgumentError("the image contains NaN or infinite values")
    low, high = float(array.min()), float(array.max())
    if low < -FLOAT_TOLERANCE or high > 1 + FLOAT_TOLERANCE:
        raise ArgumentError(
            f"expected a float image with values in [0, 1], got values in [{low:.4g}, {high:.4g}]"
            " (a normalised model input? pass the original image, or uint8 0..255)"
        )
    return np.clip(array, 0.0, 1.0)


def to_rgb_uint8(image: object) -> np.ndarray:
    """Any supported image -> ``HxWx3`` uint8 RGB (a new array).

    PIL images, numpy arrays (``HxW``, ``HxWx1``, ``HxWx3``, ``HxWx4``; read channels-last) or
    torch tensors (``HxW``, ``CxHxW``, ``1xCxHxW``; read channels-first), unless only the other
    reading has 1, 3 or 4 channels. Gray is repeated, alpha dropped (not composited). bool ->
    0/255, float in [0, 1] scaled by 255 and rounded, uint16 divided by 257 and rounded; other
    integers must lie in 0..255.
    """
    array = _image_rgb(image)
    if array.dtype == np.uint8:
        return array.copy()
    if array.dtype == np.bool_:
        return array.astype(np.uint8) * 255
    if np.issubdtype(array.dtype, np.floating):
        return np.round(_check_unit_range(array) * 255.0).astype(np.uint8)
    if not np.issubdtype(array.dtype, np.integer):
        raise ArgumentError(
            f"expected a uint8, integer, bool or float image, got {describe(image)}"
        )
    if array.dtype == np.uint16:
        return np.round(array / 257.0).astype(np.uint8)
    low, high = int(array.min()), int(array.max())
    if low < 0 or high > 255:
        raise ArgumentError(
            f"expected integer image values in 0..255 (or uint16), got {array.dtype} values in "
            f"[{low}, {high}]"
        )
    return array.astype(np.uint8)


def rgb_pixels(image: object) -> np.ndarray:
    """Any supported image -> ``HxWx3`` RGB without a float copy: uint8 (not copied when it
    already is), or float32 in [0, 1] for a float image. For work that converts to float in
    parts (a resize in strips), so that memory follows the output's size, not the photo's."""
    array = _image_rgb(image)
    if np.issubdtype(array.dtype, np.floating):
        return _check_unit_range(array)
    return array if array.dtype == np.uint8 else to_rgb_uint8(array)


def to_rgb_float(image: object) -> np.ndarray:
    """Any supported image -> ``HxWx3`` float32 RGB in [0, 1] (float input keeps its precision)."""
    array = _image_rgb(image)
    if np.issubdtype(array.dtype, np.floating):
        return _check_unit_range(array).copy()
    return to_rgb_uint8(array).astype(np.float32) / 255.0


def thumbnail(image: object, max_side: int = 256) -> np.ndarray:
    """An image shrunk so its longer side is at most ``max_side`` -> ``hxwx3`` uint8 RGB, the
    aspect ratio kept (an image small enough: unchanged). Area interpolation (no aliasing), in
    two steps for speed: by the largest whole factor ``k`` that keeps the final size (each pixel
    the mean of a ``k x k`` block, the last ``< k`` rows/columns dropped), then to the size.
    """
    if max_side < 1:
        raise ArgumentError(f"expected max_side >= 1, got {max_side}")
    rgb = to_rgb_uint8(image)
    height, width = rgb.shape[:2]
    scale = max_side / max(height, width)
    if scale >= 1.0:
        return rgb
    size = (max(1, round(width * scale)), max(1, round(height * scale)))
    factor = min(width // size[0], height // size[1])
    if factor >= 2:  # whole-factor area reduction is ~4x faster than a fractional one
        reduced = (width // factor, height // factor)
        rgb = cv2.resize(
            rgb[: reduced[1] * factor, : reduced[0] * factor], reduced, interpolation=cv2.INTER_AREA
        )
    if (rgb.shape[1], rgb.shape[0]) == size:
        return rgb
    return cv2.resize(rgb, size, interpolation=cv2.INTER_AREA)

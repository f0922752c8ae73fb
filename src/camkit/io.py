"""Image files and conversions: any image to RGB arrays, reading files with limits, atomic writes.

Images may be PIL images, numpy arrays (``HxW``, ``HxWx1``, ``HxWx3``, ``HxWx4``) or torch tensors
(``HxW``, ``CxHxW`` with C in 1/3/4, or ``1xCxHxW``), as ``uint8`` (0..255) or float (0..1).
Numpy arrays are read channels-last and tensors channels-first, unless only the other reading
has 1, 3 or 4 channels. Gray is repeated to RGB and an alpha channel is dropped (not composited).
Every file is written atomically: readers never see a half-written file.
"""

from __future__ import annotations

import io
import json
import os
import uuid
from pathlib import Path

import cv2
import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError

CHANNEL_COUNTS = (1, 3, 4)
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


def _image_hwc(image: object) -> np.ndarray:
    """Any supported image -> numpy ``HxWxC`` (C in 1/3/4), dtype unchanged."""
    if isinstance(image, Image.Image):
        return np.asarray(image.convert("RGB"))
    if isinstance(image, torch.Tensor):
        channels_first = True
        if image.ndim == 4 and image.shape[0] == 1:
            image = image[0]
    elif isinstance(image, np.ndarray):
        channels_first = False
    else:
        raise TypeError(
            f"expected an image as a PIL image, numpy array or torch tensor, got {describe(image)}"
        )
    array = as_numpy(image)
    if array.ndim == 2:
        array = array[:, :, None]
    elif array.ndim == 3:
        first_ok, last_ok = array.shape[0] in CHANNEL_COUNTS, array.shape[2] in CHANNEL_COUNTS
        if (channels_first and first_ok) or (not last_ok and first_ok):
            array = np.moveaxis(array, 0, 2)
        elif not last_ok:
            raise ValueError(
                "expected an image with 1, 3 or 4 channels (HxWxC array or CxHxW tensor), "
                f"got {describe(image)}"
            )
    else:
        raise ValueError(
            f"expected a 2-D (gray) or 3-D (color) image, got {describe(image)} "
            f"with {array.ndim} dimensions"
        )
    if array.shape[0] == 0 or array.shape[1] == 0:
        raise ValueError(f"the image is empty: {describe(image)}")
    return array


def _rgb_channels(array: np.ndarray) -> np.ndarray:
    if array.shape[2] == 1:
        return np.repeat(array, 3, axis=2)
    return array[:, :, :3]


def _check_unit_range(array: np.ndarray) -> np.ndarray:
    """Float image -> float32 clipped to [0, 1]; refuses NaN/inf and values far outside [0, 1]."""
    array = array.astype(np.float32, copy=False)
    if not np.isfinite(array).all():
        raise ValueError("the image contains NaN or infinite values")
    low, high = float(array.min()), float(array.max())
    if low < -FLOAT_TOLERANCE or high > 1 + FLOAT_TOLERANCE:
        raise ValueError(
            f"expected a float image with values in [0, 1], got values in [{low:.4g}, {high:.4g}]"
            " (a normalised model input? pass the original image, or uint8 0..255)"
        )
    return np.clip(array, 0.0, 1.0)


def _integer_as_uint8(array: np.ndarray) -> np.ndarray:
    if array.dtype == np.uint16:
        return np.round(array / 257.0).astype(np.uint8)
    low, high = int(array.min()), int(array.max())
    if low < 0 or high > 255:
        raise ValueError(
            f"expected integer image values in 0..255 (or uint16), got {array.dtype} values in "
            f"[{low}, {high}]"
        )
    return array.astype(np.uint8)


def to_rgb_uint8(image: object) -> np.ndarray:
    """Any supported image -> ``HxWx3`` uint8 RGB (a new array).

    uint8 is kept as is, bool maps to 0/255, float in [0, 1] is scaled by 255 and rounded, uint16 is
    divided by 257; other integer types must already lie in 0..255.
    """
    array = _rgb_channels(_image_hwc(image))
    if array.dtype == np.uint8:
        return array.copy()
    if array.dtype == np.bool_:
        return array.astype(np.uint8) * 255
    if np.issubdtype(array.dtype, np.floating):
        return np.round(_check_unit_range(array) * 255.0).astype(np.uint8)
    if np.issubdtype(array.dtype, np.integer):
        return _integer_as_uint8(array)
    raise TypeError(f"expected a uint8, integer, bool or float image, got {describe(image)}")


def to_rgb_float(image: object) -> np.ndarray:
    """Any supported image -> ``HxWx3`` float32 RGB in [0, 1] (float input keeps its precision)."""
    array = _rgb_channels(_image_hwc(image))
    if np.issubdtype(array.dtype, np.floating):
        return _check_unit_range(array).copy()
    return to_rgb_uint8(array).astype(np.float32) / 255.0


def write_atomic(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to a hidden temporary file next to ``path``, then rename it over ``path``.

    Readers never see a half-written file, and a killed writer leaves none behind.
    """
    target = Path(path)
    temporary = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    descriptor = os.open(temporary, flags, 0o666)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return target


def save_png(path: str | os.PathLike[str], rgb_uint8: object) -> Path:
    """Write an image (anything :func:`to_rgb_uint8` takes) to a ``.png`` file atomically."""
    target = Path(path)
    if target.suffix.lower() != ".png":
        raise ValueError(f"expected a path ending in .png, got {str(target)!r}")
    rgb = to_rgb_uint8(rgb_uint8)
    ok, encoded = cv2.imencode(".png", np.ascontiguousarray(rgb[:, :, ::-1]))
    if not ok:
        raise OSError(f"OpenCV could not encode a PNG of shape {rgb.shape}")
    return write_atomic(target, encoded.tobytes())


def save_npy(path: str | os.PathLike[str], array: np.ndarray) -> Path:
    """``np.save`` written atomically."""
    buffer = io.BytesIO()
    np.save(buffer, array)
    return write_atomic(path, buffer.getvalue())


def save_json(path: str | os.PathLike[str], value: object) -> Path:
    """Indented JSON written atomically."""
    return write_atomic(path, (json.dumps(value, indent=2) + "\n").encode("utf-8"))


def read_image(path: str | os.PathLike[str]) -> np.ndarray:
    """An image file -> ``HxWx3`` uint8 RGB, upright (EXIF orientation applied), first frame.

    Pillow's decompression-bomb limit applies: a header promising too many pixels is refused
    before anything is allocated.
    """
    with Image.open(path) as image:
        upright = ImageOps.exif_transpose(image)
        if upright.mode.startswith("I;16"):
            return to_rgb_uint8(np.asarray(upright).astype(np.uint16))
        return np.asarray(upright.convert("RGB"))


READ_ERRORS = (OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError)


def read_failure(error: BaseException) -> str:
    """One line saying why an image could not be read."""
    if isinstance(error, UnidentifiedImageError):
        return "not an image file that Pillow can decode"
    return str(error) or type(error).__name__

"""Reading image files as ``HxWx3`` uint8 RGB, the size checked from the header first."""

from __future__ import annotations

import os
import warnings

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from camkit.errors import ArgumentError, CamkitError
from camkit.io.convert import to_rgb_uint8

MAX_PIXELS = 89_478_485
"""Default pixel limit of :func:`read_image` (Pillow's own warning threshold, about 89.5 MP: a
``9459x9459`` image, ~256 MB as RGB). Larger images are refused before decoding."""

IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp", ".gif"})
"""The file name endings that folders are searched for (the CLI and the explorer; a GIF is read
as its first frame)."""

_SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I")


class ImageTooLargeError(CamkitError):
    """An image whose header declares more pixels than allowed; refused before decoding."""


READ_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    ValueError,
    SyntaxError,
    EOFError,
    Image.DecompressionBombError,
)
"""What :func:`read_image` raises for a file it cannot turn into an image (never a bug)."""


def read_failure(error: BaseException) -> str:
    """One line saying why a file could not be read (for logs and the manifest)."""
    if isinstance(error, UnidentifiedImageError):
        return "not an image file that Pillow can decode"
    if isinstance(error, Image.DecompressionBombError):
        return f"possibly a decompression bomb, refused before decoding: {error}"
    if isinstance(error, FileNotFoundError):
        return "no such file"
    if isinstance(error, OSError) and "truncated" in str(error).lower():
        return f"the file is truncated or corrupt ({error})"
    if isinstance(error, MemoryError):
        return "not enough memory to decode the image"
    return str(error) or type(error).__name__


def _upright(image: Image.Image) -> Image.Image:
    """The image rotated/flipped as its EXIF orientation says (unchanged without one)."""
    try:
        return ImageOps.exif_transpose(image)
    except (ValueError, TypeError, KeyError, SyntaxError, OSError) as error:
        warnings.warn(
            f"ignoring an unreadable EXIF orientation ({error}); the image is used as stored",
            stacklevel=3,
        )
        return image


def _pil_to_rgb(image: Image.Image) -> np.ndarray:
    """A loaded PIL image of any mode -> ``HxWx3`` uint8 RGB."""
    mode = image.mode
    if mode in _SIXTEEN_BIT_MODES:  # 16-bit gray (PNG, TIFF): 0..65535 -> 0..255
        values = np.asarray(image).astype(np.int64)
        return to_rgb_uint8(np.clip(values, 0, 65535).astype(np.uint16))
    if mode == "F":
        values = np.asarray(image)
        if not np.isfinite(values).all() or values.min() < 0.0 or values.max() > 1.0:
            raise ArgumentError(
                "a floating-point image must hold values in [0, 1]; convert it to 8 or 16 bits"
            )
        return to_rgb_uint8(values)
    if mode == "RGB":
        return np.asarray(image).copy()
    if mode == "L":  # Pillow's L -> RGB repeats the gray; this makes no 4-byte RGB image first
        return np.repeat(np.asarray(image)[:, :, None], 3, axis=2)
    # L, LA, 1, P, PA, RGBA, RGBX, CMYK, YCbCr...: Pillow's conversion; alpha is dropped as in
    # torchvision's ImageFolder loader, so the model sees what it was trained on
    return np.asarray(image.convert("RGB")).copy()


def read_image(path: str | os.PathLike[str], *, max_pixels: int | None = MAX_PIXELS) -> np.ndarray:
    """An image file -> ``HxWx3`` uint8 RGB, upright (EXIF orientation applied), first frame.

    Gray, palette and 1-bit images are expanded; alpha is dropped (not composited, as
    torchvision's loader does); 16-bit gray is divided by 257 and rounded (16-bit RGB(A) PNG:
    Pillow keeps the high byte); CMYK JPEG goes through Pillow's formula (no ICC profile).
    More than ``max_pixels`` pixels in the header (``None``: no limit of camkit's own) raises
    :class:`ImageTooLargeError` before decoding; Pillow's bomb check also applies. Errors are
    those in :data:`READ_ERRORS` (:func:`read_failure`: a one-line reason).
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # our own limit applies
        try:
            opened = Image.open(path)
        except Image.DecompressionBombError as error:  # Pillow's check on the header's size
            raise ImageTooLargeError(
                f"{error}; refused before decoding (Pillow's Image.MAX_IMAGE_PIXELS)"
            ) from None
        with opened as image:
            width, height = image.size
            if width < 1 or height < 1:
                raise ArgumentError(f"the image header declares an empty size {width}x{height}")
            if max_pixels is not None and width * height > max_pixels:
                raise ImageTooLargeError(
                    f"the image is {width}x{height} ({width * height:,} pixels), more than the "
                    f"limit of {max_pixels:,} pixels; refused before decoding (raise max_pixels, "
                    "or --max-pixels on the command line, to read it)"
                )
            image.load()
            return _pil_to_rgb(_upright(image))

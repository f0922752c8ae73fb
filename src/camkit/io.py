"""Image files in and out: safe decoding, conversion to RGB, atomic writes, a DataLoader dataset.

Reading (:func:`read_image`) gives every file the same shape: ``HxWx3`` uint8 RGB, upright
(EXIF orientation applied), first frame only, whatever the file holds (grayscale, palette,
RGBA/LA, 16-bit, CMYK JPEG). The image size is checked from the header *before* any pixel is
decoded, so a decompression bomb or a forged ``100000x100000`` header is refused without
allocating its pixels (:class:`ImageTooLargeError`).

Writing goes through :func:`write_atomic`: a hidden temporary file next to the target, renamed
over it, so readers (and a resumed run) never see a half-written file.

:class:`ImageFiles` decodes and preprocesses images inside ``torch.utils.data.DataLoader``
workers; :func:`collate` batches them and reports unreadable files instead of raising.
"""

from __future__ import annotations

import io
import json
import os
import uuid
import warnings
from pathlib import Path

import cv2
import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError

from camkit.errors import ArgumentError, CamkitError

__all__ = [
    "MAX_PIXELS",
    "READ_ERRORS",
    "ImageTooLargeError",
    "read_failure",
    "read_image",
    "save_jpeg",
    "save_json",
    "IMAGE_FORMATS",
    "save_image",
    "save_npy",
    "save_png",
    "save_webp",
    "thumbnail",
    "to_rgb_float",
    "to_rgb_uint8",
    "write_atomic",
]

MAX_PIXELS = 89_478_485
"""Default pixel limit of :func:`read_image` (Pillow's own warning threshold, about 89.5 MP: a
``9459x9459`` image, ~256 MB as RGB). Larger images are refused before decoding."""

_CHANNEL_COUNTS = (1, 3, 4)
FLOAT_TOLERANCE = 1e-3  # float images may stray this far outside [0, 1] (rounding) before clipping
_SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I")


# ----------------------------------------------------------------------------- conversion


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
        raise ArgumentError(
            f"expected an image as a PIL image, numpy array or torch tensor, got {describe(image)}"
        )
    array = as_numpy(image)
    if array.ndim == 2:
        array = array[:, :, None]
    elif array.ndim == 3:
        first_ok, last_ok = array.shape[0] in _CHANNEL_COUNTS, array.shape[2] in _CHANNEL_COUNTS
        if (channels_first and first_ok) or (not last_ok and first_ok):
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
    return array


def _rgb_channels(array: np.ndarray) -> np.ndarray:
    if array.shape[2] == 1:
        return np.repeat(array, 3, axis=2)
    return array[:, :, :3]


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


def _integer_as_uint8(array: np.ndarray) -> np.ndarray:
    if array.dtype == np.uint16:
        return np.round(array / 257.0).astype(np.uint8)
    low, high = int(array.min()), int(array.max())
    if low < 0 or high > 255:
        raise ArgumentError(
            f"expected integer image values in 0..255 (or uint16), got {array.dtype} values in "
            f"[{low}, {high}]"
        )
    return array.astype(np.uint8)


def to_rgb_uint8(image: object) -> np.ndarray:
    """Any supported image -> ``HxWx3`` uint8 RGB (a new array).

    Images may be PIL images, numpy arrays (``HxW``, ``HxWx1``, ``HxWx3``, ``HxWx4``) or torch
    tensors (``HxW``, ``CxHxW`` with C in 1/3/4, or ``1xCxHxW``). Numpy arrays are read
    channels-last and tensors channels-first, unless only the other reading has 1, 3 or 4
    channels. Gray is repeated to RGB and an alpha channel is dropped (not composited).
    uint8 is kept as is, bool maps to 0/255, float in [0, 1] is scaled by 255 and rounded, uint16 is
    divided by 257 and rounded; other integer types must already lie in 0..255.
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
    raise ArgumentError(f"expected a uint8, integer, bool or float image, got {describe(image)}")


def to_rgb_float(image: object) -> np.ndarray:
    """Any supported image -> ``HxWx3`` float32 RGB in [0, 1] (float input keeps its precision)."""
    array = _rgb_channels(_image_hwc(image))
    if np.issubdtype(array.dtype, np.floating):
        return _check_unit_range(array).copy()
    return to_rgb_uint8(array).astype(np.float32) / 255.0


def thumbnail(image: object, max_side: int = 256) -> np.ndarray:
    """An image shrunk so its longer side is at most ``max_side`` -> ``hxwx3`` uint8 RGB.

    Area interpolation (``cv2.INTER_AREA``, no aliasing), in two steps for speed: first by the
    largest whole factor ``k`` that keeps the image at least the final size (each output pixel
    the mean of a ``k x k`` block; the last ``< k`` rows/columns are dropped), then to the
    final size. An image already small enough is
    returned unchanged (as uint8 RGB). The aspect ratio is kept; each side is at least 1.
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


# ----------------------------------------------------------------------------- reading


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


def _check_size(image: Image.Image, max_pixels: int | None) -> None:
    width, height = image.size
    if width < 1 or height < 1:
        raise ArgumentError(f"the image header declares an empty size {width}x{height}")
    if max_pixels is not None and width * height > max_pixels:
        raise ImageTooLargeError(
            f"the image is {width}x{height} ({width * height:,} pixels), more than the limit of "
            f"{max_pixels:,} pixels; refused before decoding (raise max_pixels to read it)"
        )


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
    # L, LA, 1, P, PA, RGBA, RGBX, CMYK, YCbCr...: Pillow's conversion; alpha is dropped as in
    # torchvision's ImageFolder loader, so the model sees what it was trained on
    return np.asarray(image.convert("RGB")).copy()


def read_image(path: str | os.PathLike[str], *, max_pixels: int | None = MAX_PIXELS) -> np.ndarray:
    """An image file -> ``HxWx3`` uint8 RGB, upright (EXIF orientation applied), first frame.

    * gray, palette and 1-bit images are expanded to RGB; RGBA/LA/PA drop their alpha channel
      (not composited, as torchvision's loader does);
    * 16-bit gray (``I;16`` PNG/TIFF) is divided by 257 and rounded; 16-bit RGB(A) PNG is
      reduced to 8 bits by Pillow, which keeps the high byte (``v >> 8``, at most one level
      below ``round(v / 257)``);
    * CMYK JPEG (Adobe, inverted or not) is converted by Pillow's CMYK -> RGB formula (embedded
      ICC profiles are not applied);
    * EXIF orientations 2-8 are undone, so the array is as the photo is meant to be seen.

    The size is checked from the header before decoding: more than ``max_pixels`` pixels
    (``None``: no limit of camkit's own) raises :class:`ImageTooLargeError`; Pillow's
    ``Image.MAX_IMAGE_PIXELS`` bomb check also applies. Errors are those in :data:`READ_ERRORS`;
    :func:`read_failure` makes a one-line reason of them.
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
            _check_size(image, max_pixels)
            image.load()
            return _pil_to_rgb(_upright(image))


# ----------------------------------------------------------------------------- writing


def write_atomic(path: str | os.PathLike[str], data: bytes, *, durable: bool = True) -> Path:
    """Write ``data`` to a hidden temporary file next to ``path``, then rename it over ``path``.

    Readers never see a half-written file, and a killed writer leaves none behind.
    ``durable``: ``fsync`` before the rename, so the file survives a power cut too (leave it
    off for files that are cheap to remake, such as thumbnails: an fsync costs milliseconds).
    """
    target = Path(path)
    temporary = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    descriptor = os.open(temporary, flags, 0o666)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(temporary, target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return target


def _encode(suffixes: tuple[str, ...], path: Path, image: object, params: list[int]) -> bytes:
    if path.suffix.lower() not in suffixes:
        raise ArgumentError(f"expected a path ending in {' or '.join(suffixes)}, got {str(path)!r}")
    rgb = to_rgb_uint8(image)
    ok, encoded = cv2.imencode(suffixes[0], np.ascontiguousarray(rgb[:, :, ::-1]), params)
    if not ok:
        raise OSError(f"OpenCV could not encode a {suffixes[0]} image of shape {rgb.shape}")
    return encoded.tobytes()


def save_png(path: str | os.PathLike[str], rgb_uint8: object, *, durable: bool = True) -> Path:
    """Write an image (anything :func:`to_rgb_uint8` takes) to a ``.png`` file atomically
    (``durable``: see :func:`write_atomic`)."""
    target = Path(path)
    return write_atomic(target, _encode((".png",), target, rgb_uint8, []), durable=durable)


def save_jpeg(
    path: str | os.PathLike[str], image: object, quality: int = 85, *, durable: bool = True
) -> Path:
    """Write an image (anything :func:`to_rgb_uint8` takes) to a ``.jpg`` file atomically
    (``durable``: see :func:`write_atomic`)."""
    if not 1 <= quality <= 100:
        raise ArgumentError(f"expected a JPEG quality in 1..100, got {quality}")
    target = Path(path)
    params = [cv2.IMWRITE_JPEG_QUALITY, int(quality)]
    data = _encode((".jpg", ".jpeg"), target, image, params)
    return write_atomic(target, data, durable=durable)


def save_webp(
    path: str | os.PathLike[str], image: object, quality: int = 90, *, durable: bool = True
) -> Path:
    """Write an image (anything :func:`to_rgb_uint8` takes) to a ``.webp`` file atomically
    (``durable``: see :func:`write_atomic`); ``quality`` 1..100 (lossy WebP)."""
    if not 1 <= quality <= 100:
        raise ArgumentError(f"expected a WebP quality in 1..100, got {quality}")
    target = Path(path)
    params = [cv2.IMWRITE_WEBP_QUALITY, int(quality)]
    return write_atomic(target, _encode((".webp",), target, image, params), durable=durable)


# the formats :func:`save_image` writes: file suffix -> writer
IMAGE_FORMATS = {"png": save_png, "jpg": save_jpeg, "webp": save_webp}


def save_image(
    path: str | os.PathLike[str], image: object, quality: int = 90, *, durable: bool = True
) -> Path:
    """Write an image atomically in the format its suffix names: ``.png`` (lossless),
    ``.jpg``/``.jpeg`` or ``.webp`` (lossy, ``quality`` 1..100)."""
    suffix = Path(path).suffix.lower().lstrip(".")
    suffix = "jpg" if suffix == "jpeg" else suffix
    if suffix not in IMAGE_FORMATS:
        raise ArgumentError(
            f"expected a path ending in .{', .'.join(IMAGE_FORMATS)} or .jpeg, got {str(path)!r}"
        )
    if suffix == "png":
        return save_png(path, image, durable=durable)
    return IMAGE_FORMATS[suffix](path, image, quality, durable=durable)


def save_npy(path: str | os.PathLike[str], array: np.ndarray) -> Path:
    """``np.save`` written atomically."""
    buffer = io.BytesIO()
    np.save(buffer, array)
    return write_atomic(path, buffer.getvalue())


def save_json(path: str | os.PathLike[str], value: object) -> Path:
    """Indented JSON written atomically."""
    return write_atomic(path, (json.dumps(value, indent=2) + "\n").encode("utf-8"))


# ----------------------------------------------------------------------------- DataLoader

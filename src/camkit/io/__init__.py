"""Image files in and out: safe decoding, conversion to RGB, atomic writes.

Reading (:func:`read_image`) gives every file the same shape: ``HxWx3`` uint8 RGB, upright
(EXIF orientation applied), first frame only, whatever the file holds (grayscale, palette,
RGBA/LA, 16-bit, CMYK JPEG). The image size is checked from the header *before* any pixel is
decoded, so a decompression bomb or a forged ``100000x100000`` header is refused without
allocating its pixels (:class:`ImageTooLargeError`).

Writing goes through :func:`write_atomic`: a hidden temporary file next to the target, renamed
over it, so readers (and a resumed run) never see a half-written file.

The modules: :mod:`camkit.io.convert` (any image -> RGB, thumbnails), :mod:`camkit.io.read`
(files -> RGB, limits before decoding), :mod:`camkit.io.write` (atomic writes, encoders); every
name is imported from ``camkit.io`` as before.
"""

from __future__ import annotations

from camkit.io.convert import (
    FLOAT_TOLERANCE,  # noqa: F401 -- for camkit's own modules (viz), as before the split
    as_numpy,  # noqa: F401
    describe,  # noqa: F401
    rgb_pixels,
    thumbnail,
    to_rgb_float,
    to_rgb_uint8,
)
from camkit.io.read import (
    IMAGE_SUFFIXES,
    MAX_PIXELS,
    READ_ERRORS,
    ImageTooLargeError,
    read_failure,
    read_image,
)
from camkit.io.write import (
    IMAGE_FORMATS,
    encode_image,
    leftover_temporaries,
    save_image,
    save_jpeg,
    save_json,
    save_npy,
    save_png,
    save_webp,
    write_atomic,
)

__all__ = [
    "IMAGE_SUFFIXES",
    "MAX_PIXELS",
    "READ_ERRORS",
    "ImageTooLargeError",
    "encode_image",
    "leftover_temporaries",
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
    "rgb_pixels",
    "to_rgb_float",
    "to_rgb_uint8",
    "write_atomic",
]

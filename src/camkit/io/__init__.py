"""Image files in and out: safe decoding (:mod:`~camkit.io.read`: ``HxWx3`` uint8 RGB, upright,
the size checked from the header before decoding), conversion to RGB and thumbnails
(:mod:`~camkit.io.convert`), atomic writes (:mod:`~camkit.io.write`: readers never see a
half-written file); videos: :mod:`camkit.io.video`."""

from __future__ import annotations

from camkit.io import video  # noqa: F401 -- camkit.io.video: video files in and out
from camkit.io.convert import (
    FLOAT_TOLERANCE,  # noqa: F401 -- for camkit's own modules (viz)
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

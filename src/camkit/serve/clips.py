"""The explorer's videos, for a video model (one whose ``clip_length`` is set): the gallery lists
video files, each explained on its first clip (the model's clip length from the first frame; a
shorter video repeats its last frame, as ``camkit explain``'s clips do); its map is
``(T, H, W)``, one per frame, shown one frame at a time with one colour scale for the whole clip
(:func:`camkit.viz.video.overlay_frames`), and its per-frame importance is
:func:`camkit.metrics.frame_importance`. Decoding is :mod:`camkit.io.video`'s."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from camkit import io, metrics, models
from camkit.errors import ArgumentError
from camkit.io import video
from camkit.viz.video import overlay_frames

READ_ERRORS = (*io.READ_ERRORS, video.VideoReadError)
"""What reading a gallery entry may raise: an image's errors and a video's."""


def suffixes(clip_length: int | None) -> frozenset[str]:
    """The file endings the gallery lists: images for an image model, videos (and GIFs) for a
    video model."""
    return io.IMAGE_SUFFIXES if clip_length is None else video.VIDEO_SUFFIXES | {".gif"}


def read(path: Path, clip_length: int | None, max_pixels: int | None) -> np.ndarray:
    """An image ``(H, W, 3)`` for an image model, the first clip ``(T, H, W, 3)`` of a video
    for a video model (``clip_length`` frames), both uint8 RGB."""
    if clip_length is None:
        return io.read_image(path, max_pixels=max_pixels)
    if not video.is_video(path):
        raise video.VideoReadError(f"not a video: this model takes clips of {clip_length} frames")
    _, frames = next(video.stream_clips(video.iter_frames(path), [(0, clip_length)]))
    if max_pixels is not None and frames.shape[1] * frames.shape[2] > max_pixels:
        raise video.VideoReadError(
            f"frames of {frames.shape[2]}x{frames.shape[1]} pixels, over the limit of {max_pixels}"
        )
    return frames


def shown_frame(photo: np.ndarray) -> np.ndarray:
    """The picture that stands for an entry (thumbnail, the model's view): an image, or a
    clip's first frame."""
    return photo[0] if photo.ndim == 4 else photo


def model_input(preprocess: models.Preprocess, photo: np.ndarray) -> Tensor:
    """An image's input ``(3, H, W)`` or a clip's ``(3, T, H, W)``."""
    return preprocess.clip(photo) if photo.ndim == 4 else preprocess(photo)


def frame_overlay(
    preprocess: models.Preprocess,
    clip: np.ndarray,
    heat: np.ndarray,
    frame: int,
    alpha: float,
    colormap: str,
) -> bytes:
    """Frame ``frame`` of a clip's map ``(T, H, W)`` over the model's view of that frame, as
    PNG: :func:`~camkit.viz.video.overlay_frames` of the whole clip (one colour scale; a
    signed map on its absolute values, as single images are shown), then that frame."""
    if not 0 <= frame < len(heat):
        raise ArgumentError(
            f"frame {frame} is out of range: the clip has frames 0..{len(heat) - 1}"
        )
    views = np.stack([preprocess.resize_crop(picture) for picture in clip])
    return io.encode_image(overlay_frames(views, np.abs(heat), alpha, colormap)[frame])


def frame_importance(heat: np.ndarray) -> list[float]:
    """Each frame's share of a clip's map ``(T, H, W)`` (absolute values)."""
    maps = torch.from_numpy(np.abs(heat).astype(np.float32))[None]
    return metrics.frame_importance(maps)[0].tolist()


__all__ = [
    "READ_ERRORS",
    "frame_importance",
    "frame_overlay",
    "model_input",
    "read",
    "shown_frame",
    "suffixes",
]

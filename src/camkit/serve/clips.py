"""The explorer's videos, for a video model (one whose ``clip_length`` is set): the gallery lists
video files, each explained over its whole length, window by window as ``camkit explain`` does
(:func:`camkit.io.video.clip_windows`: clips of the model's length side by side, the last one
ending on the last frame; a video shorter than a clip repeats its last frame). Its prediction
is the mean of its windows' softmax; its map is ``(N, H, W)``, one per frame of the video, each
frame's the mean of the windows that hold it, shown one frame at a time with one colour scale
for the whole video (:func:`camkit.viz.video.clip_scale`); its per-frame importance is
:func:`camkit.metrics.frame_importance`. The explorer holds a video in memory: up to
:data:`MAX_FRAMES` frames (``camkit explain`` streams any length). Decoding is
:mod:`camkit.io.video`'s."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from camkit import io, metrics, models
from camkit.errors import ArgumentError
from camkit.io import video
from camkit.viz.video import clip_scale, frame_heat, overlay_frames

READ_ERRORS = (*io.READ_ERRORS, video.VideoReadError)
"""What reading a gallery entry may raise: an image's errors and a video's."""

MAX_FRAMES = 600  # camkit explain's longest video with a GIF: what one page holds in memory
VIDEOS_HELD = 8  # videos (frames and model inputs) the explorer keeps decoded


def suffixes(clip_length: int | None) -> frozenset[str]:
    """The file endings the gallery lists: images for an image model, videos (and GIFs) for a
    video model."""
    return io.IMAGE_SUFFIXES if clip_length is None else video.VIDEO_SUFFIXES | {".gif"}


def read(path: Path, clip_length: int | None, max_pixels: int | None) -> np.ndarray:
    """An image ``(H, W, 3)`` for an image model, every frame ``(N, H, W, 3)`` of a video for a
    video model (at most :data:`MAX_FRAMES`), both uint8 RGB."""
    if clip_length is None:
        return io.read_image(path, max_pixels=max_pixels)
    if not video.is_video(path):
        raise video.VideoReadError(f"not a video: this model takes clips of {clip_length} frames")
    decoded = video.iter_frames(path, max_frames=None)
    first = next(decoded)
    if max_pixels is not None and first.shape[0] * first.shape[1] > max_pixels:
        raise video.VideoReadError(
            f"frames of {first.shape[1]}x{first.shape[0]} pixels, over the limit of {max_pixels}"
        )
    frames = [first, *itertools.islice(decoded, MAX_FRAMES)]
    decoded.close()  # the decoder released now, not when collected
    if len(frames) > MAX_FRAMES:
        raise video.VideoReadError(
            f"more than {MAX_FRAMES} frames: the explorer holds a video in memory; explain it "
            "with camkit explain, which streams videos of any length"
        )
    return np.stack(frames)


def windows(photo: np.ndarray, clip_length: int) -> list[tuple[int, int]]:
    """The ``[start, stop)`` clips a video's frames ``(N, H, W, 3)`` are explained in."""
    return video.clip_windows(len(photo), clip_length)


def shown_frame(photo: np.ndarray) -> np.ndarray:
    """The picture that stands for an entry (thumbnail, the model's view): an image, or a
    video's first frame."""
    return photo[0] if photo.ndim == 4 else photo


def model_input(
    preprocess: models.Preprocess, photo: np.ndarray, clip_length: int | None
) -> Tensor:
    """An image's input ``(3, H, W)``, or a video's windows ``(n, 3, L, H, W)``."""
    if photo.ndim != 4 or clip_length is None:
        return preprocess(photo)
    clips = [video.clip_frames(photo, window) for window in windows(photo, clip_length)]
    return torch.stack([preprocess.clip(clip) for clip in clips])


def rows(x: Tensor) -> Tensor:
    """An entry's model input as rows of a batch: an image's one, a video's windows."""
    return x if x.ndim == 5 else x[None]


def per_entry(values: Tensor, counts: Sequence[int]) -> Tensor:
    """``(rows, ...) -> (entries, ...)``: the mean of each entry's ``counts`` rows (a video's
    prediction: the mean of its windows' softmax, as ``camkit explain``'s)."""
    return torch.stack([part.mean(dim=0) for part in values.split(list(counts))])


def video_heat(heat: Tensor, spans: Sequence[tuple[int, int]], count: int) -> Tensor:
    """``(n, K, L, H, W)`` maps of a video's ``n`` windows ``spans`` -> ``(K, count, H, W)``:
    each frame's map the mean of the windows that hold it (:func:`~camkit.viz.video.frame_heat`,
    as ``camkit explain``'s; frames past the video, repeated to fill a window, dropped)."""
    held = [(start, stop, heat[row].float()) for row, (start, stop) in enumerate(spans)]
    frames = [
        frame_heat([(start, part) for start, stop, part in held if start <= t < stop], t)
        for t in range(count)
    ]
    return torch.stack(frames, dim=1)


def entry_maps(
    heat: Tensor, counts: Sequence[int], photos: Sequence[np.ndarray], clip_length: int | None
) -> list[np.ndarray]:
    """A batch's maps ``(rows, K, [L,] H, W)`` -> one ``(K, [N,] H, W)`` per entry: an image's
    row, a video's windows laid out over its frames (:func:`video_heat`)."""
    if clip_length is None:
        return list(heat.cpu().numpy())
    parts = heat.split(list(counts))
    return [
        video_heat(part, windows(photo, clip_length), len(photo)).cpu().numpy()
        for part, photo in zip(parts, photos, strict=True)
    ]


def frame_overlay(
    preprocess: models.Preprocess,
    frames: np.ndarray,
    heat: np.ndarray,
    frame: int,
    alpha: float,
    colormap: str,
) -> bytes:
    """Frame ``frame`` of a video's map ``(N, H, W)`` over the model's view of that frame, as
    PNG, on the video's one colour scale (:func:`~camkit.viz.video.clip_scale`; a signed map
    on its absolute values, as single images are shown): what
    :func:`~camkit.viz.video.overlay_frames` of the whole video draws there."""
    if not 0 <= frame < len(heat):
        raise ArgumentError(
            f"frame {frame} is out of range: the video has frames 0..{len(heat) - 1}"
        )
    view = preprocess.resize_crop(frames[frame])[None]
    scaled = clip_scale(np.abs(heat).astype(np.float32))
    return io.encode_image(overlay_frames(view, scaled[frame : frame + 1], alpha, colormap)[0])


def frame_importance(heat: np.ndarray) -> list[float]:
    """Each frame's share of a video's map ``(N, H, W)`` (absolute values)."""
    maps = torch.from_numpy(np.abs(heat).astype(np.float32))[None]
    return metrics.frame_importance(maps)[0].tolist()


__all__ = [
    "MAX_FRAMES",
    "READ_ERRORS",
    "VIDEOS_HELD",
    "entry_maps",
    "frame_importance",
    "frame_overlay",
    "model_input",
    "per_entry",
    "read",
    "rows",
    "shown_frame",
    "suffixes",
    "video_heat",
    "windows",
]

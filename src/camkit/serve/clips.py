"""The explorer's videos, for a video model (one with a ``clip_length``): each video explained
over its whole length, window by window as ``camkit explain`` does
(:func:`camkit.io.video.clip_windows`); its prediction the mean of its windows' softmax, its map
``(N, H, W)`` one per frame (the mean of the windows that hold it), shown a frame at a time on
one colour scale for the video. The explorer holds a video in memory: up to :data:`MAX_FRAMES`.
"""

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

READ_ERRORS = (*io.READ_ERRORS, video.VideoReadError)  # what reading an entry may raise

MAX_FRAMES = 600  # camkit explain's longest video with a GIF: what one page holds in memory
VIDEOS_HELD = 8  # videos (frames and model inputs) the explorer keeps decoded


def suffixes(clip_length: int | None) -> frozenset[str]:
    """The file endings the gallery lists: images, or a video model's videos (and GIFs)."""
    return io.IMAGE_SUFFIXES if clip_length is None else video.VIDEO_SUFFIXES | {".gif"}


def read(path: Path, clip_length: int | None, max_pixels: int | None) -> np.ndarray:
    """An image ``(H, W, 3)``, or a video model's every frame ``(N, H, W, 3)``, uint8 RGB."""
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
    """The picture that stands for an entry: an image, or a video's first frame."""
    return photo[0] if photo.ndim == 4 else photo


def model_input(
    preprocess: models.Preprocess, photo: np.ndarray, clip_length: int | None
) -> Tensor:
    """An image's input ``(3, H, W)``, or a video's windows ``(n, 3, L, H, W)``."""
    if photo.ndim != 4 or clip_length is None:
        return preprocess(photo)
    spans = windows(photo, clip_length)
    return torch.stack([preprocess.clip(video.clip_frames(photo, span)) for span in spans])


def rows(x: Tensor) -> Tensor:
    """An entry's model input as rows of a batch: an image's one, a video's windows."""
    return x if x.ndim == 5 else x[None]


def per_entry(values: Tensor, counts: Sequence[int]) -> Tensor:
    """``(rows, ...) -> (entries, ...)``: the mean of each entry's ``counts`` rows."""
    return torch.stack([part.mean(dim=0) for part in values.split(list(counts))])


def entry_maps(
    heat: Tensor, counts: Sequence[int], photos: Sequence[np.ndarray], clip_length: int | None
) -> list[np.ndarray]:
    """A batch's maps ``(rows, K, [L,] H, W)`` -> one ``(K, [N,] H, W)`` per entry: an image's
    row; a video's windows laid out over its frames, each frame's map the mean of the windows
    that hold it (:func:`~camkit.viz.video.frame_heat`; frames repeated past the end dropped)."""
    if clip_length is None:
        return list(heat.cpu().numpy())
    maps = []
    for part, photo in zip(heat.split(list(counts)), photos, strict=True):
        held = list(zip(windows(photo, clip_length), part.float(), strict=True))
        frames = [
            frame_heat([(start, row) for (start, stop), row in held if start <= t < stop], t)
            for t in range(len(photo))
        ]
        maps.append(torch.stack(frames, dim=1).cpu().numpy())
    return maps


def frame_overlay(
    preprocess: models.Preprocess,
    frames: np.ndarray,
    heat: np.ndarray,
    frame: int,
    alpha: float,
    colormap: str,
) -> bytes:
    """Frame ``frame`` of a video's map ``(N, H, W)`` over the model's view of it, PNG, on the
    video's one colour scale (a signed map on its absolute values): what
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

"""Pictures of a clip's explanation: the animated overlay (one frame per input frame) and the
per-frame importance curve."""

from __future__ import annotations

import base64
import os
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
from matplotlib.figure import Figure

from camkit.errors import ArgumentError, InputError
from camkit.io import as_numpy, video
from camkit.viz import overlay_on_photo

Heat = TypeVar("Heat", np.ndarray, torch.Tensor)


def clip_scale(heat: np.ndarray) -> np.ndarray:
    """A clip's heat ``(T, h, w)`` on one scale in [0, 1]: as it is when in [0, 1], else min-max
    rescaled over the whole clip (zeros when flat), so a frame alone looks as among the others."""
    low, high = float(heat.min()), float(heat.max())
    if low < 0 or high > 1:
        return (heat - low) / (high - low) if high > low else np.zeros_like(heat)
    return heat


def frame_heat(covering: list[tuple[int, Heat]], t: int) -> Heat:
    """Frame ``t``'s heat ``(..., H, W)`` in a video explained window by window: the mean of
    the windows that hold it, ``covering`` their ``(start, heat (..., L, H, W))``; the one rule
    of ``camkit explain``'s animations and the explorer's."""
    parts = [heat[..., t - start, :, :] for start, heat in covering]
    if not parts:
        raise InputError(f"no window holds frame {t}")
    return sum(parts[1:], parts[0]) / len(parts)


def overlay_frames(
    frames: np.ndarray,
    heat: np.ndarray | torch.Tensor,
    alpha: float = 0.5,
    colormap: str = "jet",
    region: tuple[float, float, float, float] | None = None,
) -> np.ndarray:
    """Frames ``(T, H, W, 3)`` uint8 and their heat ``(T, h, w)`` -> ``(T, H, W, 3)`` uint8:
    :func:`camkit.viz.overlay_on_photo` frame by frame (``region``: where the model's input
    lies on a frame; None: all of it), on one scale for the clip (:func:`clip_scale`; never
    frame by frame, which would make a quiet frame look hot)."""
    heat = np.asarray(as_numpy(heat), dtype=np.float32)
    if heat.ndim != 3 or len(heat) != len(frames):
        raise InputError(
            f"expected one heat map per frame, (T, h, w) with T = {len(frames)}, got {heat.shape}"
        )
    heat = clip_scale(heat)
    if region is None:
        region = (0.0, 0.0, float(frames.shape[1]), float(frames.shape[2]))
    drawn = [
        overlay_on_photo(frame, h, region, alpha, colormap)
        for frame, h in zip(frames, heat, strict=True)
    ]
    return np.stack(drawn)


@dataclass(frozen=True)
class Animation:
    """A clip's overlay (``frames (T, H, W, 3)`` uint8 RGB at ``fps``) that a notebook plays
    as an inline looping GIF and :meth:`save` writes as MP4 or GIF."""

    frames: np.ndarray
    fps: float

    def _repr_html_(self) -> str:
        data = base64.b64encode(video.gif_bytes(self.frames, self.fps)).decode("ascii")
        return f'<img src="data:image/gif;base64,{data}" alt="animated overlay"/>'

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the animation: an MP4 for ``.mp4``, a GIF for ``.gif``."""
        suffix = Path(path).suffix.lower()
        if suffix not in (".mp4", ".gif"):
            raise ArgumentError(f"an animation is saved as .mp4 or .gif, got {str(path)!r}")
        save = video.save_mp4 if suffix == ".mp4" else video.save_gif
        return save(path, self.frames, self.fps)


def animate(
    frames: np.ndarray,
    heat: np.ndarray | torch.Tensor,
    fps: float = video.DEFAULT_FPS,
    **overlay: Any,
) -> Animation:
    """Frames ``(T, H, W, 3)`` uint8 and their heat ``(T, h, w)`` -> the :class:`Animation` of
    their overlay (:func:`overlay_frames`, which takes ``overlay``'s ``alpha``, ``colormap``
    and ``region``)."""
    return Animation(overlay_frames(frames, heat, **overlay), float(fps))


def importance_plot(
    importance: np.ndarray | torch.Tensor,
    fps: float,
    *,
    drop: np.ndarray | torch.Tensor | None = None,
    title: str | None = None,
) -> bytes:
    """The per-frame importance (:func:`camkit.metrics.frame_importance`) as a PNG: a step per
    frame, seconds on a second axis; ``drop`` (:func:`camkit.metrics.frame_drop`) as a line."""
    values = np.asarray(torch.as_tensor(importance).float().cpu())
    figure = Figure(figsize=(6.4, 2.8), layout="constrained")
    axes = figure.subplots()
    frames = np.arange(len(values))
    edges = np.arange(len(values) + 1) - 0.5  # one filled step per frame: one artist, any length
    axes.stairs(values, edges, fill=True, color="#d95f02", label="map mass per frame")
    axes.set_xlabel("frame")
    axes.set_ylabel("share of the map")
    axes.set_xlim(-0.5, len(values) - 0.5)
    seconds = axes.secondary_xaxis("top", functions=(lambda f: f / fps, lambda s: s * fps))
    seconds.set_xlabel("seconds")
    if drop is not None:
        other = axes.twinx()
        other.plot(frames, np.asarray(torch.as_tensor(drop).float().cpu()), "k.-")
        other.set_ylabel("score drop without the frame")
    if title:
        axes.set_title(title, fontsize=9)
    buffer = BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()


__all__ = [
    "Animation",
    "animate",
    "clip_scale",
    "frame_heat",
    "importance_plot",
    "overlay_frames",
]

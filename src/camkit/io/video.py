"""Video files in and out: decoding frames, choosing clips, writing animations.

* :func:`read_video` -- a video file (MP4, AVI, WebM, MKV, MOV: OpenCV's FFmpeg; animated GIF:
  Pillow) -> ``(T, H, W, 3)`` uint8 RGB frames and the frame rate, with a frame limit checked
  while decoding;
* :func:`clip_windows` -- the clips a model of clip length ``length`` sees in ``count`` frames:
  one clip every ``stride`` frames (sliding windows), the last one ending on the last frame,
  and a video shorter than a clip padded by repeating its last frame;
* :func:`save_mp4` / :func:`save_gif` -- frames -> an animation (``cv2.VideoWriter`` with the
  ``mp4v`` codec; Pillow's GIF writer), written atomically as every camkit file.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path

import cv2
import numpy as np
from PIL import Image, ImageSequence

from camkit.errors import ArgumentError, CamkitError
from camkit.io.write import write_atomic

VIDEO_SUFFIXES = frozenset({".mp4", ".m4v", ".avi", ".webm", ".mkv", ".mov"})
"""File name endings read as videos by OpenCV (plus animated ``.gif``, read by Pillow)."""

MAX_FRAMES = 100_000
"""Default frame limit of :func:`read_video` (about 55 minutes at 30 frames/s)."""

DEFAULT_FPS = 25.0
"""The frame rate of a file that does not declare one (and of a GIF without durations)."""


class VideoReadError(CamkitError):
    """A video file that cannot be decoded (missing, not a video, no codec, no frames)."""


@dataclass(frozen=True)
class Video:
    """Decoded frames ``(T, H, W, 3)`` uint8 RGB and the frame rate (frames per second)."""

    frames: np.ndarray
    fps: float

    def __len__(self) -> int:
        return len(self.frames)


def is_video(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is read as a video: a :data:`VIDEO_SUFFIXES` ending, or a GIF with
    more than one frame."""
    suffix = Path(path).suffix.lower()
    if suffix in VIDEO_SUFFIXES:
        return True
    if suffix != ".gif":
        return False
    try:
        with Image.open(path) as image:
            return getattr(image, "n_frames", 1) > 1
    except (OSError, ValueError):
        return False


def read_video(path: str | os.PathLike[str], *, max_frames: int | None = MAX_FRAMES) -> Video:
    """A video file -> :class:`Video` (every frame, RGB). Raises :class:`VideoReadError` for a
    file that cannot be decoded or holds no frame, and for more than ``max_frames`` frames
    (``None``: no limit), checked while decoding."""
    path = Path(path)
    if not path.is_file():
        raise VideoReadError(f"{path}: no such file")
    frames = _gif_frames(path) if path.suffix.lower() == ".gif" else None
    fps = frames[1] if frames else None
    frames = frames[0] if frames else _cv2_frames(path, max_frames)
    if max_frames is not None and len(frames) > max_frames:
        raise VideoReadError(f"{path}: more than {max_frames} frames (raise max_frames)")
    if not frames:
        raise VideoReadError(f"{path}: no frame could be decoded (not a video, or no codec)")
    if fps is None:
        capture = cv2.VideoCapture(str(path))
        fps = capture.get(cv2.CAP_PROP_FPS)
        capture.release()
    fps = float(fps) if fps and np.isfinite(fps) and fps > 0 else DEFAULT_FPS
    return Video(np.stack(frames), fps)


def _cv2_frames(path: Path, max_frames: int | None) -> list[np.ndarray]:
    capture = cv2.VideoCapture(str(path))
    frames: list[np.ndarray] = []
    try:
        while capture.isOpened():
            ok, frame = capture.read()
            if not ok:
                break
            frames.append(cv2.cvtColor(frame, cv2.COLOR_BGR2RGB))
            if max_frames is not None and len(frames) > max_frames:
                break
    finally:
        capture.release()
    return frames


def _gif_frames(path: Path) -> tuple[list[np.ndarray], float | None]:
    try:
        with Image.open(path) as image:
            frames = [np.asarray(f.convert("RGB")).copy() for f in ImageSequence.Iterator(image)]
            duration = image.info.get("duration")
    except (OSError, ValueError, SyntaxError, EOFError) as error:
        raise VideoReadError(f"{path}: not a readable GIF ({error})") from None
    return frames, (1000.0 / duration if duration else None)


def clip_windows(count: int, length: int, stride: int | None = None) -> list[tuple[int, int]]:
    """``(start, stop)`` frame ranges of the clips of ``length`` frames over ``count`` frames:
    starts ``0, stride, 2 * stride...`` (``stride`` None: ``length``, clips side by side), the
    last clip ending on the last frame so every frame is seen; one clip ``(0, length)`` when the
    video is shorter (:func:`clip_frames` repeats its last frame)."""
    stride = length if stride is None else stride
    for name, value in (("count", count), ("length", length), ("stride", stride)):
        if not isinstance(value, int) or value < 1:
            raise ArgumentError(f"{name} must be a positive int, got {value!r}")
    if count <= length:
        return [(0, length)]
    starts = list(range(0, count - length + 1, stride))
    if starts[-1] + length < count:
        starts.append(count - length)
    return [(start, start + length) for start in starts]


def clip_frames(frames: np.ndarray, window: tuple[int, int]) -> np.ndarray:
    """The frames ``window`` of ``frames``, the last frame repeated past the end."""
    start, stop = window
    indices = np.minimum(np.arange(start, stop), len(frames) - 1)
    return frames[indices]


def _checked(frames: object) -> np.ndarray:
    array = np.asarray(frames)
    if array.ndim != 4 or array.shape[-1] != 3 or array.dtype != np.uint8 or not len(array):
        raise ArgumentError(f"expected frames (T, H, W, 3) uint8 RGB, got {array.shape}")
    return array


def save_mp4(path: str | os.PathLike[str], frames: object, fps: float) -> Path:
    """Frames ``(T, H, W, 3)`` uint8 RGB -> an MP4 file (``mp4v``), written atomically."""
    array = _checked(frames)
    target = Path(path)
    with tempfile.TemporaryDirectory(dir=target.parent) as folder:
        scratch = os.path.join(folder, "video.mp4")
        height, width = array.shape[1:3]
        writer = cv2.VideoWriter(scratch, cv2.VideoWriter_fourcc(*"mp4v"), fps, (width, height))
        if not writer.isOpened():
            raise VideoReadError("OpenCV cannot write MP4 here (no mp4v encoder)")
        try:
            for frame in array:
                writer.write(cv2.cvtColor(frame, cv2.COLOR_RGB2BGR))
        finally:
            writer.release()
        return write_atomic(target, Path(scratch).read_bytes())


def save_gif(path: str | os.PathLike[str], frames: object, fps: float) -> Path:
    """Frames ``(T, H, W, 3)`` uint8 RGB -> an animated GIF looping forever, written
    atomically (Pillow; each frame quantised to its own 256 colours)."""
    images = [Image.fromarray(frame) for frame in _checked(frames)]
    buffer = BytesIO()
    duration = max(20, round(1000 / fps))  # browsers show < 20 ms frames at 100 ms
    images[0].save(
        buffer, "GIF", save_all=True, append_images=images[1:], duration=duration, loop=0
    )
    return write_atomic(Path(path), buffer.getvalue())


__all__ = [
    "DEFAULT_FPS",
    "MAX_FRAMES",
    "VIDEO_SUFFIXES",
    "Video",
    "VideoReadError",
    "clip_frames",
    "clip_windows",
    "is_video",
    "read_video",
    "save_gif",
    "save_mp4",
]

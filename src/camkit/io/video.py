"""Video files in and out: decoding frames (MP4, AVI, WebM, MKV, MOV through OpenCV's FFmpeg;
animated GIF through Pillow) one at a time with a frame limit, choosing the clips a model of a
given clip length sees (:func:`clip_windows`), cutting them from frames read once
(:func:`stream_clips`), and writing animations (MP4 ``mp4v``, GIF) atomically.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Iterator, Sequence
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
    """Whether ``path`` is a video: a :data:`VIDEO_SUFFIXES` ending, or a GIF of several frames."""
    suffix = Path(path).suffix.lower()
    if suffix != ".gif":
        return suffix in VIDEO_SUFFIXES
    try:
        with Image.open(path) as image:
            return getattr(image, "n_frames", 1) > 1
    except (OSError, ValueError):
        return False


def frame_rate(path: str | os.PathLike[str]) -> float:
    """The frame rate a video file declares (a GIF: its first frame's), else :data:`DEFAULT_FPS`."""
    path = Path(path)
    if path.suffix.lower() == ".gif":
        try:
            with Image.open(path) as image:
                duration = image.info.get("duration")
            fps = 1000.0 / duration if duration else None
        except (OSError, ValueError, SyntaxError, EOFError):
            fps = None
    else:
        capture = cv2.VideoCapture(str(path))
        fps = capture.get(cv2.CAP_PROP_FPS)
        capture.release()
    return float(fps) if fps and np.isfinite(fps) and fps > 0 else DEFAULT_FPS


def iter_frames(
    path: str | os.PathLike[str], *, start: int = 0, max_frames: int | None = MAX_FRAMES
) -> Iterator[np.ndarray]:
    """The frames of a video file from frame ``start`` on, one ``(H, W, 3)`` uint8 RGB array at
    a time, decoded as asked for (those before ``start`` decoded, not converted).
    :class:`VideoReadError` for a missing file, one without frames, and past ``max_frames``
    frames (``None``: no limit)."""
    yield from (frame for frame in _frames(path, start, max_frames) if frame is not None)


def count_frames(path: str | os.PathLike[str], *, max_frames: int | None = MAX_FRAMES) -> int:
    """How many frames :func:`iter_frames` gives, all decoded (a container's count may lie)."""
    return sum(1 for _ in _frames(path, None, max_frames))


def _frames(
    path: str | os.PathLike[str], start: int | None, max_frames: int | None
) -> Iterator[np.ndarray | None]:
    """RGB frames from ``start`` on, ``None`` before it (``start`` None: only counted)."""
    path = Path(path)
    if not path.is_file():
        raise VideoReadError(f"{path}: no such file")
    count = 0
    gif = path.suffix.lower() == ".gif"
    for count, frame in enumerate(_gif_frames(path, start) if gif else _cv2_frames(path, start), 1):
        if max_frames is not None and count > max_frames:
            raise VideoReadError(f"{path}: more than {max_frames} frames (raise max_frames)")
        yield frame
    if not count:
        raise VideoReadError(f"{path}: no frame could be decoded (not a video, or no codec)")


def read_video(path: str | os.PathLike[str], *, max_frames: int | None = MAX_FRAMES) -> Video:
    """A video file -> :class:`Video`, every frame in memory (long videos: :func:`iter_frames`)."""
    return Video(np.stack(list(iter_frames(path, max_frames=max_frames))), frame_rate(path))


def _cv2_frames(path: Path, start: int | None) -> Iterator[np.ndarray | None]:
    capture = cv2.VideoCapture(str(path))
    try:
        index = 0
        while capture.isOpened():
            kept = start is not None and index >= start
            ok, frame = capture.read() if kept else (capture.grab(), None)  # grab: not converted
            if not ok:
                break
            yield cv2.cvtColor(frame, cv2.COLOR_BGR2RGB) if kept else None
            index += 1
    finally:
        capture.release()


def _gif_frames(path: Path, start: int | None) -> Iterator[np.ndarray | None]:
    try:
        with Image.open(path) as image:
            for index, frame in enumerate(ImageSequence.Iterator(image)):
                kept = start is not None and index >= start
                yield np.asarray(frame.convert("RGB")).copy() if kept else None
    except (OSError, ValueError, SyntaxError, EOFError) as error:
        raise VideoReadError(f"{path}: not a readable GIF ({error})") from None


def clip_windows(count: int, length: int, stride: int | None = None) -> list[tuple[int, int]]:
    """``(start, stop)`` frame ranges of the clips of ``length`` frames over ``count`` frames:
    starts ``0, stride, 2 * stride...`` (``stride`` None: ``length``), the last clip ending on
    the last frame; one clip ``(0, length)`` for a shorter video."""
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


def stream_clips(
    frames: Iterable[np.ndarray], windows: Sequence[tuple[int, int]], start: int = 0
) -> Iterator[tuple[tuple[int, int], np.ndarray]]:
    """``(window, its frames (L, H, W, 3))`` for each of ``windows`` (from
    :func:`clip_windows`, in order; some may be left out), reading ``frames`` (frame ``start``
    first) once and keeping only the frames a window still needs (about one clip in memory).
    A window past the last frame repeats it, as :func:`clip_frames` does."""
    kept: dict[int, np.ndarray] = {}
    source = iter(frames)
    read = start  # the index of the next frame
    for index, (first, stop) in enumerate(windows):
        while read < stop:
            frame = next(source, None)
            if frame is None:
                break
            if read >= first:  # frames between two windows are not kept
                kept[read] = frame
            read += 1
        if not kept or read <= first:
            raise VideoReadError(f"the video ended after {read} frames, before clip {first}-{stop}")
        last = max(kept)
        yield (first, stop), np.stack([kept[min(t, last)] for t in range(first, stop)])
        following = windows[index + 1][0] if index + 1 < len(windows) else stop
        for t in [t for t in kept if t < following and t != last]:
            del kept[t]


class Mp4Writer:
    """Frames ``(H, W, 3)`` uint8 RGB written one at a time to an MP4 (``mp4v``) that appears
    at ``path`` only when closed without an error: ``with Mp4Writer(path, fps) as out:
    out.write(frame)``."""

    def __init__(self, path: str | os.PathLike[str], fps: float):
        self.path, self.fps = Path(path), fps
        self.folder = Path(tempfile.mkdtemp(prefix=".video-", dir=self.path.parent))
        self.scratch = self.folder / f"video{self.path.suffix}"
        self.writer: cv2.VideoWriter | None = None
        self.frames = 0

    def write(self, frame: np.ndarray) -> None:
        if self.writer is None:
            height, width = frame.shape[:2]
            fourcc = cv2.VideoWriter_fourcc(*"mp4v")
            self.writer = cv2.VideoWriter(str(self.scratch), fourcc, self.fps, (width, height))
            if not self.writer.isOpened():
                raise VideoReadError("OpenCV cannot write MP4 here (no mp4v encoder)")
        self.writer.write(cv2.cvtColor(frame, cv2.COLOR_RGB2BGR))
        self.frames += 1

    def __enter__(self) -> Mp4Writer:
        return self

    def __exit__(self, kind: object, *rest: object) -> None:
        if self.writer is not None:
            self.writer.release()
        if kind is None and self.frames:
            os.replace(self.scratch, self.path)
        self.scratch.unlink(missing_ok=True)
        self.folder.rmdir()


def _checked(frames: object) -> np.ndarray:
    array = np.asarray(frames)
    if array.ndim != 4 or array.shape[-1] != 3 or array.dtype != np.uint8 or not len(array):
        raise ArgumentError(f"expected frames (T, H, W, 3) uint8 RGB, got {array.shape}")
    return array


def save_mp4(path: str | os.PathLike[str], frames: object, fps: float) -> Path:
    """Frames ``(T, H, W, 3)`` uint8 RGB -> an MP4 file (``mp4v``), written atomically."""
    with Mp4Writer(path, fps) as out:
        for frame in _checked(frames):
            out.write(frame)
    return Path(path)


def gif_bytes(frames: object, fps: float) -> bytes:
    """Frames ``(T, H, W, 3)`` uint8 RGB -> a looping animated GIF's bytes (256 colours a frame)."""
    images = [Image.fromarray(frame) for frame in _checked(frames)]
    buffer = BytesIO()
    duration = max(20, round(1000 / fps))  # browsers show < 20 ms frames at 100 ms
    images[0].save(
        buffer, "GIF", save_all=True, append_images=images[1:], duration=duration, loop=0
    )
    return buffer.getvalue()


def save_gif(path: str | os.PathLike[str], frames: object, fps: float) -> Path:
    """Frames ``(T, H, W, 3)`` uint8 RGB -> an animated GIF file, written atomically."""
    return write_atomic(Path(path), gif_bytes(frames, fps))


__all__ = [
    "DEFAULT_FPS",
    "Mp4Writer",
    "MAX_FRAMES",
    "VIDEO_SUFFIXES",
    "Video",
    "VideoReadError",
    "clip_frames",
    "clip_windows",
    "count_frames",
    "frame_rate",
    "gif_bytes",
    "is_video",
    "iter_frames",
    "read_video",
    "save_gif",
    "save_mp4",
    "stream_clips",
]

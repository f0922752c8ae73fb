"""Video files as DataLoader datasets, and the files that hold each finished window's result:
:class:`VideoFacts` (frame counts and rates), :class:`VideoWindows` (the clips, each worker
decoding one contiguous span of them, each video it touches once), :class:`VideoFrames` (one
video's frames in order) and :class:`WindowStore`. None of them raises for a bad video: an item
carries the error and the run goes on.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from camkit import io
from camkit.cli.dataset import PinsInputs
from camkit.cli.ranks import span
from camkit.io import video

WINDOWS = ".windows"  # the folder of :class:`WindowStore` in a run's ``--out``

DECODE_ERRORS = (
    video.VideoReadError,
    cv2.error,
    OSError,
    ValueError,
    TypeError,
    RuntimeError,
    MemoryError,
)
"""What decoding or preprocessing a video may raise: reported as the video's error."""

Window = tuple[int, int]
WindowItem = tuple[int, str, Window]  # (video index, path, window)


class VideoFacts(Dataset):
    """``dataset[i]`` -> ``{"index": i, "frames": int, "fps": float, "error": str | None}`` of
    ``paths[i]`` (:func:`camkit.io.video.count_frames`, :func:`~camkit.io.video.frame_rate`)."""

    def __init__(self, paths: Sequence[str | os.PathLike[str]]) -> None:
        self.paths = [os.fspath(path) for path in paths]

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> dict[str, Any]:
        path = self.paths[index]
        try:
            frames, fps = video.count_frames(path), video.frame_rate(path)
        except DECODE_ERRORS as error:
            return {"index": index, "frames": 0, "fps": 0.0, "error": str(error)}
        return {"index": index, "frames": frames, "fps": fps, "error": None}


def as_list(items: list) -> list:
    """A DataLoader ``collate_fn`` that keeps a batch's items as they are."""
    return items


class VideoWindows(IterableDataset):
    """The clips of ``items`` (each video's windows in frame order) -> ``{video, window, input (3,
    L, h, w), error: None}``, or one item with the ``error`` where a video stops decoding."""

    def __init__(self, items: Sequence[WindowItem], preprocess: Callable[[Any], Tensor]) -> None:
        self.items = list(items)
        self.preprocess = preprocess

    def __iter__(self) -> Iterator[dict[str, Any]]:
        worker = get_worker_info()
        mine = self.items if worker is None else span(self.items, worker.num_workers, worker.id)
        for index, group in itertools.groupby(mine, key=lambda item: item[0]):
            windows = list(group)
            yield from self._clips(index, windows[0][1], [window for *_, window in windows])

    def _clips(self, index: int, path: str, windows: list[Window]) -> Iterator[dict[str, Any]]:
        first = windows[0][0]
        try:
            frames = video.iter_frames(path, start=first)
            for window, clip in video.stream_clips(frames, windows, first):
                clip_input = self.preprocess.clip(clip)  # type: ignore[attr-defined]
                yield {"video": index, "window": window, "input": clip_input, "error": None}
        except DECODE_ERRORS as error:
            yield {"video": index, "window": None, "input": None, "error": str(error)}


@dataclasses.dataclass
class WindowBatch(PinsInputs):
    """What :func:`collate_windows` makes of :class:`VideoWindows` items: ``inputs`` (or None),
    ``videos`` and ``windows`` along its rows; ``failures``: ``(video index, why)``."""

    inputs: Tensor | None
    videos: list[int]
    windows: list[Window]
    failures: list[tuple[int, str]]


def collate_windows(items: Sequence[dict[str, Any]]) -> WindowBatch:
    """``DataLoader`` ``collate_fn`` of :class:`VideoWindows`."""
    good = [item for item in items if item["error"] is None]
    return WindowBatch(
        inputs=torch.stack([item["input"] for item in good]) if good else None,
        videos=[item["video"] for item in good],
        windows=[item["window"] for item in good],
        failures=[(item["video"], item["error"]) for item in items if item["error"]],
    )


class VideoFrames(IterableDataset):
    """The first ``count`` frames of one video, ``(frame (H, W, 3) uint8, None)`` each in order,
    or ``(None, why)`` last when it cannot be decoded (read it with at most one worker)."""

    def __init__(self, path: str | os.PathLike[str], count: int) -> None:
        self.path, self.count = os.fspath(path), count

    def __iter__(self) -> Iterator[tuple[np.ndarray | None, str | None]]:
        try:
            for frame in itertools.islice(video.iter_frames(self.path), self.count):
                yield frame, None
        except DECODE_ERRORS as error:
            yield None, str(error)


class WindowStore:
    """One video's finished windows, ``OUT/.windows/<stem>/<stage>-<start>-<stop>.npy``: written
    before the manifest records the window, removed once the video's record is."""

    def __init__(self, out: Path, stem: str) -> None:
        self.folder = out / WINDOWS / stem

    def path(self, stage: str, window: Window) -> Path:
        return self.folder / f"{stage}-{window[0]}-{window[1]}.npy"

    def save(self, stage: str, window: Window, array: np.ndarray) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        io.save_npy(self.path(stage, window), array)

    def has(self, stage: str, window: Window) -> bool:
        return self.path(stage, window).is_file()

    def load(self, stage: str, window: Window) -> np.ndarray:
        return np.load(self.path(stage, window))

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)

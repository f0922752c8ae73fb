"""``camkit explain`` on video files: one rank's videos, clip by clip, streamed.

Each video is decoded frame by frame (:func:`camkit.io.video.iter_frames`) and cut into clips of
the model's clip length (:func:`camkit.io.video.clip_windows`: every ``stride`` frames, the last
clip ending on the last frame), each frame preprocessed as an image is. A first pass counts the
frames and predicts: the video's prediction is the mean of its clips' softmax, the explained
class its top-1 (or ``--target``) in every clip. A second pass computes the maps; a frame seen
by several clips gets the mean of their heat, and is drawn and written as soon as no later clip
covers it, so memory stays that of about one batch of clips however long the video. Written per
method and class: the animated overlay (MP4, frame by frame, and a GIF for videos of at most
:data:`GIF_MAX_FRAMES` frames; one frame per input frame, at the video's frame rate) and the
per-frame importance plot; the manifest record lists the frames, the frame rate, the clips and
the importance. A video that cannot be read becomes an error record and the run goes on.
"""

from __future__ import annotations

import contextlib
import itertools
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from camkit import io
from camkit.cli.pipeline import Job, build_explainers, top5, unique_stems
from camkit.cli.ranks import Ranks
from camkit.core.explainer import displayed
from camkit.core.progress import progress
from camkit.io import video
from camkit.metrics.frames import mass_shares
from camkit.models import LoadedModel
from camkit.runs.manifest import append, part_path
from camkit.targets.resolver import select_output
from camkit.viz.video import importance_plot, overlay_frames

GIF_MAX_FRAMES = 600
"""Longer videos get no GIF (it holds every frame in memory and weighs megabytes); their MP4 is
written frame by frame."""


def explain_videos(
    loaded: LoadedModel,
    paths: list[Path],
    indices: list[int],
    job: Job,
    ranks: Ranks,
    head: dict,
    stride: int | None = None,
) -> None:
    """Explain the videos ``indices`` of ``paths`` on this rank, appending each video's records
    to this rank's part of the manifest as soon as its files are written."""
    job.out.mkdir(parents=True, exist_ok=True)
    stems = unique_stems(paths)
    part = part_path(job.out, ranks.rank)
    append(part, [head | {"rank": ranks.rank}])
    model = loaded.model.to(job.device)
    explainers = build_explainers(model, job)
    started, done = time.perf_counter(), 0
    with progress(len(indices), "explain", "video", enabled=not job.quiet) as shown:
        for index in indices:
            path = paths[index]
            try:
                one = _Video(loaded, job, model, explainers, path, stride)
                records = one.explain(stems[index], ranks.rank)
            except video.VideoReadError as error:
                shown.write(f"camkit: cannot read {path}: {error}", file=sys.stderr)
                records = [{"image": str(path), "error": str(error), "rank": ranks.rank}]
            done += 1
            append(part, [{"record": r} for r in records] + [_throughput(ranks, done, started)])
            shown.update(1)
    if not indices:
        append(part, [_throughput(ranks, 0, started)])


def _throughput(ranks: Ranks, done: int, started: float) -> dict:
    seconds = time.perf_counter() - started
    speed = done / seconds if seconds and done else None
    return {
        "throughput": {
            "rank": ranks.rank,
            "images": done,
            "seconds": seconds,
            "images_per_second": speed,
        }
    }


class _Video:
    """One video file, streamed twice (prediction, then maps)."""

    def __init__(
        self,
        loaded: LoadedModel,
        job: Job,
        model: torch.nn.Module,
        explainers: dict,
        path: Path,
        stride: int | None,
    ):
        self.loaded, self.job, self.model, self.explainers = loaded, job, model, explainers
        self.path = path
        self.fps = video.frame_rate(path)
        self.count = sum(1 for _ in video.iter_frames(path))  # decoded once, nothing kept
        self.windows = video.clip_windows(self.count, loaded.clip_length or 1, stride)
        # the first frame of the next clip (the frame count after the last): frames before it
        # are final once a clip has been explained
        starts = [start for start, _ in self.windows[1:]] + [self.count]
        self.following = dict(zip(self.windows, starts, strict=True))

    def batches(self) -> Iterator[tuple[list[tuple[int, int]], list[np.ndarray], torch.Tensor]]:
        """``(windows, their frames, inputs (n, 3, L, H, W))``, ``images_per_batch`` clips at a
        time, from one more pass over the file."""
        clips = video.stream_clips(video.iter_frames(self.path), self.windows)
        while chunk := list(itertools.islice(clips, self.job.images_per_batch)):
            frames = [clip for _, clip in chunk]
            inputs = torch.stack([self.loaded.preprocess.clip(clip) for clip in frames])
            yield [window for window, _ in chunk], frames, inputs.to(self.job.device)

    def probabilities(self) -> torch.Tensor:
        """The video's softmax: the mean of its clips'."""
        parts = []
        with torch.inference_mode():
            for _, _, inputs in self.batches():
                parts.append(select_output(self.model(inputs)).float().softmax(dim=-1).cpu())
        return torch.cat(parts).mean(dim=0)

    def explain(self, stem: str, rank: int) -> list[dict]:
        """Write every method's and class's files; their records."""
        probabilities = self.probabilities()
        job = self.job
        classes = [int(probabilities.argmax())] if job.classes is None else list(job.classes)
        outputs = {
            (method, column): _Output(self, f"{stem}_{method}_{target}")
            for method in job.methods
            for column, target in enumerate(classes)
        }
        # frame -> (the frame, {method: summed heat (K, H, W)}, clips that saw it)
        pending: dict[int, tuple[np.ndarray, dict[str, torch.Tensor], int]] = {}
        with contextlib.ExitStack() as stack:
            for output in outputs.values():
                stack.enter_context(output.mp4)
            for windows, frames, inputs in self.batches():
                target = [classes] * len(inputs)
                heats = {m: displayed(self.explainers[m], inputs, target)[0] for m in job.methods}
                for row, ((start, stop), clip) in enumerate(zip(windows, frames, strict=True)):
                    for t in range(start, min(stop, self.count)):
                        frame, total, seen = pending.get(t, (clip[t - start], {}, 0))
                        for method, heat in heats.items():
                            here = heat[row, :, t - start].float().cpu()
                            total[method] = total[method] + here if method in total else here
                        pending[t] = (frame, total, seen + 1)
                following = self.following[windows[-1]]
                for t in sorted(t for t in pending if t < following):  # no later clip sees t
                    frame, total, seen = pending.pop(t)
                    for (method, column), output in outputs.items():
                        output.add(frame, total[method][column] / seen)
        return [
            output.record(method, classes[column], probabilities, rank)
            for (method, column), output in outputs.items()
        ]


class _Output:
    """One method and class of a video: its MP4 written frame by frame, its GIF's frames (short
    videos only), each frame's map mass."""

    def __init__(self, owner: _Video, name: str):
        self.owner, self.name = owner, name
        self.mp4 = video.Mp4Writer(owner.job.out / f"{name}.mp4", owner.fps)
        self.gif: list[np.ndarray] | None = [] if owner.count <= GIF_MAX_FRAMES else None
        self.mass: list[float] = []
        self.size: list[int] = []  # a frame's [width, height]

    def add(self, frame: np.ndarray, heat: torch.Tensor) -> None:
        """Draw one frame with its heat ``(H, W)`` (the model's input size) and write it."""
        job = self.owner.job
        region = self.owner.loaded.preprocess.photo_region(*frame.shape[:2])
        drawn = overlay_frames(frame[None], heat[None], job.alpha, job.colormap, region)[0]
        self.mp4.write(drawn)
        if self.gif is not None:
            self.gif.append(drawn)
        self.mass.append(float(heat.sum()))
        self.size = [frame.shape[1], frame.shape[0]]

    def record(self, method: str, target: int, probabilities: torch.Tensor, rank: int) -> dict:
        """Write the GIF and the importance plot; the manifest record."""
        owner, out = self.owner, self.owner.job.out
        loaded, fps = owner.loaded, owner.fps
        if self.gif is not None:
            video.save_gif(out / f"{self.name}.gif", np.stack(self.gif), fps)
        importance = mass_shares(torch.tensor(self.mass))
        label = loaded.labels[target]
        plot = importance_plot(importance, fps, title=f"{owner.path.name}: {method}, {label}")
        io.write_atomic(out / f"{self.name}_frames.png", plot)
        return {
            "image": str(owner.path),
            "output": f"{self.name}.mp4",
            "animation": f"{self.name}.gif" if self.gif is not None else None,
            "frame_plot": f"{self.name}_frames.png",
            "method": method,
            "layer": owner.job.layer if owner.explainers[method].needs_layer else None,
            "target": target,
            "label": label,
            "probability": probabilities[target].item(),
            "top5": top5(probabilities, loaded.labels),
            "model": loaded.name,
            "rank": rank,
            "size": self.size,
            "frames": owner.count,
            "fps": fps,
            "clip_length": loaded.clip_length,
            "windows": [list(window) for window in owner.windows],
            "frame_importance": [round(v, 6) for v in importance.tolist()],
        }


__all__ = ["GIF_MAX_FRAMES", "explain_videos"]

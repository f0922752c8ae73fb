"""``camkit explain`` on video files: window by window, across ranks, resumable, streamed.

Each video is cut into clips of the model's clip length (:func:`camkit.io.video.clip_windows`),
in stages, each rank decoding a contiguous span of the windows in its DataLoader workers: count
the frames; ``predict`` each window (a video's class: the top-1 of their mean, or ``--target``);
its ``maps`` for that class; then decode each video once more and draw each frame with the mean
heat of the windows that cover it straight into the MP4 (and a GIF, up to
:data:`GIF_MAX_FRAMES` frames), with the per-frame importance plot. A finished window is a file
(:class:`~camkit.cli.video_windows.WindowStore`) and a manifest line (``--resume`` skips it); a
video that cannot be read becomes one error record and the run goes on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from camkit import io
from camkit.cli.pipeline import (
    Job,
    build_explainers,
    class_record,
    data_loader,
    unique_stems,
)
from camkit.cli.ranks import Ranks
from camkit.cli.video_windows import (
    VideoFacts,
    VideoFrames,
    VideoWindows,
    WindowStore,
    as_list,
    collate_windows,
)
from camkit.core.copies import trim_heap
from camkit.core.explainer import displayed
from camkit.core.progress import LogProgress, progress
from camkit.io import video
from camkit.metrics.frames import mass_shares
from camkit.models import LoadedModel
from camkit.runs.manifest import append, part_path
from camkit.targets.resolver import select_output
from camkit.viz.video import frame_heat, importance_plot, overlay_frames

GIF_MAX_FRAMES = 600  # longer videos get no GIF: it holds every frame in memory
PREDICT, MAPS = "predict", "maps"  # the stages whose windows are recorded


@dataclasses.dataclass
class _Plan:
    """One readable video: file, frames, frame rate, windows, window files, stem."""

    path: Path
    count: int
    fps: float
    windows: list[tuple[int, int]]
    store: WindowStore
    stem: str


def explain_videos(
    loaded: LoadedModel,
    paths: list[Path],
    todo: list[int],
    job: Job,
    ranks: Ranks,
    head: dict,
    stride: int | None = None,
    finished: Iterable[dict] = (),
) -> None:
    """Explain the videos ``todo`` (indices of ``paths``) on every rank, skipping the ``finished``
    windows of a resumed run whose files are there; each rank appends to its manifest part."""
    job.out.mkdir(parents=True, exist_ok=True)
    run = _Run(loaded, job, ranks)
    append(run.part, [head | {"rank": ranks.rank}])
    stems = unique_stems(paths)
    facts = run.measure(paths, todo)
    failed = {index: fact for index, fact in facts.items() if isinstance(fact, str)}
    length = loaded.clip_length or 1
    plans = {}  # in the inputs' order, the same on every rank
    for index, fact in sorted(facts.items()):
        if not isinstance(fact, str):
            count, fps = fact
            windows = video.clip_windows(count, length, stride)
            store = WindowStore(job.out, stems[index])
            plans[index] = _Plan(paths[index], count, fps, windows, store, stems[index])
    done = {(w["image"], w["stage"], w["start"], w["stop"]) for w in finished}
    failed |= run.stage(PREDICT, plans, done, {})
    predictions = {i: _prediction(plan) for i, plan in plans.items() if i not in failed}
    classes = {
        index: [int(p.argmax())] if job.classes is None else list(job.classes)
        for index, p in predictions.items()
    }
    failed |= run.stage(MAPS, {i: plans[i] for i in classes}, done, classes)
    mine = ranks.shard(todo)
    with progress(len(mine), ranks.label("draw"), "video", enabled=not job.quiet) as shown:
        for index in mine:
            records, why = None, failed.get(index)
            if why is None:
                records, why = _draw(run, plans[index], classes[index], predictions[index], shown)
            if records is None:
                records = [{"image": str(paths[index]), "error": why, "rank": ranks.rank}]
            run.videos += 1
            append(run.part, [{"record": r} for r in records] + [run.throughput()])
            if index in plans:
                plans[index].store.remove()
            shown.update(1)
    if not mine:
        append(run.part, [run.throughput()])


def _prediction(plan: _Plan) -> np.ndarray:
    """The video's softmax: the mean of its windows' (summed in window order)."""
    total = sum(plan.store.load(PREDICT, window).astype(np.float64) for window in plan.windows)
    return total / len(plan.windows)


class _Run:
    """This rank's model, methods, manifest part and counts."""

    def __init__(self, loaded: LoadedModel, job: Job, ranks: Ranks):
        self.loaded, self.job, self.ranks = loaded, job, ranks
        self.model = loaded.model.to(job.device)
        self.explainers = build_explainers(self.model, job)
        self.part = part_path(job.out, ranks.rank)
        self.started, self.videos, self.windows = time.perf_counter(), 0, 0

    def throughput(self) -> dict:
        seconds = time.perf_counter() - self.started
        speed = self.videos / seconds if seconds and self.videos else None
        counts = {"rank": self.ranks.rank, "images": self.videos, "windows": self.windows}
        return {"throughput": counts | {"seconds": seconds, "images_per_second": speed}}

    def report(self, failed: dict, index: int, why: str, path: Path, say: Callable = print) -> None:
        """Name a video that cannot be read on stderr (``say``: above a progress bar), once."""
        if index not in failed:
            failed[index] = why
            say(f"camkit: cannot read {path}: {why}", file=sys.stderr)

    def measure(self, paths: list[Path], todo: list[int]) -> dict[int, tuple[int, float] | str]:
        """``{index: (frames, fps) or why not}`` of the videos ``todo``, from every rank."""
        mine = self.ranks.shard(todo)
        found: dict[int, tuple[int, float] | str] = {}
        for batch in data_loader(VideoFacts([paths[i] for i in mine]), self.job, as_list):
            for fact in batch:
                index = mine[fact["index"]]
                if fact["error"] is not None:
                    self.report(found, index, fact["error"], paths[index])
                else:
                    found[index] = (fact["frames"], fact["fps"])
        return {index: fact for part in self.ranks.gather(found) for index, fact in part.items()}

    def stage(
        self, stage: str, plans: dict[int, _Plan], done: set, classes: dict[int, list[int]]
    ) -> dict[int, str]:
        """Run ``stage`` on this rank's windows not ``done`` -> every rank's unreadable videos."""
        todo = [
            (index, str(plan.path), window)
            for index, plan in plans.items()
            for window in plan.windows
            if (str(plan.path), stage, *window) not in done or not plan.store.has(stage, window)
        ]
        mine = self.ranks.span(todo)
        failed: dict[int, str] = {}
        loader = data_loader(VideoWindows(mine, self.loaded.preprocess), self.job, collate_windows)
        label = self.ranks.label(stage)
        with progress(len(mine), label, "window", enabled=not self.job.quiet) as shown:
            for batch in loader:
                for index, why in batch.failures:
                    self.report(failed, index, why, plans[index].path, shown.write)
                lines = []
                if batch.inputs is not None:
                    inputs = batch.inputs.to(self.job.device, non_blocking=True)
                    targets = [classes.get(index) for index in batch.videos]
                    results = (
                        self.predict(inputs) if stage == PREDICT else self.maps(inputs, targets)
                    )
                    done_now = zip(batch.videos, batch.windows, results, strict=True)
                    for index, (start, stop), result in done_now:
                        plans[index].store.save(stage, (start, stop), result)
                        image = str(plans[index].path)
                        window = {"image": image, "stage": stage, "start": start, "stop": stop}
                        lines.append({"window": window})
                self.windows += len(lines)
                append(self.part, lines + [self.throughput()])
                shown.update(len(lines))
                # with DataLoader workers, freed batch buffers otherwise fragment glibc's heap:
                # +125 MB peak on a 10-minute video (benchmarks/VIDEO.md)
                trim_heap()
        return {index: why for part in self.ranks.gather(failed) for index, why in part.items()}

    def predict(self, inputs: torch.Tensor) -> np.ndarray:
        """``(n, classes)`` softmax of a batch of clips."""
        with torch.inference_mode():
            return select_output(self.model(inputs)).float().softmax(dim=-1).cpu().numpy()

    def maps(self, inputs: torch.Tensor, targets: list) -> np.ndarray:
        """``(n, methods, K, L, H, W)`` float16 display heat of a batch of clips."""
        heats = [displayed(self.explainers[m], inputs, targets)[0] for m in self.job.methods]
        return torch.stack(heats, dim=1).to(torch.float16).cpu().numpy()


def _heats(run: _Run, plan: _Plan) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``(frame, heat (methods, K, H, W))`` frame by frame: the mean of the windows that cover it
    (a few loaded at a time); :class:`~camkit.io.video.VideoReadError` if it cannot be decoded."""
    loaded: dict[tuple[int, int], np.ndarray] = {}
    upcoming = iter(plan.windows)
    following = next(upcoming, None)
    frames = data_loader(VideoFrames(plan.path, plan.count), run.job, as_list, workers=1)
    for t, (frame, why) in enumerate(item for batch in frames for item in batch):
        if frame is None:
            raise video.VideoReadError(why)
        while following is not None and following[0] <= t:
            loaded[following] = plan.store.load(MAPS, following).astype(np.float32)
            following = next(upcoming, None)
        for window in [window for window in loaded if window[1] <= t]:
            del loaded[window]
        yield frame, frame_heat([(start, heat) for (start, _), heat in loaded.items()], t)


def _draw(
    run: _Run, plan: _Plan, classes: list[int], probabilities: np.ndarray, shown: tqdm | LogProgress
) -> tuple[list[dict] | None, str | None]:
    """Write one video's files -> (records, None), or (None, why) when it cannot be decoded."""
    outputs = [
        (row, column, _Output(run, plan, method, target))
        for row, method in enumerate(run.job.methods)
        for column, target in enumerate(classes)
    ]
    try:
        with contextlib.ExitStack() as stack:
            for *_, output in outputs:
                stack.enter_context(output.mp4)
            for frame, heat in _heats(run, plan):
                for row, column, output in outputs:
                    output.add(frame, heat[row, column])
    except video.VideoReadError as error:
        shown.write(f"camkit: cannot read {plan.path}: {error}", file=sys.stderr)
        return None, str(error)
    chances = torch.from_numpy(probabilities).float()
    return [output.record(chances) for *_, output in outputs], None


class _Output:
    """One method and class of a video: its MP4, GIF frames and each frame's map mass."""

    def __init__(self, run: _Run, plan: _Plan, method: str, target: int):
        self.run, self.plan, self.method, self.target = run, plan, method, target
        self.name = name = f"{plan.stem}_{method}_{target}"
        self.mp4 = video.Mp4Writer(run.job.out / f"{name}.mp4", plan.fps)
        self.gif: list[np.ndarray] | None = [] if plan.count <= GIF_MAX_FRAMES else None
        self.mass: list[float] = []
        self.size: list[int] = []  # a frame's [width, height]

    def add(self, frame: np.ndarray, heat: np.ndarray) -> None:
        """Draw one frame with its heat ``(H, W)`` (the model's input size) and write it."""
        job, loaded = self.run.job, self.run.loaded
        region = loaded.preprocess.photo_region(*frame.shape[:2])
        drawn = overlay_frames(frame[None], heat[None], job.alpha, job.colormap, region)[0]
        self.mp4.write(drawn)
        if self.gif is not None:
            self.gif.append(drawn)
        self.mass.append(float(heat.sum(dtype=np.float64)))
        self.size = [frame.shape[1], frame.shape[0]]

    def record(self, probabilities: torch.Tensor) -> dict:
        """Write the GIF and the importance plot; the manifest record."""
        run, plan, method, target = self.run, self.plan, self.method, self.target
        out, loaded, fps = run.job.out, run.loaded, plan.fps
        if self.gif is not None:
            video.save_gif(out / f"{self.name}.gif", np.stack(self.gif), fps)
        importance = mass_shares(torch.tensor(self.mass, dtype=torch.float64))
        label = loaded.labels[target]
        plot = importance_plot(importance, fps, title=f"{plan.path.name}: {method}, {label}")
        io.write_atomic(out / f"{self.name}_frames.png", plot)
        return {
            "image": str(plan.path),
            "output": f"{self.name}.mp4",
            "animation": f"{self.name}.gif" if self.gif is not None else None,
            "frame_plot": f"{self.name}_frames.png",
            **class_record(loaded, run.job, method, target, probabilities, run.ranks.rank),
            "size": self.size,
            "frames": plan.count,
            "fps": fps,
            "clip_length": loaded.clip_length,
            "windows": [list(window) for window in plan.windows],
            "frame_importance": [round(v, 6) for v in importance.tolist()],
        }

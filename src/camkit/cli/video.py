"""``camkit explain`` on video files: one rank's videos, clip by clip.

Each video is decoded (:func:`camkit.io.video.read_video`), cut into clips of the model's clip
length (:func:`camkit.io.video.clip_windows`: every ``stride`` frames, the last clip ending on
the last frame), each frame preprocessed as an image is; the video's prediction is the mean of
its clips' softmax, the explained class that top-1 (or ``--target``) for every clip. A frame
seen by several clips gets the mean of their heat. Written per method and class: the animated
overlay (MP4 and GIF, one frame per input frame, at the video's frame rate) and the per-frame
importance plot (:func:`camkit.metrics.frame_importance`); the manifest record lists the frames,
the frame rate, the clips and the importance. A video that cannot be read becomes an error
record and the run goes on.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import torch

from camkit import io, metrics
from camkit.cli.pipeline import Job, build_explainers, top5, unique_stems
from camkit.cli.ranks import Ranks
from camkit.core.progress import progress
from camkit.io import video
from camkit.models import LoadedModel
from camkit.runs.manifest import append, part_path
from camkit.targets.resolver import select_output
from camkit.viz.video import importance_plot, overlay_frames


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
    if loaded.clip_length is None:
        raise video.VideoReadError(
            f"--model {loaded.name} takes images, not clips: explain videos with a video model "
            "(e.g. torchvision:r3d_18) or extract the frames as images"
        )
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
                clip = video.read_video(path)
            except video.VideoReadError as error:
                shown.write(f"camkit: cannot read {path}: {error}", file=sys.stderr)
                records = [{"image": str(path), "error": str(error), "rank": ranks.rank}]
            else:
                one = _Video(loaded, job, model, explainers, clip, stride)
                records = one.explain(path, stems[index], ranks.rank)
            done += 1
            seconds = time.perf_counter() - started
            throughput = {
                "rank": ranks.rank,
                "images": done,
                "seconds": seconds,
                "images_per_second": done / seconds if seconds else None,
            }
            append(part, [{"record": r} for r in records] + [{"throughput": throughput}])
            shown.update(1)
    if not indices:
        throughput = {"rank": ranks.rank, "images": 0, "seconds": 0.0, "images_per_second": None}
        append(part, [{"throughput": throughput}])


class _Video:
    """One decoded video: its clips, prediction, maps and files."""

    def __init__(
        self,
        loaded: LoadedModel,
        job: Job,
        model: torch.nn.Module,
        explainers: dict,
        clip: video.Video,
        stride: int | None,
    ):
        self.loaded, self.job, self.model, self.explainers = loaded, job, model, explainers
        self.clip = clip
        length = loaded.clip_length or 1
        self.windows = video.clip_windows(len(clip), length, stride)
        frames = torch.stack([loaded.preprocess(frame) for frame in clip.frames], dim=1)
        self.inputs = torch.stack(  # (clips, 3, T, H, W); past the end: the last frame again
            [frames[:, np.minimum(np.arange(a, b), len(clip) - 1)] for a, b in self.windows]
        )

    def _chunks(self) -> list[slice]:
        size = self.job.images_per_batch
        return [slice(i, i + size) for i in range(0, len(self.inputs), size)]

    def probabilities(self) -> torch.Tensor:
        """The video's softmax: the mean of its clips'."""
        parts = []
        with torch.inference_mode():
            for rows in self._chunks():
                inputs = self.inputs[rows].to(self.job.device)
                parts.append(select_output(self.model(inputs)).float().softmax(dim=-1).cpu())
        return torch.cat(parts).mean(dim=0)

    def heat(self, method: str, classes: list[int]) -> torch.Tensor:
        """``(K, frames, H, W)``: each frame's heat, the mean over the clips that saw it."""
        explainer = self.explainers[method]
        total = torch.zeros(len(classes), len(self.clip), *self.inputs.shape[-2:])
        seen = torch.zeros(len(self.clip))
        for rows in self._chunks():
            inputs = self.inputs[rows].to(self.job.device)
            heat, _ = explainer.heatmaps(inputs, [classes] * len(inputs))
            for window, clip_heat in zip(self.windows[rows], heat.cpu(), strict=True):
                start, stop = window[0], min(window[1], len(self.clip))
                total[:, start:stop] += clip_heat[:, : stop - start]
                seen[start:stop] += 1
        return total / seen[:, None, None]

    def explain(self, path: Path, stem: str, rank: int) -> list[dict]:
        probabilities = self.probabilities()
        classes = (
            [int(probabilities.argmax())] if self.job.classes is None else list(self.job.classes)
        )
        frames, fps = self.clip.frames, self.clip.fps
        region = self.loaded.preprocess.photo_region(*frames.shape[1:3])
        records = []
        for method in self.job.methods:
            heat = self.heat(method, classes)
            for column, target in enumerate(classes):
                name = f"{stem}_{method}_{target}"
                job = self.job
                drawn = overlay_frames(frames, heat[column], job.alpha, job.colormap, region)
                video.save_mp4(self.job.out / f"{name}.mp4", drawn, fps)
                video.save_gif(self.job.out / f"{name}.gif", drawn, fps)
                importance = metrics.frame_importance(heat[column])
                label = self.loaded.labels[target]
                title = f"{path.name}: {method}, {label}"
                plot = importance_plot(importance, fps, title=title)
                io.write_atomic(self.job.out / f"{name}_frames.png", plot)
                records.append(
                    {
                        "image": str(path),
                        "output": f"{name}.mp4",
                        "animation": f"{name}.gif",
                        "frame_plot": f"{name}_frames.png",
                        "method": method,
                        "layer": self.job.layer if self.explainers[method].needs_layer else None,
                        "target": target,
                        "label": label,
                        "probability": probabilities[target].item(),
                        "top5": top5(probabilities, self.loaded.labels),
                        "model": self.loaded.name,
                        "rank": rank,
                        "size": [frames.shape[2], frames.shape[1]],
                        "frames": len(frames),
                        "fps": fps,
                        "clip_length": self.loaded.clip_length,
                        "windows": [list(window) for window in self.windows],
                        "frame_importance": [round(v, 6) for v in importance.tolist()],
                    }
                )
        return records


__all__ = ["explain_videos"]

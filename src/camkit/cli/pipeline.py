"""``camkit explain`` on one rank: decoding workers, the methods, writers, its manifest part."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, IterableDataset, Subset

from camkit import io, models, registry, viz
from camkit.cli import report
from camkit.cli.common import BATCH_SIZE, UsageError
from camkit.cli.dataset import ImageBatch, ImageFiles, collate
from camkit.cli.ranks import Ranks
from camkit.core.explainer import displayed
from camkit.core.layers import first_output
from camkit.core.progress import progress
from camkit.errors import CamkitError
from camkit.relevance.composites import DEFAULT_COMPOSITE
from camkit.runs import maps as mapstore
from camkit.runs.manifest import append, part_path
from camkit.targets.ranking import top1
from camkit.targets.resolver import select_output

OVERLAY_QUALITY = 90  # JPEG and WebP overlays: no visible loss on a blended heatmap
OVERLAY_SETTINGS = ("alpha", "colormap", "save_raw", "format", "max_size")  # in a run's settings


@dataclasses.dataclass(frozen=True)
class Job:
    """What to explain and how to write it, checked and resolved from the command line."""

    methods: tuple[str, ...]
    layer: str
    classes: tuple[int, ...] | None  # None: each image's top-1 class
    out: Path
    device: torch.device
    images_per_batch: int = 8
    batch_size: int = BATCH_SIZE  # rows per forward pass inside the methods that loop
    composite: str = DEFAULT_COMPOSITE  # the LRP composite (--composite)
    alpha: float = 0.5
    colormap: str = "jet"
    save_raw: bool = False
    format: str = "jpg"  # the overlays' file format: jpg, png or webp
    max_size: int | None = None  # the overlays' longer side at most (None: the photo's size)
    save_maps: bool = False  # every raw map in one maps.npz (camkit.cli.mapstore)
    workers: int = 0
    quiet: bool = False
    max_pixels: int | None = io.MAX_PIXELS  # larger images are refused before decoding
    report: bool = False

    @property
    def build_settings(self) -> registry.Settings:
        """How the methods are built: seed 0, ``batch_size``, the LRP ``composite``."""
        return registry.Settings(batch_size=self.batch_size, composite=self.composite)

    def settings(self, loaded: models.LoadedModel, weights_sha256: str | None) -> dict:
        """What changes the outputs: a resumed run must have the same."""
        composite = any(registry.get(method).takes_composite for method in self.methods)
        return {
            "methods": list(self.methods),
            "layer": self.layer,
            "model": loaded.name,
            "weights_sha256": weights_sha256,
            "target": None if self.classes is None else list(self.classes),
            "input_size": list(loaded.input_size),
            "crop": loaded.preprocess.crop_mode,
            "composite": self.composite if composite else None,
            **{name: getattr(self, name) for name in OVERLAY_SETTINGS},
        } | ({"save_maps": True} if self.save_maps else {})


def loader_workers(requested: int | None) -> int:
    """``--workers``, else one core left to the model and at most 4 decoding."""
    return max(0, min(4, (os.cpu_count() or 1) - 1)) if requested is None else requested


def build_explainers(model: nn.Module, job: Job) -> dict[str, Any]:
    """``{method: explainer}`` of ``job.methods``, built as every front end builds them; a
    method that cannot explain this model is a usage error, before any image is read."""
    explainers = {}
    for method in job.methods:
        try:
            explainers[method] = registry.build(method, model, job.layer, job.build_settings)
        except CamkitError as error:
            raise UsageError(f"--method {method}: {error}") from None
    return explainers


def unique_stems(paths: Sequence[Path]) -> list[str]:
    """File stems, with ``-2``, ``-3``... added where two inputs share a stem."""
    used: dict[str, None] = {}  # in the order of the paths
    for path in paths:
        stem, count = path.stem, 1
        while stem in used:
            count += 1
            stem = f"{path.stem}-{count}"
        used[stem] = None
    return list(used)


def class_record(
    loaded: models.LoadedModel, job: Job, method: str, target: int, probabilities: Tensor, rank: int
) -> dict:
    """The manifest fields of one map of an image or video: its method, class and prediction."""
    top5 = models.top_classes(probabilities, loaded.labels, 5)
    return {
        "method": method,
        "layer": job.layer if registry.get(method).needs_layer else None,
        "target": target,
        "label": loaded.labels[target],
        "probability": probabilities[target].item(),
        "top5": [{"index": i, "label": name, "probability": p} for i, name, p in top5],
        "model": loaded.name,
        "rank": rank,
    }


@dataclasses.dataclass
class Explained:
    """One batch's records, and the files still being written for them."""

    records: list[dict]
    writes: list[Future]
    images: int
    maps: list[tuple[dict, np.ndarray]] = dataclasses.field(default_factory=list)  # --save-maps


class BatchExplainer:
    """The methods of a run on one rank: batches in, files (written by a thread pool while the next
    batch runs) and records out; the clean batch of the first CAM also gives the prediction."""

    def __init__(self, loaded: models.LoadedModel, job: Job, rank: int, writer: Executor):
        self.loaded, self.job, self.rank, self.writer = loaded, job, rank, writer
        self.model = loaded.model.to(job.device)
        self.explainers = build_explainers(self.model, job)
        # a method whose first forward is the clean batch: its output is also the prediction
        clean = [m for m in job.methods if registry.get(m).cls.clean_batch_first()][:1]
        self.order = clean + [m for m in job.methods if m not in clean]

    def batch(self, batch: ImageBatch, paths: list[Path], stems: list[str]) -> Explained:
        """One batch's records and files; unreadable images become error records."""
        started = time.perf_counter()
        records = [
            {"image": str(paths[index]), "error": reason, "rank": self.rank}
            for index, _, reason in batch.failures
        ]
        explained = Explained(records, [], len(batch))
        if batch.inputs is None:
            return explained
        inputs = batch.inputs.to(self.job.device, non_blocking=True)
        given = None if self.job.classes is None else [list(self.job.classes)] * len(inputs)
        results, probabilities = self.run_methods(inputs, given)
        classes = top1(probabilities, keepdim=True).tolist() if given is None else given
        seconds = (time.perf_counter() - started) / len(inputs)
        for row, (index, original) in enumerate(zip(batch.indices, batch.images, strict=True)):
            image = original.numpy()  # numpy: an image a few pixels tall is read channels-last
            for method in self.job.methods:
                heat, raw, measured = results[method]
                for column, target in enumerate(classes[row]):
                    name = f"{stems[index]}_{method}_{target}"
                    record = {"image": str(paths[index]), "output": f"{name}.{self.job.format}"}
                    if self.job.save_raw:
                        record["raw"] = f"{name}.npy"
                    record |= class_record(
                        self.loaded, self.job, method, target, probabilities[row], self.rank
                    )
                    if measured is not None:  # what the method measured (LRP: conservation)
                        record |= measured[row][column]
                    record |= {"size": [image.shape[1], image.shape[0]], "seconds": seconds}
                    first = method == self.job.methods[0] and column == 0
                    files = (record, image, heat[row, column], raw[row, column], first)
                    explained.writes.append(self.writer.submit(self.write, *files))
                    records.append(record)
                    if self.job.save_maps:
                        explained.maps.append((record, mapstore.as_map(raw[row, column])))
        return explained

    def run_methods(self, inputs: Tensor, target: list | None) -> tuple[dict[str, tuple], Tensor]:
        """``{method: (heat (B, K, H, W), raw, measured)}`` on the CPU, and the softmax."""
        results, logits = {}, None
        for method in self.order:
            explainer = self.explainers[method]
            if logits is None and explainer.clean_batch_first():
                with first_output(self.model) as kept:
                    heat, found = displayed(explainer, inputs, target)
                logits = select_output(kept[0])
            else:
                heat, found = displayed(explainer, inputs, target)
            results[method] = (heat.cpu(), found.maps.cpu(), explainer.measured())
        if logits is None:
            with torch.inference_mode():
                logits = select_output(self.model(inputs))
        return results, logits.float().softmax(dim=-1).cpu()

    def write(
        self, record: dict, image: np.ndarray, heat: Tensor, raw: Tensor, first: bool
    ) -> None:
        """The overlay (and raw map, thumbnails) of one record."""
        if self.job.max_size is not None:  # colour and encode only the pixels that are kept
            image = io.thumbnail(image, self.job.max_size)
        region = self.loaded.preprocess.photo_region(*image.shape[:2])
        overlay = viz.overlay_on_photo(image, heat, region, self.job.alpha, self.job.colormap)
        io.save_image(self.job.out / record["output"], overlay, OVERLAY_QUALITY)
        if self.job.save_raw:
            io.save_npy(self.job.out / record["raw"], raw.numpy())
        if self.job.report:
            report.save_thumbnails(self.job.out, record, image if first else None, overlay)


def explain_files(
    loaded: models.LoadedModel,
    paths: list[Path],
    indices: list[int],
    job: Job,
    ranks: Ranks,
    head: dict,
) -> None:
    """Explain the images ``indices`` of ``paths`` on this rank, appending to its manifest part
    after every batch whose files are written."""
    job.out.mkdir(parents=True, exist_ok=True)
    stems = unique_stems(paths)
    files = Subset(ImageFiles(paths, loaded.preprocess, max_pixels=job.max_pixels), indices)
    part = part_path(job.out, ranks.rank)
    append(part, [head | {"rank": ranks.rank}])
    maps = mapstore.MapPart(job.out, ranks.rank) if job.save_maps else None
    done: set[str] = set()
    started = time.perf_counter()

    def record(batch: Explained) -> None:
        """Wait for a batch's files; append its maps, records and throughput to the parts."""
        for write in batch.writes:
            write.result()
        if maps is not None:
            rows = maps.append([kept for _, kept in batch.maps])
            for (one, _), row in zip(batch.maps, rows, strict=True):
                one["map_part"] = row
        done.update(one["image"] for one in batch.records)
        seconds = time.perf_counter() - started
        speed = len(done) / seconds if seconds else None
        counts = {"rank": ranks.rank, "images": len(done), "seconds": seconds}
        throughput = {"throughput": counts | {"images_per_second": speed}}
        append(part, [{"record": one} for one in batch.records] + [throughput])
        shown.update(batch.images)

    with (
        ThreadPoolExecutor(max_workers=2, initializer=_lowest_priority) as writer,
        progress(len(indices), ranks.label("explain"), "image", enabled=not job.quiet) as shown,
    ):
        explainer = BatchExplainer(loaded, job, ranks.rank, writer)
        pending: list[Explained] = []
        for batch in data_loader(files, job, collate):
            for _, path, reason in batch.failures:
                shown.write(f"camkit: cannot read {path}: {reason}", file=sys.stderr)
            pending.append(explainer.batch(batch, paths, stems))
            if len(pending) > 1:  # the previous batch's files were written meanwhile
                record(pending.pop(0))
        for explained in [*pending, Explained([], [], 0)]:  # the empty one: a rank without images
            record(explained)


def data_loader(
    dataset: Dataset | IterableDataset,
    job: Job,
    collate_fn: Callable[[list], Any],
    workers: int | None = None,
) -> DataLoader:
    """A run's DataLoader: ``job.images_per_batch`` items a batch, decoded by ``job.workers``
    (at most ``workers``) one-thread processes at the lowest priority; pinned for CUDA."""
    return DataLoader(
        dataset,
        batch_size=job.images_per_batch,
        num_workers=job.workers if workers is None else min(workers, job.workers),
        collate_fn=collate_fn,
        pin_memory=job.device.type == "cuda",
        worker_init_fn=_one_thread,
    )


def _one_thread(worker: int) -> None:
    torch.set_num_threads(1)  # decoding workers leave the cores to the model
    _lowest_priority()


def _lowest_priority() -> None:
    """Nice 19 for this thread: it never holds up the model's OpenMP threads at a barrier (+9 %
    images/s on 2 cores, docs/performance.md)."""
    with contextlib.suppress(OSError, AttributeError):  # AttributeError: no setpriority (Windows)
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)

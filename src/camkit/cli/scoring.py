"""What ``camkit evaluate`` scores: the metrics and their ``metrics.csv`` columns, the pointing
games' masks, one batch's scores from :mod:`camkit.metrics`, the sanity check."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from camkit import io, metrics, models, registry
from camkit.cli.common import UsageError
from camkit.cli.pipeline import Job
from camkit.io import IMAGE_SUFFIXES

# metric name on the command line -> its columns in metrics.csv (name, higher is better)
COLUMNS = {
    "deletion": [("deletion", False)],
    "insertion": [("insertion", True)],
    "drop": [("average_drop", False)],
    "increase": [("increase_in_confidence", True)],
    "road": [("road_morf", False), ("road_lerf", True)],
    "pointing": [("pointing_game", True)],
    "energy": [("energy_pointing_game", True)],
}
NEEDS_MASKS = ("pointing", "energy")
METRICS = (*COLUMNS, "sanity")


@dataclasses.dataclass(frozen=True)
class Settings:
    """The metric settings the command line chose."""

    metrics: tuple[str, ...]
    steps: int
    baseline: str
    batch_size: int
    tolerance: int


def parse_metrics(spec: str) -> tuple[str, ...]:
    """``"deletion,road"`` -> ``("deletion", "road")``; unknown names are usage errors."""
    names = tuple(dict.fromkeys(name.strip().lower() for name in spec.split(",") if name.strip()))
    unknown = [name for name in names if name not in METRICS]
    if unknown or not names:
        choices = ", ".join(METRICS)
        raise UsageError(f"--metrics: unknown {unknown or spec!r}; choose from {choices}")
    return names


def find_masks(folder: str | None, paths: Sequence[Path], wanted: Sequence[str]) -> dict[int, Path]:
    """``{image index: mask file}``: the mask of ``photo.jpg`` is ``folder/photo.*``."""
    if folder is None:
        if any(name in NEEDS_MASKS for name in wanted):
            raise UsageError("--metrics pointing/energy need --masks DIR (one mask per image)")
        return {}
    directory = Path(folder)
    if not directory.is_dir():
        raise UsageError(f"--masks {folder}: not a directory")
    by_stem = {
        entry.stem: entry
        for entry in sorted(directory.iterdir())
        if entry.suffix.lower() in IMAGE_SUFFIXES
    }
    return {i: by_stem[path.stem] for i, path in enumerate(paths) if path.stem in by_stem}


def read_mask(path: Path, preprocess: models.Preprocess) -> Tensor:
    """A mask file as ``(H, W)`` bool (nonzero: the object) at the model's input size, through
    its image's resize and crop or padding (nearest)."""
    mask = (io.read_image(path).max(axis=-1) > 0).astype(np.uint8) * 255
    nearest = dataclasses.replace(preprocess, interpolation="nearest")
    placed = nearest.resize_crop(np.repeat(mask[..., None], 3, axis=-1), fill=(0.0, 0.0, 0.0))
    return torch.from_numpy(placed[..., 0] > 127)


def score_batch(
    model: torch.nn.Module,
    inputs: Tensor,
    maps: Tensor,
    target: list[int],
    masks: Tensor | None,
    settings: Settings,
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """``{column: (B,)}`` for the chosen metrics, and the deletion/insertion curves."""
    values: dict[str, Tensor] = {}
    curves: dict[str, Tensor] = {}
    rows = {"batch_size": settings.batch_size}
    for kind in ("deletion", "insertion"):
        if kind in settings.metrics:
            values[kind], curves[kind] = getattr(metrics, kind)(
                model,
                inputs,
                maps,
                target,
                steps=settings.steps,
                baseline=settings.baseline,
                return_curves=True,
                **rows,
            )
    for name in ("drop", "increase"):  # their column is the metric's function
        if name in settings.metrics:
            ((column, _),) = COLUMNS[name]
            values[column] = getattr(metrics, column)(model, inputs, maps, target, **rows)
    if "road" in settings.metrics:  # the mean over the percentiles; seeded noise: reruns agree
        for order in ("morf", "lerf"):
            score = metrics.road(model, inputs, maps, target, order=order, seed=0, **rows)
            values[f"road_{order}"] = score.mean(dim=-1)
    if masks is not None and "pointing" in settings.metrics:
        values["pointing_game"] = metrics.pointing_game(maps, masks, tolerance=settings.tolerance)
    if masks is not None and "energy" in settings.metrics:
        values["energy_pointing_game"] = metrics.energy_pointing_game(maps, masks)
    return {k: v.float().cpu() for k, v in values.items()}, {k: v.cpu() for k, v in curves.items()}


def sanity(
    loaded: models.LoadedModel, job: Job, inputs: Tensor, target: list[int], methods: list[str]
) -> dict[str, list[dict]]:
    """The cascading randomisation test of each method on ``inputs`` (one batch)."""
    build = functools.partial(registry.build, layer=job.layer, settings=job.build_settings)
    return {
        method: metrics.randomization_test(
            functools.partial(build, method), loaded.model, inputs, target, order="cascade", seed=0
        )
        for method in methods
    }

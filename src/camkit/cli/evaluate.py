"""``camkit evaluate``: how faithful each method's maps are on a set of images, from the metrics
of :mod:`camkit.metrics`; writes ``metrics.csv``, ``metrics.json`` (means with 95% bootstrap
intervals), the plots, and a summary table on stdout."""

from __future__ import annotations

import argparse
import csv
import dataclasses
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from torch.nn import functional as F
from torch.utils.data import DataLoader

from camkit import io, metrics, models
from camkit.cli import report
from camkit.cli.common import (
    IMAGE_SUFFIXES,
    UsageError,
    add_run_arguments,
    check_out_dir,
    exit_status,
    find_images,
    load_model,
    methods_help,
    parse_methods,
    parse_target,
    pick_device,
    pick_layer,
    positive_int,
)
from camkit.cli.dataset import ImageFiles, collate
from camkit.cli.manifest import MANIFEST, read
from camkit.cli.pipeline import Job, build_explainer, build_explainers, default_workers
from camkit.core.progress import progress
from camkit.core.targets import select_output
from camkit.errors import CamkitError

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
ROW_FIELDS = ["image", "method", "target", "label", "probability"]
RESULTS = "metrics.csv"
METRICS = (*COLUMNS, "sanity")


@dataclasses.dataclass
class Collected:
    """What the images gave: one row per image and method, the deletion/insertion curves per
    method, the unreadable files, and the first batch (inputs, targets) for the sanity check."""

    rows: list[dict] = dataclasses.field(default_factory=list)
    curves: dict[str, dict[str, list[Tensor]]] = dataclasses.field(default_factory=dict)
    failed: list[str] = dataclasses.field(default_factory=list)
    first_batch: tuple[Tensor, list[int]] | None = None


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
    """``{image index: mask file}``: the mask of ``photo.jpg`` is the image file ``photo.*`` in
    ``folder``."""
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


def read_mask(path: Path, size: tuple[int, int]) -> Tensor:
    """A mask file as ``(H, W)`` bool at the model's input size (squashed like the image):
    nonzero pixels are the object."""
    mask = torch.from_numpy(io.read_image(path)).amax(dim=-1) > 0
    resized = F.interpolate(mask[None, None].float(), size=size, mode="nearest")
    return resized[0, 0] > 0.5


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
            metric = getattr(metrics, kind)
            auc, curve = metric(
                model, inputs, maps, target, steps=settings.steps, baseline=settings.baseline,
                return_curves=True, **rows,
            )  # fmt: skip
            values[kind], curves[kind] = auc, curve
    if "drop" in settings.metrics:
        values["average_drop"] = metrics.average_drop(model, inputs, maps, target, **rows)
    if "increase" in settings.metrics:
        values["increase_in_confidence"] = metrics.increase_in_confidence(
            model, inputs, maps, target, **rows
        )
    if "road" in settings.metrics:  # the mean over the percentiles; seeded noise: reruns agree
        for order in ("morf", "lerf"):
            score = metrics.road(model, inputs, maps, target, order=order, seed=0, **rows)
            values[f"road_{order}"] = score.mean(dim=-1)
    if masks is not None:
        if "pointing" in settings.metrics:
            values["pointing_game"] = metrics.pointing_game(
                maps, masks, tolerance=settings.tolerance
            )
        if "energy" in settings.metrics:
            values["energy_pointing_game"] = metrics.energy_pointing_game(maps, masks)
    return {k: v.float().cpu() for k, v in values.items()}, {k: v.cpu() for k, v in curves.items()}


def read_rows(out: Path) -> list[dict]:
    """The rows of ``OUT/metrics.csv`` (none when there is no such file)."""
    path = out / RESULTS
    if not path.is_file():
        return []
    with open(path, newline="") as file:
        return list(csv.DictReader(file))


def overlay_metrics(records: Sequence[dict], rows: Sequence[dict]) -> dict[str, dict]:
    """``{overlay output: {metric: value}}``: each ``camkit explain`` manifest record matched to
    the ``metrics.csv`` row of its image, method and target, for
    :func:`camkit.cli.report.write_report`.
    """
    by_key = {(row["image"], row["method"], str(row["target"])): row for row in rows}
    found = {}
    for record in records:
        row = by_key.get((record.get("image"), record.get("method"), str(record.get("target"))))
        if row is not None and record.get("output"):
            found[record["output"]] = {
                name: float(value)
                for name, value in row.items()
                if name not in ROW_FIELDS and value not in ("", None)
            }
    return found


def bootstrap(values: Sequence[float], resamples: int = 1000, seed: int = 0) -> dict:
    """Mean and the 95% percentile bootstrap interval of the finite values (NaN: excluded)."""
    finite = np.asarray([v for v in values if math.isfinite(v)], dtype=np.float64)
    if finite.size == 0:
        return {"mean": None, "ci95": [None, None], "n": 0}
    rng = np.random.default_rng(seed)
    means = rng.choice(finite, size=(resamples, finite.size)).mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return {"mean": float(finite.mean()), "ci95": [float(low), float(high)], "n": int(finite.size)}


def sanity(
    loaded: models.LoadedModel, job: Job, inputs: Tensor, target: list[int], methods: list[str]
) -> dict[str, list[dict]]:
    """The cascading randomisation test of each method on ``inputs`` (one batch)."""
    results = {}
    for method in methods:
        factory: Callable = lambda net, m=method: build_explainer(m, net, job)  # noqa: E731
        results[method] = metrics.randomization_test(
            factory, loaded.model, inputs, target, order="cascade", seed=0
        )
    return results


def summary_table(summary: dict[str, dict[str, dict]], columns: list[str]) -> str:
    """Methods x metrics: ``mean [low, high]``."""
    head = ["method", *columns]
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for method, by_metric in summary.items():
        cells = [method]
        for column in columns:
            entry = by_metric[column]
            if entry["mean"] is None:
                cells.append("n/a")
            else:
                low, high = entry["ci95"]
                cells.append(f"{entry['mean']:.3f} [{low:.3f}, {high:.3f}]")
        lines.append(" | ".join(cells))
    return "\n".join(lines)


def run_evaluate(args: argparse.Namespace) -> int:
    """``camkit evaluate``: every method's maps of every readable image, scored."""
    paths = find_images(args.images)
    methods = parse_methods(args.method)
    wanted = parse_metrics(args.metrics)
    mask_files = find_masks(args.masks, paths, wanted)
    out = Path(args.out)
    check_out_dir(out)
    device = pick_device(args.device)
    loaded = load_model(args.model, args.weights)
    classes = parse_target(args.target, loaded.labels)
    if classes is not None and len(classes) > 1:
        raise UsageError("--target: evaluate scores one class per image (or top1)")
    layer = pick_layer(loaded, args.layer, methods)
    job = Job(tuple(methods), layer, None, out, device, batch_size=args.batch_size, quiet=True)
    settings = Settings(
        tuple(n for n in wanted if n != "sanity"), args.steps, args.baseline, args.batch_size,
        args.tolerance,
    )  # fmt: skip
    model = loaded.model.to(device)
    explainers = build_explainers(model, job)
    squash = dataclasses.replace(loaded.preprocess, crop_mode="squash")
    loader = DataLoader(
        ImageFiles(paths, squash, keep_original=False),
        batch_size=args.images_per_batch,
        num_workers=default_workers() if args.workers is None else args.workers,
        collate_fn=collate,
    )
    collected = Collected(curves={method: {} for method in methods})
    with progress(len(paths), "evaluate", "image", enabled=not args.quiet) as shown:
        for batch in loader:
            for _, path, reason in batch.failures:
                shown.write(f"camkit: cannot read {path}: {reason}", file=sys.stderr)
                collected.failed.append(path)
            if batch.inputs is None:
                shown.update(len(batch))
                continue
            inputs = batch.inputs.to(device)
            with torch.inference_mode():
                probabilities = select_output(model(inputs)).float().softmax(dim=-1).cpu()
            target = (
                probabilities.argmax(dim=-1).tolist() if classes is None else classes * len(inputs)
            )
            masks = None
            if mask_files:
                size = tuple(inputs.shape[-2:])
                masks = torch.stack(
                    [
                        read_mask(mask_files[i], size)
                        if i in mask_files
                        else torch.zeros(size, dtype=torch.bool)  # no mask: NaN, never a hit
                        for i in batch.indices
                    ]
                ).to(device)
            collected.first_batch = collected.first_batch or (inputs, target)
            scored = {}
            for method in methods:
                try:
                    heat, _ = explainers[method].heatmaps(inputs, target)
                    scored[method], method_curves = score_batch(
                        model, inputs, heat[:, 0].to(device), target, masks, settings
                    )
                except CamkitError as error:
                    raise UsageError(f"--method {method}: {error}") from None
                for kind, curve in method_curves.items():
                    collected.curves[method].setdefault(kind, []).append(curve)
            for row, index in enumerate(batch.indices):  # rows: image by image, then method
                image = {
                    "image": str(paths[index]),
                    "target": target[row],
                    "label": loaded.labels[target[row]],
                    "probability": round(float(probabilities[row, target[row]]), 6),
                }
                for method, values in scored.items():
                    collected.rows.append(
                        image
                        | {"method": method}
                        | {name: float(value[row]) for name, value in values.items()}
                    )
            shown.update(len(batch))
    return write_results(args, collected, loaded, job, wanted)


def write_results(
    args: argparse.Namespace,
    collected: Collected,
    loaded: models.LoadedModel,
    job: Job,
    wanted: tuple[str, ...],
) -> int:
    """Write metrics.csv, metrics.json and the plots; print the summary."""
    out, rows, failed, methods = job.out, collected.rows, collected.failed, list(job.methods)
    out.mkdir(parents=True, exist_ok=True)
    columns = [
        column
        for name in wanted
        if name in COLUMNS and (name not in NEEDS_MASKS or args.masks)
        for column, _ in COLUMNS[name]
    ]
    with open(out / RESULTS, "w", newline="") as file:
        writer = csv.DictWriter(file, [*ROW_FIELDS, *columns])
        writer.writeheader()
        writer.writerows(rows)
    summary = {
        method: {
            column: bootstrap([row[column] for row in rows if row["method"] == method])
            for column in columns
        }
        for method in methods
    }
    result = {
        "model": loaded.name,
        "layer": job.layer,
        "images": len({row["image"] for row in rows}),
        "unreadable": failed,
        "settings": {"steps": args.steps, "baseline": args.baseline, "tolerance": args.tolerance},
        "higher_is_better": {c: better for n in COLUMNS for c, better in COLUMNS[n]},
        "methods": summary,
    }
    from camkit.metrics import plots  # here: matplotlib only when a run gets this far

    figures = []
    for kind in ("deletion", "insertion"):
        by_method = {m: torch.cat(c[kind]) for m, c in collected.curves.items() if c.get(kind)}
        if by_method:
            figures.append(f"{kind}.png")
            plots.plot_curves(by_method, kind, path=out / figures[-1])
    if "sanity" in wanted and collected.first_batch is not None:
        result["sanity"] = sanity(loaded, job, *collected.first_batch, methods)
        result["sanity_images"] = len(collected.first_batch[1])
    io.save_json(out / "metrics.json", result)
    if columns:
        print(summary_table(summary, columns))
    for method, cascade in result.get("sanity", {}).items():
        steps = ", ".join(f"{entry['layer']} {entry['spearman']:.2f}" for entry in cascade)
        print(f"sanity ({method}, Spearman to the original, cascading from the top): {steps}")
    print(f"wrote {RESULTS}, metrics.json{''.join(', ' + f for f in figures)} to {out}")
    if (out / MANIFEST).is_file():  # `camkit explain` wrote here: its page gets the metrics
        explained = read(out / MANIFEST)
        records = explained["records"]
        colormap = (explained.get("settings") or {}).get("colormap", "jet")
        metrics_of = overlay_metrics(records, rows)
        page = report.write_report(out, records, metrics=metrics_of, colormap=colormap)
        print(f"added the metrics of {len(metrics_of)} overlay(s) to {page}")
    return exit_status(failed)


def add_parser(commands: argparse._SubParsersAction) -> None:
    """The ``evaluate`` subcommand."""
    evaluate = commands.add_parser(
        "evaluate",
        help="score how faithful each method's maps are (deletion, insertion, ROAD, ...)",
        description="Score each method's maps of each image with camkit.metrics: one row per "
        "image and method in metrics.csv, means with 95% bootstrap intervals in metrics.json.",
        epilog="metrics: deletion, insertion (Petsiuk et al. 2018), drop, increase "
        "(Chattopadhay et al. 2018), road (Rong et al. 2022), pointing, energy (need --masks: "
        "Zhang et al. 2016, Wang et al. 2020), sanity (cascading model randomisation, Adebayo "
        "et al. 2018, on the first batch of images).\n\n"
        f"{methods_help()}\n\n"
        "exit status: 0 ok, 1 some images unreadable (the others scored), 2 usage error",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_run_arguments(evaluate, what="scored")
    evaluate.add_argument(
        "--metrics",
        default="deletion,insertion,drop,increase",
        help=f"comma-separated from {', '.join(METRICS)} (default %(default)s)",
    )
    evaluate.add_argument(
        "--masks",
        metavar="DIR",
        help="object masks for pointing/energy: DIR/<image stem>.<image suffix>, nonzero pixels "
        "are the object",
    )
    evaluate.add_argument(
        "--steps",
        type=positive_int,
        default=50,
        metavar="N",
        help="deletion/insertion: pixels removed or added in N steps (default %(default)s)",
    )
    evaluate.add_argument(
        "--baseline",
        choices=("blur", "zero", "mean"),
        default="blur",
        help="deletion/insertion: what replaces a removed pixel (default %(default)s)",
    )
    evaluate.add_argument(
        "--tolerance",
        type=int,
        default=15,
        metavar="PIXELS",
        help="pointing game: a hit within this many pixels of the object (default %(default)s)",
    )
    evaluate.set_defaults(run=run_evaluate)

"""``camkit evaluate``'s ``metrics.csv`` (a row per image and method), ``metrics.json`` (means,
95% bootstrap intervals), plots and summary; the rows read back for an explain run's overlays."""

from __future__ import annotations

import argparse
import csv
import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from camkit import models
from camkit.cli import report
from camkit.cli.common import exit_status
from camkit.cli.pipeline import Job
from camkit.cli.scoring import COLUMNS, NEEDS_MASKS, sanity
from camkit.runs.manifest import MANIFEST, read
from camkit.runs.metrics import METRICS_FILE, MetricsRecord, write_metrics

ROW_FIELDS = ["image", "method", "target", "label", "probability"]
RESULTS = "metrics.csv"


@dataclasses.dataclass
class Collected:
    """What the images gave: one row per image and method, the deletion/insertion curves per
    method, the unreadable files, and the first batch (inputs, targets) for the sanity check."""

    rows: list[dict] = dataclasses.field(default_factory=list)
    curves: dict[str, dict[str, list[Tensor]]] = dataclasses.field(default_factory=dict)
    failed: list[str] = dataclasses.field(default_factory=list)
    first_batch: tuple[Tensor, list[int]] | None = None


def read_rows(out: Path) -> list[dict]:
    """The rows of ``OUT/metrics.csv`` (none when there is no such file)."""
    path = out / RESULTS
    if not path.is_file():
        return []
    with open(path, newline="") as file:
        return list(csv.DictReader(file))


def overlay_metrics(records: Sequence[dict], rows: Sequence[dict]) -> dict[str, dict]:
    """``{overlay output: {metric: value}}``: each ``camkit explain`` record matched to the
    ``metrics.csv`` row of its image, method and target."""
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


def summary_table(summary: dict[str, dict[str, dict]], columns: list[str]) -> str:
    """Methods x metrics: ``mean [low, high]``."""

    def cell(entry: dict) -> str:
        if entry["mean"] is None:
            return "n/a"
        return "{:.3f} [{:.3f}, {:.3f}]".format(entry["mean"], *entry["ci95"])

    head = ["method", *columns]
    rows = [[method, *(cell(by[c]) for c in columns)] for method, by in summary.items()]
    return "\n".join(" | ".join(row) for row in [head, ["---"] * len(head), *rows])


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
    result = MetricsRecord(
        model=loaded.name,
        layer=job.layer,
        images=len({row["image"] for row in rows}),
        unreadable=failed,
        settings={"steps": args.steps, "baseline": args.baseline, "tolerance": args.tolerance},
        higher_is_better={c: better for n in COLUMNS for c, better in COLUMNS[n]},
        methods=summary,
    )
    from camkit.metrics import plots  # here: matplotlib only when a run gets this far

    figures = []
    for kind in ("deletion", "insertion"):
        by_method = {m: torch.cat(c[kind]) for m, c in collected.curves.items() if c.get(kind)}
        if by_method:
            figures.append(f"{kind}.png")
            plots.plot_curves(by_method, kind, path=out / figures[-1])
    if "sanity" in wanted and collected.first_batch is not None:
        result.sanity = sanity(loaded, job, *collected.first_batch, methods)
        result.sanity_images = len(collected.first_batch[1])
    write_metrics(out, result)
    if columns:
        print(summary_table(summary, columns))
    for method, cascade in (result.sanity or {}).items():
        steps = ", ".join(f"{entry['layer']} {entry['spearman']:.2f}" for entry in cascade)
        print(f"sanity ({method}, Spearman to the original, cascading from the top): {steps}")
    print(f"wrote {RESULTS}, {METRICS_FILE}{''.join(', ' + f for f in figures)} to {out}")
    if (out / MANIFEST).is_file():  # `camkit explain` wrote here: its page gets the metrics
        explained = read(out / MANIFEST)
        records = explained["records"]
        colormap = (explained.get("settings") or {}).get("colormap", "jet")
        metrics_of = overlay_metrics(records, rows)
        page = report.write_report(out, records, metrics=metrics_of, colormap=colormap)
        print(f"added the metrics of {len(metrics_of)} overlay(s) to {page}")
    return exit_status(failed)

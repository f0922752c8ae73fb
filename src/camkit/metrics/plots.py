"""The metrics' figures: deletion / insertion curves labelled with their AUC, and the
randomisation sanity check (maps per randomised block, similarity against depth)."""

from __future__ import annotations

import io
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from camkit.errors import ArgumentError, InputError
from camkit.io import write_atomic
from camkit.metrics.sanity import checked_similarity

if TYPE_CHECKING:
    from matplotlib.figure import Figure

KINDS = ("deletion", "insertion")


def plot_curves(
    curves_by_method: Mapping[str, Tensor], kind: str, path: str | os.PathLike[str] | None = None
) -> Figure:
    """Curves from ``deletion``/``insertion(..., return_curves=True)`` -> a matplotlib Figure
    (no pyplot), saved to ``path`` when given (the format by its suffix).

    ``curves_by_method``: ``{name: curves}``, each ``(steps + 1,)`` or ``(B, steps + 1)`` (their
    mean drawn, the legend giving the mean AUC); ``kind``: ``"deletion"`` or ``"insertion"``.
    """
    if kind not in KINDS:
        raise ArgumentError(f"kind must be one of {KINDS}, got {kind!r}")
    if not curves_by_method:
        raise InputError("curves_by_method is empty: give {name: curves}")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6, 4.5), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots()
    for name, curves in curves_by_method.items():
        if not isinstance(curves, Tensor) or curves.ndim not in (1, 2) or curves.shape[-1] < 2:
            got = tuple(curves.shape) if isinstance(curves, Tensor) else type(curves).__name__
            raise InputError(
                f"curves of {name!r} must be (steps + 1,) or (B, steps + 1), got {got}"
            )
        curves = curves.detach().float().cpu().reshape(-1, curves.shape[-1])
        steps = curves.shape[1] - 1
        auc = torch.trapezoid(curves, dx=1.0 / steps, dim=1).mean().item()
        x = torch.linspace(0, 1, steps + 1)
        axes.plot(x.numpy(), curves.mean(dim=0).numpy(), label=f"{name} (AUC {auc:.3f})")
    better = "lower" if kind == "deletion" else "higher"
    verb = "removed" if kind == "deletion" else "inserted"
    axes.set(xlabel=f"share of pixels {verb}", ylabel="target probability", xlim=(0, 1))
    axes.set_ylim(bottom=0)
    axes.set_title(f"{kind} curves ({better} AUC is better)")
    axes.legend()
    if path is not None:
        figure.savefig(os.fspath(path))
    return figure


def plot_randomization(
    results: Sequence[Mapping[str, Any]] | Mapping[str, Sequence[Mapping[str, Any]]],
    maps_by_layer: Mapping[str, Tensor] | Mapping[str, Mapping[str, Tensor]],
    path: str | os.PathLike[str] | None = None,
    *,
    sample: int = 0,
    image: object = None,
    similarity: str | Sequence[str] | None = None,
) -> Figure:
    """A row of maps (original, then each randomised block) with their similarities, and the
    similarity against the depth of randomisation -> a matplotlib Figure (no pyplot), saved as
    PNG to ``path`` when given.

    ``results``/``maps_by_layer``: those of one :func:`randomization_test` call
    (``return_maps=True``), or ``{method name: ...}`` of several (a row and curves each).
    ``sample``: the image of the batch shown (its values where ``per_sample=True``); ``image``:
    that photo ``(H, W, 3)``, drawn first in each row; ``similarity``: those drawn (default:
    all reported).
    """
    from matplotlib.figure import Figure

    from camkit.io import to_rgb_uint8

    several = isinstance(results, Mapping)
    runs = dict(results) if several else {"": list(results)}
    all_maps = dict(maps_by_layer) if several else {"": maps_by_layer}
    if set(runs) != set(all_maps):
        raise ArgumentError(
            f"results and maps name different methods: {list(runs)} vs {list(all_maps)}"
        )
    first = next(iter(runs.values()))
    if not first:
        raise ArgumentError("results is empty: nothing to plot")
    reported = [k for k in first[0] if k != "layer"]
    shown = reported if similarity is None else checked_similarity(similarity, with_abs=False)
    if missing := [k for k in shown if k not in reported]:
        raise ArgumentError(f"similarity {missing[0]!r} is not in the results ({reported})")
    short = {"spearman": "ρ", "spearman_abs": "|ρ|", "ssim": "SSIM", "hog": "HOG"}

    def value(row: Mapping[str, Any], key: str) -> float:
        v = row[key]
        return float(v[sample]) if isinstance(v, list) else float(v)

    columns = len(first) + 1 + (image is not None)
    figure = Figure(figsize=(1.7 * columns, 1.9 * len(runs) + 3.0), layout="constrained")
    grid = figure.add_gridspec(len(runs) + 1, columns, height_ratios=[1.0] * len(runs) + [1.5])
    for row_index, (method, rows) in enumerate(runs.items()):
        maps = all_maps[method]
        column = int(image is not None)
        if image is not None:
            ax = figure.add_subplot(grid[row_index, 0])
            ax.imshow(to_rgb_uint8(image))
            ax.set_axis_off()
            ax.set_title(method, fontsize=9)
        panels = [("original", None)] + [(row["layer"], row) for row in rows]
        for offset, (name, row) in enumerate(panels):
            if name not in maps:
                raise ArgumentError(f"no map for {name!r} in maps_by_layer ({list(maps)})")
            ax = figure.add_subplot(grid[row_index, column + offset])
            ax.imshow(maps[name][sample].numpy(), cmap="jet", vmin=0, vmax=1)
            ax.set(xticks=[], yticks=[])
            ax.set_title(name, fontsize=8)
            if offset == 0 and image is None and method:
                ax.set_ylabel(method, fontsize=9)
            if row is not None:
                text = "\n".join(f"{short[k]} {value(row, k):.2f}" for k in shown)
                ax.set_xlabel(text, fontsize=7)
    curve = figure.add_subplot(grid[len(runs), :])
    styles = ("-", "--", ":", "-.")
    for colour, (method, rows) in enumerate(runs.items()):
        for key, style in zip(shown, styles, strict=False):
            ys = [1.0] + [value(row, key) for row in rows]
            label = f"{method} {short[key]}".strip()
            curve.plot(range(len(ys)), ys, f"C{colour}", linestyle=style, marker="o", label=label)
    labels = ["original"] + [row["layer"] for row in first]
    curve.set_xticks(range(len(labels)), labels, rotation=45, ha="right", fontsize=8)
    curve.set_ylabel("similarity to the original map")
    curve.set_xlabel("randomised block, top first (cascade: every block up to it)")
    curve.axhline(0, color="grey", linewidth=0.5)
    curve.set_ylim(min(-0.2, curve.get_ylim()[0]), 1.05)
    curve.legend(fontsize=7, ncol=max(1, math.ceil(len(runs) * len(shown) / 4)))
    if path is not None:
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=110)
        write_atomic(Path(path), buffer.getvalue())
    return figure

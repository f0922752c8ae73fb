"""Deletion / insertion curves in one figure, each labelled with its AUC."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from camkit.errors import ArgumentError, InputError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

KINDS = ("deletion", "insertion")


def plot_curves(
    curves_by_method: Mapping[str, Tensor], kind: str, path: str | os.PathLike[str] | None = None
) -> Figure:
    """Curves from ``deletion``/``insertion(..., return_curves=True)`` -> a matplotlib Figure.

    ``curves_by_method``: ``{name: curves}``, each ``(steps + 1,)`` or ``(B, steps + 1)`` (the
    mean over the images is drawn); the legend gives each AUC (the trapezoid over ``x = k /
    steps``, the mean of the images' AUCs). ``kind`` is ``"deletion"`` (lower is better) or
    ``"insertion"`` (higher is better). Drawn with the Agg canvas, no pyplot and no global
    matplotlib state; saved to ``path`` when given (any format matplotlib knows by suffix).
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
    axes.set_xlabel(f"share of pixels {verb}")
    axes.set_ylabel("target probability")
    axes.set_xlim(0, 1)
    axes.set_ylim(bottom=0)
    axes.set_title(f"{kind} curves ({better} AUC is better)")
    axes.legend()
    if path is not None:
        figure.savefig(os.fspath(path))
    return figure

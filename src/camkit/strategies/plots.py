"""Pictures of the strategies of a class: prototypes, montages of members, the eigenvalue
spectrum with its gap, the 2-D embedding coloured by cluster; and how a notebook shows them
(``_repr_png_`` and ``_repr_html_`` of :mod:`camkit.strategies.results`: a prototype as a PNG,
clusters as an HTML table with their prototypes inline; nothing fetched, nothing written)."""

from __future__ import annotations

import base64
import html
from collections.abc import Iterable, Sequence
from typing import Any

import cv2
import numpy as np
from matplotlib.figure import Figure

from camkit import io, viz

# the result types of camkit.strategies.results, which imports this module for its rich displays:
# named here by what they are, not imported (no import circle)
Strategies = Any  # a ClassStrategies
ClusterResult = Any  # a Cluster


def prototype_picture(prototype: np.ndarray, side: int = 128, colormap: str = "jet") -> np.ndarray:
    """A cluster's mean map ``(gh, gw)`` -> ``side x side`` RGB uint8, scaled to its own
    maximum, blocky (nearest) so the grid cells stay visible."""
    peak = float(prototype.max())
    unit = prototype / peak if peak > 0 else np.zeros_like(prototype)
    unit = cv2.resize(unit.astype(np.float32), (side, side), interpolation=cv2.INTER_NEAREST)
    return viz.overlay(np.zeros((side, side, 3), np.uint8), unit, alpha=1.0, colormap=colormap)


def montage(pictures: Sequence[np.ndarray], columns: int = 8, side: int = 96) -> np.ndarray:
    """RGB uint8 pictures side by side (``columns`` a row, each fitted in ``side x side`` on a
    white tile) -> one RGB uint8 picture."""
    if not pictures:
        return np.full((side, side, 3), 255, np.uint8)
    rows = -(-len(pictures) // columns)
    sheet = np.full((rows * (side + 2), min(columns, len(pictures)) * (side + 2), 3), 255, np.uint8)
    for k, picture in enumerate(pictures):
        h, w = picture.shape[:2]
        scale = side / max(h, w)
        size = (max(1, round(w * scale)), max(1, round(h * scale)))
        small = cv2.resize(picture, size, interpolation=cv2.INTER_AREA)
        top, left = (k // columns) * (side + 2) + 1, (k % columns) * (side + 2) + 1
        sheet[top : top + size[1], left : left + size[0]] = small
    return sheet


def eigengap_figure(found: Strategies, title: str | None = None) -> Figure:
    """The smallest eigenvalues of the normalised Laplacian, the suggested ``k`` marked."""
    figure = Figure(figsize=(4.2, 3.0), layout="constrained")
    ax = figure.subplots()
    values = found.eigenvalues
    ax.plot(np.arange(1, len(values) + 1), values, "o-", color="#2457c5")
    k = found.suggested_k
    if k < len(values):
        ax.axvspan(k + 0.1, k + 0.9, color="#f4a261", alpha=0.35, label=f"largest gap: k = {k}")
        ax.legend(loc="lower right", fontsize=8)
    ax.set(xlabel="eigenvalue index", ylabel="eigenvalue of the normalised Laplacian")
    ax.set_title(title or "eigengap", fontsize=10)
    return figure


def embedding_figure(found: Strategies, title: str | None = None) -> Figure:
    """The 2-D embedding, one colour per cluster (noise grey)."""
    figure = Figure(figsize=(4.2, 3.6), layout="constrained")
    ax = figure.subplots()
    if found.embedding is not None:
        position = {int(index): k for k, index in enumerate(found.indices)}
        labels = found.labels[[position[int(i)] for i in found.embedding_index]]
        for cluster in sorted(set(labels.tolist())):
            points = found.embedding[labels == cluster]
            name = "noise" if cluster < 0 else f"cluster {cluster}"
            color = "#999999" if cluster < 0 else f"C{cluster % 10}"
            ax.scatter(points[:, 0], points[:, 1], s=8, color=color, label=name)
        ax.legend(fontsize=7, markerscale=1.5)
    ax.set(xticks=[], yticks=[])
    ax.set_title(title or "2-D embedding", fontsize=10)
    return figure


def save_figure(figure: Figure, path: str) -> None:
    """A matplotlib figure as a PNG file."""
    figure.savefig(path, dpi=110)


def prototype_png(cluster: ClusterResult, side: int = 96) -> bytes:
    """The cluster's prototype (its mean pooled map) as PNG bytes."""
    return io.encode_image(prototype_picture(cluster.prototype, side), "png")


def _number(value: float | None, digits: int = 2) -> str:
    return "–" if value is None or not np.isfinite(value) else f"{value:.{digits}f}"


def _row(class_id: int | None, cluster: ClusterResult) -> str:
    picture = base64.b64encode(prototype_png(cluster, 48)).decode("ascii")
    return (
        f"<tr><td>{html.escape(str(class_id))}</td><td>{cluster.id}</td>"
        f'<td><img src="data:image/png;base64,{picture}" alt="prototype" width="48"></td>'
        f"<td>{cluster.size}</td><td>{_number(cluster.suspiciousness, 3)}</td>"
        f"<td>{_number(cluster.confidence)}</td><td>{_number(cluster.accuracy)}</td></tr>"
    )


def table(classes: Iterable[Strategies], skipped: dict[int, str] | None = None) -> str:
    """The clusters of ``classes`` as an HTML table, the most suspicious of a class first (and
    the classes skipped, with why)."""
    head = (
        "<tr><th>class</th><th>cluster</th><th>prototype</th><th>size</th>"
        "<th>suspiciousness</th><th>confidence</th><th>accuracy</th></tr>"
    )
    rows = "".join(_row(c.class_id, cluster) for c in classes for cluster in c.by_suspiciousness())
    listed = ", ".join(f"{c} ({html.escape(why)})" for c, why in (skipped or {}).items())
    note = f"<p>skipped: {listed}</p>" if listed else ""
    return f"<table>{head}{rows}</table>{note}"

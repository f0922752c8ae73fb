"""How a notebook shows the strategies: a cluster's prototype as a PNG, a class's or every
class's clusters as an HTML table with their prototypes inline (``_repr_png_`` and
``_repr_html_`` of :mod:`camkit.strategies.results`); nothing fetched, nothing written."""

from __future__ import annotations

import base64
import html
from collections.abc import Iterable

import numpy as np

from camkit import io
from camkit.strategies.plots import prototype_picture
from camkit.strategies.results import ClassStrategies, Cluster


def prototype_png(cluster: Cluster, side: int = 96) -> bytes:
    """The cluster's prototype (its mean pooled map) as PNG bytes."""
    return io.encode_image(prototype_picture(cluster.prototype, side), "png")


def _number(value: float | None, digits: int = 2) -> str:
    return "–" if value is None or not np.isfinite(value) else f"{value:.{digits}f}"


def class_rows(found: ClassStrategies) -> Iterable[str]:
    """One table row per cluster, the most suspicious first."""
    for cluster in found.by_suspiciousness():
        picture = base64.b64encode(prototype_png(cluster, 48)).decode("ascii")
        yield (
            f"<tr><td>{html.escape(str(found.class_id))}</td><td>{cluster.id}</td>"
            f'<td><img src="data:image/png;base64,{picture}" alt="prototype" width="48"></td>'
            f"<td>{cluster.size}</td><td>{_number(cluster.suspiciousness, 3)}</td>"
            f"<td>{_number(cluster.confidence)}</td><td>{_number(cluster.accuracy)}</td></tr>"
        )


def table(classes: Iterable[ClassStrategies], skipped: dict[int, str] | None = None) -> str:
    """The clusters of ``classes`` as an HTML table (and the classes skipped, with why)."""
    head = (
        "<tr><th>class</th><th>cluster</th><th>prototype</th><th>size</th>"
        "<th>suspiciousness</th><th>confidence</th><th>accuracy</th></tr>"
    )
    rows = "".join(row for found in classes for row in class_rows(found))
    note = ""
    if skipped:
        listed = ", ".join(f"{c} ({html.escape(why)})" for c, why in skipped.items())
        note = f"<p>skipped: {listed}</p>"
    return f"<table>{head}{rows}</table>{note}"

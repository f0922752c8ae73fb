"""``OUT/index.html``: one self-contained page (``camkit/cli/page/report.{html,css,js}``
inlined, nothing fetched) to browse an explained dataset, responsive for 10,000 images (one JSON
blob, cards built 60 at a time on scroll, lazy thumbnails). Manifest strings reach the page as
JSON and are set with ``textContent``, never as HTML."""

from __future__ import annotations

import datetime
import html
import json
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from camkit import io as cio
from camkit.cli.report_files import (
    SIGNED_COLORMAP,
    THUMB_SIDE,
    THUMBS_DIR,
    image_url,
    make_thumbnails,
    original_thumb_name,
    overlay_thumb_name,
    raw_map_name,
    save_thumbnails,
    url_path,
)
from camkit.errors import ArgumentError
from camkit.runs.concepts import atlas_data, read_concepts
from camkit.runs.strategies import StrategiesRecord, strategies_data
from camkit.viz.colour import colormap_lut

__all__ = ["original_thumb_name", "save_thumbnails", "write_report"]

_COLORBAR_STOPS = 17


def _gradient(colormap: str) -> str:
    """A CSS ``linear-gradient`` (left to right) of the colormap."""
    levels = np.round(np.linspace(0, 255, _COLORBAR_STOPS)).astype(int)
    stops = [
        f"rgb({r},{g},{b}) {100 * k / (_COLORBAR_STOPS - 1):.1f}%"
        for k, (r, g, b) in enumerate(colormap_lut(colormap)[levels].tolist())
    ]
    return f"linear-gradient(to right, {', '.join(stops)})"


_KNOWN_KEYS = frozenset(
    {"image", "output", "method", "layer", "target", "label", "probability", "top5", "model"}
    | {"size", "raw", "error", "conservation", "tokens", "animation", "frame_plot"}
)


def _conservation_facts(row: Mapping[str, Any]) -> dict[str, Any]:
    """An LRP record's conservation as the detail view's facts."""
    found = row.get("conservation")
    if not isinstance(found, Mapping):
        return {}
    facts = {"score share at the input": found.get("input")}
    lost = found.get("lost_most")
    if isinstance(lost, Mapping) and isinstance(lost.get("between"), list):
        above, stage = (str(name) for name in lost["between"][:2])
        facts["loses most"] = f"{above} → {stage} ({lost.get('share')} of the score)"
    return facts


def _url(row: Mapping[str, Any], key: str) -> str | None:
    """The URL of the file ``row[key]`` names, relative to the output folder (None: no file)."""
    return url_path(str(row[key])) if row.get(key) else None


def _video_data(row: Mapping[str, Any]) -> dict[str, Any] | None:
    """A video record's MP4, GIF, importance plot and values; None for an image's."""
    if "frame_importance" not in row:
        return None
    return {
        "mp4": _url(row, "output"),
        "gif": _url(row, "animation"),
        "plot": _url(row, "frame_plot"),
        "importance": [float(v) for v in row["frame_importance"]],
        "fps": row.get("fps"),
    }


def _scalars(values: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Numbers, strings, booleans of a mapping (non-finite numbers as strings); None if empty."""
    if not values:
        return None
    kept: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, (bool, str)) or value is None:
            kept[str(key)] = value
        elif isinstance(value, (int, float, np.integer, np.floating)):
            number = value.item() if isinstance(value, np.generic) else value
            kept[str(key)] = number if math.isfinite(number) else str(number)
    return kept or None


def _group(records: Iterable[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    grouped: dict[str, list[Mapping[str, Any]]] = {}
    for index, record in enumerate(records):
        if not isinstance(record, Mapping) or "image" not in record:
            raise ArgumentError(f"manifest row {index} has no 'image' field: {record!r:.200}")
        grouped.setdefault(str(record["image"]), []).append(record)
    return grouped


def _page_data(
    out: Path,
    grouped: Mapping[str, Sequence[Mapping[str, Any]]],
    metrics: Mapping[str, Mapping[str, Any]],
    raw_scales: Mapping[str, dict[str, Any]],
) -> list[dict[str, Any]]:
    resolved = out.resolve()
    folder = out / THUMBS_DIR
    made = {f"{THUMBS_DIR}/{name}" for name in os.listdir(folder)} if folder.is_dir() else set()
    images = []
    for image, rows in grouped.items():
        first = rows[0]
        thumb = original_thumb_name(image)
        extra = {k for row in rows for k in row if k not in _KNOWN_KEYS}
        shared = {k for k in extra if all(k in row and row[k] == first.get(k) for row in rows)}
        overlays = []
        for row in rows:
            if "error" in row or not row.get("output"):
                continue
            output = str(row["output"])
            clip = _video_data(row)
            if clip is not None:  # the GIF animates in the card; a long video shows its plot
                small = clip["gif"] or clip["plot"]
            else:
                made_thumb = overlay_thumb_name(output)
                small = url_path(made_thumb if made_thumb in made else output)
            raw = raw_map_name(str(row["raw"])) if row.get("raw") else None
            overlays.append(
                {
                    "method": str(row.get("method")),
                    "layer": row.get("layer"),
                    "target": row.get("target"),
                    "label": str(row.get("label")),
                    "p": row.get("probability"),
                    "src": url_path(output),
                    "thumb": small,
                    "video": clip,
                    "raw": {"src": url_path(raw), "file": _url(row, "raw")} | raw_scales[raw]
                    if raw in raw_scales
                    else None,
                    "metrics": _scalars(metrics.get(output)),
                    "tokens": _url(row, "tokens"),
                    "info": _scalars(
                        {k: v for k, v in row.items() if k in extra - shared}
                        | _conservation_facts(row)
                    ),
                }
            )
        images.append(
            {
                "name": Path(image).name,
                "path": image,
                "src": image_url(image, resolved),
                "thumb": url_path(thumb) if thumb in made else None,
                "error": next((str(r["error"]) for r in rows if "error" in r), None),
                "size": first.get("size"),
                "model": first.get("model"),
                "top5": [
                    [entry.get("index"), str(entry.get("label")), entry.get("probability")]
                    for entry in first.get("top5") or []
                ],
                "metrics": _scalars(metrics.get(image)),
                "info": _scalars({k: v for k, v in first.items() if k in shared}),
                "overlays": overlays,
            }
        )
    return images


def _asset(name: str) -> str:
    """A file of the page (``camkit/cli/page/report.{html,css,js}``) as text."""
    return resources.files("camkit").joinpath("cli", "page", name).read_text("utf-8")


def _json_for_script(value: object) -> str:
    """JSON that is safe inside ``<script type="application/json">`` (no ``</script>``)."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text.translate({ord(c): f"\\u{ord(c):04x}" for c in "<>&\u2028\u2029"})


def write_report(
    out_dir: str | os.PathLike[str],
    records: Sequence[Mapping[str, Any]],
    *,
    metrics: Mapping[str, Mapping[str, Any]] | None = None,
    title: str = "camkit report",
    colormap: str = "jet",
    thumb_side: int = THUMB_SIDE,
    workers: int | None = None,
    strategies: StrategiesRecord | None = None,
    strategies_dir: str | os.PathLike[str] | None = None,
) -> Path:
    """Write ``OUT/index.html``, a static page to browse the explained images -> its path.

    ``records``: ``camkit explain``'s manifest rows (``output``, ``raw``, ``tokens`` relative to
    ``out_dir``; ``image`` and ``error`` for an unreadable file); other scalar fields show in the
    detail view. ``metrics``: ``{metric: number}`` by ``output`` or by ``image`` (cards, sort
    keys). ``colormap``: the overlays'. Missing or stale thumbnails (side ``thumb_side``) and
    raw-map pictures are made in ``workers`` threads. ``strategies`` (``strategies.json``'s
    record, files in ``strategies_dir``) adds the strategies view; ``camkit concepts`` results in
    ``OUT`` add the concept atlas.
    """
    import camkit

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    grouped = _group(records)
    colormap_lut(colormap)  # an unknown name fails before any file is made
    workers = min(4, os.cpu_count() or 1) if workers is None else workers
    scales = make_thumbnails(out, grouped, colormap, thumb_side, workers)
    concepts = read_concepts(out)
    images = _page_data(out, grouped, dict(metrics or {}), scales)
    methods = list(dict.fromkeys(o["method"] for image in images for o in image["overlays"]))
    metric_names = sorted(
        {
            name
            for image in images
            for values in [image["metrics"], *(o["metrics"] for o in image["overlays"])]
            if values
            for name, value in values.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool)
        }
    )
    data = {
        "title": title,
        "generated": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "camkit": camkit.__version__,
        "colormap": colormap,
        "gradients": {colormap: _gradient(colormap), SIGNED_COLORMAP: _gradient(SIGNED_COLORMAP)},
        "methods": methods,
        "metricNames": metric_names,
        "images": images,
        "strategies": None
        if strategies is None
        else strategies_data(out, images, strategies, Path(strategies_dir or out)),
        "concepts": None if concepts is None else atlas_data(out, concepts, out),
    }
    parts = {
        "TITLE": html.escape(title),
        "STYLE": _asset("report.css"),
        "SCRIPT": _asset("report.js"),
        "DATA": _json_for_script(data),
    }
    page = re.sub(
        r"\{\{(TITLE|STYLE|SCRIPT|DATA)\}\}", lambda m: parts[m[1]], _asset("report.html")
    )
    return cio.write_atomic(out / "index.html", page.encode("utf-8"))

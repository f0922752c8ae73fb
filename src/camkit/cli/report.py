"""A static HTML page to browse an explained dataset: ``OUT/index.html``.

:func:`write_report` turns the manifest rows of ``camkit explain`` into one self-contained page
(inline CSS and JavaScript, no server, no CDN, nothing fetched from the network) that opens from
the file system: a gallery of every image with its overlays side by side per method, the
predicted top-5, the target, metrics when given; sorted by confidence (or name, or a metric),
filtered by predicted class, method and file name; a detail view per image with the original,
the full-size overlays, the raw map and its colour bar.

The page is ``camkit/data/report.html`` with ``report.css`` and ``report.js`` inlined.
It stays responsive for 10,000 images: the data is one JSON blob rendered by the page's
script, cards are built 60 at a time as the reader scrolls, and thumbnails (small JPEGs in
``OUT/thumbs/``) are loaded lazily (``loading="lazy"``). Every string from the manifest reaches
the page as JSON text and is put into the document with ``textContent``, never as HTML.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import html
import json
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np

from camkit import io as cio
from camkit import viz
from camkit.errors import ArgumentError

__all__ = [
    "THUMB_SIDE",
    "THUMBS_DIR",
    "original_thumb_name",
    "overlay_thumb_name",
    "raw_map_name",
    "save_thumbnails",
    "write_report",
]

THUMB_SIDE = 256
"""Longer side of the thumbnails, in pixels."""
THUMBS_DIR = "thumbs"
"""Folder of the thumbnails and raw-map pictures, inside the output folder."""
_THUMB_QUALITY = 82
_SIGNED_COLORMAP = "bwr"
_SIGNED_PERCENTILE = 99.5  # signed raw maps are drawn at +-this percentile of |values|
_COLORBAR_STOPS = 17


# ----------------------------------------------------------------------------- file names


def original_thumb_name(image: str) -> str:
    """Thumbnail of an input image, relative to the output folder: ``thumbs/<hash>.jpg``.

    Named by a hash of the image path as the manifest gives it (two inputs may share a name).
    """
    digest = hashlib.sha1(image.encode("utf-8", "surrogatepass")).hexdigest()[:20]
    return f"{THUMBS_DIR}/img-{digest}.jpg"


def overlay_thumb_name(output: str) -> str:
    """Thumbnail of an overlay file (``output`` relative to the output folder)."""
    return f"{THUMBS_DIR}/{Path(output).with_suffix('').as_posix().replace('/', '__')}.jpg"


def raw_map_name(raw: str) -> str:
    """Coloured picture of a raw map file (``.npy`` relative to the output folder)."""
    return f"{THUMBS_DIR}/{Path(raw).with_suffix('').as_posix().replace('/', '__')}.raw.png"


def save_thumbnails(
    out_dir: str | os.PathLike[str],
    record: Mapping[str, Any],
    original: object | None = None,
    overlay: object | None = None,
    side: int = THUMB_SIDE,
) -> None:
    """Write the thumbnails of one manifest row from pictures already in memory.

    For the pipeline's writer, which holds the decoded ``original`` (``HxWx3`` uint8) and the
    ``overlay`` it has just saved: :func:`write_report` then finds them and decodes nothing.
    """
    out = Path(out_dir)
    (out / THUMBS_DIR).mkdir(parents=True, exist_ok=True)
    if original is not None:
        thumb = cio.thumbnail(original, side)
        cio.save_jpeg(
            out / original_thumb_name(str(record["image"])), thumb, _THUMB_QUALITY, durable=False
        )
    if overlay is not None and record.get("output"):
        thumb = cio.thumbnail(overlay, side)
        cio.save_jpeg(
            out / overlay_thumb_name(str(record["output"])), thumb, _THUMB_QUALITY, durable=False
        )


def _fresh(target: Path, source: Path) -> bool:
    """``target`` exists and is not older than ``source`` (a missing source counts as older)."""
    try:
        made = target.stat().st_mtime
    except FileNotFoundError:
        return False
    try:
        return made >= source.stat().st_mtime
    except FileNotFoundError:
        return True


def _url(path: str) -> str:
    """A relative POSIX path -> a URL path ('#', '?', '%', spaces... escaped)."""
    return quote(path, safe="/")


def _image_url(image: str, out: Path) -> str:
    """The input image's URL relative to the output folder (a ``file:`` URI across drives).

    ``out`` must be absolute and resolved.
    """
    absolute = Path(os.path.realpath(image))
    try:
        return _url(Path(os.path.relpath(absolute, out)).as_posix())
    except ValueError:  # another drive (Windows)
        return absolute.as_uri()


# ----------------------------------------------------------------------------- colours


def _colormap_ramp(colormap: str) -> np.ndarray:
    """``256x3`` uint8 RGB of ``colormap`` at 0, 1/255, ..., 1, by :func:`viz.overlay`."""
    ramp = np.arange(256, dtype=np.float32)[None, :] / 255.0
    return viz.overlay(np.zeros((1, 256, 3), np.uint8), ramp, alpha=1.0, colormap=colormap)[0]


def _gradient(colormap: str) -> str:
    """A CSS ``linear-gradient`` (left to right) of the colormap."""
    lut = _colormap_ramp(colormap)
    stops = []
    for k in range(_COLORBAR_STOPS):
        level = round(k * 255 / (_COLORBAR_STOPS - 1))
        red, green, blue = (int(v) for v in lut[level])
        stops.append(f"rgb({red},{green},{blue}) {100 * k / (_COLORBAR_STOPS - 1):.1f}%")
    return f"linear-gradient(to right, {', '.join(stops)})"


def _render_raw(source: Path, target: Path, colormap: str) -> dict[str, Any]:
    """A raw map ``.npy`` -> a coloured PNG at the map's own resolution, and its scale.

    ``(H, W)`` maps (CAMs) use ``colormap`` on ``[0, 1]`` when their values lie there, else on
    ``[min, max]``; ``(3, H, W)`` pixel attributions are summed over channels and drawn with
    the diverging ``bwr`` colormap centred at 0, clipped at +-the 99.5th percentile of
    ``|values|`` (as :func:`camkit.viz.plot` draws them).
    """
    values = np.load(source, allow_pickle=False).astype(np.float64)
    while values.ndim > 2 and values.shape[0] == 1:
        values = values[0]
    if values.ndim == 3:
        values = values.sum(axis=0)
    if values.ndim != 2 or values.size == 0 or not np.isfinite(values).all():
        raise ArgumentError(
            f"expected a finite 2-D map or (3, H, W) attribution, got {values.shape}"
        )
    if values.min() < 0:
        limit = float(np.percentile(np.abs(values), _SIGNED_PERCENTILE)) or float(
            np.abs(values).max()
        )
        limit = limit or 1.0
        low, high, cmap = -limit, limit, _SIGNED_COLORMAP
    else:
        low, high, cmap = float(values.min()), float(values.max()), colormap
        if high <= 1.0:
            low, high = 0.0, 1.0
    unit = np.clip((values - low) / ((high - low) or 1.0), 0.0, 1.0)
    picture = viz.overlay(np.zeros((*unit.shape, 3), np.uint8), unit, 1.0, cmap)
    cio.save_png(target, picture, durable=False)
    return {"min": low, "max": high, "cmap": cmap, "size": [unit.shape[1], unit.shape[0]]}


# ----------------------------------------------------------------------------- page data


_KNOWN_KEYS = frozenset(
    {"image", "output", "method", "layer", "target", "label", "probability", "top5", "model"}
    | {"size", "raw", "error"}
)


def _scalars(values: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Numbers, strings, booleans of a mapping (non-finite numbers as strings); None if empty."""
    if not values:
        return None
    kept: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, bool) or value is None or isinstance(value, str):
            kept[str(key)] = value
        elif isinstance(value, (int, float, np.integer, np.floating)):
            number = float(value) if isinstance(value, (float, np.floating)) else int(value)
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
    overlay_thumb = functools.lru_cache(maxsize=None)(overlay_thumb_name)
    images = []
    for image, rows in grouped.items():
        first = rows[0]
        thumb = original_thumb_name(image)
        extra = {k for row in rows for k in row if k not in _KNOWN_KEYS}
        shared = {k for k in extra if all(k in row and row[k] == first.get(k) for row in rows)}
        entry: dict[str, Any] = {
            "name": Path(image).name,
            "path": image,
            "src": _image_url(image, resolved),
            "thumb": _url(thumb) if thumb in made else None,
            "error": next((str(r["error"]) for r in rows if "error" in r), None),
            "size": first.get("size"),
            "model": first.get("model"),
            "top5": [
                [entry.get("index"), str(entry.get("label")), entry.get("probability")]
                for entry in first.get("top5") or []
            ],
            "metrics": _scalars(metrics.get(image)),
            "info": _scalars({k: v for k, v in first.items() if k in shared}),
            "overlays": [],
        }
        for row in rows:
            if "error" in row or not row.get("output"):
                continue
            output = str(row["output"])
            raw = str(row["raw"]) if row.get("raw") else None
            entry["overlays"].append(
                {
                    "method": str(row.get("method")),
                    "layer": row.get("layer"),
                    "target": row.get("target"),
                    "label": str(row.get("label")),
                    "p": row.get("probability"),
                    "src": _url(output),
                    "thumb": _url(overlay_thumb(output))
                    if overlay_thumb(output) in made
                    else _url(output),
                    "raw": None
                    if raw is None or raw_map_name(raw) not in raw_scales
                    else {"src": _url(raw_map_name(raw)), "file": _url(raw)}
                    | raw_scales[raw_map_name(raw)],
                    "metrics": _scalars(metrics.get(output)),
                    "info": _scalars({k: v for k, v in row.items() if k in extra - shared}),
                }
            )
        images.append(entry)
    return images


def _make_thumbnails(
    out: Path,
    grouped: Mapping[str, Sequence[Mapping[str, Any]]],
    colormap: str,
    side: int,
    workers: int,
) -> dict[str, dict[str, Any]]:
    """Missing or stale thumbnails, and the raw-map pictures -> the raw maps' scales by
    picture name (``thumbs/<name>.raw.png``)."""
    (out / THUMBS_DIR).mkdir(parents=True, exist_ok=True)
    jobs: dict[Path, tuple[str, Path, Path]] = {}  # by target: each file made once
    for image, rows in grouped.items():
        if all("error" in row for row in rows):
            continue
        target = out / original_thumb_name(image)
        if not _fresh(target, Path(image)):
            jobs[target] = ("image", Path(image), target)
        for row in rows:
            if row.get("output"):
                source = out / str(row["output"])
                target = out / overlay_thumb_name(str(row["output"]))
                if not _fresh(target, source):
                    jobs[target] = ("image", source, target)
            if row.get("raw"):
                target = out / raw_map_name(str(row["raw"]))
                jobs[target] = ("raw", out / str(row["raw"]), target)

    def run(job: tuple[str, Path, Path]) -> tuple[str, Path, dict[str, Any] | None]:
        kind, source, target = job
        try:
            if kind == "raw":
                return kind, target, _render_raw(source, target, colormap)
            thumb = cio.thumbnail(cio.read_image(source), side)
            cio.save_jpeg(target, thumb, _THUMB_QUALITY, durable=False)
        except (*cio.READ_ERRORS, MemoryError):
            pass  # the page shows the full-size file, or a placeholder
        return kind, source, None

    scales: dict[str, dict[str, Any]] = {}
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for kind, target, scale in pool.map(run, jobs.values()):
            if kind == "raw" and scale is not None:
                scales[target.relative_to(out).as_posix()] = scale
    return scales


def _strategies_data(
    out: Path, images: Sequence[Mapping[str, Any]], found: Mapping[str, Any], folder: Path
) -> dict[str, Any]:
    """``strategies.json`` for the page: map rows -> page image indices, files -> URLs."""
    page = {image["path"]: index for index, image in enumerate(images)}
    rows = [page.get(str(image), -1) for image in found.get("images", [])]
    prefix = Path(os.path.relpath(folder.resolve(), out.resolve())).as_posix()

    def url(name: str | None) -> str | None:
        return None if name is None else _url(f"{prefix}/{name}" if prefix != "." else name)

    groups = []
    for group in found.get("groups", []):
        clusters = [
            {key: cluster.get(key) for key in ("id", "size", "confidence", "accuracy")}
            | {
                "score": cluster.get("suspiciousness"),
                "prototype": url(cluster.get("prototype")),
                "typical": [rows[r] for r in cluster.get("typical", [])],
                "atypical": [rows[r] for r in cluster.get("atypical", [])],
                "members": [rows[r] for r in cluster.get("members", [])],
            }
            for cluster in group.get("clusters", [])
        ]
        groups.append(
            {key: group.get(key) for key in ("method", "class", "label", "samples", "k")}
            | {
                "suggested": group.get("suggested_k"),
                "eigenvalues": group.get("eigenvalues", []),
                "eigengap": url(group.get("eigengap_plot")),
                "points": [[x, y, c, rows[r]] for x, y, c, r in group.get("points", [])],
                "clusters": clusters,
            }
        )
    return {"groups": groups, "skipped": list(found.get("skipped", []))}


def _asset(name: str) -> str:
    """A file of the page (``camkit/data/report.{html,css,js}``) as text."""
    return resources.files("camkit").joinpath("data", name).read_text("utf-8")


def _json_for_script(value: object) -> str:
    """JSON that is safe inside ``<script type="application/json">`` (no ``</script>``)."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    for character, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026")):
        text = text.replace(character, escaped)
    return text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def write_report(
    out_dir: str | os.PathLike[str],
    records: Sequence[Mapping[str, Any]],
    *,
    metrics: Mapping[str, Mapping[str, Any]] | None = None,
    title: str = "camkit report",
    colormap: str = "jet",
    thumb_side: int = THUMB_SIDE,
    workers: int | None = None,
    strategies: Mapping[str, Any] | None = None,
    strategies_dir: str | os.PathLike[str] | None = None,
) -> Path:
    """Write ``OUT/index.html``, a static page to browse the explained images -> its path.

    ``records``: the manifest rows of ``camkit explain`` (``image``, ``output``, ``method``,
    ``layer``, ``target``, ``label``, ``probability``, ``top5``, ``model``, ``size``, optional
    ``raw``; or ``image`` and ``error`` for an unreadable file). ``output``/``raw`` are relative
    to ``out_dir``; ``image`` is the input's path as given (relative to the current directory or
    absolute). Any other scalar field (``rank``, timings...) is shown in the detail view.
    ``metrics``: per-overlay (keyed by ``output``) or per-image (keyed by ``image``) mappings of
    metric name -> number, shown on the cards and offered as sort keys. ``colormap``: the one the
    overlays were drawn with (for the colour bar and the raw maps).

    Thumbnails (``OUT/thumbs/*.jpg``, longer side ``thumb_side``) and raw-map pictures are made
    here when missing or older than their source (``workers`` threads, default up to 4); the
    pipeline can write them earlier with :func:`save_thumbnails`. The page is written
    atomically; rerunning updates it.

    ``strategies``: the content of ``strategies.json`` written by ``camkit strategies`` (files
    named relative to ``strategies_dir``): the page then has a strategies view per method and
    class (clusters side by side, the embedding, links from members to their cards).
    """
    import camkit

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    grouped = _group(records)
    viz.overlay(np.zeros((1, 1, 3), np.uint8), np.zeros((1, 1)), colormap=colormap)
    workers = min(4, os.cpu_count() or 1) if workers is None else workers
    scales = _make_thumbnails(out, grouped, colormap, thumb_side, workers)
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
        "gradients": {colormap: _gradient(colormap), _SIGNED_COLORMAP: _gradient("bwr")},
        "methods": methods,
        "metricNames": metric_names,
        "images": images,
        "strategies": None
        if strategies is None
        else _strategies_data(out, images, strategies, Path(strategies_dir or out)),
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

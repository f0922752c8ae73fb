"""The report's thumbnails and raw-map pictures in ``OUT/thumbs/``: their names, making the missing
or stale ones (in threads), and files' URLs relative to the output folder."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from camkit import io as cio
from camkit import viz
from camkit.errors import ArgumentError
from camkit.runs.strategies import url_path
from camkit.viz.colour import DIVERGING_COLORMAP, signed_limit

THUMB_SIDE = 256  # longer side of the thumbnails, in pixels
THUMBS_DIR = "thumbs"  # the thumbnails and raw-map pictures, in the output folder
SIGNED_COLORMAP = DIVERGING_COLORMAP  # of signed raw maps (pixel attributions), centred at 0
_THUMB_QUALITY = 82


def original_thumb_name(image: str) -> str:
    """Thumbnail of an input image, relative to the output folder: ``thumbs/img-<hash>.jpg``,
    a hash of its path as the manifest gives it (two inputs may share a name)."""
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
    """Write the thumbnails of one manifest row from the decoded ``original`` (``HxWx3``
    uint8) and the ``overlay`` the pipeline's writer holds: the report then decodes nothing."""
    out = Path(out_dir)
    (out / THUMBS_DIR).mkdir(parents=True, exist_ok=True)
    if original is not None:
        name = original_thumb_name(str(record["image"]))
        cio.save_jpeg(out / name, cio.thumbnail(original, side), _THUMB_QUALITY, durable=False)
    if overlay is not None and record.get("output"):
        name = overlay_thumb_name(str(record["output"]))
        cio.save_jpeg(out / name, cio.thumbnail(overlay, side), _THUMB_QUALITY, durable=False)


def _fresh(target: Path, source: Path) -> bool:
    """``target`` exists and is not older than ``source`` (a missing source counts as older)."""
    try:
        made = target.stat().st_mtime
    except FileNotFoundError:
        return False
    return not source.exists() or made >= source.stat().st_mtime


def image_url(image: str, out: Path) -> str:
    """The input image's URL relative to ``out`` (absolute and resolved; a ``file:`` URI
    across drives)."""
    absolute = Path(os.path.realpath(image))
    try:
        return url_path(Path(os.path.relpath(absolute, out)).as_posix())
    except ValueError:  # another drive (Windows)
        return absolute.as_uri()


def _render_raw(source: Path, target: Path, colormap: str) -> dict[str, Any]:
    """A raw map ``.npy`` -> a coloured PNG and its scale: ``colormap`` on ``[0, 1]`` or ``[min,
    max]``, a signed map (summed over channels) diverging at 0, clipped as :func:`viz.plot` does."""
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
        limit = signed_limit(values) or 1.0
        low, high, cmap = -limit, limit, SIGNED_COLORMAP
    else:
        low, high, cmap = float(values.min()), float(values.max()), colormap
        if high <= 1.0:
            low, high = 0.0, 1.0
    unit = np.clip((values - low) / ((high - low) or 1.0), 0.0, 1.0)
    picture = viz.overlay(np.zeros((*unit.shape, 3), np.uint8), unit, 1.0, cmap)
    cio.save_png(target, picture, durable=False)
    return {"min": low, "max": high, "cmap": cmap, "size": [unit.shape[1], unit.shape[0]]}


def make_thumbnails(
    out: Path,
    grouped: Mapping[str, Sequence[Mapping[str, Any]]],
    colormap: str,
    side: int,
    workers: int,
) -> dict[str, dict[str, Any]]:
    """Missing or stale thumbnails and raw-map pictures -> the raw maps' scales."""
    (out / THUMBS_DIR).mkdir(parents=True, exist_ok=True)
    jobs: dict[Path, tuple[str, Path, Path]] = {}  # by target: each file made once
    for image, rows in grouped.items():
        if all("error" in row for row in rows):
            continue
        target = out / original_thumb_name(image)
        if not _fresh(target, Path(image)):
            jobs[target] = ("video" if cio.video.is_video(image) else "image", Path(image), target)
        for row in rows:
            if row.get("output") and "frame_importance" not in row:  # a video's: its GIF
                source = out / str(row["output"])
                target = out / overlay_thumb_name(str(row["output"]))
                if not _fresh(target, source):
                    jobs[target] = ("image", source, target)
            if row.get("raw"):
                target = out / raw_map_name(str(row["raw"]))
                jobs[target] = ("raw", out / str(row["raw"]), target)

    def run(job: tuple[str, Path, Path]) -> dict[str, Any] | None:
        kind, source, target = job
        try:
            if kind == "raw":
                return _render_raw(source, target, colormap)
            if kind == "video":  # its first frame
                picture = next(cio.video.iter_frames(source))
            else:
                picture = cio.read_image(source)
            cio.save_jpeg(target, cio.thumbnail(picture, side), _THUMB_QUALITY, durable=False)
        except (*cio.READ_ERRORS, cio.video.VideoReadError, StopIteration, MemoryError):
            pass  # the page shows the full-size file, or a placeholder
        return None

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        made = dict(zip(jobs, pool.map(run, jobs.values()), strict=True))
    return {path.relative_to(out).as_posix(): scale for path, scale in made.items() if scale}

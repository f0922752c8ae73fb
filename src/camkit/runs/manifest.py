"""The manifest of a run folder (``camkit explain``): what reproduces it, one row per output,
the parts a killed run leaves, merging them.

After every batch whose files are on disk, each rank appends to its own part
``manifest.rank<R>.jsonl`` (JSON lines: records, then the throughput so far) and flushes it, so
a batch costs the same however large the run; rank 0 merges the parts into ``manifest.json``.
A killed run's parts list only images whose files are written, so ``--resume`` merges them and
skips those; a video's finished windows stay listed until the video has its record.

One writer (:func:`write_manifest`), one reader (:func:`read_manifest`); a manifest without a
``version`` is version 0 (camkit 0.2's layout, or 0.1's bare list of records); a broken one is
a :class:`~camkit.errors.RunFileError`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from camkit.runs import maps
from camkit.runs.records import Fields, FileKind, read_record, write_json

MANIFEST = "manifest.json"
KIND = FileKind(MANIFEST, 1, "camkit explain IMAGES --out RUN")
"""Version 1: version 0's layout (camkit 0.2) with a ``version`` field."""
VERSIONED = ("camkit", "torch", "torchvision", "timm")


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def versions() -> dict[str, str]:
    """The versions that make a run reproducible, under the packages' names."""
    found = {}
    for package in VERSIONED:
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = "missing"
    return found | {"python": platform.python_version()}


def sha256(path: str | None) -> str | None:
    """The SHA-256 of a weights file (None for none)."""
    if path is None:
        return None
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


PARTS = "manifest.rank*.jsonl"


def part_path(out: Path, rank: int) -> Path:
    return out / f"manifest.rank{rank}.jsonl"


def append(path: Path, lines: list[dict]) -> None:
    """Append JSON lines to a part and flush them to the disk."""
    with open(path, "a", encoding="utf-8") as part:
        part.write("".join(json.dumps(line) + "\n" for line in lines))
        part.flush()
        os.fsync(part.fileno())


@dataclasses.dataclass
class Manifest:
    """``manifest.json``: the ``records`` (one per output: ``image``, ``output``, ``method``,
    ``target``... or ``image`` and ``error``), and the ``header``, everything else (versions,
    arguments, ``settings``, ``model``, ``weights_sha256``, counts, throughput, ``runs``)."""

    records: list[dict[str, Any]]
    header: dict[str, Any]
    version: int = KIND.version

    @property
    def settings(self) -> dict[str, Any] | None:
        """The run's settings (None for a camkit 0.1 manifest, which recorded none)."""
        return self.header.get("settings")

    @property
    def crop(self) -> str:
        """The ``--crop`` the run was made with (:func:`recorded_crop`)."""
        return recorded_crop(self.header)

    def as_dict(self) -> dict[str, Any]:
        """The header and the records as one dictionary, as the file holds them."""
        return self.header | {"records": self.records}


def write_manifest(out: Path, manifest: dict[str, Any]) -> Path:
    """Write ``OUT/manifest.json`` (the header's keys and ``records``) -> its path."""
    return write_json(out / MANIFEST, KIND, manifest)


def read_manifest(path: Path) -> Manifest | None:
    """A run's ``manifest.json`` (``path``: the file or its run folder); None when absent; a
    broken one is a :class:`~camkit.errors.RunFileError`."""
    return read_record(path / MANIFEST if path.is_dir() else path, KIND, _manifest_record)


def _manifest_record(data: Any, read: Fields) -> Manifest:
    if isinstance(data, list):  # camkit 0.1: a bare list of records, no settings
        data = {"settings": None, "records": data}
    records = read.items(data, "records", dict)
    for index, record in enumerate(records):
        read.get(record, "image", str, f"records[{index}].")
    read.get(data, "settings", (dict, type(None)), default=None)
    header = {key: value for key, value in data.items() if key not in ("records", "version")}
    return Manifest(records=records, header=header, version=read.version)


def read(path: Path) -> dict | None:
    """A manifest (``.json``, :func:`read_manifest` as a dictionary) or a part (``.jsonl``: its
    header, records, finished windows and last throughput); None when absent. A part's records
    and windows count only once their batch's throughput line follows: a kill mid-append leaves
    none of that batch. A camkit 0.1 manifest has no settings to compare: no resuming from it."""
    if path.suffix == ".json":
        found = read_manifest(path)
        return None if found is None else found.as_dict()
    if not path.is_file():
        return None
    part: dict = {"records": [], "windows": []}
    batch: list[tuple[str, dict]] = []  # records count once their throughput line is there
    for text in path.read_text("utf-8").splitlines():
        try:
            line = json.loads(text)
        except json.JSONDecodeError:  # the line a kill cut short: its batch is not recorded
            break
        if "record" in line:
            batch.append(("records", line["record"]))
        elif "window" in line:
            batch.append(("windows", line["window"]))
        else:
            for key, item in batch:
                part[key].append(item)
            batch = []
            part.update(line)
    return part


def unfinished_windows(pieces: list[dict | None], records: list[dict]) -> dict:
    """``{"windows": [...]}``: the finished windows (``{image, stage, start, stop}``, once each)
    that ``pieces`` (manifests and parts) record for videos without a record yet, which a
    ``--resume`` skips; ``{}`` when there are none."""
    finished = {record["image"] for record in records}
    windows = {}
    for piece in pieces:
        for window in (piece or {}).get("windows", []):
            key = (window["image"], window["stage"], window["start"], window["stop"])
            windows[key] = window
    kept = [window for window in windows.values() if window["image"] not in finished]
    return {"windows": kept} if kept else {}


def recorded_crop(manifest: dict) -> str:
    """The crop a run was made with: the ``--crop`` its manifest's settings record, or
    ``"squash"`` for a run made before ``--crop`` existed (those runs squashed every photo)."""
    return (manifest.get("settings") or {}).get("crop", "squash")


def _records(pieces: list[dict | None]) -> list[dict]:
    """The records of ``pieces`` (manifests and parts), one per (image, output): the last."""
    records = {}
    for piece in pieces:
        for record in piece["records"] if piece else []:
            records[(record["image"], record.get("output"))] = record
    return list(records.values())


def _write(out: Path, manifest: dict, head: dict, parts: list[Path]) -> None:
    """Fold the maps of a ``--save-maps`` run, write ``manifest.json``, remove the ``parts``."""
    if (head.get("settings") or {}).get("save_maps"):
        maps.fold(out, manifest["records"], head)
    write_manifest(out, manifest)
    for path in parts:
        path.unlink(missing_ok=True)


def gather(out: Path) -> dict | None:
    """``manifest.json`` and the parts left by a killed run as one manifest (records of an image
    that two of them hold appear once)."""
    pieces = [read(out / MANIFEST), *(read(path) for path in sorted(out.glob(PARTS)))]
    pieces = [piece for piece in pieces if piece is not None]
    if not pieces:
        return None
    rows = _records(pieces)
    gathered = {key: value for key, value in pieces[0].items() if key != "windows"}
    return gathered | {"records": rows} | unfinished_windows(pieces, rows)


def consolidate(out: Path) -> None:
    """Merge what an earlier run left into ``manifest.json`` and remove its parts (rank 0,
    before the others start)."""
    gathered = gather(out)
    if gathered is not None:
        _write(out, gathered, gathered, list(out.glob(PARTS)))


def header(settings: dict, model: str, device: str, arguments: list[str]) -> dict:
    """Everything but the records: versions, arguments, settings, the model and its weights."""
    return versions() | {
        "arguments": arguments,
        "command": [Path(sys.argv[0]).name, *arguments],
        "settings": settings,
        "model": model,
        "weights_sha256": settings.get("weights_sha256"),
        "device": device,
        "dtype": "float32",
        "started": now(),
    }


def merge(out: Path, head: dict, order: list[str], world: int, todo: int) -> dict:
    """Rank 0, after the barrier: every rank's part (and what a resumed run had) as one
    ``manifest.json`` ordered like the inputs; the parts are removed. ``explained`` and
    ``unreadable`` count the images of every run; ``runs`` keeps each run's own start, end,
    throughput and counts (``todo``: the images this run had to do); ``started``/``throughput``
    are the first run's start and the sums over the runs."""
    previous = read(out / MANIFEST)
    paths = [part_path(out, rank) for rank in range(world)]
    parts = [read(path) for path in paths]
    position = {image: index for index, image in enumerate(order)}
    rows = sorted(_records([previous, *parts]), key=lambda r: position.get(r["image"], len(order)))
    ranks = [part["throughput"] for part in parts if part is not None]
    seconds = max((rank["seconds"] for rank in ranks), default=0.0)
    images = sum(rank["images"] for rank in ranks)
    failed_now = {r["image"] for part in parts if part for r in part["records"] if "error" in r}
    this_run = {
        "started": head["started"],
        "finished": now(),
        "todo": todo,
        "explained": todo - len(failed_now),
        "unreadable": len(failed_now),
        "throughput": _throughput(images, seconds) | {"ranks": ranks},
    }
    runs = [*earlier_runs(previous), this_run]
    explained = {r["image"] for r in rows if "error" not in r}
    total_images = sum(run["throughput"]["images"] for run in runs)
    total_seconds = sum(run["throughput"]["seconds"] for run in runs)
    manifest = (
        head
        | {
            "started": runs[0]["started"],
            "explained": len(explained),
            "unreadable": len({r["image"] for r in rows if "error" in r} - explained),
            "finished": this_run["finished"],
            "throughput": _throughput(total_images, total_seconds) | {"ranks": ranks},
            "runs": runs,
            "records": rows,
        }
        | unfinished_windows([previous, *parts], rows)
    )
    _write(out, manifest, head, paths)
    return manifest


def _throughput(images: int, seconds: float) -> dict:
    return {
        "images": images,
        "seconds": seconds,
        "images_per_second": images / seconds if seconds else None,
    }


def earlier_runs(previous: dict | None) -> list[dict]:
    """The runs an earlier manifest records (one made before ``runs`` existed: its own
    start, end, counts and throughput as one run)."""
    if not previous or previous.get("throughput") is None:
        return []
    if "runs" in previous:
        return list(previous["runs"])
    keep = ("started", "finished", "explained", "unreadable", "throughput")
    return [{key: previous.get(key) for key in keep}]

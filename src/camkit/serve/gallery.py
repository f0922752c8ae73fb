"""The images the explorer shows: found in folders (ImageFolder layout gives true labels) or in
a ``camkit explain`` run's manifest, plus uploads; filtered and sorted. Images are known by their
index, never by a path from the web."""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from camkit.errors import ArgumentError
from camkit.io import IMAGE_SUFFIXES
from camkit.runs import manifest as run_manifest
from camkit.runs import strategies as run_strategies
from camkit.runs.concepts import ConceptsRecord
from camkit.runs.strategies import STRATEGIES_DIR, cluster_view

Prediction = list[tuple[int, str, float]]
"""Top classes of one image: ``(class index, label, probability)``, most probable first."""


@dataclass
class Entry:
    """One image of the gallery."""

    name: str
    path: Path | None = None  # None for an upload (its pixels are in ``pixels``)
    truth: str | None = None  # the true class from the folder layout, when there is one
    pixels: np.ndarray | None = None
    run_maps: list[dict] = field(default_factory=list)  # a run's records of this image
    error: str | None = None  # why the file could not be read


@dataclass(frozen=True)
class RunViews:
    """What the explorer shows of a ``camkit explain`` run folder (the empty record: no run):
    ``root``, whose files may be served; ``header``, its manifest's model, settings and
    versions; ``strategies`` (:func:`read_strategies`); ``concepts``, its ``camkit concepts``
    results; ``problems``, its broken files (file name -> the error's message)."""

    root: Path | None = None
    header: dict | None = None
    strategies: dict | None = None
    concepts: ConceptsRecord | None = None
    problems: dict[str, str] = field(default_factory=dict)


def _images(folder: str | Path, root: Path, suffixes: Collection[str]) -> list[os.DirEntry]:
    """The visible files of ``folder`` with one of ``suffixes`` that resolve under ``root``."""
    with os.scandir(folder) as listing:
        found = [
            item
            for item in listing
            if not item.name.startswith(".")
            and Path(item.name).suffix.lower() in suffixes
            and item.is_file()
            and Path(item.path).resolve().is_relative_to(root)
        ]
    return sorted(found, key=lambda item: item.name)


def scan(
    paths: Sequence[Path], suffixes: Collection[str] = IMAGE_SUFFIXES
) -> tuple[list[Entry], list[Path]]:
    """The images of files and folders (``suffixes``: the file endings listed), and the roots
    they lie under. A folder's own images have no true class; those in its subfolders (one
    level, torchvision's ``ImageFolder``: ``root/<class>/<image>``) have the subfolder's name.
    Links that lead out of a folder are skipped."""
    entries: list[Entry] = []
    roots: list[Path] = []
    for path in paths:
        if path.is_file():
            entries.append(Entry(path.name, path))
            roots.append(path.parent.resolve())
            continue
        root = path.resolve()
        roots.append(root)
        entries += [Entry(item.name, Path(item.path)) for item in _images(root, root, suffixes)]
        with os.scandir(root) as listing:
            subs = sorted((e for e in listing if not e.name.startswith(".")), key=lambda e: e.name)
        for sub in subs:
            if sub.is_dir() and Path(sub.path).resolve().is_relative_to(root):
                entries += [
                    Entry(f"{sub.name}/{item.name}", Path(item.path), sub.name)
                    for item in _images(sub.path, root, suffixes)
                ]
    return entries, roots


RUN_MAP_FIELDS = ("output", "raw", "method", "layer", "target", "label")


def read_run(run: Path) -> tuple[list[Entry], dict, dict[int, Prediction]]:
    """A ``camkit explain`` folder's images, manifest header and recorded predictions by index."""
    loaded = run_manifest.gather(run)
    if loaded is None:
        raise FileNotFoundError(f"no {run_manifest.MANIFEST} in {run}")
    entries: list[Entry] = []
    predictions: dict[int, Prediction] = {}
    position: dict[str, int] = {}
    for record in loaded["records"]:
        image = record["image"]
        if image not in position:
            position[image] = len(entries)
            entries.append(Entry(Path(image).name, Path(image)))
        index = position[image]
        if record.get("top5"):
            predictions[index] = [
                (int(row["index"]), str(row["label"]), float(row["probability"]))
                for row in record["top5"]
            ]
        if record.get("output"):
            entries[index].run_maps.append({key: record.get(key) for key in RUN_MAP_FIELDS})
    header = {key: value for key, value in loaded.items() if key != "records"}
    return entries, header, predictions


def _wrong(entry: Entry, prediction: Prediction | None) -> bool:
    """Whether the top-1 class differs from the folder's true class (its name or number)."""
    if entry.truth is None or not prediction:
        return False
    index, label, _ = prediction[0]
    truth = entry.truth.strip().lower()
    return not (truth == label.lower() or (truth.isdigit() and int(truth) == index))


ORDERS = ("name", "confidence", "-confidence", "ranking")


def select(
    entries: Sequence[Entry],
    predictions: dict[int, Prediction],
    *,
    predicted: str | None = None,
    truth: str | None = None,
    wrong: bool = False,
    order: str = "name",
    only: Collection[int] | None = None,
    ranking: Mapping[int, float] | None = None,
) -> list[int]:
    """Entry indices that pass the filters, in the asked order. ``predicted``: top-1 label;
    ``truth``: folder class; ``wrong``: misclassified only; ``only``: these indices only;
    ``order``: ``"name"`` (as found), ``"confidence"`` (low first), ``"-confidence"``, or
    ``"ranking"`` (highest ``ranking`` first); images without a value come last.
    """
    if order not in ORDERS:
        raise ArgumentError(f"unknown order {order!r}; choose from {', '.join(ORDERS)}")

    def kept(index: int, entry: Entry) -> bool:
        prediction = predictions.get(index)
        return (
            (predicted is None or (bool(prediction) and prediction[0][1] == predicted))
            and (truth is None or entry.truth == truth)
            and (not wrong or _wrong(entry, prediction))
            and (only is None or index in only)
        )

    chosen = [index for index, entry in enumerate(entries) if kept(index, entry)]
    if order != "name":
        sign = {"confidence": -1.0, "-confidence": 1.0}.get(order)
        if sign is not None:
            ranking = {i: sign * found[0][2] for i, found in predictions.items() if found}
        ranks = ranking or {}
        chosen.sort(key=lambda index: (index not in ranks, -ranks.get(index, 0.0)))
    return chosen


def read_strategies(run: Path, entries: Sequence[Entry]) -> dict | None:
    """The run's ``strategies/strategies.json`` (the clusters of each class's maps, SpRAy) with
    its members (rows of the run's map file) as gallery ids and its pictures as paths under the
    run folder; None without one (a broken file: :class:`~camkit.errors.RunFileError`)."""
    found = run_strategies.read_strategies(run / STRATEGIES_DIR)
    if found is None:
        return None
    position = {os.path.normpath(str(e.path)): i for i, e in enumerate(entries) if e.path}
    images = [os.path.normpath(str(image)) for image in found.images]

    def ids(rows: Sequence[int]) -> list[int]:
        found = (position.get(images[row]) for row in rows if 0 <= row < len(images))
        return [index for index in found if index is not None]

    def picture(name: str | None) -> str | None:
        return f"{STRATEGIES_DIR}/{name}" if name else None

    groups = []
    for group in found.groups:
        clusters = [
            cluster_view(cluster, ids, picture, lists=("typical", "atypical", "members"))
            for cluster in group.get("clusters", [])
        ]
        groups.append(
            {key: group.get(key) for key in ("method", "class", "label", "samples", "suggested_k")}
            | {"eigengap_plot": picture(group.get("eigengap_plot")), "clusters": clusters}
        )
    return {"groups": groups, "skipped": found.skipped}

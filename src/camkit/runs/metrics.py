"""``metrics.json`` of a run folder (``camkit evaluate --out RUN``): per method and metric the
mean with its 95% bootstrap interval, the settings of the scoring, and the randomisation sanity
check when it ran. One writer (:func:`write_metrics`) and one reader (:func:`read_metrics`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from camkit.runs.records import Fields, FileKind, read_record, write_json

METRICS_FILE = "metrics.json"
KIND = FileKind(METRICS_FILE, 1, "camkit evaluate IMAGES --out RUN")
"""Version 1: version 0's layout (camkit 0.2) with a ``version`` field."""


@dataclasses.dataclass
class MetricsRecord:
    """``metrics.json``: ``methods[method][column]`` is ``{"mean", "ci95": [low, high], "n"}``
    (``mean`` None where no image gave a finite value); ``higher_is_better[column]``;
    ``sanity[method]``: the cascading randomisation's ``[{"layer", "spearman", ...}]``, with
    ``sanity_images`` the images it used (both None when it did not run)."""

    model: str
    layer: str | None
    images: int
    unreadable: list[str]
    settings: dict[str, Any]
    higher_is_better: dict[str, bool]
    methods: dict[str, dict[str, dict[str, Any]]]
    sanity: dict[str, list[dict[str, Any]]] | None = None
    sanity_images: int | None = None
    version: int = KIND.version


def write_metrics(out: Path, record: MetricsRecord) -> Path:
    """Write ``OUT/metrics.json`` -> its path."""
    fields = dataclasses.asdict(record)
    if record.sanity is None:  # as version 0 wrote it: no sanity keys when it did not run
        fields = {key: value for key, value in fields.items() if not key.startswith("sanity")}
    return write_json(out / METRICS_FILE, KIND, fields)


def read_metrics(out: Path) -> MetricsRecord | None:
    """``OUT/metrics.json`` (None when the folder has none); a broken file is a
    :class:`~camkit.errors.RunFileError`."""
    return read_record(out / METRICS_FILE, KIND, _metrics_record)


def _metrics_record(data: Any, read: Fields) -> MetricsRecord:
    methods = read.get(data, "methods", dict)
    for method, columns in methods.items():
        where = f"methods.{method}"
        for column in read.check(columns, dict, where):
            read.get(columns[column], "mean", (float, type(None)), f"{where}.{column}.")
            read.items(columns[column], "ci95", (float, type(None)), f"{where}.{column}.")
            read.get(columns[column], "n", int, f"{where}.{column}.")
    higher = read.get(data, "higher_is_better", dict)
    for column in higher:
        read.get(higher, column, bool, "higher_is_better.")
    sanity = read.get(data, "sanity", (dict, type(None)), default=None)
    for method in sanity or {}:
        read.items(sanity, method, dict, "sanity.")
    return MetricsRecord(
        model=read.get(data, "model", str),
        layer=read.get(data, "layer", (str, type(None))),
        images=read.get(data, "images", int),
        unreadable=read.items(data, "unreadable", str),
        settings=read.get(data, "settings", dict),
        higher_is_better=higher,
        methods=methods,
        sanity=sanity,
        sanity_images=read.get(data, "sanity_images", (int, type(None)), default=None),
        version=read.version,
    )


__all__ = ["KIND", "METRICS_FILE", "MetricsRecord", "read_metrics", "write_metrics"]

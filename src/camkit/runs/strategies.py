"""The strategies results of a run folder: ``strategies/strategies.json`` (``camkit
strategies``), and what pages show of it: one cluster (:func:`cluster_view`, for the report and
the explorer) and the report's whole view (:func:`strategies_data`)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

from camkit.runs.records import Fields, FileKind, read_record, write_json

STRATEGIES_DIR = "strategies"
"""The folder of the run where ``camkit strategies RUN_DIR`` writes (without ``--out``)."""
STRATEGIES_FILE = "strategies.json"
"""The results' file in that folder."""
STRATEGIES = Path(STRATEGIES_DIR) / STRATEGIES_FILE
"""Where ``camkit strategies RUN_DIR`` writes its results, inside the run folder."""
KIND = FileKind(STRATEGIES_FILE, 1, "camkit strategies RUN_DIR")
"""Version 1: version 0's layout (camkit 0.2) with a ``version`` field."""


@dataclasses.dataclass
class StrategiesRecord:
    """``strategies.json``: the ``images`` of the run's map rows, one group per (method, class)
    (:meth:`camkit.strategies.ClassStrategies.to_dict` with ``method``, ``label``, plot files
    and ``points`` ``[x, y, cluster, row]``), the ``skipped`` classes, the ``run`` folder and
    the ``parameters`` (camkit 0.2 files may lack these two)."""

    images: list[str]
    groups: list[dict[str, Any]]
    skipped: list[dict[str, Any]]
    run: str | None = None
    parameters: dict[str, Any] = dataclasses.field(default_factory=dict)
    version: int = KIND.version


def write_strategies(folder: Path, record: StrategiesRecord) -> Path:
    """Write ``FOLDER/strategies.json`` -> its path."""
    return write_json(folder / STRATEGIES_FILE, KIND, dataclasses.asdict(record))


def read_strategies(folder: Path) -> StrategiesRecord | None:
    """``FOLDER/strategies.json`` (None when the folder has none); a broken file is a
    :class:`~camkit.errors.RunFileError`."""
    return read_record(folder / STRATEGIES_FILE, KIND, _strategies_record)


def _strategies_record(data: Any, read: Fields) -> StrategiesRecord:
    images = read.items(data, "images", str)
    groups = read.items(data, "groups", dict)
    for k, group in enumerate(groups):
        read.get(group, "method", str, f"groups[{k}].")
        read.get(group, "class", int, f"groups[{k}].")
        for j, cluster in enumerate(read.items(group, "clusters", dict, f"groups[{k}].")):
            where = f"groups[{k}].clusters[{j}]."
            read.get(cluster, "id", int, where)
            for name in ("members", "typical", "atypical"):
                read.items(cluster, name, int, where, default=[])
    return StrategiesRecord(
        images=images,
        groups=groups,
        skipped=read.items(data, "skipped", dict, default=[]),
        run=read.get(data, "run", (str, type(None)), default=None),
        parameters=read.get(data, "parameters", dict, default={}),
        version=read.version,
    )


def url_path(path: str) -> str:
    """A relative POSIX path -> a URL path ('#', '?', '%', spaces... escaped)."""
    return quote(path, safe="/")


def relative_urls(out: Path, folder: Path) -> Callable[[str | None], str | None]:
    """Names of files in ``folder`` -> URLs relative to ``out`` (a page written there); None
    stays None."""
    prefix = Path(os.path.relpath(folder.resolve(), out.resolve())).as_posix()

    def url(name: str | None) -> str | None:
        return None if name is None else url_path(f"{prefix}/{name}" if prefix != "." else name)

    return url


def cluster_view(
    cluster: Mapping[str, Any],
    members: Callable[[Sequence[int]], list[int]],
    picture: Callable[[str | None], str | None],
    *,
    score: str = "suspiciousness",
    lists: Sequence[str] = ("typical", "atypical"),
) -> dict[str, Any]:
    """One cluster of ``strategies.json`` for a page: its ``id``, ``size``, ``confidence``,
    ``accuracy``, suspiciousness (named ``score``), ``concepts`` (None when not found), its
    prototype through ``picture`` (file name -> the page's reference) and its member ``lists``
    through ``members`` (map rows -> the page's). ``atypical`` leaves out the ``typical``
    members (a small cluster's two lists overlap)."""
    found = {name: members(cluster.get(name, [])) for name in lists}
    if "typical" in found and "atypical" in found:
        typical = set(found["typical"])
        found["atypical"] = [member for member in found["atypical"] if member not in typical]
    return (
        {key: cluster.get(key) for key in ("id", "size", "confidence", "accuracy")}
        | {score: cluster.get("suspiciousness"), "prototype": picture(cluster.get("prototype"))}
        | {"concepts": cluster.get("concepts")}
        | found
    )


def strategies_data(
    out: Path, images: Sequence[Mapping[str, Any]], found: StrategiesRecord, folder: Path
) -> dict[str, Any]:
    """:func:`read_strategies`'s record for the report's page: map rows -> page image indices
    (-1: not on the page), files (relative to ``folder``) -> URLs relative to ``out``."""
    page = {image["path"]: index for index, image in enumerate(images)}
    rows = [page.get(str(image), -1) for image in found.images]
    url = relative_urls(out, folder)
    lists = ("typical", "atypical", "members")

    def on_page(members: Sequence[int]) -> list[int]:
        return [rows[r] for r in members]

    groups = [
        {key: group.get(key) for key in ("method", "class", "label", "samples", "k")}
        | {
            "suggested": group.get("suggested_k"),
            "eigenvalues": group.get("eigenvalues", []),
            "eigengap": url(group.get("eigengap_plot")),
            "points": [[x, y, c, rows[r]] for x, y, c, r in group.get("points", [])],
            "clusters": [
                cluster_view(c, on_page, url, score="score", lists=lists)
                for c in group.get("clusters", [])
            ],
        }
        for group in found.groups
    ]
    return {"groups": groups, "skipped": list(found.skipped)}

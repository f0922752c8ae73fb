"""The strategies results of a run folder: ``strategies/strategies.json`` (written by ``camkit
strategies``) read for a page. :func:`cluster_view` turns one cluster into what a page shows, for
the static report and the explorer (:func:`camkit.serve.gallery.read_strategies`);
:func:`strategies_data` is the report's whole view (map rows -> the page's image indices, files
-> URLs)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

STRATEGIES = Path("strategies") / "strategies.json"
"""Where ``camkit strategies RUN_DIR`` writes its results, inside the run folder."""


def url_path(path: str) -> str:
    """A relative POSIX path -> a URL path ('#', '?', '%', spaces... escaped)."""
    return quote(path, safe="/")


def relative_urls(out: Path, folder: Path) -> Callable[[str], str]:
    """Names of files in ``folder`` -> URLs relative to ``out`` (a page written there)."""
    prefix = Path(os.path.relpath(folder.resolve(), out.resolve())).as_posix()

    def url(name: str) -> str:
        return url_path(f"{prefix}/{name}" if prefix != "." else name)

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
    ``accuracy`` and suspiciousness (named ``score``), its prototype picture through
    ``picture`` (a file name relative to the strategies folder -> the page's reference) and its
    member ``lists`` (rows of the run's map file) through ``members`` (rows -> the page's).
    ``atypical`` leaves out the ``typical`` members: a small cluster's two lists overlap, and
    the page would show the same images as both. ``concepts``: the cluster's dominant concepts
    when ``camkit strategies`` found them (a run with ``camkit concepts`` results), else None."""
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
    out: Path, images: Sequence[Mapping[str, Any]], found: Mapping[str, Any], folder: Path
) -> dict[str, Any]:
    """``strategies.json`` for the report's page: map rows -> page image indices (-1: not on
    the page), files (relative to ``folder``) -> URLs relative to ``out``."""
    page = {image["path"]: index for index, image in enumerate(images)}
    rows = [page.get(str(image), -1) for image in found.get("images", [])]
    file_url = relative_urls(out, folder)

    def url(name: str | None) -> str | None:
        return None if name is None else file_url(name)

    def indices(members: Sequence[int]) -> list[int]:
        return [rows[r] for r in members]

    groups = []
    for group in found.get("groups", []):
        clusters = [
            cluster_view(
                cluster, indices, url, score="score", lists=("typical", "atypical", "members")
            )
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

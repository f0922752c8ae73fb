"""The concepts results of a run folder: ``concepts.json`` (written by ``camkit concepts --out
RUN``: per channel of one layer its reference images, most active and most relevant, each with
its patch) read for a page, the explorer's concept views and the report's concept atlas."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from camkit.runs.strategies import relative_urls

CONCEPTS = Path("concepts.json")
"""Where ``camkit concepts ... --out RUN`` writes its results, inside the run folder."""
RANKINGS = ("activation", "relevance")
"""The two rankings of the reference images (activation and relevance maximisation)."""


def read_concepts(run: Path) -> dict[str, Any] | None:
    """``RUN/concepts.json`` as ``{"layer", "model", "rules", "images", "channels": {channel:
    {"activation": [...], "relevance": [...]}}}`` (channels as ints; each entry its ``rank``,
    ``image``, ``score``, ``class``, ``label``, ``box`` and ``patch``, a path relative to the
    run folder); None when the run has none or the file is not a ``camkit concepts`` result."""
    path = run / CONCEPTS
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text("utf-8"))
        channels = {
            int(channel): {mode: list(rows.get(mode, [])) for mode in RANKINGS}
            for channel, rows in data["channels"].items()
        }
        layer = str(data["layer"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return {
        "layer": layer,
        "model": data.get("model"),
        "rules": data.get("rules"),
        "images": data.get("images"),
        "channels": channels,
    }


def channel_references(found: dict[str, Any] | None, layer: str, channel: int) -> dict | None:
    """One channel's reference images of :func:`read_concepts`'s results, when they are of
    ``layer`` and list that channel; else None."""
    if found is None or found["layer"] != layer:
        return None
    return found["channels"].get(channel)


def atlas_data(out: Path, found: dict[str, Any], folder: Path) -> dict[str, Any]:
    """:func:`read_concepts`'s results (``folder``: where ``concepts.json`` lies) for the
    report's concept atlas in ``out``: per channel, in the file's order (the most relevant
    over the images first), its reference patches of each ranking with their image's name,
    predicted label and score, patch paths -> URLs relative to ``out``."""
    url = relative_urls(out, folder)
    channels = []
    for channel, rows in found["channels"].items():
        entry: dict[str, Any] = {"channel": channel}
        for mode in RANKINGS:
            entry[mode] = [
                {
                    "rank": row.get("rank"),
                    "src": url(str(row["patch"])),
                    "image": Path(str(row.get("image", ""))).name,
                    "label": row.get("label"),
                    "score": row.get("score"),
                }
                for row in rows[mode]
                if row.get("patch")
            ]
        channels.append(entry)
    keys = ("layer", "model", "rules", "images")
    return {key: found.get(key) for key in keys} | {"channels": channels}


__all__ = ["CONCEPTS", "RANKINGS", "atlas_data", "channel_references", "read_concepts"]

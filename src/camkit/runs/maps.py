"""The maps file of a run folder (``camkit explain --save-maps``): every raw map in one
``maps.npz``.

Like the manifest, each rank appends its maps to its own part, ``maps.rank<R>.f16`` (raw
float16 rows at the model's input size, flushed to the disk), before the records that name
them (``"map_part": [rank, row]``) are appended to its manifest part: a record in a part always
has its map on the disk. When rank 0 merges the manifest (at the end, or when ``--resume``
consolidates a killed run) it streams the rows of the earlier ``maps.npz`` and of the parts into
a new ``maps.npz`` in the manifest's order, and each record's ``"map"`` becomes its row there.
The file format is :mod:`camkit.strategies.mapfile`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
from torch import Tensor

from camkit.strategies.mapfile import MAPS_FILE, load_maps, write_maps

PARTS = "maps.rank*.f16"
BLOCK = 256  # rows copied at a time when merging


def part_path(out: Path, rank: int) -> Path:
    return out / f"maps.rank{rank}.f16"


def as_map(raw: Tensor) -> np.ndarray:
    """A method's raw map ``(H, W)`` or pixel attribution ``(C, H, W)`` (summed over the
    channels) -> ``(H, W)`` float16."""
    return (raw.sum(dim=0) if raw.ndim == 3 else raw).float().numpy().astype(np.float16)


class MapPart:
    """This rank's part: maps appended as rows, each append flushed to the disk."""

    def __init__(self, out: Path, rank: int):
        self.path, self.rank = part_path(out, rank), rank

    def append(self, maps: Sequence[np.ndarray]) -> list[list[int]]:
        """Append ``maps`` -> their ``[rank, row]`` references."""
        if not maps:
            return []
        with open(self.path, "ab") as part:
            start = part.tell() // maps[0].nbytes
            part.write(b"".join(np.ascontiguousarray(m, "<f2").tobytes() for m in maps))
            part.flush()
            os.fsync(part.fileno())
        return [[self.rank, start + row] for row in range(len(maps))]


def fold(out: Path, records: list[dict], head: dict) -> None:
    """Rewrite ``OUT/maps.npz`` with the maps of ``records`` (in their order) from the earlier
    file and the ranks' parts; set each record's ``"map"`` to its row and remove the parts."""
    shape = tuple(head["settings"]["input_size"])
    rows = [record for record in records if "map" in record or "map_part" in record]
    previous = load_maps(out / MAPS_FILE).maps if (out / MAPS_FILE).is_file() else None
    parts: dict[int, np.ndarray] = {}
    for path in out.glob(PARTS):
        rank = int(path.name.split(".")[1].removeprefix("rank"))
        parts[rank] = np.memmap(path, dtype="<f2", mode="r").reshape(-1, *shape)

    def blocks() -> Iterator[np.ndarray]:
        for start in range(0, len(rows), BLOCK):
            block = []
            for record in rows[start : start + BLOCK]:
                if "map_part" in record:
                    rank, row = record["map_part"]
                    block.append(parts[rank][row])
                else:
                    block.append(previous[record["map"]])
            yield np.stack(block)

    if rows:
        index = {
            "image": [r["image"] for r in rows],
            "method": [r["method"] for r in rows],
            "target": [r["target"] for r in rows],
            "probability": [r["probability"] for r in rows],
            "prediction": [r["top5"][0]["index"] for r in rows],
            "confidence": [r["top5"][0]["probability"] for r in rows],
            "truth": [r.get("truth", -1) for r in rows],
        }
        classes = {str(r["target"]): r["label"] for r in rows}
        classes |= {str(e["index"]): e["label"] for r in rows for e in r["top5"]}
        keep = ("camkit", "torch", "settings", "model", "weights_sha256", "started")
        metadata = {key: head.get(key) for key in keep} | {"classes": classes}
        write_maps(out / MAPS_FILE, blocks(), len(rows), shape, index, metadata)
    for position, record in enumerate(rows):
        record.pop("map_part", None)
        record["map"] = position
    for path in out.glob(PARTS):
        path.unlink()


def stale(out: Path) -> list[Path]:
    """What an earlier run left: its ``maps.npz`` and parts (removed when a new run starts)."""
    return [*out.glob(PARTS), *([out / MAPS_FILE] if (out / MAPS_FILE).is_file() else [])]

"""The maps file of a run folder: every raw map in one ``maps.npz`` (``camkit explain
--save-maps``), an uncompressed NumPy archive readable with numpy alone::

    data = np.load("run/maps.npz")
    data["maps"]        # (N, H, W) float16, the raw maps at the model's input size
                        # (CAMs as computed; pixel attributions summed over colour channels)
    data["image"]       # (N,) str, the image path as the manifest gives it
    data["method"]      # (N,) str
    data["target"]      # (N,) int, the explained class
    data["probability"] # (N,) float32, the target's softmax probability
    data["prediction"]  # (N,) int, the top-1 class
    data["confidence"]  # (N,) float32, the top-1 probability
    data["truth"]       # (N,) int, the true label, -1 where unknown
    json.loads(str(data["metadata"]))  # the run: versions, settings, model, class labels,
                                       # and the file's "version" (none: version 0, camkit 0.2)

Row ``i`` is the manifest record whose ``"map"`` is ``i``. The writer streams rows and the
reader maps ``maps`` from the file, so runs larger than memory fit.

Each rank appends its maps to its own part ``maps.rank<R>.f16`` (raw float16 rows, flushed)
before the manifest records that name them (``"map_part": [rank, row]``); merging the manifest
streams the earlier ``maps.npz`` and the parts into a new one in its order (:func:`fold`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import struct
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from torch import Tensor

from camkit.errors import InputError, RunFileError
from camkit.runs.records import FileKind

MAPS_FILE = "maps.npz"
KIND = FileKind(MAPS_FILE, 1, "camkit explain IMAGES --save-maps --out RUN")
"""Version 1: version 0's layout (camkit 0.2) with a ``version`` in the metadata."""
INDEX_FIELDS = {
    "image": str,
    "method": str,
    "target": np.int64,
    "probability": np.float32,
    "prediction": np.int64,
    "confidence": np.float32,
    "truth": np.int64,
}


@dataclasses.dataclass
class MapSet:
    """The maps of a run and their index (see the module's docstring for the fields)."""

    maps: np.ndarray  # (N, H, W) float16, possibly a read-only memory map
    image: np.ndarray
    method: np.ndarray
    target: np.ndarray
    probability: np.ndarray
    prediction: np.ndarray
    confidence: np.ndarray
    truth: np.ndarray
    metadata: dict[str, Any]
    version: int = KIND.version

    def __len__(self) -> int:
        return len(self.maps)

    def labels(self) -> list[str] | None:
        """The model's class names, when the run recorded them."""
        return self.metadata.get("labels")


def write_maps(
    path: str | os.PathLike[str],
    rows: Iterable[np.ndarray],
    count: int,
    shape: tuple[int, int],
    index: Mapping[str, Any],
    metadata: Mapping[str, Any],
) -> Path:
    """Write ``count`` maps of ``shape`` (``(n, H, W)`` blocks), their ``index`` columns and
    ``metadata`` (with the file's version) as ``path``, atomically."""
    path = Path(path)
    temporary = path.with_name(path.name + ".tmp")
    header = {"descr": "<f2", "fortran_order": False, "shape": (count, *shape)}
    written = 0
    with zipfile.ZipFile(temporary, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
        with archive.open("maps.npy", "w", force_zip64=True) as handle:
            np.lib.format.write_array_header_1_0(handle, header)
            for block in rows:
                block = np.ascontiguousarray(block, dtype="<f2")
                if block.shape[1:] != tuple(shape):
                    raise InputError(f"maps of shape {shape} expected, got {block.shape[1:]}")
                handle.write(block.tobytes())
                written += len(block)
        if written != count:
            raise InputError(f"{count} maps announced, {written} written")
        for name, kind in INDEX_FIELDS.items():
            column = np.asarray(index[name], dtype=kind)
            if column.shape != (count,):
                raise InputError(f"index column {name}: {count} values expected")
            with archive.open(f"{name}.npy", "w") as handle:
                np.lib.format.write_array(handle, column, allow_pickle=False)
        with archive.open("metadata.npy", "w") as handle:
            stamped = {"version": KIND.version, **metadata}
            np.lib.format.write_array(handle, np.array(json.dumps(stamped)))
    with open(temporary, "rb+") as handle:
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    return path


def _mapped(path: Path, info: zipfile.ZipInfo) -> np.ndarray | None:
    """A stored (uncompressed) ``.npy`` member as a read-only memory map; None if compressed."""
    if info.compress_type != zipfile.ZIP_STORED:
        return None
    with open(path, "rb") as handle:
        handle.seek(info.header_offset)
        local = handle.read(30)
        name_length, extra_length = struct.unpack("<HH", local[26:30])
        handle.seek(info.header_offset + 30 + name_length + extra_length)
        version = np.lib.format.read_magic(handle)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(handle)
        else:
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(handle)
        offset = handle.tell()
    if fortran or dtype.hasobject:
        return None
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape)


def load_maps(path: str | os.PathLike[str], *, mmap: bool = True) -> MapSet:
    """Read ``maps.npz`` (or a run folder holding one); ``mmap``: map the maps from the file.
    No file: :class:`~camkit.errors.InputError`; a broken one:
    :class:`~camkit.errors.RunFileError`."""
    path = Path(path)
    if path.is_dir():
        path = path / MAPS_FILE
    if not path.is_file():
        raise InputError(
            f"no saved maps at {path}: run 'camkit explain ... --save-maps' to write them"
        )
    version = None
    try:
        with np.load(path, allow_pickle=False) as data:
            missing = {"maps", "metadata", *INDEX_FIELDS} - set(data.files)
            if missing:
                raise KIND.error(path, None, f"its members {sorted(missing)} are missing")
            metadata = json.loads(str(data["metadata"]))
            if not isinstance(metadata, dict):
                raise KIND.error(path, None, "its metadata is not a JSON object")
            version = KIND.version_of(path, metadata)
            columns = {name: data[name] for name in INDEX_FIELDS}
            maps = _mapped(path, data.zip.getinfo("maps.npy")) if mmap else None
            if maps is None:
                maps = data["maps"]
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as error:
        if isinstance(error, InputError | RunFileError):
            raise
        raise KIND.error(path, version, f"not a complete map file ({error})") from None
    if maps.ndim != 3 or any(column.shape != (len(maps),) for column in columns.values()):
        lengths = {name: column.shape for name, column in columns.items()}
        raise KIND.error(path, version, f"maps {maps.shape} and index columns {lengths} differ")
    return MapSet(maps=maps, metadata=metadata, version=version, **columns)


PARTS = "maps.rank*.f16"
BLOCK = 256  # rows copied at a time when merging


def as_map(raw: Tensor) -> np.ndarray:
    """A method's raw map ``(H, W)`` or pixel attribution ``(C, H, W)`` (summed over the
    channels) -> ``(H, W)`` float16."""
    return (raw.sum(dim=0) if raw.ndim == 3 else raw).float().numpy().astype(np.float16)


class MapPart:
    """This rank's part: maps appended as rows, each append flushed to the disk."""

    def __init__(self, out: Path, rank: int):
        self.path, self.rank = out / f"maps.rank{rank}.f16", rank

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

    def stored(record: dict) -> np.ndarray:
        if "map_part" in record:
            rank, row = record["map_part"]
            return parts[rank][row]
        return previous[record["map"]]

    if rows:
        index = {
            key: [r[key] for r in rows] for key in ("image", "method", "target", "probability")
        }
        index |= {
            "prediction": [r["top5"][0]["index"] for r in rows],
            "confidence": [r["top5"][0]["probability"] for r in rows],
            "truth": [r.get("truth", -1) for r in rows],
        }
        classes = {str(r["target"]): r["label"] for r in rows}
        classes |= {str(e["index"]): e["label"] for r in rows for e in r["top5"]}
        keep = ("camkit", "torch", "settings", "model", "weights_sha256", "started")
        metadata = {key: head.get(key) for key in keep} | {"classes": classes}
        starts = range(0, len(rows), BLOCK)
        blocks = (np.stack([stored(r) for r in rows[s : s + BLOCK]]) for s in starts)
        write_maps(out / MAPS_FILE, blocks, len(rows), shape, index, metadata)
    for position, record in enumerate(rows):
        record.pop("map_part", None)
        record["map"] = position
    for path in out.glob(PARTS):
        path.unlink()


def stale(out: Path) -> list[Path]:
    """What an earlier run left: its ``maps.npz`` and parts (removed when a new run starts)."""
    return [*out.glob(PARTS), *([out / MAPS_FILE] if (out / MAPS_FILE).is_file() else [])]

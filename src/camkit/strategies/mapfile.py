"""The raw maps of a run in one file: ``maps.npz`` (``camkit explain --save-maps``).

An uncompressed NumPy ``.npz`` archive, readable with numpy alone::

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
    json.loads(str(data["metadata"]))  # the run: versions, settings, model, class labels

Row ``i`` is the manifest record whose ``"map"`` field is ``i``. The archive is written by
streaming rows (never the whole array in memory), and :func:`load_maps` maps ``maps`` from the
file without reading it (``mmap``), so runs larger than memory can be analysed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import struct
import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from camkit.errors import InputError

MAPS_FILE = "maps.npz"
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
    """Write ``count`` maps of ``shape`` (an iterable of ``(n, H, W)`` blocks) with their
    ``index`` columns and ``metadata`` as ``path`` (atomically: a temporary file renamed)."""
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
            np.lib.format.write_array(handle, np.array(json.dumps(dict(metadata))))
    with open(temporary, "rb+") as handle:
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    return path


def _mapped(path: Path, archive: zipfile.ZipFile, name: str) -> np.ndarray | None:
    """A stored (uncompressed) ``.npy`` member as a read-only memory map; None if compressed."""
    info = archive.getinfo(name)
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
    """Read ``maps.npz`` (or a run folder holding one); ``mmap``: map the maps from the file
    instead of reading them into memory."""
    path = Path(path)
    if path.is_dir():
        path = path / MAPS_FILE
    if not path.is_file():
        raise InputError(
            f"no saved maps at {path}: run 'camkit explain ... --save-maps' to write them"
        )
    try:
        with np.load(path, allow_pickle=False) as data:
            missing = {"maps", "metadata", *INDEX_FIELDS} - set(data.files)
            if missing:
                raise InputError(f"{path} is not a camkit map file (missing {sorted(missing)})")
            columns = {name: data[name] for name in INDEX_FIELDS}
            metadata = json.loads(str(data["metadata"]))
            maps = None
            if mmap:
                with zipfile.ZipFile(path) as archive:
                    maps = _mapped(path, archive, "maps.npy")
            if maps is None:
                maps = data["maps"]
    except (OSError, ValueError, zipfile.BadZipFile, json.JSONDecodeError) as error:
        if isinstance(error, InputError):
            raise
        raise InputError(f"cannot read the map file {path}: {error}") from None
    return MapSet(maps=maps, metadata=metadata, **columns)

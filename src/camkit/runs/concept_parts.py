"""The resume files of a ``camkit concepts`` run in progress: ``concepts.part-<rank>-<id>.pt``,
each rank's channel rankings so far, saved after every batch so that ``--resume`` continues a
killed run and rank 0 merges the ranks' parts. A part is a ``torch.save`` dictionary read back
with ``weights_only=True`` (no pickled code runs): the run's identity as top-level keys,
``done``, ``unreadable`` and the collector's ``state``."""

from __future__ import annotations

import dataclasses
import pickle
import uuid
import zipfile
from io import BytesIO
from pathlib import Path
from typing import Any

import torch

from camkit import io
from camkit.runs.records import Fields, FileKind

PARTS = "concepts.part-*.pt"
"""The parts in a run folder (a glob pattern)."""
KIND = FileKind(PARTS, 1, "camkit concepts IMAGES --out RUN")
"""Version 1: version 0's layout (camkit 0.2) with a ``version`` key."""
_OWN = ("done", "unreadable", "state")  # a part's keys besides the run's and the version


@dataclasses.dataclass
class ConceptsPart:
    """One rank's part: the ``run`` it belongs to (the keys that identify a run), the indices of
    the images it ranked (``done``), the ``unreadable`` paths, the collector's ``state`` and
    the file it was read from (``path``)."""

    run: dict[str, Any]
    done: list[int]
    unreadable: list[str]
    state: dict[str, Any]
    version: int = KIND.version
    path: Path | None = None


def new_part_path(out: Path, rank: int) -> Path:
    """A new part's file for ``rank`` (a random id: a resumed run never overwrites a part)."""
    return out / f"concepts.part-{rank}-{uuid.uuid4().hex[:8]}.pt"


def write_part(path: Path, part: ConceptsPart) -> Path:
    """Save ``part`` at ``path`` (atomically, renamed into place) -> the path."""
    saved = part.run | {key: getattr(part, key) for key in _OWN} | {"version": KIND.version}
    buffer = BytesIO()
    torch.save(saved, buffer)
    return io.write_atomic(path, buffer.getvalue(), durable=False)


def _read_part(path: Path) -> ConceptsPart:
    try:
        data = torch.load(path, weights_only=True)
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise KIND.error(path, None, f"not a complete torch file ({reason})") from None
    read = Fields(KIND, path, KIND.version_of(path, data))
    return ConceptsPart(
        run={key: value for key, value in data.items() if key not in (*_OWN, "version")},
        done=read.items(data, "done", int),
        unreadable=read.items(data, "unreadable", str),
        state=read.get(data, "state", dict),
        version=read.version,
        path=path,
    )


def read_parts(out: Path) -> list[ConceptsPart]:
    """Every part in ``out``, by file name (a broken one: :class:`~camkit.errors.RunFileError`)."""
    return [_read_part(path) for path in sorted(out.glob(PARTS))]


__all__ = ["KIND", "PARTS", "ConceptsPart", "new_part_path", "read_parts", "write_part"]

"""What every file of a run folder shares: its kind (file name, the version this camkit writes,
the command that writes it), reading its version (none: :data:`LEGACY`, camkit 0.2's layout;
above the kind's: refused) and typed reads of its values that turn a missing key or a wrong
type into a :class:`~camkit.errors.RunFileError` naming the file, its version and what to do."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from camkit import io
from camkit.errors import RunFileError

LEGACY = 0
"""The version of a file written before run files had a ``version`` field (camkit <= 0.2)."""
_REQUIRED = object()
Record = TypeVar("Record")
Types = type | tuple[type, ...]
"""The type or types a value read must be of (``type(None)``: null)."""


@dataclasses.dataclass(frozen=True)
class FileKind:
    """One kind of run file: its ``name`` in the run folder, the ``version`` this camkit writes
    and knows (it reads every version up to it) and the command that ``writes`` it."""

    name: str
    version: int
    writes: str

    def error(self, path: Path, version: int | None, problem: str) -> RunFileError:
        """The error of a broken file: the file, its version, the problem, what to do."""
        shown = {
            None: "version unknown",
            LEGACY: f"version {LEGACY}: no version field, written by camkit 0.2 or earlier",
        }.get(version, f"version {version}")
        return RunFileError(
            f"{path} ({self.name}, {shown}): {problem}; run '{self.writes}' again to write it"
        )

    def version_of(self, path: Path, data: Any) -> int:
        """The version a loaded file declares (:data:`LEGACY` when it has none); a version that
        is not a whole number, or newer than this camkit knows, is an error."""
        version = data.get("version", LEGACY) if isinstance(data, Mapping) else LEGACY
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise self.error(path, None, f"its version {version!r} is not a whole number >= 0")
        if version > self.version:
            raise RunFileError(
                f"{path} ({self.name}, version {version}): written by a newer camkit (this one "
                f"reads up to version {self.version}); upgrade camkit, or run '{self.writes}' "
                "again with this one"
            )
        return version


@dataclasses.dataclass(frozen=True)
class Fields:
    """Typed reads of one loaded file's values (``path``: the file, ``version``: its version):
    each failure is ``kind``'s :class:`~camkit.errors.RunFileError`."""

    kind: FileKind
    path: Path
    version: int

    def fail(self, problem: str) -> RunFileError:
        return self.kind.error(self.path, self.version, problem)

    def check(self, value: Any, types: Types, where: str) -> Any:
        """``value`` when it is of ``types`` (a bool is not an int, an int is a float)."""
        kinds = types if isinstance(types, tuple) else (types,)
        accepted = (*kinds, int) if float in kinds else kinds
        if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, accepted):
            names = " or ".join("null" if kind is type(None) else kind.__name__ for kind in kinds)
            raise self.fail(f"{where} is {type(value).__name__}, expected {names}")
        return value

    def get(
        self, data: Any, key: str, types: Types, where: str = "", default: Any = _REQUIRED
    ) -> Any:
        """``data[key]`` of ``types``; a missing key is an error unless a ``default`` is given
        (``where``: the path of ``data`` in the file, for the message)."""
        self.check(data, dict, where.rstrip(".") or "the file's top level")
        if key not in data:
            if default is _REQUIRED:
                raise self.fail(f"the key {where}{key} is missing")
            return default
        return self.check(data[key], types, f"{where}{key}")

    def items(
        self, data: Any, key: str, types: Types, where: str = "", default: Any = _REQUIRED
    ) -> list:
        """``data[key]``: a list whose every item is of ``types``."""
        values = self.get(data, key, list, where, default)
        for index, value in enumerate(values):
            self.check(value, types, f"{where}{key}[{index}]")
        return list(values)


def read_record(
    path: Path, kind: FileKind, parse: Callable[[Any, Fields], Record]
) -> Record | None:
    """``parse(data, reads)`` of a run file: its JSON and the typed reads of its values (its
    version read); None when there is no such file; a file that cannot be read or is not
    complete JSON is ``kind``'s error."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text("utf-8"))
    except OSError as error:
        raise kind.error(path, None, f"cannot be read ({error.strerror})") from None
    except UnicodeDecodeError:
        raise kind.error(path, None, "not UTF-8 text") from None
    except json.JSONDecodeError as error:
        where = f"line {error.lineno} column {error.colno}"
        raise kind.error(path, None, f"not complete JSON ({error.msg} at {where})") from None
    return parse(data, Fields(kind, path, kind.version_of(path, data)))


def write_json(path: Path, kind: FileKind, fields: Mapping[str, Any]) -> Path:
    """Write a run file (atomically) with ``kind``'s version first (whatever version
    ``fields`` held) -> its path."""
    fields = {key: value for key, value in fields.items() if key != "version"}
    return io.save_json(path, {"version": kind.version, **fields})

"""``concepts.json`` of a run folder (``camkit concepts --out RUN``): per channel of one layer
its reference images, most active and most relevant, each with its patch; what the explorer
(:func:`channel_references`) and the report's concept atlas (:func:`atlas_data`) show of it."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from camkit.runs.records import Fields, FileKind, read_record, write_json
from camkit.runs.strategies import relative_urls

CONCEPTS_FILE = "concepts.json"
"""Where ``camkit concepts ... --out RUN`` writes its results, inside the run folder."""
KIND = FileKind(CONCEPTS_FILE, 1, "camkit concepts IMAGES --out RUN")
"""Version 1: version 0's layout (camkit 0.2) with a ``version`` field."""
RANKINGS = ("activation", "relevance")
"""The two rankings of the reference images (activation and relevance maximisation)."""


@dataclasses.dataclass
class ConceptReference:
    """One reference image of a channel: its ``rank``, ``image`` path, ``score``, predicted
    ``class_index`` and ``label``, the receptive field's ``box`` ``[top, left, bottom, right]``
    on the photo and its ``patch`` file (relative to the run)."""

    rank: int
    image: str
    score: float
    class_index: int
    label: str
    box: list[int]
    patch: str

    def to_dict(self) -> dict[str, Any]:
        """As the file (and the pages) hold it: ``class_index`` is ``"class"``."""
        fields = dataclasses.asdict(self)
        return {"class" if key == "class_index" else key: value for key, value in fields.items()}


@dataclasses.dataclass
class ConceptsRecord:
    """``concepts.json``: the ``layer``, ``channels[channel][ranking]`` (:data:`RANKINGS`) its
    references by rank (the most relevant channels first), and (camkit 0.2 files may lack them)
    the ``model``, references per ranking (``top``), ``images`` ranked, ``unreadable`` paths,
    ``rules``, what the ``score`` is and the ``run`` (as a manifest's header)."""

    layer: str
    channels: dict[int, dict[str, list[ConceptReference]]]
    model: str | None = None
    top: int | None = None
    images: int | None = None
    unreadable: list[str] = dataclasses.field(default_factory=list)
    rules: str | None = None
    score: str | None = None
    run: dict[str, Any] | None = None
    version: int = KIND.version


def write_concepts(out: Path, record: ConceptsRecord) -> Path:
    """Write ``OUT/concepts.json`` -> its path."""
    channels = {
        str(channel): {mode: [ref.to_dict() for ref in rows[mode]] for mode in RANKINGS}
        for channel, rows in record.channels.items()
    }
    names = ("model", "layer", "top", "images", "unreadable", "rules", "score", "run")
    head = {name: getattr(record, name) for name in names}
    return write_json(out / CONCEPTS_FILE, KIND, head | {"channels": channels})


def _reference(read: Fields, row: Any, where: str) -> ConceptReference:
    box = read.items(row, "box", int, where)
    if len(box) != 4:
        raise read.fail(f"{where}box has {len(box)} numbers, expected 4 (top, left, bottom, right)")
    return ConceptReference(
        rank=read.get(row, "rank", int, where),
        image=read.get(row, "image", str, where),
        score=float(read.get(row, "score", float, where)),
        class_index=read.get(row, "class", int, where),
        label=read.get(row, "label", str, where),
        box=box,
        patch=read.get(row, "patch", str, where),
    )


def read_concepts(run: Path) -> ConceptsRecord | None:
    """``RUN/concepts.json`` (None when the run has none); a broken file is a
    :class:`~camkit.errors.RunFileError`."""
    return read_record(run / CONCEPTS_FILE, KIND, _concepts_record)


def _concepts_record(data: Any, read: Fields) -> ConceptsRecord:
    channels: dict[int, dict[str, list[ConceptReference]]] = {}
    for name, rankings in read.get(data, "channels", dict).items():
        if not name.isdigit():
            raise read.fail(f"channels has the key {name!r}, expected channel numbers")
        channels[int(name)] = {
            mode: [
                _reference(read, row, f"channels.{name}.{mode}[{k}].")
                for k, row in enumerate(read.items(rankings, mode, dict, f"channels.{name}."))
            ]
            for mode in RANKINGS
        }
    optional = {"model": str, "top": int, "images": int, "rules": str, "score": str, "run": dict}
    return ConceptsRecord(
        layer=read.get(data, "layer", str),
        channels=channels,
        unreadable=read.items(data, "unreadable", str, default=[]),
        version=read.version,
        **{
            key: read.get(data, key, (kind, type(None)), default=None)
            for key, kind in optional.items()
        },
    )


def channel_references(
    found: ConceptsRecord | None, layer: str, channel: int
) -> dict[str, list[dict[str, Any]]] | None:
    """One channel's reference images of :func:`read_concepts`'s record (per ranking, as the
    file holds them), when they are of ``layer`` and list that channel; else None."""
    if found is None or found.layer != layer or channel not in found.channels:
        return None
    return {mode: [ref.to_dict() for ref in refs] for mode, refs in found.channels[channel].items()}


def atlas_data(out: Path, found: ConceptsRecord, folder: Path) -> dict[str, Any]:
    """:func:`read_concepts`'s record (read from ``folder``) for the report's concept atlas in
    ``out``: per channel its patches of each ranking (URLs relative to ``out``) with their
    image's name, predicted label and score."""
    url = relative_urls(out, folder)

    def patches(refs: list[ConceptReference]) -> list[dict[str, Any]]:
        return [
            {"rank": ref.rank, "src": url(ref.patch), "image": Path(ref.image).name}
            | {"label": ref.label, "score": ref.score}
            for ref in refs
            if ref.patch
        ]

    channels = [
        {"channel": channel} | {mode: patches(rows[mode]) for mode in RANKINGS}
        for channel, rows in found.channels.items()
    ]
    head = {"layer": found.layer, "model": found.model, "rules": found.rules}
    return head | {"images": found.images, "channels": channels}


__all__ = [
    "CONCEPTS_FILE",
    "KIND",
    "RANKINGS",
    "ConceptReference",
    "ConceptsRecord",
    "atlas_data",
    "channel_references",
    "read_concepts",
    "write_concepts",
]

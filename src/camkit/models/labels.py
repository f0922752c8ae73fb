"""Class names: ImageNet's, a labels file's, a checkpoint's (``load.class_names`` picks)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from importlib import resources
from pathlib import Path

from camkit.errors import ArgumentError


def imagenet_labels() -> list[str]:
    """The 1000 ImageNet-1k class names in index order (torchvision's names: 281 is 'tabby')."""
    text = resources.files("camkit").joinpath("data/imagenet_classes.txt").read_text("utf-8")
    labels = [line.strip() for line in text.splitlines() if line.strip()]
    if len(labels) != 1000:
        raise RuntimeError(f"camkit/data/imagenet_classes.txt has {len(labels)} labels, not 1000")
    return labels


LABEL_KEYS = ("labels", "classes", "id2label")
"""Where a checkpoint keeps its class names (a list, or ``{index: name}`` as HuggingFace's
``id2label``): in a ``torch.save``d dict (also under ``"config"``) or safetensors metadata."""


def as_labels(found: object, source: str) -> list[str]:
    """Class names from a list (index order) or a mapping ``{index: name}`` (keys ints or digit
    strings, as HuggingFace's ``id2label``) covering ``0..n-1``."""
    if isinstance(found, (list, tuple)) and all(isinstance(name, str) for name in found):
        return [name.strip() for name in found]
    if isinstance(found, Mapping):
        try:
            by_index = {int(key): str(name).strip() for key, name in found.items()}
        except (TypeError, ValueError):
            by_index = {}
        if by_index and sorted(by_index) == list(range(len(by_index))):
            return [by_index[index] for index in range(len(by_index))]
    raise ArgumentError(
        f"{source}: expected class names as a list of strings or a mapping of the indices "
        f"0..n-1 to names (as HuggingFace's id2label), got {type(found).__name__}"
    )


def read_labels(path: str | os.PathLike[str]) -> list[str]:
    """A labels file: JSON (a list of names, or ``{index: name}`` / ``{"id2label": {...}}``),
    or plain text with one name per line (blank lines and ``#`` comments skipped)."""
    path = Path(path)
    try:
        text = path.read_text("utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ArgumentError(f"labels file {path}: cannot be read ({error})") from None
    if text.lstrip().startswith(("[", "{")):
        try:
            found = json.loads(text)
        except json.JSONDecodeError as error:
            raise ArgumentError(f"labels file {path}: not valid JSON ({error})") from None
        if isinstance(found, Mapping):
            found = next((found[key] for key in LABEL_KEYS if key in found), found)
        return as_labels(found, f"labels file {path}")
    names = [line.strip() for line in text.splitlines()]
    names = [name for name in names if name and not name.startswith("#")]
    if not names:
        raise ArgumentError(f"labels file {path}: no class names (expected one name per line)")
    return names


def checkpoint_labels(entries: Mapping[str, object], source: str) -> list[str] | None:
    """The class names a checkpoint's extra entries hold (:data:`LABEL_KEYS`, also under
    ``"config"``), None when it has none."""
    for where in (entries, entries.get("config")):
        if not isinstance(where, Mapping):
            continue
        for key in LABEL_KEYS:
            if key in where:
                found = where[key]
                if isinstance(found, str):  # safetensors metadata: JSON text
                    try:
                        found = json.loads(found)
                    except json.JSONDecodeError:
                        raise ArgumentError(f"{source}: {key!r} is not JSON text") from None
                return as_labels(found, f"{source} ({key})")
    return None

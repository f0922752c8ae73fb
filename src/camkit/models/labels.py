"""Class names: ImageNet's for 1000-class models, ``class <i>`` otherwise."""

from __future__ import annotations

from functools import lru_cache
from importlib import resources


@lru_cache(maxsize=1)
def _imagenet_labels() -> tuple[str, ...]:
    text = resources.files("camkit").joinpath("data/imagenet_classes.txt").read_text("utf-8")
    labels = tuple(line.strip() for line in text.splitlines() if line.strip())
    if len(labels) != 1000:
        raise RuntimeError(f"camkit/data/imagenet_classes.txt has {len(labels)} labels, not 1000")
    return labels


def imagenet_labels() -> list[str]:
    """The 1000 ImageNet-1k class names in index order (torchvision's names: 281 is 'tabby')."""
    return list(_imagenet_labels())


def labels_for(num_classes: int) -> list[str]:
    if num_classes == 1000:
        return imagenet_labels()
    return [f"class {index}" for index in range(num_classes)]  # 0 classes: no labels

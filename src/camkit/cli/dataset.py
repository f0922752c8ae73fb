"""Image files as a Dataset decoded in DataLoader workers; a bad file is reported, never raised."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from camkit.errors import ArgumentError
from camkit.io import MAX_PIXELS, READ_ERRORS, describe, read_failure, read_image


@dataclasses.dataclass(eq=False)
class ImageFiles(Dataset):
    """Image files decoded in DataLoader workers: ``dataset[i]`` -> ``{index, path, input:
    preprocess(rgb) (3, h, w), image: the (H, W, 3) uint8 original (``keep_original``), error}``;
    an unreadable file never raises: its ``error`` says why. Batch them with :func:`collate`."""

    paths: Sequence[str | os.PathLike[str]]
    preprocess: Callable[[np.ndarray], Tensor]
    _: dataclasses.KW_ONLY
    keep_original: bool = True
    max_pixels: int | None = MAX_PIXELS

    def __post_init__(self) -> None:
        if not callable(self.preprocess):
            raise ArgumentError(
                f"expected preprocess to be callable, got {describe(self.preprocess)}"
            )
        self.paths = [os.fspath(path) for path in self.paths]

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> dict[str, Any]:
        path = self.paths[index]
        item: dict[str, Any] = {"index": index, "path": path, "input": None, "image": None}
        try:
            rgb = read_image(path, max_pixels=self.max_pixels)
        except (*READ_ERRORS, MemoryError) as error:
            return item | {"error": read_failure(error)}
        try:
            model_input = self.preprocess(rgb)
        except (ValueError, TypeError, RuntimeError) as error:
            return item | {"error": f"preprocessing failed: {error}"}
        if not isinstance(model_input, Tensor) or model_input.ndim != 3:
            return item | {
                "error": f"preprocess must return a (3, h, w) tensor, got {describe(model_input)}"
            }
        image = torch.from_numpy(rgb) if self.keep_original else None
        return item | {"input": model_input, "image": image, "error": None}


class PinsInputs:
    """A batch dataclass of which ``DataLoader(pin_memory=True)`` pins ``inputs`` only."""

    inputs: Tensor | None

    def pin_memory(self) -> Any:
        inputs = None if self.inputs is None else self.inputs.pin_memory()
        return dataclasses.replace(self, inputs=inputs)  # type: ignore[type-var]


@dataclasses.dataclass
class ImageBatch(PinsInputs):
    """What :func:`collate` makes of :class:`ImageFiles` items: ``inputs`` ``(n, 3, h, w)`` (or
    None), ``indices``, ``paths``, ``images`` along its rows; ``failures``: (index, path, why)."""

    inputs: Tensor | None
    indices: list[int]
    paths: list[str]
    images: list[Tensor | None]
    failures: list[tuple[int, str, str]]

    def __len__(self) -> int:
        return len(self.indices) + len(self.failures)


def collate(items: Sequence[dict[str, Any]]) -> ImageBatch:
    """``collate_fn`` of :class:`ImageFiles`; inputs of different shapes (a preprocess that does
    not resize to one size) raise :class:`~camkit.errors.ArgumentError`."""
    good = [item for item in items if item["error"] is None]
    failures = [(item["index"], item["path"], item["error"]) for item in items if item["error"]]
    shapes = {tuple(item["input"].shape) for item in good}
    if len(shapes) > 1:
        raise ArgumentError(
            f"preprocessed images differ in shape ({sorted(shapes)}); use a preprocess that "
            "resizes every image to one size (e.g. crop_mode='squash' or 'center')"
        )
    return ImageBatch(
        inputs=torch.stack([item["input"] for item in good]) if good else None,
        indices=[item["index"] for item in good],
        paths=[item["path"] for item in good],
        images=[item["image"] for item in good],
        failures=failures,
    )

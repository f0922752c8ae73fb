"""Two checkpoints of one model compared image by image: whether the top-1 class changed, how
far the probability of the first checkpoint's top-1 class moved, and how far its map moved:
``1 - Spearman rank correlation`` (as in the model-randomisation sanity check of Adebayo et al.,
NeurIPS 2018) of the two maps at the default layer, Grad-CAM's (Selvaraju et al., ICCV 2017)
where it fits: 0 for maps ranked alike, 1 for unrelated, 2 for reversed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from camkit import metrics
from camkit.errors import InputError
from camkit.serve.explorer import Explorer
from camkit.targets.ranking import top1

CHUNK = 16  # images per forward pass


@dataclass(frozen=True)
class Disagreement:
    """How two checkpoints differ on one image (``first``: the first checkpoint's top-1)."""

    first: int
    second: int
    changed: bool  # the top-1 classes differ
    confidence_moved: float  # |p_first(c) - p_second(c)| for c = the first's top-1
    map_moved: float  # 1 - Spearman(map_first, map_second) of class c


class Comparison:
    """The disagreements of the explorer's first two checkpoints, measured on demand and kept."""

    def __init__(self, explorer: Explorer) -> None:
        self.explorer = explorer
        self.first, self.second = list(explorer.checkpoints)[:2]
        self.method = "gradcam" if "gradcam" in explorer.methods else explorer.methods[0]
        self.found: dict[int, Disagreement] = {}

    def measure(self, images: Sequence[int]) -> dict[int, Disagreement]:
        """The disagreement on each readable one of ``images``, chunk by chunk."""
        todo = [i for i in dict.fromkeys(images) if i not in self.found]
        for start in range(0, len(todo), CHUNK):
            self._measure(todo[start : start + CHUNK])
        return {image: self.found[image] for image in images if image in self.found}

    def _measure(self, images: list[int]) -> None:
        explorer, both = self.explorer, (self.first, self.second)
        readable = []
        for image in images:
            with contextlib.suppress(InputError):  # the entry holds why; the gallery shows it
                if explorer.entry(image).error is None:  # found unreadable before: not again
                    explorer.model_input(image)
                    readable.append(image)
        if not readable:
            return
        probabilities = {c: explorer.probabilities_of(readable, c) for c in both}
        tops = top1(probabilities[self.first]).tolist()
        pairs = list(zip(readable, tops, strict=True))
        layers = (explorer.default_layer,)
        heats = {}
        for checkpoint in both:
            explorer.compute(checkpoint, self.method, layers, pairs)
            keys = [explorer.keys(checkpoint, self.method, layers, i, c)[0] for i, c in pairs]
            heats[checkpoint] = torch.from_numpy(
                np.stack([explorer.maps.get_item(k) for k in keys])
            )
        moved = 1.0 - metrics.spearman(heats[self.first], heats[self.second])
        for row, (image, top) in enumerate(pairs):
            first, second = probabilities[self.first][row], probabilities[self.second][row]
            other = int(top1(second))
            self.found[image] = Disagreement(
                first=top,
                second=other,
                changed=other != top,
                confidence_moved=abs(float(first[top] - second[top])),
                map_moved=float(moved[row]),
            )

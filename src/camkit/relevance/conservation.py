"""How much of the target score an LRP explanation carries: the conservation record.

LRP redistributes the score ``S`` layer by layer; ideally every layer's relevance sums to ``S``
(Bach et al., PLOS ONE 2015, eq. 2; Montavon et al. 2019, sec. 10.2). Biases (and merged
BatchNorm shifts), the stabiliser, neurons whose activation no input explains (a unit driven
by its bias alone), and the first-layer rules lose or create some of it. The record gives, per
sample and target, the share ``sum(R_A) / S`` at the input and at each recorded layer, and the
step (between two recorded stages, from the output down) that loses the most.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from camkit.errors import ConservationWarning, warn

OUTPUT, INPUT = "output", "input"


def share_of(totals: Tensor, scores: Tensor) -> Tensor:
    """``totals / scores`` where the score is not 0, NaN where it is: ``(B, K), (B, K)``."""
    nonzero = scores != 0
    return torch.where(nonzero, totals / torch.where(nonzero, scores, 1), torch.nan)


@dataclass(frozen=True)
class Conservation(Mapping):
    """The share of each target's score that reached the input and each recorded layer.

    A mapping ``{"input" or layer name: (B, K) share}`` (1: conserved; NaN where the score is
    0). ``stages``: the names from the output down to the input (recorded layers deepest
    first); :attr:`lost` the share lost at each step, :meth:`lossiest` where the most is lost.
    """

    shares: dict[str, Tensor]
    stages: tuple[str, ...]

    @staticmethod
    def of(totals: dict[str, Tensor], scores: Tensor, forward_order: Sequence[str]) -> Conservation:
        """From the relevance sums ``{name: (B, K)}`` (with ``"input"``) and the scores
        ``(B, K)``; ``forward_order``: the recorded layers in the order the forward meets them."""
        shares = {name: share_of(total, scores) for name, total in totals.items()}
        layers = [name for name in forward_order if name in shares and name != INPUT]
        return Conservation(shares, (*reversed(layers), INPUT))

    def __getitem__(self, name: str) -> Tensor:
        return self.shares[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.shares)

    def __len__(self) -> int:
        return len(self.shares)

    @property
    def input(self) -> Tensor:
        """``(B, K)``: the share of the score that reached the input."""
        return self.shares[INPUT]

    @property
    def lost(self) -> dict[str, Tensor]:
        """``{stage: (B, K)}``: the share lost between the stage above (the output for the
        deepest) and this one; negative where relevance is created."""
        above = [torch.ones_like(self.input), *(self.shares[s] for s in self.stages)]
        return {s: above[i] - self.shares[s] for i, s in enumerate(self.stages)}

    def lossiest(self) -> list[list[tuple[str, str, float]]]:
        """Per sample, per target: ``(above, stage, share lost)``, the step that loses most."""
        steps = torch.stack([lost.nan_to_num(0.0) for lost in self.lost.values()], dim=-1)
        above = (OUTPUT, *self.stages)
        return [
            [(above[i], self.stages[i], float(row[k, i])) for k, i in enumerate(worst.tolist())]
            for row, worst in zip(steps, steps.argmax(-1), strict=True)
        ]

    def summary(self) -> list[list[dict]]:
        """Per sample, per target, as plain JSON: ``{"input": share, "layers": {name: share},
        "lost_most": {"between": [above, stage], "share": lost}}`` (NaN as None)."""

        def number(value: float) -> float | None:
            return None if value != value else round(value, 6)

        return [
            [
                {
                    INPUT: number(float(self.input[b, k])),
                    "layers": {
                        s: number(float(self.shares[s][b, k])) for s in self.stages if s != INPUT
                    },
                    "lost_most": {"between": [above, stage], "share": number(lost)},
                }
                for k, (above, stage, lost) in enumerate(steps)
            ]
            for b, steps in enumerate(self.lossiest())
        ]

    def check(self, low: float, high: float, what: str) -> None:
        """Warn (:class:`~camkit.errors.ConservationWarning`) when an input share of a
        sample-target pair is outside ``[low, high]``, naming the step that loses most (a
        score of 0, whose share is NaN, is not checked)."""
        share = self.input
        off = ~((share >= low) & (share <= high)) & ~share.isnan()
        if not bool(off.any()):
            return
        b, k = (int(i) for i in off.nonzero()[0])
        above, stage, lost = self.lossiest()[b][k]
        narrow = " (record more layers, layers=[...], to narrow it down)" if above == OUTPUT else ""
        warn(
            f"{what}: the input relevance is {float(share[b, k]):.3g} of the target score, "
            f"outside [{low:g}, {high:g}] (sample {b}, target {k}; {int(off.sum())} "
            f"sample-target pair(s) in all); most of it ({lost:.3g} of the score) is lost "
            f"between {above!r} and {stage!r}{narrow}. Biases and BatchNorm shifts absorb "
            "relevance, so do units that only their bias drives (the default composite's "
            "bias_units='bias' treats them as biases); see docs/relevance.md for the composite "
            "to choose",
            ConservationWarning,
        )


__all__ = ["Conservation", "share_of"]

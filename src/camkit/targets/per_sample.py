"""Target objects per sample (see :mod:`camkit.targets.resolver`): ``B`` callables, or ``B``
lists of ``K``, each sample's rows scored by its own."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from camkit.errors import TargetError
from camkit.targets.base import Target
from camkit.targets.outputs import describe


@dataclass(eq=False)  # identity: a RowScorer holding one stays hashable
class PerSample:
    """Target objects per sample: ``B`` callables, or ``B`` lists of ``K`` (the target axis).
    A camkit :class:`Target` scores the whole output, of which its sample's rows are kept; any
    other callable (pytorch-grad-cam's targets) gets each of its sample's rows (``output[i]``)
    and returns one score. Copies of several samples in one forward are each scored by theirs.
    """

    targets: list[list[Callable[[Any], Tensor]]]
    several: bool

    @classmethod
    def of(cls, target: object, batch: int) -> PerSample | None:
        """The per-sample targets in ``target`` (None when it holds no callable); checked."""
        if isinstance(target, Tensor | str) or not isinstance(target, Sequence) or not target:
            return None
        items = [
            list(t) if isinstance(t, Sequence) and not isinstance(t, str) else t for t in target
        ]
        rows = [item if isinstance(item, list) else [item] for item in items]
        calls = [callable(t) and not isinstance(t, Tensor) for row in rows for t in row]
        if not any(calls):
            return None
        several = all(isinstance(item, list) for item in items)
        if not all(calls) or (any(isinstance(item, list) for item in items) and not several):
            raise TargetError(
                "a list of target objects must hold only callables: B of them (one per sample) "
                "or B lists of K (K per sample), not mixed with classes"
            )
        if len(rows) != batch or len({len(row) for row in rows}) != 1 or not rows[0]:
            raise TargetError(
                f"a list of target objects needs one per sample ({batch}) or {batch} lists of K "
                f"each (the same K), got {len(rows)} item(s) with "
                f"{sorted({len(row) for row in rows})} target(s) each for a batch of {batch}"
            )
        return cls(rows, several)

    def each(self, form: str) -> PerSample:
        """The same with each target object's ``form()`` (:meth:`Target.for_copies`...)."""
        targets = [
            [getattr(t, form)() if isinstance(t, Target) else t for t in row]
            for row in self.targets
        ]
        return PerSample(targets, self.several)

    def scores(self, output: Any, rows: Tensor) -> Tensor:
        """``(n, K)`` scores: row ``i`` by the targets of sample ``rows[i]``."""
        n = rows.shape[0]
        columns: list[list[Tensor | None]] = [[None] * n for _ in self.targets[0]]
        samples = rows.tolist()
        for sample in sorted(set(samples)):
            picked = [i for i, s in enumerate(samples) if s == sample]
            for k, target in enumerate(self.targets[sample]):
                if isinstance(target, Target):  # camkit's targets score the whole output
                    values = target(output)
                    if not isinstance(values, Tensor) or values.shape != (n,):
                        raise TargetError(
                            f"target {target!r} of sample {sample} must return ({n},) scores "
                            f"for the {n} rows of the output, got {describe(values)}"
                        )
                    for i in picked:
                        columns[k][i] = values[i]
                    continue
                if not isinstance(output, Tensor | list | tuple):
                    raise TargetError(
                        f"a list of per-sample callables needs a tensor or list output, got "
                        f"{type(output).__name__}; pass one callable on the whole output instead"
                    )
                for i in picked:  # pytorch-grad-cam's form: the sample's own output
                    value = target(output[i])
                    if not isinstance(value, Tensor) or value.numel() != 1:
                        raise TargetError(
                            f"target {target!r} of sample {sample} gets that sample's output "
                            f"(output[i]) and must return one score, got {describe(value)}"
                        )
                    columns[k][i] = value.reshape(())
        return torch.stack([torch.stack(column) for column in columns], dim=1)


__all__ = ["PerSample"]

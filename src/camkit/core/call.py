"""One call of a method, passed down explicitly: every forward camkit runs is
``call.forward(model, inputs, rows)``, ``rows`` naming the sample each input row comes from.
:func:`chunks` is the one chunking policy.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from camkit.core.examples import Example, Inputs
from camkit.errors import ArgumentError


@dataclass(frozen=True, eq=False)
class Call:
    """The samples of one call (``batch``, or a tuple of explained inputs) and the model's
    other inputs (captum's ``additional_forward_args``): ``model(x, *args, **kwargs)``; a
    tensor with ``B`` rows is per sample (each forward gets its samples' rows).
    """

    batch: Tensor | tuple[Tensor, ...]
    args: tuple = ()
    kwargs: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, batch: Tensor | tuple[Tensor, ...], additional_forward_args: Any = None) -> Call:
        """The call of ``batch`` with ``additional_forward_args`` (a dict: keyword inputs; a
        tuple: positional ones; else one positional input)."""
        extra = additional_forward_args
        if extra is None:
            return cls(batch)
        if isinstance(extra, dict):
            return cls(batch, kwargs=dict(extra))
        return cls(batch, args=extra if isinstance(extra, tuple) else (extra,))

    @property
    def size(self) -> int:
        """The number of samples ``B``."""
        return (self.batch[0] if isinstance(self.batch, tuple) else self.batch).shape[0]

    def forward(
        self, model: nn.Module, inputs: Tensor | tuple[Tensor, ...], rows: Tensor | None = None
    ) -> Any:
        """``model(*inputs, *args, **kwargs)`` with the per-sample extra inputs of ``rows`` (the
        sample of each row of ``inputs``; None: the call's samples)."""
        explained = inputs if isinstance(inputs, tuple) else (inputs,)
        if not (self.args or self.kwargs):
            return model(*explained)
        if rows is None:
            extra = (*self.args, *self.kwargs.values())
            if explained[0].shape[0] != self.size and any(map(self._per_sample, extra)):
                raise ArgumentError(
                    f"a forward of {explained[0].shape[0]} rows cannot be matched to the "
                    f"per-sample additional_forward_args of a batch of {self.size}"
                )
            rows = torch.arange(self.size)
        args, kwargs = self._extra(rows)
        return model(*explained, *args, **kwargs)

    def following(self, samples: Tensor, batch: Tensor) -> Call:
        """The call of a new ``batch`` whose row ``i`` comes from sample ``samples[i]``."""
        return Call(batch, *self._extra(samples))

    def _extra(self, rows: Tensor) -> tuple[tuple, dict[str, Any]]:
        """The extra inputs of the samples ``rows``: per-sample tensors indexed, others as is."""

        def pick(arg: Any) -> Any:
            return arg[rows.to(arg.device)] if self._per_sample(arg) else arg

        return tuple(map(pick, self.args)), {key: pick(a) for key, a in self.kwargs.items()}

    def example(self, batch: Tensor) -> Example:
        """The call's inputs for tracing the model with ``batch``."""
        if self.kwargs:
            return Inputs((batch, *self.args), dict(self.kwargs))
        return (batch, *self.args) if self.args else batch

    def _per_sample(self, arg: object) -> bool:
        return isinstance(arg, Tensor) and arg.ndim > 0 and arg.shape[0] == self.size


def chunk_size(count: int, batch_size: int | None) -> int:
    """How many of ``count`` rows one forward pass takes: ``batch_size``, or all for None."""
    return min(batch_size or count, count) or 1


def chunks(
    count: int, batch_size: int | None, device: torch.device | None = None
) -> Iterator[Tensor]:
    """Row indices ``0..count-1`` in chunks of at most ``batch_size`` (all at once for None)."""
    step = chunk_size(count, batch_size)
    for start in range(0, count, step):
        yield torch.arange(start, min(start + step, count), device=device)


__all__ = ["Call", "chunk_size", "chunks"]

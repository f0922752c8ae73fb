"""Scoring many copies of a batch (masked images, patches, noisy images, path points): the one
loop that perturbation CAMs, SESS, the metrics and the pixel methods share. Row ``i`` of a
forward is a copy of sample ``samples[i]``: it is scored for that sample's target (its
**clean** top-1 class, :func:`pin_top1`) with that sample's extra inputs, ``batch_size`` rows
at a time, ``channels_last`` on the CPU.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import replace
from functools import cache, partial
from typing import Any

import torch
from torch import Tensor, nn

from camkit.core.call import Call, chunks
from camkit.core.formats import MemoryFormat, autocast
from camkit.core.state import buffers_kept
from camkit.targets.outputs import class_logits
from camkit.targets.resolver import RowScorer

TRIM_BYTES = 8 * 2**20  # copies from this size on free the heap before forwarding


@cache
def _malloc_trim() -> Callable[[int], int]:
    """glibc's ``malloc_trim``, else a no-op (another C library, another OS)."""
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return lambda pad: 0


def trim_heap() -> None:
    """Give the C heap's free pages back to the OS before a forward of copies on the CPU.

    glibc keeps what the previous chunk's forward freed, and the next forward adds its own
    peak on top: Score-CAM's peak RSS on ResNet-18 layer4, batch 32, drops from about 300 MB
    to the tensors' own 214 MB (benchmarks/MEMORY_SCORECAM.md). Chunks under ``TRIM_BYTES``
    skip it: there the re-faulted pages cost more time (about 10 %) than the memory is worth.
    """
    _malloc_trim()(0)


def pin_top1(
    model: nn.Module,
    batch: Tensor | tuple[Tensor, ...],
    scorer: RowScorer,
    call: Call,
    *,
    dtype: torch.dtype | None = None,
    batch_size: int | None = None,
) -> RowScorer:
    """``scorer`` with top-1 classes fixed on a clean pass over ``call``'s samples ``batch`` (or
    tuple of inputs), so that copies keep explaining the clean prediction."""
    if not scorer.top1:
        return scorer
    inputs = batch if isinstance(batch, tuple) else (batch,)
    first = inputs[0]
    classes = []
    with buffers_kept(model), torch.inference_mode(), autocast(first.device, dtype):
        for rows in chunks(first.shape[0], batch_size, first.device):
            chunk = tuple(t[rows] for t in inputs)
            logits = class_logits(call.forward(model, chunk, rows), scorer.selector)
            classes.append(scorer.top1_of(logits, rows))
    return replace(scorer, classes=torch.cat(classes).clone())


class CopyScorer:
    """Scores copies of the samples of ``batch`` (those of ``call``) for their own sample's
    target, as ``(n, K)`` float32. ``probabilities=True`` scores a class target by its softmax
    probability (as the metrics and SESS compare images). ``scores``: the clean batch's
    ``(B, K)`` scores, if known (:meth:`clean` computes them). Callable targets must score
    each row of the output on its own.
    """

    def __init__(
        self,
        model: nn.Module,
        batch: Tensor,
        scorer: RowScorer,
        call: Call,
        *,
        dtype: torch.dtype | None = None,
        batch_size: int | None = None,
        probabilities: bool = False,
        scores: Tensor | None = None,
        memory: MemoryFormat | None = None,
    ):
        self.model, self.batch, self.call = model, batch, call
        self.scorer = scorer.for_copies()  # e.g. a lost detection scores 0 in a copy
        self.dtype, self.batch_size, self.probabilities = dtype, batch_size, probabilities
        self.memory = memory or MemoryFormat(batch)
        self.scores = None if scores is None else scores.detach().float()

    @classmethod
    def clean(
        cls, model: nn.Module, batch: Tensor, scorer: RowScorer, call: Call, **options: Any
    ) -> CopyScorer:
        """A scorer with top-1 classes pinned and the clean batch's ``scores``."""
        pin = {k: v for k, v in options.items() if k in ("dtype", "batch_size")}
        pinned = pin_top1(model, batch, scorer, call, **pin)
        clean = cls(model, batch, pinned, call, **options)
        clean.scorer = pinned  # the clean images themselves: a lost detection is an error
        scores = clean.over(batch.shape[0], lambda rows: (batch[rows], rows))
        return cls(model, batch, pinned, call, scores=scores, memory=clean.memory, **options)

    def score(self, inputs: Tensor, samples: Tensor) -> Tensor:
        """``(n, K)`` scores of ``inputs`` whose row ``i`` is a copy of sample ``samples[i]``
        (buffers restored: the metrics call this outside any method)."""
        with buffers_kept(self.model):
            return self.memory.run(partial(self._score, inputs, samples))

    def over(
        self, count: int, build: Callable[[Tensor], tuple[Tensor, Tensor]], bar: Any = None
    ) -> Tensor:
        """The ``(count, K)`` scores of rows built chunk by chunk: ``build(indices) -> (inputs,
        samples)``."""
        parts = []
        for indices in chunks(count, self.batch_size, self.batch.device):
            inputs, samples = build(indices)
            parts.append(self.score(inputs, samples))
            if bar is not None:
                bar.update(len(indices))
        return torch.cat(parts)

    def _score(self, inputs: Tensor, samples: Tensor, memory_format: torch.memory_format) -> Tensor:
        if inputs.device.type == "cpu" and inputs.numel() * inputs.element_size() >= TRIM_BYTES:
            trim_heap()
        with torch.inference_mode(), autocast(inputs.device, self.dtype):
            inputs = inputs.contiguous(memory_format=memory_format)
            output = self.call.forward(self.model, inputs, samples)
            score = self.scorer.probabilities if self.probabilities else self.scorer
            scores = score(output, samples)  # the scorer checks one row per input
        return scores.float()


__all__ = ["TRIM_BYTES", "CopyScorer", "pin_top1", "trim_heap"]

"""How camkit runs its own forwards: the memory format of the inputs it builds, and
``autocast`` for ``dtype=``."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import TypeVar

import torch
from torch import Tensor

Result = TypeVar("Result")


def autocast(device: torch.device, dtype: torch.dtype | None):
    """``torch.autocast`` on ``device`` when a dtype is asked for, else nothing."""
    return nullcontext() if dtype is None else torch.autocast(device.type, dtype=dtype)


class MemoryFormat:
    """The memory format of the inputs camkit builds itself: ``channels_last`` for a 4-D batch
    on the CPU (oneDNN runs CNNs 1.2-2x faster so, docs/performance.md); for a model that
    refuses it, the caller's input's format from then on. The caller's tensor is not converted.
    """

    def __init__(self, like: Tensor):
        channels_last = like.ndim == 4 and like.is_contiguous(memory_format=torch.channels_last)
        self.given = (
            torch.channels_last
            if channels_last and not like.is_contiguous()
            else torch.contiguous_format
        )
        fast = like.ndim == 4 and like.device.type == "cpu"
        self.preferred = torch.channels_last if fast else self.given

    def run(self, forward: Callable[[torch.memory_format], Result]) -> Result:
        """``forward(memory_format)`` in the preferred format, or in the given one if it fails."""
        try:
            return forward(self.preferred)
        except RuntimeError:
            if self.preferred == self.given:
                raise
            result = forward(self.given)  # raises again when the format was not the cause
            self.preferred = self.given
            return result


__all__ = ["MemoryFormat", "autocast"]

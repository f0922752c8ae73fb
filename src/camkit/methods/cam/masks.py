"""Score-CAM's masks and the one reused buffer of masked inputs
(:mod:`camkit.methods.cam.perturbation`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from camkit.core.copies import CopyScorer
from camkit.core.finish import RESAMPLING, extremes, flat_between


def score_masks(grid: Tensor, samples: Tensor, channels: Tensor, like: Tensor) -> Tensor:
    """``H = minmax(upsample(A[samples[i], channels[i]]))``: ``(n, 1, H, W)`` (volumes ``(n, 1,
    D, H, W)``, trilinear) in [0, 1] at the size of ``like``, normalised in place (no temporary
    of the masks' size)."""
    dims = grid.ndim - 2
    masks = F.interpolate(
        grid[samples, channels].unsqueeze(1),
        size=tuple(like.shape[-dims:]),
        mode=RESAMPLING[dims],
        align_corners=False,
    )
    low, high = extremes(masks, dims)
    is_flat = flat_between(low, high)  # the flat-map policy of core.finish.minmax
    span = high.sub_(low)
    return masks.sub_(low).div_(span.masked_fill_(is_flat, 1)).masked_fill_(is_flat, 0)


class MaskedBuffer:
    """One ``(rows, C_in, H, W)`` buffer of masked inputs in the runs' memory format, allocated
    once: ``x[samples[i]] * masks[i]`` is written into it, chunk after chunk."""

    def __init__(self, run: CopyScorer, rows: int):
        self.run = run
        self.rows = rows
        self.buffer = self._allocate()

    def _allocate(self) -> Tensor:
        batch = self.run.batch
        self.format = self.run.memory.preferred
        shape = (self.rows, *batch.shape[1:])
        return torch.empty(shape, dtype=batch.dtype, device=batch.device, memory_format=self.format)

    def masked(self, masks: Tensor, samples: Tensor) -> Tensor:
        """``x[samples[i]] * masks[i]`` in the buffer (overwritten by the next chunk)."""
        batch = self.run.batch
        if self.format != self.run.memory.preferred:  # the model refused channels_last
            self.buffer = self._allocate()
        images = batch if batch.shape[0] == 1 else batch[samples]  # one image: broadcast
        out = self.buffer[: samples.shape[0]]
        return torch.mul(images, masks.to(batch.dtype), out=out)


__all__ = ["MaskedBuffer", "score_masks"]

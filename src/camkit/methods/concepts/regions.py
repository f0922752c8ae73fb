"""Where concepts are counted: a region of the input mapped onto a layer's grid, and per-sample
values cut to a chunk of samples."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from camkit.errors import ArgumentError


def region_weights(region: object, grid: tuple[int, ...], like: Tensor) -> Tensor:
    """``(B, 1, *grid)`` weights of a region mask given at the input's size (each cell weighs
    the share of it inside the region) or at the layer grid's size."""
    if not isinstance(region, Tensor):
        raise ArgumentError(f"region must be a mask tensor (H, W) or (B, H, W), got {region!r}")
    size, batch, dims = tuple(like.shape[2:]), like.shape[0], len(grid)
    r = region.to(like.device, torch.float32)
    if r.ndim == dims:
        r = r.expand(batch, *r.shape)
    if r.ndim != dims + 1 or r.shape[0] != batch or tuple(r.shape[1:]) not in (size, grid):
        raise ArgumentError(
            f"region has shape {tuple(region.shape)}; expected a mask of the input's size "
            f"{size} or of the layer grid's {grid}, alone or with the batch's {batch} first"
        )
    if not torch.isfinite(r).all() or r.min() < 0 or r.max() > 1:
        raise ArgumentError("region must hold weights in [0, 1] (a boolean mask)")
    r = r.unsqueeze(1)
    return r if tuple(r.shape[2:]) == grid else F.interpolate(r, size=grid, mode="area")


def rows_of(value: object, rows: slice, batch: int) -> object:
    """The rows ``rows`` of a per-sample target or region (a tensor or list with one entry per
    sample); anything else (one class, None, a region for every image) as it is."""
    sized = isinstance(value, list) or isinstance(value, Tensor) and value.ndim > 0
    return value[rows] if sized and batch > 1 and len(value) == batch else value


__all__ = ["region_weights", "rows_of"]

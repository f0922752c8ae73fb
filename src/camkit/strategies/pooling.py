"""Pooling the maps of a dataset for SpRAy, a chunk at a time (a memory-mapped map file is never
read whole, its pages dropped as they are read).

Lapuschkin et al., "Unmasking Clever Hans predictors and assessing what machines really learn",
Nature Communications 10, 1096 (2019), section "Spectral relevance analysis" (downscaling).
"""

from __future__ import annotations

import contextlib
import mmap
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F

from camkit.errors import ArgumentError, InputError


def pool_maps(
    maps: np.ndarray | torch.Tensor,
    grid: int | tuple[int, int] = 32,
    *,
    normalize: Literal["l1", "max"] = "l1",
    positive: Literal["clip", "abs"] = "clip",
    rows: np.ndarray | None = None,
    chunk: int = 256,
) -> np.ndarray:
    """Maps ``(N, H, W)`` (or ``(N, C, H, W)``, summed over channels) -> ``(N, gh, gw)`` float32:
    average-pooled to the ``grid`` (SpRAy's downscaling), made non-negative (``positive``:
    ``clip`` or ``abs``) and normalised per map (``normalize``: ``l1`` to sum 1, ``max`` to peak
    1; a map with no mass stays zeros). ``rows``: pool only these maps. Read ``chunk`` maps at a
    time; non-finite values raise :class:`~camkit.errors.InputError` naming the maps."""
    if normalize not in ("l1", "max"):
        raise ArgumentError(f"normalize must be 'l1' or 'max', got {normalize!r}")
    if positive not in ("clip", "abs"):
        raise ArgumentError(f"positive must be 'clip' or 'abs', got {positive!r}")
    size = (grid, grid) if isinstance(grid, int) else tuple(grid)
    if len(size) != 2 or not all(isinstance(s, int) and s > 0 for s in size):
        raise ArgumentError(f"grid must be a positive int or (rows, columns), got {grid!r}")
    if not isinstance(maps, (np.ndarray, torch.Tensor)):
        raise InputError(f"maps must be a numpy array or torch tensor, got {type(maps).__name__}")
    if maps.ndim not in (3, 4) or maps.shape[0] == 0 or 0 in maps.shape[-2:]:
        raise InputError(f"expected maps (N, H, W) or (N, C, H, W) with N > 0, got {maps.shape}")
    count = maps.shape[0] if rows is None else len(rows)
    if count == 0:
        raise InputError("no maps to pool (rows is empty)")
    pooled = []
    for start in range(0, count, chunk):
        part = maps[start : start + chunk] if rows is None else maps[rows[start : start + chunk]]
        if isinstance(part, np.ndarray):  # a copy: a memory-mapped file is read-only
            part = torch.from_numpy(np.array(part, dtype=np.float32))
        part = part.float()
        if part.ndim == 4:
            part = part.sum(dim=1)
        bad = ~torch.isfinite(part).flatten(1).all(dim=1)
        if bad.any():
            where = (torch.nonzero(bad).flatten() + start).tolist()
            raise InputError(f"maps {where[:10]} hold NaN or infinite values")
        part = part.relu() if positive == "clip" else part.abs()
        part = F.adaptive_avg_pool2d(part[:, None], size)[:, 0]
        scale = part.flatten(1).sum(1) if normalize == "l1" else part.flatten(1).amax(1)
        part = part / torch.where(scale > 0, scale, 1.0)[:, None, None]
        pooled.append(part.numpy())
        _release(maps)
    return np.concatenate(pooled)


def _release(maps: object) -> None:
    """Drop the pages of a memory-mapped file read so far from this process's memory (they
    stay in the page cache): pooling a map file larger than memory keeps a constant footprint."""
    while isinstance(maps, np.ndarray) and getattr(maps, "_mmap", None) is None:
        maps = maps.base
    handle = getattr(maps, "_mmap", None)
    if handle is not None and hasattr(mmap, "MADV_DONTNEED"):
        with contextlib.suppress(OSError, ValueError):
            handle.madvise(mmap.MADV_DONTNEED)

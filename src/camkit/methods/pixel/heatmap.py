"""Turning a signed pixel attribution into a map for display."""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from camkit.errors import ArgumentError

HEATMAP_REDUCTIONS = ("abs-max", "sum", "norm")


def to_heatmap(
    attr: Tensor,
    reduce: Literal["abs-max", "sum", "norm"] = "abs-max",
    *,
    percentile: float = 100.0,
    volume: bool = False,
) -> Tensor:
    """Reduce an attribution ``(..., C, H, W) -> (..., H, W)`` over its channel axis for display
    (``volume=True``: ``(..., C, D, H, W) -> (..., D, H, W)``, each volume one map).

    ``reduce``: ``"abs-max"`` ``max_c |attr|`` (Simonyan et al.) or ``"norm"`` (L2), in [0, 1],
    or ``"sum"``, in [-1, 1]. Each map over its largest absolute value, or that ``percentile``
    of them and clipped (Smilkov et al. clip at the 99th); an all-zero map stays zero.
    """
    spatial = 3 if volume else 2
    if not isinstance(attr, Tensor) or attr.ndim < spatial + 1:
        got = tuple(attr.shape) if isinstance(attr, Tensor) else type(attr).__name__
        expected = "(C, D, H, W) or (B, C, D, H, W)" if volume else "(C, H, W) or (B, C, H, W)"
        raise ArgumentError(f"expected an attribution {expected}, got {got}")
    if reduce not in HEATMAP_REDUCTIONS:
        raise ArgumentError(f"unknown reduction {reduce!r}; choose from {HEATMAP_REDUCTIONS}")
    if not 0 < percentile <= 100:
        raise ArgumentError(f"percentile must be in (0, 100], got {percentile}")
    attr = attr.detach().float()
    heat = {
        "abs-max": lambda c: attr.abs().amax(dim=c),
        "norm": lambda c: torch.linalg.vector_norm(attr, dim=c),
        "sum": lambda c: attr.sum(dim=c),
    }[reduce](-spatial - 1)  # over the channels
    magnitude = heat.abs().flatten(-spatial)
    full = percentile == 100
    scale = magnitude.amax(dim=-1) if full else magnitude.quantile(percentile / 100, dim=-1)
    scale = scale.view(*scale.shape, *[1] * spatial)
    scaled = heat / torch.where(scale > 0, scale, torch.ones_like(scale))
    return scaled.clamp(-1, 1)

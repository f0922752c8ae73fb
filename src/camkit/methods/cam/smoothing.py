"""The two smoothings of pytorch-grad-cam, as call options of every CAM: ``eigen_smooth``
(:func:`principal_component`) and ``aug_smooth`` (:func:`explained`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from camkit.core.call import Call
from camkit.core.explainer import Explanation
from camkit.core.finish import Finishing, minmax
from camkit.core.inputs import boolean
from camkit.targets.resolver import RowScorer

FLIPS = (False, True)  # ttach.HorizontalFlip
FACTORS = (0.9, 1.0, 1.1)  # ttach.Multiply(factors=[0.9, 1, 1.1]): intensities, not sizes

Maps = Tensor | dict[str, Tensor]


def principal_component(weighted: Tensor) -> Tensor:
    """``(B, K, C, *spatial) -> (B, K, *spatial)``: the positions' projection on the first
    principal component of the channels (2-D maps or volumes).

    As pytorch-grad-cam's ``get_2d_projection`` (Eigen-CAM, Muhammad & Yeasin, IJCNN 2020): the
    ``(positions, C)`` matrix centred per channel, projected on its first right singular vector,
    its sign (LAPACK's in pytorch-grad-cam) set to correlate positively with the channel mean.
    """
    grid = weighted.shape[3:]
    positions = weighted.flatten(3).transpose(-1, -2)  # (B, K, n, C)
    centred = positions - positions.mean(dim=-2, keepdim=True)
    _, _, vh = torch.linalg.svd(centred, full_matrices=False)
    projection = (centred @ vh[..., 0, :, None]).squeeze(-1)  # (B, K, n)
    agreement = (projection * positions.mean(dim=-1)).sum(dim=-1, keepdim=True)
    projection = torch.where(agreement < 0, -projection, projection)
    return projection.unflatten(-1, grid)


def explained(
    method: Any, call: Call, scorer: RowScorer, finishing: Finishing, aug_smooth: bool
) -> Explanation:
    """``method.maps`` of ``call``'s batch; ``aug_smooth``: pytorch-grad-cam's (its ``ttach``
    transforms), the mean of the maps of ``flip(x) * factor`` (:data:`FLIPS`, :data:`FACTORS`),
    mirrored back, for the clean top-1 target, normalised again with ``finishing.normalize``."""
    batch = call.batch
    if not boolean("aug_smooth", aug_smooth):
        return Explanation.of(method.maps(batch, scorer, finishing, call), scorer)
    target = method.pinned(batch, scorer, call)
    total: Maps | None = None
    for flip in FLIPS:
        for factor in FACTORS:
            view = batch.flip(-1) if flip else batch
            result = method.maps(view * factor, target, finishing, call)
            if flip:
                result = _each(result, lambda m: m.flip(-1))
            total = result if total is None else _each(total, torch.add, result)
    count = len(FLIPS) * len(FACTORS)
    mean = _each(total, lambda m: m / count)
    if finishing.normalize:
        mean = _each(mean, lambda m: minmax(m, m.ndim - 2))
    return Explanation.of(mean, scorer)


def _each(maps: Maps, fn: Callable[..., Tensor], other: Maps | None = None) -> Maps:
    """``fn`` on a map or on each of ``{layer: map}`` (with ``other``'s)."""
    if isinstance(maps, dict):
        return {
            name: fn(m) if other is None else fn(m, other[name])  # type: ignore[index]
            for name, m in maps.items()
        }
    return fn(maps) if other is None else fn(maps, other)


__all__ = ["FACTORS", "FLIPS", "explained", "principal_component"]

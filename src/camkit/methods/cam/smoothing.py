"""The two smoothings of pytorch-grad-cam, as call options of every CAM.

* :func:`principal_component` (``eigen_smooth=True``): a layer's map is the first principal
  component of its weighted activations ``w_c A_c`` instead of their sum over channels
  (pytorch-grad-cam's ``get_2d_projection``; Eigen-CAM's projection, Muhammad & Yeasin,
  IJCNN 2020).
* :func:`augmented` (``aug_smooth=True``): test-time augmentation as pytorch-grad-cam's
  ``forward_augmentation_smoothing`` with its default ``ttach`` transforms: the image and its
  horizontal mirror, each with its intensities multiplied by 0.9, 1 and 1.1; each finished map
  is aligned back (mirrored again) and the six are averaged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from camkit.core.call import Call
from camkit.core.finish import Finishing, minmax

FLIPS = (False, True)  # ttach.HorizontalFlip
FACTORS = (0.9, 1.0, 1.1)  # ttach.Multiply(factors=[0.9, 1, 1.1]): intensities, not sizes

Maps = Tensor | dict[str, Tensor]


def principal_component(weighted: Tensor) -> Tensor:
    """``(B, K, C, *spatial) -> (B, K, *spatial)``: the positions' projection on the first
    principal component of the channels (2-D maps or volumes).

    As pytorch-grad-cam's ``get_2d_projection``: the ``(positions, C)`` matrix is centred per
    channel and projected on its first right singular vector. That vector's sign is arbitrary
    (pytorch-grad-cam keeps whatever LAPACK returns); camkit fixes it so that the projection
    correlates positively with the channel mean of the uncentred matrix, i.e. with the plain
    map ``sum_c w_c A_c``: the smoothed map never flips to the complement of the map it smooths.
    """
    grid = weighted.shape[3:]
    positions = weighted.flatten(3).transpose(-1, -2)  # (B, K, n, C)
    centred = positions - positions.mean(dim=-2, keepdim=True)
    _, _, vh = torch.linalg.svd(centred, full_matrices=False)
    projection = (centred @ vh[..., 0, :, None]).squeeze(-1)  # (B, K, n)
    agreement = (projection * positions.mean(dim=-1)).sum(dim=-1, keepdim=True)
    projection = torch.where(agreement < 0, -projection, projection)
    return projection.unflatten(-1, grid)


def augmented(
    maps: Callable[[Tensor, Any, Finishing, Call], Maps],
    batch: Tensor,
    target: Any,
    finishing: Finishing,
    call: Call,
) -> Maps:
    """pytorch-grad-cam's ``aug_smooth``: ``maps(x', target, finishing, call)`` of the six augmented
    batches ``x' = flip(x) * factor`` (``flip`` the identity or the mirror along the last axis,
    ``factor`` in 0.9, 1, 1.1), each finished map mirrored back, then averaged. With
    ``finishing.normalize`` the mean is min-max normalised again (pytorch-grad-cam returns the
    mean of the normalised maps as it is: the same map up to an affine scale). ``target``
    should be resolved with its top-1 classes pinned on the clean batch, so that every copy
    explains the same class."""
    total: Maps | None = None
    for flip in FLIPS:
        for factor in FACTORS:
            view = batch.flip(-1) if flip else batch
            result = maps(view * factor, target, finishing, call)
            if flip:
                result = _each(result, lambda m: m.flip(-1))
            total = result if total is None else _each(total, torch.add, result)
    count = len(FLIPS) * len(FACTORS)
    mean = _each(total, lambda m: m / count)
    if finishing.normalize:
        mean = _each(mean, lambda m: minmax(m, m.ndim - 2))
    return mean


def _each(maps: Maps, fn: Callable[..., Tensor], other: Maps | None = None) -> Maps:
    """``fn`` on a map, or on each layer's map of ``{layer: map}`` (with ``other``'s likewise)."""
    if isinstance(maps, dict):
        return {
            name: fn(m) if other is None else fn(m, other[name])  # type: ignore[index]
            for name, m in maps.items()
        }
    return fn(maps) if other is None else fn(maps, other)


__all__ = ["FACTORS", "FLIPS", "augmented", "principal_component"]

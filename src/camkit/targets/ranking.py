"""The one tie rule of predictions: among equal scores the lowest class index comes first, for
the top-1 (the prediction, the top-1 target), the top-k (a manifest's ``top5``, the explorer's
list) and every order of classes, so that a record's target is its own top-5's first."""

from __future__ import annotations

from torch import Tensor


def top1(scores: Tensor, *, keepdim: bool = False) -> Tensor:
    """The index of the highest score along the last axis, the lowest among equal ones
    (``torch.argmax``'s documented rule): ``(..., C) -> (...)``, ``(..., 1)`` with ``keepdim``."""
    return scores.argmax(dim=-1, keepdim=keepdim)


def ranked(scores: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The ``k`` highest scores along the last axis and their indices ``(..., C) -> ((..., k),
    (..., k))``, ties lowest index first (a stable sort; ``torch.topk``'s order is not set)."""
    values, indices = scores.sort(dim=-1, descending=True, stable=True)
    return values[..., :k], indices[..., :k]

"""What one run of a method found, the target axis ``K`` kept: :class:`Explanation`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor

from camkit.core.finish import drop_axes
from camkit.targets.resolver import RowScorer


@dataclass(frozen=True)
class Explanation:
    """What :meth:`~camkit.core.explainer.Explainer.explain_batch` returns (a family that finds
    more returns a subclass: LRP's :class:`~camkit.relevance.lrp.Relevance`).

    ``maps``: ``(B, K, ...)`` (a CAM's ``(B, K, H, W)``, a pixel method's ``(B, K, C, H, W)``),
    ``{layer: (B, K, ...)}`` for unfused layers, or a tuple of them (one per input of a tuple of
    inputs; Integrated Gradients' attribution and error). ``targets``: the classes explained
    ``(B, K)`` (top-1 ones resolved; None for a callable target). ``several``: whether ``K``
    targets per sample were asked (a 2-D target, a callable returning ``(B, K)``)."""

    maps: Any
    targets: Tensor | None
    several: bool

    @classmethod
    def of(cls, maps: Any, scorer: RowScorer, **extra: Any) -> Explanation:
        """The result ``maps`` for the target ``scorer`` scored (it knows what was asked)."""
        return cls(maps, scorer.explained, scorer.several, **extra)

    def shaped(self, single: bool) -> Any:
        """The maps as a call returns them: without the target axis unless ``K`` targets were
        asked, without the batch axis for a ``single`` sample."""
        return drop_axes(self.maps, single, self.several)


__all__ = ["Explanation"]

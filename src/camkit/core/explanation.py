"""What one run of a method found: :class:`Explanation`, the target axis ``K`` always kept.

:meth:`Explainer.explain_batch <camkit.core.explainer.Explainer.explain_batch>` returns it; the
call (``method(x, target)``) returns its :meth:`~Explanation.shaped` maps. A family that finds
more than maps returns a subclass (LRP's :class:`~camkit.relevance.lrp.Relevance` adds the
layers' relevance, the scores and the conservation shares).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor

from camkit.core.finish import drop_axes
from camkit.targets.resolver import RowScorer


@dataclass(frozen=True)
class Explanation:
    """The result of one batch, float32, detached where it is a map.

    ``maps``: ``(B, K, ...)`` (a CAM's ``(B, K, H, W)``, a pixel method's ``(B, K, C, H, W)``),
    ``{layer: (B, K, ...)}`` for unfused layers, or a tuple of them (one per input of a tuple of
    inputs; Integrated Gradients' attribution and completeness error). ``targets``: the classes
    explained ``(B, K)`` (the top-1 ones resolved), None for a callable target. ``several``:
    whether ``K`` targets per sample were asked (a 2-D target, a callable returning ``(B, K)``),
    the axis the call keeps."""

    maps: Any
    targets: Tensor | None
    several: bool

    @classmethod
    def of(cls, maps: Any, scorer: RowScorer, **extra: Any) -> Explanation:
        """The result ``maps`` of the target ``scorer`` scored (it knows what was asked)."""
        return cls(maps, scorer.explained, scorer.several, **extra)

    def shaped(self, single: bool) -> Any:
        """The maps as a call returns them: the target axis dropped unless ``K`` targets were
        asked, the batch axis dropped for a ``single`` sample (each part of a tuple likewise)."""
        return drop_axes(self.maps, single, self.several)


__all__ = ["Explanation"]

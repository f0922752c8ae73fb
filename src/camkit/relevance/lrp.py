"""LRP as a camkit method: ``LRP(model, composite="epsilon-plus-flat")(x, target)``.

The input relevance ``R = x * dS/dx`` with the gradient modified by the composite's rules
(:func:`~camkit.relevance.engine.rules_applied`); one forward and one batched backward for ``K``
targets per sample. :meth:`LRP.explain_batch` also returns the relevance of chosen layers and
the conservation report (:class:`Relevance`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from camkit.core.call import Call, chunks
from camkit.core.engine import layer_gradients
from camkit.core.explainer import Explanation
from camkit.core.finish import checked
from camkit.core.formats import MemoryFormat, autocast
from camkit.core.layers import find_layers
from camkit.errors import ArgumentError, ConservationWarning, GradientError, warn
from camkit.pixel.base import HEATMAP_PERCENTILE, PixelAttribution
from camkit.pixel.heatmap import to_heatmap
from camkit.registry import register
from camkit.relevance.composites import Composite, Match
from camkit.relevance.composites import composite as as_composite
from camkit.relevance.engine import rules_applied
from camkit.relevance.rules import Rule
from camkit.targets.resolver import RowScorer


@dataclass(frozen=True, kw_only=True)
class Relevance(Explanation):
    """What one :meth:`LRP.explain_batch` call found, float32, the target axis ``K`` kept.

    ``input`` (the ``maps``): ``(B, K, *x.shape[1:])``; ``layers``: ``{name: (B, K,
    *A.shape[1:])}`` (``A * dS/dA`` at the layer's output); ``scores``: ``(B, K)`` the target
    scores; ``conservation``:
    ``{"input" or layer name: (B, K)}`` the share of each score that reached it (1 when
    relevance is conserved; biases and the stabiliser absorb some, the ``Flat``/``ZBox``/
    ``WSquare`` first layers and ``AlphaBeta`` do not conserve sample by sample)."""

    layers: dict[str, Tensor]
    scores: Tensor
    conservation: dict[str, Tensor]

    @property
    def input(self) -> Tensor:
        """The input's relevance ``(B, K, *x.shape[1:])``."""
        return self.maps

    def layer_map(self, name: str, size: tuple[int, ...] | None = None) -> Tensor:
        """Layer ``name``'s relevance as a map, like a CAM: ``(B, K, C, h, w) -> (B, K, h, w)``,
        summed over the channels (signed: it sums to the layer's share of the score), resized
        bilinearly to ``size`` (e.g. the input's ``(H, W)``) when given."""
        if name not in self.layers:
            raise ArgumentError(f"no relevance recorded at {name!r}; recorded: {list(self.layers)}")
        relevance = self.layers[name]
        if relevance.dim() != 5:
            raise ArgumentError(
                f"layer {name!r} has relevance {tuple(relevance.shape[2:])}, not a (C, h, w) grid"
            )
        heat = relevance.sum(2)
        if size is None:
            return heat
        flat = heat.flatten(0, 1)[:, None]
        resized = F.interpolate(flat, size=size, mode="bilinear", align_corners=False)
        return resized[:, 0].unflatten(0, heat.shape[:2])


def _share(relevance: Tensor, scores: Tensor) -> Tensor:
    total = relevance.flatten(2).sum(-1)
    return torch.where(scores != 0, total / torch.where(scores != 0, scores, 1), torch.nan)


@register("lrp", "Bach et al., PLOS ONE 2015")
class LRP(PixelAttribution):
    """Layer-wise Relevance Propagation: the target score redistributed layer by layer onto the
    input pixels by the composite's rules, ``(C, H, W) -> (C, H, W)`` signed relevance (batches
    and ``K`` targets likewise).

    Bach et al., "On Pixel-Wise Explanations for Non-Linear Classifier Decisions by Layer-Wise
    Relevance Propagation", PLOS ONE 2015; Montavon et al., "Layer-Wise Relevance Propagation:
    An Overview", 2019. Equal to zennit 0.5.1 for its composites (its canonizers: BatchNorm
    merged; residual sums get the Norm rule where they are written).

    Args:
        composite: a name of :data:`~camkit.relevance.COMPOSITES`, a
            :class:`~camkit.relevance.Composite`, or a list of ``(module type or name pattern,
            rule)``.
        layers: layer names whose relevance :meth:`explain_batch` returns with the input's.
        tolerance: warn (:class:`~camkit.errors.ConservationWarning`) when the input relevance
            of a sample differs from its score by more than this fraction of it; None: never.
        output, dtype, batch_size: as for every method.
    """

    several_inputs = False

    def __init__(
        self,
        model: nn.Module,
        *,
        composite: str | Composite | Sequence[tuple[Match, Rule]] = "epsilon-plus-flat",
        layers: Sequence[str] = (),
        tolerance: float | None = None,
        **options: Any,
    ):
        if "rule" in options:
            raise ArgumentError("LRP takes a composite of LRP rules, not a ReLU rule= option")
        super().__init__(model, **options)
        self.composite = as_composite(composite)
        if isinstance(layers, str):
            layers = [layers]
        self.record = [name for name, _ in find_layers(self.model, list(layers))] if layers else []
        if tolerance is not None and not tolerance >= 0:
            raise ArgumentError(f"tolerance must be a number >= 0 or None, got {tolerance!r}")
        self.tolerance = tolerance

    def _explain(self, call: Call, scorer: RowScorer) -> Relevance:
        return self._propagate(call.batch, scorer, call, record=self.record)

    def display_heat(self, result: Tensor) -> Tensor:
        """``(B, K, C, H, W)`` relevance -> heat ``(B, K, H, W)``: the positive part of the
        relevance summed over the channels, divided by its 99th percentile and clipped at 1
        (LRP maps are signed; the evidence for the target is shown)."""
        heat = to_heatmap(result.detach().float(), "sum", percentile=HEATMAP_PERCENTILE)
        return heat.clamp(min=0)

    def _propagate(self, x: Tensor, scorer: RowScorer, call: Call, record: list[str]) -> Relevance:
        parts: list[tuple[Tensor, list[Tensor], Tensor]] = []
        # the caller's memory format, not channels_last: the rules' element-wise terms and the
        # convolutions that oneDNN does not take make channels_last copies slower on the CPU
        memory = MemoryFormat(x).given
        for rows in chunks(x.shape[0], self.batch_size, x.device):
            leaf = x[rows].detach().clone().requires_grad_(True)
            with torch.enable_grad(), autocast(x.device, self.dtype):
                with rules_applied(self.model, self.composite, record=record) as session:
                    output = call.forward(self.model, leaf.clone(memory_format=memory), rows)
                scores = scorer(output, rows)
            if not scores.requires_grad:
                raise GradientError("the target score does not depend on the input")
            merged = [name for name in record if session.merged_away(name)]
            if merged:
                raise ArgumentError(
                    f"layer(s) {merged} are merged with the BatchNorm that follows them (the "
                    "canonizer): their relevance is at the BatchNorm's output; record that layer"
                )
            acts = [session.recorded[name][-1] for name in record]
            grads = layer_gradients(scores, [leaf, *acts], ["input", *record], allow_unused=True)
            maps = [
                (a.detach()[:, None] * g).float()
                if g is not None
                else a.new_zeros((*scores.shape, *a.shape[1:]))
                for a, g in zip([leaf, *acts], grads, strict=True)
            ]
            parts.append((maps[0], maps[1:], scores.detach().float()))
        scores = torch.cat([p[2] for p in parts])
        relevance = checked(torch.cat([p[0] for p in parts]))
        layers = {name: torch.cat([p[1][i] for p in parts]) for i, name in enumerate(record)}
        shares = {"input": _share(relevance, scores)}
        shares.update({name: _share(r, scores) for name, r in layers.items()})
        self._check_conservation(shares["input"])
        return Relevance.of(relevance, scorer, layers=layers, scores=scores, conservation=shares)

    def _check_conservation(self, share: Tensor) -> None:
        if self.tolerance is None:
            return
        off = (share - 1).abs() > self.tolerance
        if off.any():
            first = float(share[off].flatten()[0])
            warn(
                f"LRP ({self.composite.name}): the input relevance is {first:.3g} of the target "
                f"score (the first of {int(off.sum())} sample-target pair(s) beyond the tolerance "
                f"{self.tolerance}); biases and the stabiliser absorb relevance, Flat, ZBox, "
                "WSquare and AlphaBeta do not conserve per sample",
                ConservationWarning,
            )

    def __repr__(self) -> str:
        return f"LRP(composite={self.composite.name!r})"


__all__ = ["LRP", "Relevance"]

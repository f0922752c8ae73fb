"""LRP as a camkit method: ``LRP(model, composite="epsilon-plus-flat-nobias")(x, target)``, the
input relevance ``R = x * dS/dx`` with the gradient modified by the composite's rules, and with
:meth:`LRP.explain_batch` the relevance of chosen layers and the conservation report
(:class:`Relevance`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from camkit.core.call import Call, chunks
from camkit.core.engine import layer_gradients
from camkit.core.explainer import Explanation
from camkit.core.formats import MemoryFormat, autocast
from camkit.core.layers import find_layers
from camkit.errors import ArgumentError, GradientError
from camkit.methods.pixel.base import (
    HEATMAP_PERCENTILE,
    Inputs,
    PixelAttribution,
    SampleTotals,
    as_tuple,
    finished,
)
from camkit.methods.pixel.heatmap import to_heatmap
from camkit.registry import register
from camkit.relevance.composites import DEFAULT_COMPOSITE, Composite, Match
from camkit.relevance.composites import composite as as_composite
from camkit.relevance.conservation import INPUT, Conservation
from camkit.relevance.engine import Session, rules_applied
from camkit.relevance.rules import Rule
from camkit.targets.base import TargetSpec
from camkit.targets.resolver import RowScorer


@dataclass(frozen=True, kw_only=True)
class Relevance(Explanation):
    """What one :meth:`LRP.explain_batch` call found, float32, the target axis ``K`` kept.

    ``input`` (the ``maps``): ``(B, K, *x.shape[1:])`` (one per input for a tuple of inputs);
    ``layers``: ``{name: (B, K, *A.shape[1:])}``, ``A * dS/dA`` at the layer's output (none for
    a tuple of inputs); ``scores``: ``(B, K)``; ``conservation``: the share of each score that
    reached the input and each layer (1 when conserved), and the step that loses most."""

    layers: dict[str, Tensor]
    scores: Tensor
    conservation: Conservation

    @property
    def input(self) -> Tensor:
        """The input's relevance ``(B, K, *x.shape[1:])``."""
        return self.maps

    def layer_map(self, name: str, size: tuple[int, ...] | None = None) -> Tensor:
        """Layer ``name``'s relevance summed over channels (signed), ``(B, K, C, h, w) -> (B, K,
        h, w)``, resized bilinearly to ``size`` when given."""
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


@register("lrp", "Bach et al., PLOS ONE 2015")
class LRP(PixelAttribution):
    """Layer-wise Relevance Propagation: the target score redistributed layer by layer onto the
    input by the composite's rules, ``(C, H, W) -> (C, H, W)`` signed relevance.

    Bach et al., "On Pixel-Wise Explanations for Non-Linear Classifier Decisions by Layer-Wise
    Relevance Propagation", PLOS ONE 2015; Montavon et al., "Layer-Wise Relevance Propagation:
    An Overview", 2019. Equal to zennit 0.5.1 for its composites (BatchNorm merged; residual
    sums get the Norm rule where they are written). Input x gradient under the composite.

    Args (besides those of :class:`~camkit.methods.pixel.base.PixelAttribution`):
        composite: as the base's; None: :data:`~camkit.relevance.DEFAULT_COMPOSITE`, or the
            ReLU rule that ``rule`` names.
        layers: layer names whose relevance and share of the score :meth:`explain_batch`
            returns too (one input tensor only).
        tolerance: warn (:class:`~camkit.errors.ConservationWarning`) when a sample's input
            relevance differs from its score by more than this fraction of it; None: never.
            :attr:`conservation` is the last call's record.
    """

    default_composite = DEFAULT_COMPOSITE

    def __init__(
        self,
        model: nn.Module,
        *,
        composite: str | Composite | Sequence[tuple[Match, Rule]] | None = None,
        layers: Sequence[str] = (),
        tolerance: float | None = 0.5,
        **options: Any,
    ):
        super().__init__(model, composite=composite, **options)
        self.composite = self.rule_set if self.rule_set is not None else as_composite("gradient")
        if isinstance(layers, str):
            layers = [layers]
        self.record = [name for name, _ in find_layers(self.model, list(layers))] if layers else []
        if tolerance is not None and not tolerance >= 0:
            raise ArgumentError(f"tolerance must be a number >= 0 or None, got {tolerance!r}")
        self.tolerance = tolerance
        self.conservation: Conservation | None = None

    def _explain(self, call: Call, scorer: RowScorer) -> Relevance:
        scorer = scorer.for_relevance()  # a target's own form for LRP (a prompt's cosine)
        inputs = as_tuple(call.batch)
        if self.record and len(inputs) == 1:  # the recorded layers' relevance and shares too
            relevance, layers, scores = self._propagate(inputs[0], scorer, call)
        else:
            relevance, scores = self._input_relevance(inputs, scorer, call)
            layers = {}
        maps, input_total = finished(call.batch, relevance)
        totals = {INPUT: input_total, **{name: r.flatten(2).sum(-1) for name, r in layers.items()}}
        order = [name for name, _ in self.model.named_modules() if name in totals]
        conservation = Conservation.of(totals, scores.to(input_total.dtype), order)
        self.conservation = conservation
        if self.tolerance is not None and self.composite.strict:  # an LRP composite, no ReLU rule
            bounds = (1 - self.tolerance, 1 + self.tolerance)
            conservation.check(*bounds, f"LRP ({self.composite.name})")
        return Relevance.of(maps, scorer, layers=layers, scores=scores, conservation=conservation)

    def attribute(self, inputs: Inputs, target: TargetSpec | RowScorer, call: Call) -> Inputs:
        """Each input's relevance ``x_i * dS/dx_i`` ``(B, K, ...)``."""
        return self._input_relevance(inputs, target, call)[0]

    def _input_relevance(
        self, inputs: Inputs, target: TargetSpec | RowScorer, call: Call
    ) -> tuple[Inputs, Tensor]:
        """``(x_i * dS/dx_i (B, K, ...) per input, scores (B, K))`` on the pixel base."""
        relevance, scores = SampleTotals(inputs[0].shape[0]), SampleTotals(inputs[0].shape[0])

        def keep(rows: Tensor, grads: Inputs, score: Tensor) -> None:
            parts = (t[rows].unsqueeze(1) * g for t, g in zip(inputs, grads, strict=True))
            relevance.add(rows, *parts)
            scores.add(rows, score)

        self.over_copies(inputs, target, call, 1, None, keep)
        return relevance.totals, scores.totals[0]

    def display_heat(self, result: Tensor) -> Tensor:
        """``(B, K, C, H, W) -> (B, K, H, W)``: the positive part of the channels' sum over its
        99th percentile, clipped at 1."""
        heat = to_heatmap(result.detach().float(), "sum", percentile=HEATMAP_PERCENTILE)
        return heat.clamp(min=0)

    def _propagate(
        self, x: Tensor, scorer: RowScorer, call: Call
    ) -> tuple[Inputs, dict[str, Tensor], Tensor]:
        """``((input relevance,), {layer: relevance}, scores (B, K))``, one backward per chunk."""
        record, parts = self.record, []  # per chunk: input, recorded layers, scores
        memory = MemoryFormat(x)  # channels_last on the CPU, as every pixel method
        for rows in chunks(x.shape[0], self.batch_size, x.device):
            leaf = x[rows].detach().clone().requires_grad_(True)
            scores, session = memory.run(partial(self._scored, leaf, rows, scorer, call))
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
            found = [
                (a.detach()[:, None] * g).float()
                if g is not None
                else a.new_zeros((*scores.shape, *a.shape[1:]))
                for a, g in zip([leaf, *acts], grads, strict=True)
            ]
            parts.append((*found, scores.detach().float()))
        relevance, *layers, scores = (torch.cat(column) for column in zip(*parts, strict=True))
        return (relevance,), dict(zip(record, layers, strict=True)), scores

    def _scored(
        self, leaf: Tensor, rows: Tensor, scorer: RowScorer, call: Call, memory: torch.memory_format
    ) -> tuple[Tensor, Session]:
        """The scores of ``rows`` and their forward's session (the recorded layers)."""
        with torch.enable_grad(), autocast(leaf.device, self.dtype):
            with rules_applied(self.model, self.composite, record=self.record) as session:
                output = call.forward(self.model, leaf.clone(memory_format=memory), rows)
            return scorer(output, rows), session

    def measured(self) -> list[list[dict]] | None:
        """The last call's conservation, per sample and target."""
        if self.conservation is None:
            return None
        return [[{"conservation": c} for c in row] for row in self.conservation.summary()]

    def __repr__(self) -> str:
        return f"LRP(composite={self.composite.name!r})"


__all__ = ["LRP", "Relevance"]

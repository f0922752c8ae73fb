"""Conditional relevance: which channels of a layer carry a prediction, and where.

Concept Relevance Propagation (Achtibat et al., "From attribution maps to human-understandable
explanations through Concept Relevance Propagation", Nature Machine Intelligence 5, 2023): the
relevance of concept ``c`` of layer ``l`` for the target ``y`` is ``R_c = sum_ij A_cij g_cij``
(``g = dS_y/dA`` under the rule context, :mod:`~camkit.methods.concepts.rules`), and its
conditional heatmap ``R(x | c) = sum_channels x * d/dx <A, P_c g>``: the gradient masked at the
layer by the concept (:mod:`~camkit.methods.concepts.concepts`), then carried on to the input
(linear: the heatmaps of all channels sum to the unconditional one through the layer). ``K``
conditions are ``K`` vector-Jacobian products on one forward's graph. As zennit-crp's
``exclude_parallel=True``, paths that bypass the layer carry no conditional relevance.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from camkit.core.call import Call, chunk_size
from camkit.core.engine import batched_backward
from camkit.core.inputs import as_batch, positive_int
from camkit.core.layers import (
    LayerSpec,
    explained_module,
    find_layers,
)
from camkit.core.layouts import check_reshape
from camkit.errors import ArgumentError, LayerOutputError
from camkit.methods.concepts.concepts import (
    Concept,
    ConceptSpec,
    Mask,
    TopConcepts,
    abs_norm,
    as_concept,
    as_concepts,
    region_weights,
    sample_channels,
)
from camkit.methods.concepts.rules import GRADIENT, Rules, RulesSpec, check_rules
from camkit.methods.concepts.traced import Pass, traced
from camkit.targets.base import TargetSpec
from camkit.targets.outputs import OutputSelector


class ConceptAttribution:
    """Concept Relevance Propagation on one layer of any model camkit explains.

    Inputs: an image ``(C, H, W)`` (results without the batch axis), a batch ``(B, C, H, W)``,
    or clips ``(B, C, T, H, W)`` (heatmaps ``(B, K, T, H, W)`` for a 3-D CNN's layers, video
    tokens and a frame-wise model's ``(B * T, C, h, w)`` layers, whose channel relevances sum
    the clip's frames). ``target``: one per sample (None: the predicted class).

    Args:
        model: the model (``eval()`` mode: samples must be independent).
        layer: the layer whose channels are the concepts (dotted name or module).
        rules: the backward rule context (default :data:`~camkit.methods.concepts.rules.GRADIENT`:
            gradient x activation, gradient x input), or a rule set of the one backward by
            name or composite (``"guided"``, ``"epsilon-plus-flat"``, ...).
        output: which part of the model's output holds the logits (as for every method).
        reshape: ``"auto"`` reads token ``(B, N, C)`` and channels-last outputs (a ViT's prefix
            tokens count in channel relevances), None takes the output as ``(B, C, ...)``.
        batch_size: conditions per backward pass, images per pass in :meth:`dominant` (None:
            all at once). Results do not depend on it.
    """

    def __init__(
        self,
        model: nn.Module,
        layer: LayerSpec,
        *,
        rules: RulesSpec = GRADIENT,
        output: OutputSelector = None,
        reshape: str | None = "auto",
        batch_size: int | None = None,
    ):
        self.model = explained_module(model)
        found = find_layers(self.model, layer)
        if len(found) != 1:
            raise ArgumentError(f"concepts live in one layer; got {[n for n, _ in found]}")
        self.layer = found[0][0]
        self.rules = check_rules(rules)
        self.output = output
        check_reshape(reshape)
        if callable(reshape):
            raise ArgumentError(
                "concepts need reshape='auto' or None (the channel axis must be known to mask "
                "it), not a function"
            )
        self.reshape = reshape
        self.batch_size = positive_int("batch_size", batch_size, optional=True)

    def relevances(
        self,
        x: Tensor,
        target: TargetSpec = None,
        region: Tensor | None = None,
        *,
        additional_forward_args: Any = None,
    ) -> Tensor:
        """``(B, C)``: each channel's relevance ``sum A * g`` for the target (inside
        ``region``: see :meth:`top`); an image gives ``(C,)``."""
        batch, single = as_batch(x, self.model)
        with self._traced(Call.of(batch, additional_forward_args), target, [self.layer]) as run:
            per_channel = self._channel_relevance(run, region)
        return per_channel[0] if single else per_channel

    def heatmaps(
        self,
        x: Tensor,
        concepts: ConceptSpec | Sequence[ConceptSpec] | range,
        target: TargetSpec = None,
        given: tuple[LayerSpec, ConceptSpec] | None = None,
        *,
        additional_forward_args: Any = None,
    ) -> Tensor:
        """``(B, K, H, W)`` conditional heatmaps ``R(x | concept_k)`` (signed relevance summed
        over the input's channels), the same ``K`` concepts for every sample; an image gives
        ``(K, H, W)``. ``given=(higher_layer, concept)`` conditions on a concept of a later
        layer too (the attribution graph's edges: ``R(x | concept_k, given)``)."""
        batch, single = as_batch(x, self.model)
        found = as_concepts(concepts)
        layers = [self.layer]
        if given is not None:
            upper = find_layers(self.model, given[0])[0][0]
            if upper == self.layer:
                raise ArgumentError("given= must name another (later) layer than the concepts'")
            layers.insert(0, upper)
        with self._traced(Call.of(batch, additional_forward_args), target, layers) as run:
            masks, grad = self._masks(run, self.layer, found), None
            if given is not None:  # the gradient at the layer given the later layer's concept
                (upper,) = self._masks(run, layers[0], [as_concept(given[1])])
                top = self._masked(run, layers[0], self._start(run, layers[0]), [upper])
                grad = self._vjp(run.acts[layers[0]], run.acts[self.layer], top)[0]
            heat = self._conditional(run, masks, grad)
        return heat[0] if single else heat

    def top(
        self,
        x: Tensor,
        k: int = 10,
        target: TargetSpec = None,
        region: Tensor | None = None,
        *,
        heatmaps: bool = True,
        additional_forward_args: Any = None,
    ) -> TopConcepts:
        """The ``k`` channels most relevant for the target, per sample, with their conditional
        heatmaps. ``region``: where to count relevance, a mask ``(H, W)`` or ``(B, H, W)`` at
        the input's size (averaged over each layer cell) or at the layer grid's size, applied
        at the layer (zennit-crp's ``ChannelConcept.attribute(relevance, mask)``)."""
        k = positive_int("k", k)
        batch, single = as_batch(x, self.model)
        with self._traced(Call.of(batch, additional_forward_args), target, [self.layer]) as run:
            per_channel = self._channel_relevance(run, region)
            values, channels = self._top_channels(per_channel, k)
            share = abs_norm(per_channel).gather(1, channels)
            masks = [sample_channels(c) for c in channels.T]
            heat = self._conditional(run, masks) if heatmaps else None
        found = (channels, values, share, heat, run.classes)
        if single:
            found = tuple(None if t is None else t[0] for t in found)
        return TopConcepts(self.layer, *found)

    def dominant(
        self,
        x: Tensor,
        k: int = 10,
        target: TargetSpec = None,
        region: Tensor | None = None,
        *,
        additional_forward_args: Any = None,
    ) -> TopConcepts:
        """The ``k`` channels that dominate a set of images (a strategy's cluster): each
        image's channel relevances divided by their absolute sum, averaged over the images ->
        ``channels (k,)``, mean ``relevance (k,)``, mean ``share (k,)``; no heatmaps."""
        k = positive_int("k", k)
        batch, _ = as_batch(x, self.model)
        call, n = Call.of(batch, additional_forward_args), batch.shape[0]
        step, relevance = chunk_size(n, self.batch_size), []
        for start in range(0, n, step):
            rows = slice(start, start + step)
            part = call.following(torch.arange(n)[rows], batch[rows])
            with self._traced(part, rows_of(target, rows, n), [self.layer]) as run:
                relevance.append(self._channel_relevance(run, rows_of(region, rows, n)))
        return self.dominant_of(torch.cat(relevance), k)

    def dominant_of(self, relevance: Tensor, k: int = 10) -> TopConcepts:
        """:meth:`dominant` of images whose channel relevances (:meth:`relevances`) are
        ``relevance (n, C)``."""
        k = positive_int("k", k)
        mean_share = abs_norm(relevance).mean(dim=0)
        values, channels = self._top_channels(mean_share, k)
        mean_relevance = relevance.mean(dim=0)[channels]
        return TopConcepts(self.layer, channels, mean_relevance, values, None, None)

    def graph(
        self,
        x: Tensor,
        concepts: ConceptSpec | Sequence[ConceptSpec] | range,
        lower: LayerSpec,
        target: TargetSpec = None,
        *,
        additional_forward_args: Any = None,
    ) -> Tensor:
        """``(B, K, C_lower)``: the relevance of every channel of the earlier layer ``lower``
        given each concept of this layer (the paper's attribution graph); each row sums to
        concept ``k``'s relevance when the rules conserve it. An image gives ``(K, C_lower)``."""
        batch, single = as_batch(x, self.model)
        found = as_concepts(concepts)
        low = find_layers(self.model, lower)[0][0]
        if low == self.layer:
            raise ArgumentError("lower must be another (earlier) layer than the concepts'")
        call = Call.of(batch, additional_forward_args)
        with self._traced(call, target, [self.layer, low]) as run:
            masks = self._masks(run, self.layer, found)
            grads = self._back(run, self._start(run, self.layer), masks, run.acts[low])
            parts = [self._per_channel(run, low, (run.acts[low] * g).detach(), 2) for g in grads]
            graph = torch.cat(parts).transpose(0, 1)
        return graph[0] if single else graph

    def _top_channels(self, scores: Tensor, k: int) -> tuple[Tensor, Tensor]:
        """The ``k`` largest ``scores (..., C)`` over the channels -> ``(values, channels)``."""
        if k > scores.shape[-1]:
            raise ArgumentError(f"k={k} but layer {self.layer!r} has {scores.shape[-1]} channels")
        return scores.topk(k, dim=-1)

    def _traced(self, call: Call, target: TargetSpec, layers: list[str]):
        return traced(self.model, self.rules, call, target, layers, self.output, self.reshape)

    def _start(self, run: Pass, layer: str) -> Tensor:
        """``dS/dA`` of the layer for the samples' targets, once per layer and forward."""
        if layer in run.starts:
            return run.starts[layer]
        if not run.scores.requires_grad:
            raise LayerOutputError(f"the target score does not depend on layer {layer!r}")
        (grad,) = torch.autograd.grad(
            run.scores.sum(), run.acts[layer], retain_graph=True, allow_unused=True
        )
        if grad is None:
            raise LayerOutputError(
                f"the target score does not depend on layer {layer!r}: its output does not "
                "reach the model's output"
            )
        run.starts[layer] = grad
        return grad

    def _vjp(self, outputs: Tensor, inputs: Tensor, grads: Tensor) -> Tensor:
        """``(K, *outputs.shape) -> (K, *inputs.shape)``: K vector-Jacobian products."""
        if vmapped(self.rules, grads):
            (out,) = torch.autograd.grad(
                outputs, inputs, grads, is_grads_batched=True, retain_graph=True, allow_unused=True
            )
        else:
            parts = [
                torch.autograd.grad(outputs, inputs, g, retain_graph=True, allow_unused=True)[0]
                for g in grads
            ]
            out = None if parts[0] is None else torch.stack(parts)
        if out is None:
            raise LayerOutputError(
                "a conditional backward found no path between two of its tensors: a layer "
                "given as later (given=, or the concepts' layer for graph's lower=) runs before "
                "the other one, or on another branch"
            )
        return out

    def _masks(self, run: Pass, layer: str, concepts: list[Concept]) -> list[Mask]:
        """The concepts' masks, each checked against the layer's channel count."""
        channels = run.per_sample(run.acts[layer], layer).shape[1]
        for concept in concepts:
            concept.check(channels)
        return [concept.project for concept in concepts]

    def _masked(self, run: Pass, layer: str, grad: Tensor, masks: Sequence[Mask]) -> Tensor:
        """``(K, B, *A.shape[1:])``: the gradient ``(B, ...)`` under each condition."""
        first = run.per_sample(grad, layer)
        stacked = torch.stack([mask(first) for mask in masks])
        return run.per_sample(stacked, layer, dims=2, back=True)

    def _per_channel(self, run: Pass, layer: str, relevance: Tensor, dims: int = 1) -> Tensor:
        """Sum a relevance ``(..., *A.shape[1:])`` with ``dims`` leading axes over positions."""
        first = run.per_sample(relevance, layer, dims)
        return first.flatten(dims + 1).sum(dim=-1)

    def _channel_relevance(self, run: Pass, region: Tensor | None) -> Tensor:
        act = run.acts[self.layer]
        layer_relevance = (act * self._start(run, self.layer)).detach()
        if region is None:
            return self._per_channel(run, self.layer, layer_relevance)
        layout = run.layouts[self.layer]
        grid = layer_relevance if layout is None else layout.to_grid(layer_relevance)
        weights = region_weights(region, tuple(grid.shape[2:]), run.leaf).to(grid)
        return (grid * weights).flatten(2).sum(dim=-1)

    def _conditional(self, run: Pass, masks: Sequence[Mask], grad: Tensor | None = None) -> Tensor:
        """``(B, K, *input spatial)`` heatmaps, one per condition mask on the gradient ``grad``
        at ``self.layer`` (default: the target's)."""
        grad = self._start(run, self.layer) if grad is None else grad
        parts = [(run.leaf * g).sum(dim=2).detach() for g in self._back(run, grad, masks, run.leaf)]
        return torch.cat(parts).transpose(0, 1)

    def _back(self, run: Pass, grad: Tensor, masks: Sequence[Mask], to: Tensor) -> Iterator[Tensor]:
        """The gradient ``grad`` at the layer under each mask, carried back to ``to``:
        ``(k, *to.shape)`` for ``batch_size`` masks at a time."""
        step = chunk_size(len(masks), self.batch_size)
        for start in range(0, len(masks), step):
            grads = self._masked(run, self.layer, grad, masks[start : start + step])
            yield self._vjp(run.acts[self.layer], to, grads)


def rows_of(value: object, rows: slice, batch: int) -> object:
    """The rows ``rows`` of a per-sample target or region; anything else as it is."""
    sized = isinstance(value, list) or isinstance(value, Tensor) and value.ndim > 0
    return value[rows] if sized and batch > 1 and len(value) == batch else value


def vmapped(rules: Rules, grads: Tensor) -> bool:
    """Whether the products ``grads (K, ...)`` run as one vmapped pass: where the rules allow
    it and the device prefers it (:func:`~camkit.core.engine.batched_backward`)."""
    return rules.batched and grads.shape[0] > 1 and batched_backward(grads.device)

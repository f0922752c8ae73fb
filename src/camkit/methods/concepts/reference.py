"""Reference images: for every channel of a layer, the dataset images in which it is most
active or relevant, and the patch that drives it. Activation and relevance maximisation of
Concept Relevance Propagation (Achtibat et al., Nature Machine Intelligence 5, 2023, Sec.
"Relevance maximization"), ranked as zennit-crp 0.6.0 does (``ChannelConcept.reference_sampling``,
``Maximization``): a channel's score in an image is the sum (``score="sum"``) or the largest
(``"max"``) over its positions of the activation ``A`` or the relevance ``A * g``, divided by the
image's sum of absolute channel scores (``normalise``, zennit-crp's ``abs_norm``); the driving
position is the argmax. Collectors (ranks, resumed parts) merge exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor, nn

from camkit.core.call import Call
from camkit.core.engine import Capture, require_autograd
from camkit.core.inputs import as_batch, positive_int
from camkit.core.layers import (
    LayerSpec,
    capture_outputs,
    explained_module,
    find_layers,
    single_call,
)
from camkit.core.layouts import channels_first, layer_layout
from camkit.core.state import model_guarded
from camkit.errors import ArgumentError, LayerOutputError
from camkit.methods.concepts.concepts import abs_norm
from camkit.methods.concepts.rules import GRADIENT, RulesSpec, check_rules
from camkit.targets.outputs import OutputSelector
from camkit.targets.resolver import resolve

Mode = Literal["activation", "relevance"]
MODES: tuple[Mode, ...] = ("activation", "relevance")
RF_THRESHOLD = 0.01  # share of the largest input gradient that still counts as receptive field


@dataclass
class TopK:
    """The ``top`` largest scores per channel seen so far, largest first, each ``(C, top)``:
    ``values``, ``samples`` (dataset indices; -1: none yet), ``positions`` (flat index of the
    driving position among the layer's) and ``classes`` (the image's predicted class)."""

    values: Tensor
    samples: Tensor
    positions: Tensor
    classes: Tensor

    @classmethod
    def empty(cls, channels: int, top: int) -> TopK:
        """Nothing seen yet for ``channels`` channels."""
        return cls(
            torch.full((channels, top), -torch.inf, dtype=torch.float64),
            torch.full((channels, top), -1, dtype=torch.long),
            torch.zeros((channels, top), dtype=torch.long),
            torch.full((channels, top), -1, dtype=torch.long),
        )

    def update(self, values: Tensor, samples: Tensor, positions: Tensor, classes: Tensor) -> None:
        """Fold in the scores ``values (n, C)`` of samples ``samples (n,)``; equal scores keep
        the lower index."""
        channels = values.shape[1]
        self._keep(
            values.detach().double().cpu().T,
            samples.cpu().long().expand(channels, -1),
            positions.cpu().long().T,
            classes.cpu().long().expand(channels, -1),
        )

    def merge(self, other: TopK) -> None:
        """Fold in another collector's entries (another rank's, a resumed part's)."""
        self._keep(other.values, other.samples, other.positions, other.classes)

    def _keep(self, values: Tensor, samples: Tensor, positions: Tensor, classes: Tensor) -> None:
        top = self.values.shape[1]
        values = torch.cat([self.values, values], dim=1)
        samples = torch.cat([self.samples, samples], dim=1)
        # equal scores are ordered by dataset index, so merging in any order gives one result
        by_sample = samples.argsort(dim=1, stable=True)
        by_value = values.gather(1, by_sample).argsort(dim=1, descending=True, stable=True)
        order = by_sample.gather(1, by_value)[:, :top]
        self.values = values.gather(1, order)
        self.samples = samples.gather(1, order)
        self.positions = torch.cat([self.positions, positions], dim=1).gather(1, order)
        self.classes = torch.cat([self.classes, classes], dim=1).gather(1, order)


class ReferenceCollector:
    """Streaming activation and relevance maximisation over a dataset, for one layer.

    ``collector.update(images, indices)`` for each batch, then ``collector.found``:
    ``{"activation": TopK, "relevance": TopK}``. Memory is ``O(channels * top)``.

    Args:
        model, layer: the model and the layer whose channels are ranked.
        top: images kept per channel.
        rules: the rule context of the relevance (default: gradient x activation), or a rule
            set's name or composite.
        score: ``"sum"`` over the channel's positions or its ``"max"`` position.
        normalise: divide by the image's sum of absolute channel scores (zennit-crp's
            ``abs_norm``, its default).
        output, reshape: as for :class:`~camkit.methods.concepts.ConceptAttribution`.
    """

    def __init__(
        self,
        model: nn.Module,
        layer: LayerSpec,
        *,
        top: int = 8,
        rules: RulesSpec = GRADIENT,
        score: Literal["sum", "max"] = "sum",
        normalise: bool = True,
        output: OutputSelector = None,
        reshape: str | None = "auto",
    ):
        self.capture = Capture(model, layer, output)
        if len(self.capture.layers) != 1:
            raise ArgumentError(f"reference images are per layer; got {self.capture.names}")
        if score not in ("sum", "max"):
            raise ArgumentError(f'score must be "sum" or "max", got {score!r}')
        if reshape not in ("auto", None):
            raise ArgumentError(f'reshape must be "auto" or None here, got {reshape!r}')
        self.layer = self.capture.names[0]
        self.top = positive_int("top", top)
        self.rules = check_rules(rules)
        self.score, self.normalise, self.reshape = score, normalise, reshape
        self.found: dict[Mode, TopK] = {}
        self.totals: dict[Mode, Tensor] = {}  # each channel's scores summed over the images
        self.seen = 0

    def update(
        self,
        images: Tensor,
        indices: Tensor | list[int],
        *,
        additional_forward_args: Any = None,
    ) -> None:
        """Rank the channels on a batch ``(n, C, H, W)`` of dataset samples ``indices (n,)``."""
        require_autograd("reference images")
        batch, _ = as_batch(images, self.capture.model)
        indices = torch.as_tensor(indices, dtype=torch.long)
        if indices.shape != (batch.shape[0],):
            raise ArgumentError(
                f"expected {batch.shape[0]} dataset indices for {batch.shape[0]} images, "
                f"got {tuple(indices.shape)}"
            )
        rows = torch.arange(batch.shape[0])
        scorer = resolve(None, batch.shape[0], batch.device, self.capture.output)
        with model_guarded(self.capture.model), self.rules.applied(self.capture.model):
            call = Call.of(batch, additional_forward_args)
            output, taps = self.capture.forward(batch, call, start_graph=True, rows=rows)
        (act,) = single_call(taps)
        with torch.enable_grad():
            scores = scorer(output, rows)
        if not scores.requires_grad:
            raise LayerOutputError(f"the predicted class does not depend on {self.layer!r}")
        (grad,) = torch.autograd.grad(scores.sum(), act)
        classes = scorer.pinned(output).classes[:, 0]
        layout = layer_layout(act.shape, self.capture.model, tuple(batch.shape[2:]), self.reshape)
        act, grad = channels_first(act.detach(), layout), channels_first(grad, layout)
        for mode, values in (("activation", act), ("relevance", act * grad)):
            score, positions = channel_scores(values, self.score, self.normalise)
            found = self.found.setdefault(mode, TopK.empty(score.shape[1], self.top))
            found.update(score, indices, positions, classes)
            self.totals[mode] = self.totals.get(mode, 0) + score.detach().double().sum(dim=0).cpu()
        self.seen += batch.shape[0]

    def merge(self, other: ReferenceCollector) -> None:
        """Fold in another collector of the same layer (another rank's, a resumed part's)."""
        self.load_state(other.state())

    def state(self) -> dict[str, object]:
        """What the collector found, as tensors and numbers (``torch.save`` it to resume)."""
        return {
            "layer": self.layer,
            "top": self.top,
            "seen": self.seen,
            "found": {mode: vars(found) for mode, found in self.found.items()},
            "totals": dict(self.totals),
        }

    def load_state(self, state: dict) -> None:
        """Fold in a :meth:`state` (a resumed part, another rank's)."""
        if state.get("layer") != self.layer or state.get("top") != self.top:
            raise ArgumentError(
                f"a collector state of layer {state.get('layer')!r}, top {state.get('top')} "
                f"cannot join one of layer {self.layer!r}, top {self.top}"
            )
        for mode, fields in state["found"].items():
            part = TopK(**fields)
            self.found.setdefault(mode, TopK.empty(part.values.shape[0], self.top)).merge(part)
            self.totals[mode] = self.totals.get(mode, 0) + state["totals"][mode]
        self.seen += int(state["seen"])


def channel_scores(values: Tensor, score: str, normalise: bool) -> tuple[Tensor, Tensor]:
    """``(n, C, ...) -> (scores (n, C), driving positions (n, C))`` as zennit-crp's
    ``ChannelConcept.reference_sampling`` (see the module docstring)."""
    flat = values.flatten(2) if values.ndim > 2 else values.unsqueeze(-1)
    positions = flat.argmax(dim=-1)
    scores = flat.sum(dim=-1) if score == "sum" else flat.amax(dim=-1)
    if normalise:
        scores = abs_norm(scores)
    return scores, positions


def receptive_boxes(
    model: nn.Module,
    layer: LayerSpec,
    images: Tensor,
    channels: Tensor,
    positions: Tensor,
    *,
    image: Tensor | None = None,
    reshape: str | None = "auto",
    threshold: float = RF_THRESHOLD,
    additional_forward_args: Any = None,
) -> Tensor:
    """``(n, 4)`` boxes ``(top, left, bottom, right)`` (bottom, right exclusive) of the input
    pixels that drive channel ``channels[i]`` at position ``positions[i]``: where the input
    gradient of that activation is at least ``threshold`` of its largest value (the effective
    receptive field; the whole image where it is zero). ``image[i]``: which of ``images``
    request ``i`` reads (default ``i``). The ``k``-th requests of all images share one backward
    pass. ``additional_forward_args``: the model's other inputs for ``images``."""
    model = explained_module(model)
    found = find_layers(model, layer)
    batch, _ = as_batch(images, model)
    count = channels.shape[0]
    image = torch.arange(count) if image is None else torch.as_tensor(image, dtype=torch.long)
    if image.shape != (count,) or positions.shape != (count,):
        raise ArgumentError(
            f"expected one channel, position and image index per request: got "
            f"{tuple(channels.shape)}, {tuple(positions.shape)} and {tuple(image.shape)}"
        )
    if count and not 0 <= int(image.min()) <= int(image.max()) < batch.shape[0]:
        raise ArgumentError(f"image indices must lie in 0..{batch.shape[0] - 1}")
    if count == 0:
        return torch.zeros((0, 4), dtype=torch.long)
    asked = torch.stack([image.cpu(), channels.cpu().long(), positions.cpu().long()], dim=1)
    distinct, which = asked.unique(dim=0, return_inverse=True)
    call = Call.of(batch, additional_forward_args)
    strength = _field_strength(model, found[0], call, distinct, reshape)
    peak = strength.flatten(1).amax(dim=1).view(-1, 1, 1)
    inside = ((strength >= threshold * peak) & (peak > 0)) | (peak == 0)
    top, bottom = _span(inside.any(dim=2)).unbind(1)
    left, right = _span(inside.any(dim=1)).unbind(1)
    return torch.stack([top, left, bottom, right], dim=1)[which.to(top.device)]


def _field_strength(
    model: nn.Module,
    layer: tuple[str, nn.Module],
    call: Call,
    requests: Tensor,
    reshape: str | None,
) -> Tensor:
    """``(n, H, W)``: ``|d act / d input|`` summed over the input's channels for each request
    ``(image, channel, position)`` of ``requests (n, 3)``."""
    image, channels, positions = requests.T
    slot = _slots(image)  # the backward pass that serves each request
    batch = call.batch
    leaf = batch.detach().requires_grad_(True)
    with torch.enable_grad(), model_guarded(model):
        with capture_outputs(model, [layer], start_graph=False) as taps:
            call.forward(model, leaf.clone())
        (act,) = single_call(taps)  # a layer that runs twice in one forward is refused
        layout = layer_layout(act.shape, model, tuple(batch.shape[2:]), reshape)
        flat = channels_first(act, layout).flatten(2)
        device = flat.device
        picked = flat[image.to(device), channels.to(device), positions.to(device)]
        # the k-th request of every image in the k-th backward pass on the one graph (on a CPU
        # a loop of passes costs less than one vmapped pass, is_grads_batched: 2.5x the time)
        strength = leaf.new_empty((len(requests), *leaf.shape[2:]))
        for k in range(int(slot.max()) + 1):
            here = slot == k
            (grad,) = torch.autograd.grad(picked, leaf, here.to(picked), retain_graph=True)
            strength[here.to(device)] = grad[image[here].to(device)].abs().sum(dim=1)
    return strength


def _slots(image: Tensor) -> Tensor:
    """For each request, how many requests before it read the same image."""
    order = image.argsort(stable=True)
    counts = torch.bincount(image)
    first = counts.cumsum(0) - counts
    slot = torch.empty_like(image)
    slot[order] = torch.arange(image.numel()) - first[image[order]]
    return slot


def _span(hits: Tensor) -> Tensor:
    """``(n, L)`` booleans -> ``(n, 2)`` first index and last index + 1 of the true ones."""
    index = torch.arange(hits.shape[1], device=hits.device)
    first = torch.where(hits, index, hits.shape[1]).amin(dim=1)
    last = torch.where(hits, index, -1).amax(dim=1) + 1
    return torch.stack([first, last], dim=1)


__all__ = [
    "MODES",
    "ReferenceCollector",
    "TopK",
    "channel_scores",
    "receptive_boxes",
]

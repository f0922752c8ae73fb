"""The one traced forward of conditional relevance: the input a leaf, the layers tapped, the
model called with the call's extra inputs under the rule set's backward, the target scored."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from camkit.core.call import Call
from camkit.core.engine import require_autograd
from camkit.core.layers import capture_outputs, check_batch_axes, find_layers, single_call
from camkit.core.layouts import Layout, channels_first, layer_layout
from camkit.core.spacetime import folded_frames
from camkit.core.state import model_guarded
from camkit.errors import ArgumentError
from camkit.methods.concepts.rules import Rules
from camkit.targets.base import TargetSpec
from camkit.targets.outputs import OutputSelector
from camkit.targets.resolver import resolve


@dataclass
class Pass:
    """One traced forward: the input leaf, the tapped outputs, the scores, their gradients at
    the tapped outputs once computed (``starts``) and per layer its rows per sample
    (``frames``: ``T`` for a frame-wise model's layer of ``B * T`` rows, else 1)."""

    leaf: Tensor
    acts: dict[str, Tensor]
    layouts: dict[str, Layout | None]
    scores: Tensor
    classes: Tensor | None
    frames: dict[str, int] = field(default_factory=dict)
    starts: dict[str, Tensor] = field(default_factory=dict)

    def per_sample(self, t: Tensor, layer: str, dims: int = 1, *, back: bool = False) -> Tensor:
        """``t`` (``dims`` leading axes, the last the rows, then ``layer``'s output axes) with
        its channels on axis ``dims`` and a frame-wise layer's ``B * T`` rows as ``(B, C, T,
        ...)``: what a concept masks and sums per sample; ``back`` undoes it."""
        layout, frames = self.layouts[layer], self.frames.get(layer, 1)
        if back:
            if frames > 1:
                t = t.movedim(dims + 1, dims).flatten(dims - 1, dims)
            return channels_first(t, layout, dims, back=True)
        t = channels_first(t, layout, dims)
        if frames > 1:
            t = t.unflatten(dims - 1, (-1, frames)).movedim(dims, dims + 1)
        return t


@contextmanager
def traced(
    model: nn.Module,
    rules: Rules,
    call: Call,
    target: TargetSpec,
    layers: list[str],
    output: OutputSelector,
    reshape: str | None,
) -> Iterator[Pass]:
    """One forward of ``call`` with ``layers`` tapped, the input a leaf, under ``rules``, the
    target scored; the backward passes run inside the caller's ``with``."""
    require_autograd("concept relevance")
    batch = call.batch
    size = batch.shape[0]
    scorer = resolve(target, size, batch.device, output)
    modules = find_layers(model, layers)
    leaf = batch.detach().requires_grad_(True)
    with torch.enable_grad():
        with (
            model_guarded(model),
            rules.applied(model),
            capture_outputs(model, modules, start_graph=False) as taps,
        ):
            out = call.forward(model, leaf.clone())
        check_batch_axes(taps, size, folded_frames(model, tuple(batch.shape)))
        acts = dict(zip(layers, single_call(taps), strict=True))
        scores = scorer(out, torch.arange(size))
        if scorer.several:
            raise ArgumentError(
                "concepts explain one target per sample; pass a class per sample (or None "
                "for the predicted class), and the concepts as the K axis"
            )
        classes = scorer.pinned(out).classes[:, 0] if scorer.has_classes else None
        layouts = {
            name: layer_layout(act.shape, model, tuple(batch.shape[2:]), reshape, batch=size)
            for name, act in acts.items()
        }
        frames = {name: act.shape[0] // size for name, act in acts.items()}
        yield Pass(leaf, acts, layouts, scores[:, 0], classes, frames)


__all__ = ["Pass", "traced"]

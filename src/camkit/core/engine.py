"""The tapped forward and the K targets' vector-Jacobian products that every family shares:
:class:`Capture` runs the model once with the layers tapped (autograd starts at them) and
scores the target; :func:`layer_gradients` takes the ``K`` targets' gradients after it."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from camkit.core import layers
from camkit.core.architecture import folded_rows
from camkit.core.call import Call, chunks
from camkit.core.formats import MemoryFormat, autocast
from camkit.core.trace import default_layer
from camkit.errors import GradientError, LayerOutputError, ZeroGradientWarning, warn
from camkit.targets.outputs import OutputSelector
from camkit.targets.resolver import RowScorer


def require_autograd(method: str) -> None:
    """Refuse a call made inside ``torch.inference_mode()``, where no gradient can exist."""
    if torch.is_inference_mode_enabled():
        raise GradientError(
            f"{method} needs gradients, but it was called inside torch.inference_mode(); "
            "call it outside (inside torch.no_grad() is fine: camkit turns gradients on itself)"
        )


def layer_gradients(
    scores: Tensor,
    acts: list[Tensor],
    names: list[str],
    *,
    allow_unused: bool = False,
    retain_graph: bool = False,
) -> list[Tensor | None]:
    """``d scores / d acts`` for ``scores (B, K)``: one ``(B, K, *act.shape[1:])`` per layer.

    Samples are independent, so the batch is summed; the ``K`` targets are one batched
    vector-Jacobian product or ``K`` backward passes, as :func:`batched_backward` decides. A
    tensor the scores do not depend on is an error, or gives None with ``allow_unused=True``
    (then no zero-gradient warning either). ``retain_graph`` keeps the graph for other targets.
    """
    if not scores.requires_grad:
        raise LayerOutputError(
            f"the target score does not depend on layer(s) {names}: their output does not "
            "reach the model's output"
        )
    k = scores.shape[1]
    vjp = partial(torch.autograd.grad, inputs=acts, allow_unused=True)
    if k == 1 or not batched_backward(scores.device):
        with torch.enable_grad():
            keep = [retain_graph or i < k - 1 for i in range(k)]
            passes = [vjp(scores[:, i].sum(), retain_graph=keep[i]) for i in range(k)]
        grads = [
            None if parts[0] is None else torch.stack(parts) for parts in zip(*passes, strict=True)
        ]
    else:
        one_hot = torch.eye(k, dtype=scores.dtype, device=scores.device)
        grad_outputs = one_hot[:, None, :].expand(k, *scores.shape)
        grads = vjp(
            scores, grad_outputs=grad_outputs, is_grads_batched=True, retain_graph=retain_graph
        )
    grads = [None if grad is None else grad.transpose(0, 1) for grad in grads]  # (B, K, ...)
    if allow_unused:
        return grads
    unused = [name for name, grad in zip(names, grads, strict=True) if grad is None]
    if unused:
        raise LayerOutputError(f"the target score does not depend on layer(s) {unused}")
    flat = [name for name, grad in zip(names, grads, strict=True) if not grad.any()]
    if flat:
        warn(
            f"the gradient of the target score is zero everywhere at {flat}: the target does "
            "not use what it computes there (e.g. an FPN level a detection does not come from, "
            "or every ReLU closed), so the gradient map is blank",
            ZeroGradientWarning,
        )
    return grads


def batched_backward(device: torch.device) -> bool:
    """Whether ``K`` vector-Jacobian products on one graph run as one vmapped backward
    (``is_grads_batched``) rather than ``K`` backward passes over the retained graph: not on
    the CPU, where the vmapped one is slower (one thread, ResNet-50, batch 4, 224 px, 10
    targets: 7.1 s against 4.9 s; under LRP's ``epsilon-plus-flat`` 6.4 s against 5.1 s).
    Elsewhere (CUDA, not measured here) one wide pass is what a GPU is good at."""
    return device.type != "cpu"


class Capture:
    """One forward pass with the target layers tapped, and the gradients a method needs."""

    def __init__(
        self, model: nn.Module, layer: layers.LayerSpec | None, output: OutputSelector = None
    ):
        self.model = layers.explained_module(model)
        self.layers = [] if layer is None else layers.find_layers(self.model, layer)
        self.output = output

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.layers]

    def resolve(self, batch: Tensor, call: Call) -> None:
        """Without a layer given: the model's :func:`~camkit.core.trace.default_layer`, traced
        with ``batch`` and the call's extra inputs at the first call."""
        if not self.layers:
            example = call.example(batch)
            self.layers = layers.find_layers(self.model, default_layer(self.model, example=example))

    def forward(
        self,
        batch: Tensor,
        call: Call,
        *,
        start_graph: bool,
        dtype: torch.dtype | None = None,
        memory: MemoryFormat | None = None,
        rows: Tensor | None = None,
    ) -> tuple[Any, dict[str, list[Tensor]]]:
        """One forward pass of ``call``'s samples ``rows`` (None: all) with the layers tapped
        (:func:`~camkit.core.layers.capture_outputs`): ``(model output, {layer: outputs})``, in
        ``memory``'s format (share one :class:`~camkit.core.formats.MemoryFormat` with later
        forwards)."""

        def attempt(memory_format: torch.memory_format) -> tuple[Any, dict[str, list[Tensor]]]:
            with (
                torch.no_grad(),
                autocast(batch.device, dtype),
                layers.capture_outputs(self.model, self.layers, start_graph=start_graph) as taps,
            ):
                inputs = batch.contiguous(memory_format=memory_format)
                output = call.forward(self.model, inputs, rows)
            frames = folded_rows(self.model, tuple(batch.shape))
            layers.check_batch_axes(taps, batch.shape[0], frames)
            return output, taps

        return (memory or MemoryFormat(batch)).run(attempt)

    def run(
        self,
        batch: Tensor,
        call: Call,
        scorer: RowScorer,
        rows: Tensor,
        *,
        gradients: bool,
        dtype: torch.dtype | None = None,
    ) -> tuple[list[Tensor], list[Tensor] | None, Tensor]:
        """``(activations (B, 1, ...), gradients (B, K, ...) or None, scores (B, K))``, one
        activation and gradient per layer; ``rows``: the samples' indices in the scorer's batch.
        The target is scored even without gradients, so it is checked and its ``K`` known."""
        output, taps = self.forward(batch, call, start_graph=gradients, dtype=dtype, rows=rows)
        acts = layers.single_call(taps)
        with torch.set_grad_enabled(gradients):
            scores = scorer(output, rows)
        grads = layer_gradients(scores, acts, self.names) if gradients else None
        acts = [act.detach().unsqueeze(1) for act in acts]
        return acts, grads, scores.detach()


def over_rows(batch: Tensor, batch_size: int | None, run: Callable[[Tensor, Tensor], Any]) -> Any:
    """``run(part, rows)`` over chunks of at most ``batch_size`` samples (all at once for
    None); the results (tensors, or dicts of them, batch first) are concatenated."""
    steps = chunks(batch.shape[0], batch_size)
    return _concatenate([run(batch[int(rows[0]) : int(rows[-1]) + 1], rows) for rows in steps])


def _concatenate(parts: list[Any]) -> Any:
    if isinstance(parts[0], dict):
        return {key: _concatenate([part[key] for part in parts]) for key in parts[0]}
    return parts[0] if len(parts) == 1 else torch.cat(parts)

"""The tapped forward and the batched vector-Jacobian product that every family shares.

:class:`Capture` runs the model once with the target layers tapped (autograd starts at the
layers, so nothing before them is recorded), scores the target with a
:class:`~camkit.core.targets.RowScorer`, and :func:`layer_gradients` takes the gradients of
``K`` targets per sample in one batched backward pass.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import torch
from torch import Tensor, nn

from camkit.core.examples import Example, Inputs
from camkit.core.inputs import MemoryFormat, autocast
from camkit.core.layers import (
    LayerSpec,
    capture_outputs,
    check_batch_axes,
    explained_module,
    find_layers,
    single_call,
)
from camkit.core.outputs import OutputSelector
from camkit.core.targets import RowScorer
from camkit.core.trace import default_layer
from camkit.errors import (
    ArgumentError,
    GradientError,
    LayerOutputError,
    ZeroGradientWarning,
    warn,
)

_EXTRA_ARGS: ContextVar[tuple[tuple, int] | None] = ContextVar("camkit_extra_args", default=None)


@contextmanager
def additional_forward_args(args: Any, batch: int) -> Iterator[None]:
    """Call the model as ``model(x, *args)`` (a dict: ``model(x, **args)``, keyword inputs)
    during the code inside (captum's name; the first argument is the one explained). A tensor
    whose first axis has the batch's size ``batch`` is per sample: every forward camkit runs
    gets the rows of the samples it holds (noisy copies, path points, masked images); anything
    else is passed as it is. Per thread (a context
    variable), so concurrent calls do not mix their arguments."""
    if args is None:
        yield
        return
    token = _EXTRA_ARGS.set((args if isinstance(args, tuple | dict) else (args,), batch))
    try:
        yield
    finally:
        _EXTRA_ARGS.reset(token)


@contextmanager
def following(samples: Tensor) -> Iterator[None]:
    """Inside, calls explain a new batch whose row ``i`` comes from sample ``samples[i]`` of
    the current call (patches, crops): the per-sample additional forward arguments are those
    samples' rows; others pass as they are."""
    extra = _EXTRA_ARGS.get()
    if extra is None:
        yield
        return
    args, batch = extra

    def pick(arg: Any) -> Any:
        return arg[samples.to(arg.device)] if _per_sample(arg, batch) else arg

    if isinstance(args, dict):
        picked = {key: pick(arg) for key, arg in args.items()}
    else:
        picked = tuple(map(pick, args))
    token = _EXTRA_ARGS.set((picked, samples.shape[0]))
    try:
        yield
    finally:
        _EXTRA_ARGS.reset(token)


def _per_sample(arg: object, batch: int) -> bool:
    """Whether an additional forward argument holds one row per sample of the batch."""
    return isinstance(arg, Tensor) and arg.ndim > 0 and arg.shape[0] == batch


def run_model(
    model: nn.Module, inputs: Tensor | tuple[Tensor, ...], rows: Tensor | None = None
) -> Any:
    """``model(inputs)`` (a tuple of explained inputs: ``model(*inputs)``), with the call's
    additional forward arguments for the samples ``rows`` (the sample index of each row of
    ``inputs``; None: the inputs are the batch)."""
    explained = inputs if isinstance(inputs, tuple) else (inputs,)
    extra = _EXTRA_ARGS.get()
    if extra is None:
        return model(*explained)
    args, batch = extra
    if rows is None and explained[0].shape[0] == batch:
        rows = torch.arange(batch)

    def pick(arg: Any) -> Any:
        if _per_sample(arg, batch):
            if rows is None:
                raise ArgumentError(
                    f"a forward of {explained[0].shape[0]} rows cannot be matched to the "
                    f"per-sample additional_forward_args of a batch of {batch}"
                )
            arg = arg[rows.to(arg.device)]
        return arg

    if isinstance(args, dict):
        return model(*explained, **{key: pick(arg) for key, arg in args.items()})
    return model(*explained, *map(pick, args))


def require_autograd(method: str) -> None:
    """Refuse a call made inside ``torch.inference_mode()``, where no gradient can exist."""
    if torch.is_inference_mode_enabled():
        raise GradientError(
            f"{method} needs gradients, but it was called inside torch.inference_mode(); "
            "call it outside (inside torch.no_grad() is fine: camkit turns gradients on itself)"
        )


def layer_gradients(
    scores: Tensor, acts: list[Tensor], names: list[str], *, allow_unused: bool = False
) -> list[Tensor | None]:
    """``d scores / d acts`` for ``scores (B, K)``: one ``(B, K, *act.shape[1:])`` per layer.

    Samples are independent, so the batch is summed; the ``K`` targets are one batched
    vector-Jacobian product (``is_grads_batched``), not ``K`` backward passes. A tensor the
    scores do not depend on is an error, or gives None with ``allow_unused=True`` (then the
    caller also judges blank gradients: no zero-gradient warning).
    """
    if not scores.requires_grad:
        raise LayerOutputError(
            f"the target score does not depend on layer(s) {names}: their output does not "
            "reach the model's output"
        )
    k = scores.shape[1]
    if k == 1:
        with torch.enable_grad():
            grads = torch.autograd.grad(scores.sum(), acts, allow_unused=True)
    else:
        one_hot = torch.eye(k, dtype=scores.dtype, device=scores.device)
        grad_outputs = one_hot[:, None, :].expand(k, *scores.shape)
        grads = torch.autograd.grad(
            scores, acts, grad_outputs=grad_outputs, is_grads_batched=True, allow_unused=True
        )
    if allow_unused:
        return [_targets_second(grad, k) for grad in grads]
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
    return [_targets_second(grad, k) for grad in grads]


def _targets_second(grad: Tensor | None, k: int) -> Tensor | None:
    """A gradient ``(B, ...)`` (one target) or ``(K, B, ...)`` (batched) as ``(B, K, ...)``."""
    if grad is None:
        return None
    return grad.unsqueeze(1) if k == 1 else grad.transpose(0, 1)


class Capture:
    """One forward pass with the target layers tapped, and the gradients a method needs."""

    def __init__(self, model: nn.Module, layer: LayerSpec | None, output: OutputSelector = None):
        self.model = explained_module(model)
        self.layers = [] if layer is None else find_layers(self.model, layer)
        self.output = output

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.layers]

    def resolve(self, batch: Tensor) -> None:
        """Without a layer given: the model's default layer traced with ``batch`` and the
        call's own additional forward arguments, positional or keyword
        (:func:`~camkit.core.trace.default_layer`), found once, at the first call."""
        if not self.layers:
            extra = _EXTRA_ARGS.get()
            example: Example = batch
            if extra is not None and isinstance(extra[0], dict):
                example = Inputs((batch,), dict(extra[0]))
            elif extra is not None:
                example = (batch, *extra[0])
            self.layers = find_layers(self.model, default_layer(self.model, example=example))

    def forward(
        self,
        batch: Tensor,
        *,
        start_graph: bool,
        dtype: torch.dtype | None = None,
        memory: MemoryFormat | None = None,
        rows: Tensor | None = None,
    ) -> tuple[Any, dict[str, list[Tensor]]]:
        """One forward pass with the layers tapped: ``(model output, {layer: outputs})``.

        Runs under ``torch.no_grad()`` (see :func:`~camkit.core.layers.capture_outputs` for
        ``start_graph``); the model sees the batch in the memory format of
        :class:`~camkit.core.inputs.MemoryFormat` (channels_last on the CPU: a copy, the
        caller's tensor is not converted); pass ``memory`` to share what it learns with later
        forwards.
        """

        def attempt(memory_format: torch.memory_format) -> tuple[Any, dict[str, list[Tensor]]]:
            with (
                torch.no_grad(),
                autocast(batch.device, dtype),
                capture_outputs(self.model, self.layers, start_graph=start_graph) as taps,
            ):
                inputs = batch.contiguous(memory_format=memory_format)
                output = run_model(self.model, inputs, rows)
            check_batch_axes(taps, batch.shape[0])
            return output, taps

        return (memory or MemoryFormat(batch)).run(attempt)

    def run(
        self,
        batch: Tensor,
        scorer: RowScorer,
        rows: Tensor,
        *,
        gradients: bool,
        dtype: torch.dtype | None = None,
    ) -> tuple[list[Tensor], list[Tensor] | None, Tensor, bool]:
        """``(activations (B, 1, ...), gradients (B, K, ...) or None, scores (B, K), several)``,
        with one activation and gradient per layer.

        ``rows`` are the samples' indices in the scorer's batch. The target is scored even when
        no gradient is needed, so it is checked and its ``K`` is known for every method.
        """
        output, taps = self.forward(batch, start_graph=gradients, dtype=dtype, rows=rows)
        acts = single_call(taps)
        with torch.set_grad_enabled(gradients):
            scores, several = scorer(output, rows)
        grads = layer_gradients(scores, acts, self.names) if gradients else None
        acts = [act.detach().unsqueeze(1) for act in acts]
        return acts, grads, scores.detach(), several


def over_rows(
    batch: Tensor, batch_size: int | None, run: Callable[[Tensor, Tensor], tuple[Any, bool]]
) -> tuple[Any, bool]:
    """``run(part, rows)`` over chunks of at most ``batch_size`` samples (all at once for
    None); the results (tensors, or dicts of them, batch first) are concatenated."""
    size = batch.shape[0]
    step = batch_size or size
    parts = [
        run(batch[start : start + step], torch.arange(start, min(start + step, size)))
        for start in range(0, size, step)
    ]
    return _concatenate([result for result, _ in parts]), parts[0][1]


def _concatenate(parts: list[Any]) -> Any:
    if isinstance(parts[0], dict):
        return {key: _concatenate([part[key] for part in parts]) for key in parts[0]}
    return parts[0] if len(parts) == 1 else torch.cat(parts)

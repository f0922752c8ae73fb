"""Tracing a model: every layer call with its output shape, and the default layer to explain."""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor, nn

from camkit.core.architecture import default_token_layer, folded_rows, vision_feature_layer
from camkit.core.examples import (
    Example,
    InputSize,
    call_model,
    default_example,
    describe_example,
    first_tensor,
    twins,
)
from camkit.core.layers import hooked, user_name
from camkit.core.layouts import fits_input
from camkit.errors import CamkitError, InputError, LayerOutputError, warn

_TWINS = 2  # the trace runs two different inputs, to see which layers follow them


@dataclass
class _Call:
    name: str
    type_name: str
    shape: tuple[int, ...]
    started: int
    finished: int
    passes_through: bool
    skip: str | None = None  # why this call cannot be the layer to explain (None: it can)
    frames: int = 0  # a frame-wise model's layer with B * frames rows (0: B rows)

    @property
    def unreadable(self) -> str | None:
        """Why a CAM cannot read this call's output (None: it can): the one rule of the CLI's
        ``--layer`` check, ``camkit layers`` and the explorer's layer menu."""
        if self.skip is not None:
            return self.skip
        shape = self.shape
        if len(shape) in (3, 5) or (len(shape) == 4 and shape[-1] * shape[-2] > 1):
            return None
        return (
            f"its output {shape} is not a spatial map: a CAM reads (B, C, h, w) maps of more "
            "than one position, (B, C, d, h, w) volumes or (B, N, C) tokens"
        )


def trace(
    model: nn.Module, input_size: InputSize = None, *, example: Example | None = None
) -> tuple[list[_Call], object]:
    """Run the model (eval mode, no grad) on two inputs: every module call, and the output.

    The inputs: ``example``'s first sample (a tensor, a tuple of positional inputs or a dict of
    keyword inputs, batch first; default: noise of ``input_size``) and a noisy copy. Each call
    records why it cannot be a layer to explain (``skip``: not a tensor, a first axis that is
    not the batch's, the same output for both inputs, the model's output, several calls).
    Shapes are given for the example's batch; calls in the order they start. Modes and hooks
    are restored, even on error.
    """
    if example is None:
        example = default_example(model, input_size)
    pair, perturbed = twins(example)  # refuses an example without a batched tensor
    given = first_tensor(example)
    batch_rows, frames = given.shape[0], folded_rows(model, tuple(given.shape))

    calls: list[_Call] = []
    kept: list[tuple[_Call, weakref.ref | None]] = []
    open_calls: dict[str, list[int]] = {}
    counter = iter(range(1 << 62))

    def before(name: str, module: nn.Module, args: tuple) -> None:
        open_calls.setdefault(name, []).append(next(counter))

    def after(name: str, module: nn.Module, args: tuple, output: object) -> None:
        tensor = first_tensor(output)
        call = _Call(
            name=name,
            type_name=type(module).__name__,
            shape=tuple(tensor.shape) if tensor is not None else (),
            started=open_calls[name].pop(),
            finished=next(counter),
            passes_through=isinstance(module, nn.Identity | nn.modules.dropout._DropoutNd),
            skip=_skip_reason(output, perturbed, frames),
        )
        if call.skip is None and call.shape[0] == _TWINS:
            call.shape = (batch_rows, *call.shape[1:])
        elif call.skip is None:  # a frame-wise layer: _TWINS * frames rows
            call.shape, call.frames = (batch_rows * frames, *call.shape[1:]), frames
        calls.append(call)
        kept.append((call, weakref.ref(output) if isinstance(output, Tensor) else None))

    def register() -> list:
        named = ((user_name(model, name), module) for name, module in model.named_modules())
        return [
            handle
            for name, module in named
            if name
            for handle in (
                module.register_forward_pre_hook(partial(before, name)),
                module.register_forward_hook(partial(after, name)),
            )
        ]

    training_flags = {module: module.training for module in model.modules()}
    try:
        with hooked(register), torch.no_grad():
            model.eval()  # a train-mode forward would update batch-norm statistics
            try:
                output = call_model(model, pair)
            except (RuntimeError, TypeError, AttributeError, IndexError, ValueError) as error:
                if isinstance(error, CamkitError):
                    raise
                raise InputError(
                    f"{type(model).__name__} cannot run on the traced input "
                    f"{describe_example(pair)} "
                    f"({type(error).__name__}: {error}); pass example= an input it takes: a "
                    "tensor, a tuple of positional inputs or a dict of keyword inputs, batch first"
                ) from None
    finally:
        for module, training in training_flags.items():
            module.train(training)
    final = first_tensor(output)
    for call, ref in kept:
        if call.skip is None and ref is not None and final is not None and ref() is final:
            call.skip = "its output is the model's output (the logits), not a feature map"
    _skip_shared_heads(calls)
    return sorted(calls, key=lambda call: call.started), output


def _skip_reason(output: object, perturbed: bool, frames: int | None = None) -> str | None:
    if not isinstance(output, Tensor):
        return f"returns {type(output).__name__}, not a tensor"
    if frames and output.ndim and output.shape[0] == _TWINS * frames != _TWINS:
        first, second = output[:frames], output[frames:]
        if perturbed and torch.equal(first, second):
            return "its output is the same for two different clips: it does not depend on them"
        return None
    if output.ndim == 0 or output.shape[0] != _TWINS:
        rows = output.shape[0] if output.ndim else "no"
        return (
            f"its first axis has {rows} rows for a batch of {_TWINS} inputs: it is not the "
            "batch axis (proposals, frames folded into the batch, or a shared embedding)"
        )
    if perturbed and torch.equal(output[0], output[1]):
        return "its output is the same for two different inputs: it does not depend on the input"
    return None


def _skip_shared_heads(calls: list[_Call]) -> None:
    shapes: dict[str, list[tuple[int, ...]]] = {}
    for call in calls:
        shapes.setdefault(call.name, []).append(call.shape)
    for call in calls:
        if call.skip is None and len(shapes[call.name]) > 1:
            call.skip = (
                f"it runs {len(shapes[call.name])} times in one forward pass (at "
                f"{len(set(shapes[call.name]))} shape(s): a head shared by pyramid levels, or a "
                "module reused in a block); camkit refuses a layer with several calls"
            )


def layer_shapes(
    model: nn.Module, input_size: InputSize = None, *, example: Example | None = None
) -> list[tuple[str, str, tuple[int, ...]]]:
    """``(name, type name, output shape)`` for every module call but the model's, in the order
    the calls start (a non-tensor output: its first tensor's shape, or ``()``)."""
    return [(c.name, c.type_name, c.shape) for c in trace(model, input_size, example=example)[0]]


def skipped_layers(
    model: nn.Module, input_size: InputSize = None, *, example: Example | None = None
) -> dict[str, str]:
    """``{layer name: why it cannot be explained}`` for the layers whose :func:`trace` call
    is skipped."""
    return {c.name: c.skip for c in trace(model, input_size, example=example)[0] if c.skip}


def map_layers(
    model: nn.Module, input_size: InputSize = (224, 224), *, example: Example | None = None
) -> dict[str, str | None]:
    """``{layer name: None if a CAM can read it, else why not}`` (``_Call.unreadable``) for every
    called layer, in the order the calls start."""
    return readable_layers(trace(model, input_size, example=example)[0])


def readable_layers(calls: Sequence[_Call]) -> dict[str, str | None]:
    """:func:`map_layers`' answer from a trace's calls, without tracing again."""
    answer: dict[str, str | None] = {}
    for call in calls:
        answer.setdefault(call.name, call.unreadable)
    return answer


def map_layer_shapes(
    model: nn.Module, input_size: InputSize = (224, 224), *, example: Example | None = None
) -> list[tuple[str, str, tuple[int, ...]]]:
    """:func:`layer_shapes` of the layers a CAM can read (:func:`map_layers`), from one trace."""
    calls = trace(model, input_size, example=example)[0]
    return [(call.name, call.type_name, call.shape) for call in calls if call.unreadable is None]


def default_layer(
    model: nn.Module, input_size: InputSize = None, *, example: Example | None = None
) -> str:
    """The dotted name of the layer to explain by default: a vision-language model's vision
    features (:func:`~camkit.core.architecture.vision_feature_layer`), a transformer's last
    block norm (:func:`~camkit.core.architecture.default_token_layer`), else the :func:`trace`
    call that *finishes* last (a container beats its last child: ``"layer4"`` of a ResNet) of
    those not skipped, not pass-through, with more than one position on spatial axes that are
    the input's divided by a common stride (a box decoder's ``(B, 1, 4, anchors)`` is no map);
    before the head of a model whose head is known (its layers depend on the weights). Raises
    :class:`~camkit.errors.LayerOutputError` without such a map, warns when later layers work on
    token sequences.
    """
    calls, _ = trace(model, input_size, example=example)
    return last_spatial_map(calls, model, input_size, example=example)


def _spatial(shape: tuple[int, ...], size: tuple[int, ...]) -> bool:
    """Whether an output's spatial axes, channels first or last, fit the input's size."""
    return fits_input(shape[2:], size) or fits_input(shape[1:-1], size)


def _before_the_head(model: nn.Module) -> Callable[[str], bool] | None:
    """Which layers may be the default of a model whose head is known by its structure (the
    ``backbone`` / ``features`` beside a ``classifier``, before an ultralytics head), else None."""
    children = dict(model.named_children())
    for body in ("backbone", "features"):
        if body in children and "classifier" in children:
            return lambda name, body=body: name == body or name.startswith(body + ".")
    sequence = children.get("model")
    if isinstance(sequence, nn.Sequential) and len(sequence) > 1 and hasattr(sequence[-1], "dfl"):
        head = f"model.{len(sequence) - 1}"
        return lambda name: name != head and not name.startswith(head + ".")
    return None


def last_spatial_map(
    calls: list[_Call], model: nn.Module, input_size: InputSize, *, example: Example | None = None
) -> str:
    """The default layer from a trace (see :func:`default_layer`)."""
    usable = {call.name for call in calls if call.skip is None}
    for known in (
        vision_feature_layer(model),
        default_token_layer(model, lambda name: user_name(model, name) in usable),
    ):
        known = known and user_name(model, known)
        if known is not None and known in usable:
            return known
    first = first_tensor(default_example(model, input_size) if example is None else example)
    shape = tuple(first.shape) if first is not None else (1, 3, 224, 224)
    dims = len(shape)
    candidates = [
        call
        for call in calls
        if call.skip is None
        and len(call.shape) == dims - bool(call.frames)
        and math.prod(call.shape[2:]) > 1
        and not call.passes_through
        and (dims < 4 or _spatial(call.shape, shape[2 + bool(call.frames) :]))
    ]
    if not candidates:
        what = "4-D (N, C, H, W)" if dims == 4 else f"{dims}-D (N, C, ...)"
        raise LayerOutputError(
            f"no layer of {type(model).__name__} returns a {what} map larger than 1x1 whose "
            "spatial axes are the input's divided by a stride, for its batch of inputs (layers "
            "whose first axis is not the batch, or whose output does not depend on the input, "
            "do not count); name a layer yourself "
            "(see camkit.models.layer_shapes and skipped_layers, or `camkit layers`)"
        )
    allowed = _before_the_head(model) or (lambda name: True)
    inside = [call for call in candidates if allowed(call.name)]
    chosen = max(inside or candidates, key=lambda call: call.finished)
    token_layers = [
        call
        for call in calls
        if call.finished > chosen.finished
        and call.skip is None
        and allowed(call.name)
        and len(call.shape) == 3
        and call.shape[1] > 1
    ]
    if token_layers:
        warn(
            f"the last spatial map of {type(model).__name__} is {chosen.name!r}, but "
            f"{len(token_layers)} later layers work on token sequences (e.g. "
            f"{token_layers[-1].name!r} {token_layers[-1].shape}): for a transformer, choose a "
            "layer by name and reshape its tokens to a map",
            UserWarning,
        )
    return chosen.name

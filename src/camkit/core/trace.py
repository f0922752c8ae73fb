"""Tracing a model: every layer call with its output shape, and the default layer to explain."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from camkit.core.architecture import default_token_layer
from camkit.core.inputs import as_size
from camkit.core.layers import hooked
from camkit.errors import LayerOutputError

_PASS_THROUGH_MODULES = (nn.Identity, nn.modules.dropout._DropoutNd)


@dataclass
class _Call:
    name: str
    type_name: str
    shape: tuple[int, ...]
    started: int
    finished: int
    passes_through: bool


def _first_tensor(value: object) -> Tensor | None:
    if isinstance(value, Tensor):
        return value
    if isinstance(value, Mapping):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        for item in value:
            found = _first_tensor(item)
            if found is not None:
                return found
    return None


def trace(model: nn.Module, input_size: int | tuple[int, int]) -> tuple[list[_Call], object]:
    """Run one zero image through ``model`` (eval mode, no grad): every module call, the output.

    The model's train/eval flags are restored and every hook removed, even on error.
    """
    reference = next(model.parameters(), None)
    if reference is None:
        reference = next(model.buffers(), torch.zeros(()))
    dtype = reference.dtype if reference.is_floating_point() else torch.float32
    dummy = torch.zeros(1, 3, *as_size(input_size), device=reference.device, dtype=dtype)

    calls: list[_Call] = []
    open_calls: dict[str, list[int]] = {}
    counter = iter(range(1 << 62))

    def before(name: str) -> Callable:
        def hook(module: nn.Module, args: tuple) -> None:
            open_calls.setdefault(name, []).append(next(counter))

        return hook

    def after(name: str) -> Callable:
        def hook(module: nn.Module, args: tuple, output: object) -> None:
            tensor = _first_tensor(output)
            calls.append(
                _Call(
                    name=name,
                    type_name=type(module).__name__,
                    shape=tuple(tensor.shape) if tensor is not None else (),
                    started=open_calls[name].pop(),
                    finished=next(counter),
                    passes_through=isinstance(module, _PASS_THROUGH_MODULES),
                )
            )

        return hook

    def register() -> list:
        return [
            handle
            for name, module in model.named_modules()
            if name
            for handle in (
                module.register_forward_pre_hook(before(name)),
                module.register_forward_hook(after(name)),
            )
        ]

    training_flags = {module: module.training for module in model.modules()}
    try:
        with hooked(register), torch.no_grad():
            model.eval()  # a train-mode forward would update batch-norm statistics
            output = model(dummy)
    finally:
        for module, training in training_flags.items():
            module.train(training)
    return calls, output


def layer_shapes(
    model: nn.Module, input_size: int | tuple[int, int] = (224, 224)
) -> list[tuple[str, str, tuple[int, ...]]]:
    """``(name, type name, output shape)`` for every module call, in the order the calls start.

    Runs one ``(1, 3, H, W)`` zero image (eval mode, no grad; the model's modes are restored).
    A module called twice appears twice. For a non-tensor output (tuple, dict) the shape is that
    of its first tensor, or ``()`` when it holds none. The model itself is not listed.
    """
    calls = sorted(trace(model, input_size)[0], key=lambda call: call.started)
    return [(call.name, call.type_name, call.shape) for call in calls]


def default_layer(model: nn.Module, input_size: int | tuple[int, int] = (224, 224)) -> str:
    """The dotted name of the layer to explain by default.

    A transformer (ViT, DeiT, Swin: :func:`~camkit.core.architecture.default_token_layer`) gets the
    first normalisation of its last block (timm ViT ``blocks.{-1}.norm1``, Swin
    ``layers.{-1}.blocks.{-1}.norm1``, torchvision ViT ``...encoder_layer_{-1}.ln_1``), read as
    a grid by the CAMs' ``reshape="auto"``. Otherwise the last spatial feature map. Rule: run
    one zero image and, among the modules whose output is a 4-D ``(N, C, H, W)`` tensor with
    ``H * W > 1``, take the one that *finishes* last. Global pooling (1x1) and the classifier
    are thereby excluded; when a container and its last child return the same map the container
    finishes later and wins (``"layer4"`` for a ResNet, ``"bn2"`` for timm's EfficientNet).
    Pass-through modules (``nn.Identity``, dropout) are skipped. 4-D outputs are assumed to be
    channels-first. Raises :class:`~camkit.errors.LayerOutputError` when no module gives such a
    map, and warns when later layers work on 3-D token sequences (a ViT's only map is its patch
    embedding).
    """
    return last_spatial_map(trace(model, input_size)[0], model, input_size)


def last_spatial_map(
    calls: list[_Call], model: nn.Module, input_size: int | tuple[int, int]
) -> str:
    """The default layer from a trace (see :func:`default_layer`)."""
    token_layer = default_token_layer(model)
    if token_layer is not None:
        return token_layer
    candidates = [
        call
        for call in calls
        if len(call.shape) == 4 and call.shape[2] * call.shape[3] > 1 and not call.passes_through
    ]
    if not candidates:
        raise LayerOutputError(
            f"no layer of {type(model).__name__} returns a 4-D (N, C, H, W) map larger than 1x1 "
            f"for a {as_size(input_size)} input; name a layer yourself "
            "(see camkit.models.layer_shapes or `camkit layers`)"
        )
    chosen = max(candidates, key=lambda call: call.finished)
    token_layers = [
        call
        for call in calls
        if call.finished > chosen.finished and len(call.shape) == 3 and call.shape[1] > 1
    ]
    if token_layers:
        warnings.warn(
            f"the last spatial map of {type(model).__name__} is {chosen.name!r}, but "
            f"{len(token_layers)} later layers work on token sequences (e.g. "
            f"{token_layers[-1].name!r} {token_layers[-1].shape}): for a transformer, choose a "
            "layer by name and reshape its tokens to a map",
            UserWarning,
            stacklevel=3,
        )
    return chosen.name

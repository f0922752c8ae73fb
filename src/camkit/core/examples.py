"""Examples a model is traced with: the explained input and the call's other inputs, noise
shaped for the model's first convolution, and the pair of different inputs a trace runs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import chain

import torch
from torch import Tensor, nn

from camkit.core.architecture import first_conv, patch_rows
from camkit.errors import ArgumentError


@dataclass(frozen=True)
class Inputs:
    """A forward's positional and keyword inputs: ``model(*args, **kwargs)`` (the explained
    batch first, with a call's keyword ``additional_forward_args``)."""

    args: tuple
    kwargs: dict


def first_tensor(value: object) -> Tensor | None:
    if isinstance(value, Tensor):
        return value
    if isinstance(value, Inputs):
        value = (*value.args, *value.kwargs.values())
    if isinstance(value, Mapping):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return next((t for t in map(first_tensor, value) if t is not None), None)
    return None


Example = Tensor | tuple | list | Mapping | Inputs
InputSize = int | Sequence[int] | None
"""The spatial size of the noise a model is traced with (None: :func:`default_example`'s)."""


def default_example(model: nn.Module, input_size: InputSize) -> Tensor:
    """One random input ``(1, C, *size)``: ``C`` and 2-D or 3-D from the model's first
    convolution (an image for a flattened-patch model), ``size`` from ``input_size`` (None:
    224x224, volumes 64x64x64: a 3-D network's strides divide it, and it stays small)."""
    reference = next(chain(model.parameters(), model.buffers()), torch.zeros(()))
    dtype = reference.dtype if reference.is_floating_point() else torch.float32
    conv = first_conv(model)
    dims, channels = (len(conv.kernel_size), conv.in_channels) if conv is not None else (2, 3)
    flat = patch_rows(model)  # images as flattened patches: a 3-D convolution over the frames
    if flat is not None:
        dims, channels = 2, flat.channels
    if input_size is None:
        input_size = 224 if dims < 3 else 64
    size = (input_size,) * dims if isinstance(input_size, int) else tuple(input_size)
    if len(size) != dims or not all(isinstance(n, int) and n > 0 for n in size):
        raise ArgumentError(
            f"{type(model).__name__} starts with a {dims}-D convolution: input_size must be "
            f"an int or {dims} ints, got {input_size!r}; or pass example= an input it takes"
        )
    noise = torch.randn(1, channels, *size, generator=torch.Generator().manual_seed(0), dtype=dtype)
    return noise.to(reference.device)


def twins(example: Example) -> tuple[Example, bool]:
    """The example's first sample and a noisy copy as a batch of two (in every tensor with the
    example's batch; floating-point ones get noise), and whether they differ."""
    first = first_tensor(example)
    if first is None or first.ndim == 0:
        raise ArgumentError(
            f"example must be a tensor, or a tuple / dict holding one, with a batch axis first; "
            f"got {type(example).__name__}"
        )
    batch = first.shape[0]
    generator = torch.Generator().manual_seed(1)
    perturbed = False

    def twin(value: object) -> object:
        nonlocal perturbed
        if isinstance(value, Inputs):
            return Inputs(twin(value.args), twin(value.kwargs))
        if isinstance(value, Mapping):
            return {key: twin(item) for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(twin(item) for item in value)
        if not isinstance(value, Tensor) or value.ndim == 0 or value.shape[0] != batch:
            return value
        one = value[:1]
        other = one
        if one.is_floating_point() and one.numel():
            scale = float(one.float().std()) if one.numel() > 1 else 0.0
            noise = torch.randn(one.shape, generator=generator).to(one)
            other = one + noise * (scale if scale > 0 else 1.0)
            perturbed = True
        return torch.cat([one, other])

    return twin(example), perturbed


def call_model(model: nn.Module, example: Example) -> object:
    """``model(x)``, ``model(*x)`` for a tuple / list, ``model(**x)`` for a dict,
    ``model(*x.args, **x.kwargs)`` for :class:`Inputs`."""
    if isinstance(example, Inputs):
        return model(*example.args, **example.kwargs)
    if isinstance(example, Mapping):
        return model(**example)
    if isinstance(example, (list, tuple)):
        return model(*example)
    return model(example)


def describe_example(example: Example) -> str:
    if isinstance(example, Inputs):
        return f"{describe_example(example.args)} with keywords {describe_example(example.kwargs)}"
    if isinstance(example, Tensor):
        return f"{tuple(example.shape)} {example.dtype}"
    if isinstance(example, Mapping):
        return "{" + ", ".join(f"{k!r}: {describe_example(v)}" for k, v in example.items()) + "}"
    if isinstance(example, (list, tuple)):
        return "(" + ", ".join(describe_example(v) for v in example) + ")"
    return type(example).__name__


__all__ = [
    "Example",
    "InputSize",
    "Inputs",
    "call_model",
    "default_example",
    "describe_example",
    "first_tensor",
    "twins",
]

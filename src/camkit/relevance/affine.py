"""A layer as the affine map the parametric LRP rules modify: ``op(x, weight) + bias``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor, nn

from camkit.errors import ArgumentError

CONV_TRANSPOSE = (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)
_FUNCTIONS = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}

Op = Callable[[Tensor, Tensor], Tensor]


@dataclass(frozen=True)
class Affine:
    """A layer ``op(x, weight) + bias`` (``bias`` broadcast to the output, or None), the
    parameters detached: what the parametric rules modify."""

    op: Op
    weight: Tensor
    bias: Tensor | None

    def __call__(self, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        out = self.op(x, weight)
        return out if bias is None else out + bias

    def scaled_outputs(self, scale: Tensor) -> Tensor:
        """The weight with output ``k`` scaled by ``scale[k]`` (a BatchNorm merged after)."""
        return self.weight * scale.view(-1, *(1,) * (self.weight.dim() - 1))

    def scaled_inputs(self, scale: Tensor) -> Tensor:
        """The weight with input channel ``j`` scaled by ``scale[j]`` (a BatchNorm before)."""
        return self.weight * scale.view(1, -1, *(1,) * (self.weight.dim() - 2))

    @staticmethod
    def of(module: nn.Module) -> Affine:
        """The affine map of an ``nn.Linear``, ``nn.Conv1d/2d/3d`` or ``nn.ConvTranspose1d/2d/3d``
        (:mod:`camkit.relevance.layers`)."""
        if isinstance(module, CONV_TRANSPOSE):
            return transposed_affine(module)
        weight = module.weight.detach()
        bias = None if module.bias is None else module.bias.detach()
        if isinstance(module, nn.Linear):
            return Affine(lambda x, w: F.linear(x, w), weight, bias)
        if isinstance(module, nn.Conv1d | nn.Conv2d | nn.Conv3d):
            shape = (-1,) + (1,) * (weight.dim() - 2)
            return Affine(
                lambda x, w: module._conv_forward(x, w, None),
                weight,
                None if bias is None else bias.view(shape),
            )
        raise ArgumentError(
            "a parametric LRP rule needs nn.Linear, nn.Conv1d/2d/3d or nn.ConvTranspose1d/2d/3d, "
            f"got {type(module).__name__}"
        )


@dataclass(frozen=True)
class TransposedAffine(Affine):
    """A transposed convolution's affine map: weight ``(C_in, C_out / groups, *kernel)``."""

    groups: int = 1

    def scaled_outputs(self, scale: Tensor) -> Tensor:
        """The weight with output channel ``k`` scaled by ``scale[k]`` (``C_out`` entries)."""
        w, g = self.weight, self.groups
        grouped = w.unflatten(0, (g, -1))  # (g, C_in / g, C_out / g, *kernel)
        per_out = scale.view(g, 1, -1, *(1,) * (w.dim() - 2))
        return (grouped * per_out).flatten(0, 1)

    def scaled_inputs(self, scale: Tensor) -> Tensor:
        """The weight with input channel ``j`` scaled by ``scale[j]`` (``C_in`` entries)."""
        return self.weight * scale.view(-1, *(1,) * (self.weight.dim() - 1))


def transposed_affine(module: nn.Module) -> TransposedAffine:
    """The affine map of an ``nn.ConvTranspose1d/2d/3d`` called without ``output_size`` (its
    ``output_padding`` attribute is the one used)."""
    weight = module.weight.detach()
    bias = None if module.bias is None else module.bias.detach()
    conv = _FUNCTIONS[weight.dim() - 2]

    def op(x: Tensor, w: Tensor) -> Tensor:
        return conv(
            x, w, None, module.stride, module.padding, module.output_padding, module.groups,
            module.dilation,
        )  # fmt: skip

    shape = (-1,) + (1,) * (weight.dim() - 2)
    return TransposedAffine(
        op, weight, None if bias is None else bias.view(shape), groups=module.groups
    )


def single_output(layer: Affine, x: Tensor) -> bool:
    """Whether a weight with one output unit gives every output of ``layer`` when all its
    units' weights are equal: a dense layer, or a convolution with one group (not transposed)."""
    w = layer.weight
    return not isinstance(layer, TransposedAffine) and (w.dim() == 2 or x.shape[1] == w.shape[1])


__all__ = [
    "CONV_TRANSPOSE",
    "Affine",
    "Op",
    "TransposedAffine",
    "single_output",
    "transposed_affine",
]

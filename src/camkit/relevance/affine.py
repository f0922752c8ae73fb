"""A layer as the affine map the parametric LRP rules modify: ``op(x, weight) + bias``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.graph import saved_tensors_hooks

from camkit.errors import ArgumentError, RelevanceError

CONV_TRANSPOSE = (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)
LINEAR = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d, *CONV_TRANSPOSE)  # the affine layers
_FUNCTIONS = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}

Derive = Callable[[Tensor], Tensor]
# the saved-tensor hooks in force (torch's own stack; without it, none of ours are pushed)
_outer_hooks = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)


def same(weight: Tensor) -> Tensor:
    """The weight as it is (a rule that applies the layer's own weight)."""
    return weight


def lifted(weight: Tensor, gamma: float) -> Tensor:
    """``w + gamma w+`` (the Gamma rule's weight for positive contributions)."""
    return weight + gamma * weight.clamp(min=0)


def lowered(weight: Tensor, gamma: float) -> Tensor:
    """``w + gamma w-`` (the Gamma rule's weight for negative contributions)."""
    return weight + gamma * weight.clamp(max=0)


@dataclass(frozen=True)
class Affine:
    """A layer ``op(x, weight) + bias`` (``bias`` broadcast to the output, or None), detached.
    ``rebuild``: how ``weight`` is computed again from the model's (None: it is the model's)."""

    op: Callable[[Tensor, Tensor], Tensor]
    weight: Tensor
    bias: Tensor | None
    rebuild: Callable[[], Tensor] | None = None

    def __call__(self, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        out = self.op(x, weight)
        return out if bias is None else out + bias

    def derived(self, x: Tensor, derive: Derive, bias: Tensor | None = None) -> Tensor:
        """``op(x, derive(weight)) + bias``, whose backward computes ``derive(weight)`` again
        (the same operations) instead of keeping a second copy of the model's weights."""
        weight = derive(self.weight)
        if weight is self.weight and self.rebuild is None:
            return self(x, weight, bias)  # the model's own tensor: kept at no cost
        if _outer_hooks is None or _outer_hooks(False) is not None:
            return self(x, weight, bias)  # the caller's own hooks (checkpointing) decide
        base, kept = self.rebuild or self._kept(), id(weight)

        def pack(t: Tensor) -> object:  # autograd keeps the hooks: they must not hold weight
            return partial(_built, derive, base) if id(t) == kept else t

        with saved_tensors_hooks(pack, _unpack):
            return self(x, weight, bias)

    def _kept(self) -> Callable[[], Tensor]:
        """The model's own weight on request, as it was now (its in-place version checked)."""
        return partial(_unchanged, self.weight, self.weight._version)

    def reweighted(self, derive: Derive, bias: Tensor | None) -> Affine:
        """This map with weight ``derive(weight)`` (rebuilt on request) and ``bias``."""
        base = self.rebuild or self._kept()
        return replace(
            self, weight=derive(self.weight), bias=bias, rebuild=partial(_built, derive, base)
        )

    def scaled_outputs(self, scale: Tensor, x: Tensor | None = None) -> Derive:
        """Weight -> the weight with output ``k`` scaled by ``scale[k]``, in ``x``'s layout."""
        shaped = scale.view(-1, *(1,) * (self.weight.dim() - 1))
        return partial(_scaled, scale=shaped, memory_format=_layout(self.weight, x))

    def scaled_inputs(self, scale: Tensor, x: Tensor | None = None) -> Derive:
        """Weight -> the weight with input ``j`` scaled by ``scale[j]``, in ``x``'s layout."""
        shaped = scale.view(1, -1, *(1,) * (self.weight.dim() - 2))
        return partial(_scaled, scale=shaped, memory_format=_layout(self.weight, x))

    @staticmethod
    def of(module: nn.Module) -> Affine:
        """The affine map of an ``nn.Linear``, ``nn.Conv1d/2d/3d`` or ``nn.ConvTranspose1d/2d/3d``
        (called without ``output_size``: its ``output_padding`` attribute is the one used)."""
        if not isinstance(module, LINEAR):
            raise ArgumentError(
                "a parametric LRP rule needs nn.Linear, nn.Conv1d/2d/3d or "
                f"nn.ConvTranspose1d/2d/3d, got {type(module).__name__}"
            )
        weight = module.weight.detach()
        bias = None if module.bias is None else module.bias.detach()
        if isinstance(module, nn.Linear):
            return Affine(F.linear, weight, bias)
        bias = None if bias is None else bias.view((-1,) + (1,) * (weight.dim() - 2))
        if not isinstance(module, CONV_TRANSPOSE):
            return Affine(lambda x, w: module._conv_forward(x, w, None), weight, bias)
        conv, m = _FUNCTIONS[weight.dim() - 2], module
        args = (m.stride, m.padding, m.output_padding, m.groups, m.dilation)
        return TransposedAffine(lambda x, w: conv(x, w, None, *args), weight, bias, groups=m.groups)


@dataclass(frozen=True)
class TransposedAffine(Affine):
    """A transposed convolution's affine map: weight ``(C_in, C_out / groups, *kernel)``; the
    rules apply unchanged, the BatchNorm merge finds the output channels on another axis
    (segmentation decoders: U-Net, Ronneberger et al., MICCAI 2015)."""

    groups: int = 1

    def scaled_outputs(self, scale: Tensor, x: Tensor | None = None) -> Derive:
        """Weight -> the weight with output channel ``k`` scaled by ``scale[k]``."""
        g = self.groups
        return partial(_grouped_scaled, scale=scale.view(g, 1, -1, *(1,) * (self.weight.dim() - 2)))

    def scaled_inputs(self, scale: Tensor, x: Tensor | None = None) -> Derive:
        """Weight -> the weight with input channel ``j`` scaled by ``scale[j]``."""
        return partial(_scaled, scale=scale.view(-1, *(1,) * (self.weight.dim() - 1)))


def _layout(weight: Tensor, x: Tensor | None) -> torch.memory_format:
    """Channels-last for a convolution whose input is channels-last, else the weight's own."""
    channels_last = {4: torch.channels_last, 5: torch.channels_last_3d}.get(weight.dim())
    if x is None or channels_last is None or x.dim() != weight.dim():
        return torch.preserve_format
    ours = x.is_contiguous(memory_format=channels_last) and not x.is_contiguous()
    return channels_last if ours else torch.preserve_format


def _scaled(
    weight: Tensor, scale: Tensor, memory_format: torch.memory_format = torch.preserve_format
) -> Tensor:
    """``weight * scale`` written in ``memory_format`` (a weight in its input's layout is not
    converted again by every convolution that applies it)."""
    return torch.mul(weight, scale, out=torch.empty_like(weight, memory_format=memory_format))


def _grouped_scaled(weight: Tensor, scale: Tensor) -> Tensor:
    """A transposed convolution's weight ``(C_in, C_out / g, ...)`` times ``scale`` shaped
    ``(g, 1, C_out / g, ...)``."""
    return (weight.unflatten(0, (scale.shape[0], -1)) * scale).flatten(0, 1)


def _unchanged(weight: Tensor, version: int) -> Tensor:
    if weight._version != version:
        raise RelevanceError(
            "a layer's weight was changed in place between the forward and the backward of an "
            "LRP rule (the backward builds the rule's weight again from it); run the backward "
            "before changing the model"
        )
    return weight


def _built(derive: Derive, base: Callable[[], Tensor]) -> Tensor:
    return derive(base())


def _unpack(saved: object) -> Tensor:
    return saved() if isinstance(saved, partial) else saved


def single_output(layer: Affine, x: Tensor) -> bool:
    """Whether a weight with one output unit gives every output of ``layer`` when all its
    units' weights are equal: a dense layer, or a convolution with one group (not transposed)."""
    w = layer.weight
    return not isinstance(layer, TransposedAffine) and (w.dim() == 2 or x.shape[1] == w.shape[1])


__all__ = [
    "CONV_TRANSPOSE",
    "LINEAR",
    "Affine",
    "TransposedAffine",
    "lifted",
    "lowered",
    "same",
    "single_output",
]

"""Canonizers: a model put into the form the LRP rules assume, as reversible edits.

:class:`MergeBatchNorm` merges every eval-mode BatchNorm into the adjacent ``nn.Linear`` /
``nn.Conv`` layer, in either order (``conv -> bn`` as zennit's ``SequentialMergeBatchNorm``, and
``bn -> conv``), so that the layer's rule sees one affine map ``W' x + b'`` (Montavon et al. 2019,
sec. 10.3; Hui & Binder, "BatchNorm Decomposition for Deep Neural Network Interpretation",
2019). The edit is hooks inside :func:`camkit.relevance.rules_applied`; adjacency is read from
the forward's data flow, and only the rule's backward sees the merged parameters. Residual sums
need no canonizer (zennit's ``ResNetCanonizer``): ``+`` gets its rule where it is called.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor, nn

from camkit.relevance.affine import LINEAR, Affine

BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


class Edits(Protocol):
    """The reversible edits a canonizer may ask of its block, each returning its undo handles."""

    def merge_batch_norms(
        self, norms: Collection[nn.Module], followed: Collection[nn.Module]
    ) -> list:
        """Merge each BatchNorm of ``norms`` into the layer it takes from or gives to;
        ``followed``: the layers a BatchNorm follows in the module order."""
        ...


@dataclass(eq=False)  # its repr
class Canonizer:
    """A reversible model edit for LRP: :meth:`apply` asks ``edits`` (the
    :func:`~camkit.relevance.rules_applied` block) for what ``model`` needs and returns the
    handles that undo it (removed on exit, also after an exception)."""

    def apply(self, model: nn.Module, edits: Edits) -> list:
        raise NotImplementedError


def _scale_shift(bn: nn.Module, like: Tensor) -> tuple[Tensor, Tensor]:
    """The eval-mode BatchNorm as ``scale * x + shift`` per channel."""
    var, mean = bn.running_var.detach().to(like), bn.running_mean.detach().to(like)
    weight = torch.ones_like(var) if bn.weight is None else bn.weight.detach().to(like)
    bias = torch.zeros_like(var) if bn.bias is None else bn.bias.detach().to(like)
    scale = weight / (var + bn.eps) ** 0.5
    return scale, bias - mean * scale


def channel_scale(bn: nn.Module, like: Tensor) -> Tensor:
    """The eval-mode BatchNorm's ``scale``, shaped for the channel axis (1) of ``like``."""
    return _scale_shift(bn, like)[0].view(-1, *(1,) * (like.dim() - 2))


def mergeable(bn: nn.Module) -> bool:
    """An eval-mode BatchNorm with running statistics (a training one normalises by the batch)."""
    return not bn.training and bn.running_var is not None and bn.running_mean is not None


def merged_after(layer: Affine, bn: nn.Module, x: Tensor | None = None) -> Affine:
    """``bn(layer(x))`` as one affine map: ``W' = scale W`` (per output), ``b' = scale b +
    shift`` (zennit's ``MergeBatchNorm.merge_batch_norm``); ``W'`` in ``x``'s memory layout."""
    scale, shift = _scale_shift(bn, layer.weight)
    shape = (-1,) + (1,) * (layer.weight.dim() - 2)
    scale_out, shift_out = scale.view(shape), shift.view(shape)
    bias = shift_out if layer.bias is None else layer.bias * scale_out + shift_out
    return layer.reweighted(layer.scaled_outputs(scale, x), bias)


def merged_before(bn: nn.Module, layer: Affine, x: Tensor) -> Affine:
    """``layer(bn(x))`` as one affine map: ``W' = W scale`` (per input channel), ``b' =
    layer(shift) `` (a map over the output positions: with zero padding the shift does not
    reach the border outputs fully, and the map says so exactly)."""
    scale, shift = _scale_shift(bn, layer.weight)
    channel = (1, -1) + (1,) * (x.dim() - 2)
    constant = shift.view(channel).expand((1, *x.shape[1:]))
    bias = layer(constant, layer.weight, layer.bias)
    return layer.reweighted(layer.scaled_inputs(scale, x), bias)


class MergeBatchNorm(Canonizer):
    """BatchNorm merged into the adjacent linear or convolutional layer (see the module
    docstring); one in training mode keeps its gradient."""

    def apply(self, model: nn.Module, edits: Edits) -> list:
        norms = [m for m in model.modules() if isinstance(m, BATCH_NORMS) and mergeable(m)]
        # the layers right before a mergeable BatchNorm in the module order (zennit's adjacency;
        # the data flow is checked at the call)
        order = [m for m in model.modules() if isinstance(m, BATCH_NORMS) or not any(m.children())]
        followed = {
            before
            for before, after in zip(order, order[1:], strict=False)
            if isinstance(before, LINEAR) and isinstance(after, BATCH_NORMS) and mergeable(after)
        }
        return edits.merge_batch_norms(norms, followed)


__all__ = [
    "BATCH_NORMS",
    "Canonizer",
    "Edits",
    "MergeBatchNorm",
    "channel_scale",
    "merged_after",
    "merged_before",
]

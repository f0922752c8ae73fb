"""Layer kinds beyond convolutions and dense layers: transposed convolutions as affine maps
for the LRP rules, and the copying operations of the engine's table.

``nn.ConvTranspose1d/2d/3d`` computes ``z_k = sum_j x_j w_jk + b_k`` like a convolution, with
its weight laid out ``(C_in, C_out / groups, *kernel)`` (the input channels first), so every
parametric rule (:class:`~camkit.relevance.rules.Epsilon`, ``ZPlus``, ``Gamma``, ``AlphaBeta``,
``Flat``, ``WSquare``, ``ZBox``) applies to it unchanged: the rules modify the weight entry by
entry (``w+``, ``w-``, ``w^2``, ones) and run the layer's own operation with it. What differs
is which weight axis holds the output channels, which the BatchNorm merge needs
(:meth:`TransposedAffine.scaled_outputs`). Segmentation decoders (U-Net, Ronneberger et al.,
MICCAI 2015) upsample with them; captum's issue #712 asks LRP for them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor, nn

from camkit.relevance.rules import Affine

CONV_TRANSPOSE = (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)

# operations whose outputs are copies of input entries, relevance moving with them by the plain
# gradient (the engine's table): gathers and embeddings (each output returns its relevance to
# the entry it copies), pixel shuffles, and writes (``masked_scatter``, how vision-language
# models put image features into the text sequence; ``index_put``, ``scatter``, ``x[i] = v``):
# the written values get the relevance of the positions they were written to, the overwritten
# entries get none
COPIES = ("gather", "take", "take_along_dim", "masked_select", "embedding", "pixel_shuffle")
COPIES += ("pixel_unshuffle", "channel_shuffle", "diagonal", "tril", "triu", "where")
COPIES += ("masked_scatter", "masked_scatter_", "index_put", "index_put_", "scatter", "scatter_")
COPIES += ("index_copy", "index_copy_", "masked_fill", "masked_fill_", "index_fill")
COPIES += ("index_fill_", "__setitem__")
# writes that add: a sum at the positions written (the Norm rule of sums)
ADDITIVE = ("scatter_add", "scatter_add_", "index_add", "index_add_")
_FUNCTIONS = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


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


__all__ = ["ADDITIVE", "CONV_TRANSPOSE", "COPIES", "TransposedAffine", "transposed_affine"]

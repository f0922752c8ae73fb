"""Layer kinds beyond convolutions and dense layers: transposed convolutions (their affine map
is :class:`~camkit.relevance.affine.TransposedAffine`), and the copying operations of the
engine's table.

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

from camkit.relevance.affine import CONV_TRANSPOSE, TransposedAffine, transposed_affine

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


__all__ = ["ADDITIVE", "CONV_TRANSPOSE", "COPIES", "TransposedAffine", "transposed_affine"]

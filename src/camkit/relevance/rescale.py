"""The modified gradient of a rule as one autograd node, with the fewest element-wise passes.

A rule's output is ``o`` in the forward and, in the backward, the gradient of ``T = source *
ratio`` with ``ratio`` a constant (:mod:`camkit.relevance.rules`): ``g_source = g * ratio``.
Written with ordinary operations (``o.detach() + (T - T.detach())``) that costs five full-size
tensors per layer in the forward (the product, its copy, the difference, the sum) and keeps
them; :func:`rescaled` is the same backward as one node: the forward value *is* ``o`` (its
memory, no copy) and the backward is one product. The ratios ``o / stab(z)`` are computed in
place (:func:`stabilized_ratio`, :func:`self_ratio`), bitwise equal to ``o / stabilize(z, eps)``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


def stabilize(z: Tensor, eps: float) -> Tensor:
    """``z + eps * sign(z)``, zeros pushed to ``+eps`` (zennit's ``stabilize``; the same numbers
    in one comparison and one selection)."""
    return torch.where(z >= 0, z + eps, z - eps)


class _Rescaled(torch.autograd.Function):
    """``carrier`` in the forward (marked dirty: no copy; or a copy), whose backward sends ``g *
    ratio`` to ``source`` only (vmapped under ``is_grads_batched``). Not a ``setup_context``
    Function: that binds its arguments with ``inspect`` on every call, 5x this one's cost."""

    @staticmethod
    def forward(
        ctx: Any, carrier: Tensor, source: Tensor, ratio: Tensor | float, copy: bool
    ) -> Tensor:
        if isinstance(ratio, Tensor):
            ctx.save_for_backward(ratio)
        else:
            ctx.number = ratio
        if copy:
            return carrier.clone()
        ctx.mark_dirty(carrier)
        return carrier

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        ratio = ctx.saved_tensors[0] if ctx.saved_tensors else ctx.number
        return None, grad * ratio, None, None


def rescaled(
    o: Tensor,
    source: Tensor,
    ratio: Tensor | float,
    *,
    in_place: bool = False,
    copy: bool = False,
) -> Tensor:
    """:func:`~camkit.relevance.rules.modified_output` ``(o, source * ratio.detach())`` in one
    node instead of three: ``o`` in the forward, ``g * ratio`` to ``source`` (broadcast back to
    its shape) in the backward. The forward value is ``o``'s own memory, so ``o`` must not be
    kept by its own operation's backward (a linear operation's output is not); ``copy``: it is
    (a softmax's output, a tensor also used as it is). ``ratio`` is kept for the backward (do
    not write it afterwards). ``in_place``: ``o`` is an in-place operation's result, returned
    as the same tensor, its history now the rule's."""
    ratio = ratio.detach() if isinstance(ratio, Tensor) else ratio
    return _Rescaled.apply(o if in_place else o.detach(), source, ratio, copy)


def stabilized_ratio(
    o: Tensor, z: Tensor, eps: float, *, bias: Tensor | None = None, nonnegative: bool = False
) -> Tensor:
    """``o / stabilize(z + bias, eps)`` (a new tensor; ``z`` is read only), in two to five passes
    instead of five to six. ``nonnegative``: the caller knows ``z + bias >= 0`` (or NaN)
    everywhere (z+ of the ZPlus rule, the counts of Flat), where the stabiliser is ``+eps``."""
    z = z.detach()
    fresh = bias is not None
    if fresh:
        z = z + bias
    if nonnegative:
        s = z.add_(eps) if fresh else z + eps
    else:  # eps with z's sign (zeros: +eps), then z added: the same sum as z + eps or z - eps
        s = torch.where(z >= 0, z.new_tensor(eps), z.new_tensor(-eps))
        s.add_(z)
    o = o.detach()
    if s.shape == o.shape and s.dtype == o.dtype:
        return torch.div(o, s, out=s)
    return o / s


def self_ratio(o: Tensor, eps: float, share: float = 1.0) -> Tensor:
    """``share * o / stabilize(o, eps)`` as ``share * |o| / (|o| + eps)`` (the same numbers: a
    negative ``o`` divides ``-share |o|`` by ``-(|o| + eps)``), a new tensor, three passes."""
    a = o.detach().abs()
    d = a + eps
    if share != 1.0:
        a.mul_(share)
    return a.div_(d)


def proportional(
    o: Tensor, stabilizer: float, share: float = 1.0, *, in_place: bool = False
) -> Tensor:
    """``o``, which carries its operation's own graph to the inputs, with each input's relevance
    in proportion to its contribution: ``R_j = x_j (do / dx_j) share / stab(o) R`` (the
    coefficient ``share * o / stab(o)`` detached). ``share=0.5``: each factor of a bilinear
    ``o = f(a, b)`` gets half of the relevance. ``in_place``: as for :func:`rescaled`."""
    return rescaled(o, o, self_ratio(o, stabilizer, share), in_place=in_place)


__all__ = ["proportional", "rescaled", "self_ratio", "stabilize", "stabilized_ratio"]

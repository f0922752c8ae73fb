"""The redirected ReLU gradient of feature visualisation, so that a closed ReLU still points the
way to opening it.

Olah, Mordvintsev & Schubert, "Feature Visualization", Distill 2017, and lucid's
``redirected_relu_grad`` / ``redirected_relu6_grad`` (``lucid/misc/redirected_relu_grad.py``):
a ReLU whose input is negative everywhere the objective reads it has a zero gradient, and an
optimisation that starts there never moves. The redirected backward, for the gradient ``g`` of
the loss (minus the objective) at the ReLU's output, lets ``g`` through where the ReLU is
closed as long as it would *open* it (``x < 0`` and ``g <= 0``: a descent step raises ``x``;
for ReLU6 also ``x > 6`` and ``g >= 0``), and uses this redirected gradient only for the
samples whose ordinary ReLU gradient is zero everywhere; every other sample keeps the ordinary
gradient.

The ReLU calls are caught like the guided-backprop rule's, with the same table of rectifier
functions (:data:`camkit.relevance.rectifiers.RECTIFIERS`: ``nn.ReLU``, ``F.relu``,
``torch.relu``, in-place forms, ReLU6, ``hardtanh(x, 0, max)``): by a
:class:`torch.overrides.TorchFunctionMode`, popped on exit even when the forward raises; the
model itself is never modified.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode

from camkit.relevance.rectifiers import RECTIFIERS


class _RedirectedBackward(torch.autograd.Function):
    """The rectifier's own forward; lucid's redirected gradient in the backward."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, call: Callable[[], Tensor], upper: float, inplace: bool):
        out = call()
        if inplace:
            ctx.mark_dirty(x)
        ctx.upper = upper
        ctx.save_for_backward(out)  # out <= 0 where x <= 0, out >= upper where x >= upper
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        (out,) = ctx.saved_tensors
        low, high = out <= 0, out >= ctx.upper
        plain = grad * ~(low | high)
        wrong_way = (low & (grad > 0)) | (high & (grad < 0))
        redirected = grad * ~wrong_way
        if plain.dim() == 0:
            return (redirected if plain == 0 else plain), None, None, None
        closed = (plain.reshape(len(plain), -1) == 0).all(1)  # per sample (the first axis)
        closed = closed.view(-1, *(1,) * (plain.dim() - 1))
        return torch.where(closed, redirected, plain), None, None, None


class _RedirectMode(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.rectifiers = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        rectifier = RECTIFIERS.get(func)
        if rectifier is not None:
            bound = rectifier.bind(args, kwargs)
            upper, x = rectifier.upper(bound), bound["input"]
            if upper is not None and isinstance(x, Tensor) and x.requires_grad:
                self.rectifiers += 1
                inplace = bool(bound.get("inplace", rectifier.inplace))
                return _RedirectedBackward.apply(x, lambda: func(*args, **kwargs), upper, inplace)
        return func(*args, **kwargs)


@contextmanager
def redirected_relu() -> Iterator[_RedirectMode]:
    """Run the forward inside with every ReLU (and ReLU6) backpropagating lucid's redirected
    gradient; the mode's ``rectifiers`` counts the calls it redirected."""
    mode = _RedirectMode()
    with mode:
        yield mode


__all__ = ["redirected_relu"]

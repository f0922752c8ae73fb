"""The redirected ReLU gradient of feature visualisation, so that a closed ReLU still points the
way to opening it (Olah, Mordvintsev & Schubert, "Feature Visualization", Distill 2017; lucid's
``redirected_relu_grad`` / ``redirected_relu6_grad``).

A ReLU closed everywhere the objective reads it has a zero gradient, and an optimisation that
starts there never moves. For samples whose ordinary ReLU gradient is zero everywhere, the
redirected backward lets the loss gradient ``g`` through where the ReLU is closed as long as it
would *open* it (``x < 0`` and ``g <= 0``; for ReLU6 also ``x > 6`` and ``g >= 0``); every other
sample keeps the ordinary gradient. The rectifier calls are caught as the guided-backprop rule's
(:func:`camkit.relevance.rectifiers.rectified`), by a function mode popped on exit even when the
forward raises; the model is never modified.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode

from camkit.relevance.rectifiers import RECTIFIERS, ActivationLog, rectified


def _redirected(grad: Tensor, out: Tensor, upper: float) -> Tensor:
    """lucid's redirected gradient where a sample's plain gradient is all zero."""
    low, high = out <= 0, out >= upper  # out <= 0 where x <= 0, out >= upper where x >= upper
    plain = grad * ~(low | high)
    wrong_way = (low & (grad > 0)) | (high & (grad < 0))
    redirected = grad * ~wrong_way
    if plain.dim() == 0:
        return redirected if plain == 0 else plain
    closed = (plain.reshape(len(plain), -1) == 0).all(1)  # per sample (the first axis)
    return torch.where(closed.view(-1, *(1,) * (plain.dim() - 1)), redirected, plain)


class _RedirectMode(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.log = ActivationLog("redirected")

    @property
    def rectifiers(self) -> int:
        return self.log.rectifiers

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in RECTIFIERS:
            return rectified(func, args, kwargs or {}, self.log, _redirected)
        return func(*args, **(kwargs or {}))


@contextmanager
def redirected_relu() -> Iterator[_RedirectMode]:
    """Run the forward inside with every ReLU (and ReLU6) backpropagating lucid's redirected
    gradient; the mode's ``rectifiers`` counts the rectifier calls it met."""
    with _RedirectMode() as mode:
        yield mode


__all__ = ["redirected_relu"]

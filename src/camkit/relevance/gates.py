"""Multiplicative gates: ``y = x * gate`` (squeeze-excitation ``x * sigmoid(s)``, SiLU written
as ``x * sigmoid(x)``, gated MLPs ``act(a) * b``, LSTM-style ``tanh`` gates), their rule chosen
by ``Composite(gates=...)``:

* ``"uniform"``: AttnLRP's uniform rule for the product of two activations (Achtibat et al.,
  ICML 2024, Prop. 3.3): each factor gets half of the relevance, ``R_x = R_gate = R_y / 2``;
  the gate's half travels back through the gate's own branch.
* ``"constant"``: the gate is a constant of the forward, ``y = x * gate.detach()``, and the
  gated operand gets all of the relevance (exactly conserved), as AttnLRP treats SiLU and Arras
  et al. the gates of LSTMs ("signal-take-all": "Explaining Recurrent Neural Network
  Predictions in Sentiment Analysis", WASSA 2017).

The gate is read from the data flow: the one factor that is the output of a sigmoid-like
activation (``sigmoid``, ``hardsigmoid``, ``tanh``; out of place), else the one factor that is
the output of another smooth activation (``silu``, ``gelu``, ...: a gated MLP). A product where
neither names exactly one factor keeps the uniform rule.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

GATES: tuple[str, ...] = ("uniform", "constant")
_SIGMOIDS = {
    f
    for owner in (torch, torch.Tensor, F, torch._C._nn)
    for name in ("sigmoid", "sigmoid_", "hardsigmoid", "hardsigmoid_", "tanh", "tanh_")
    if (f := getattr(owner, name, None)) is not None
}


class GateTracker:
    """The activations of one forward (weakly held: the tracker keeps none alive), and the
    product rule of the composite's ``gates``."""

    def __init__(self, gates: str):
        self.constant = gates == "constant"
        self.sigmoids: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
        self.activated: weakref.WeakValueDictionary = weakref.WeakValueDictionary()

    def tagged(self, func: Any, y: Tensor) -> Tensor:
        """``y``, the output of activation ``func``, remembered."""
        if self.constant:
            (self.sigmoids if func in _SIGMOIDS else self.activated)[id(y)] = y
        return y

    def product(self, func: Any, args: tuple, kwargs: dict, operands: list) -> Tensor | None:
        """``func(*args)`` with the factor that is a gate detached (a constant); None under the
        uniform rule or where no rule names exactly one factor."""
        if not self.constant or len(operands) != 2:
            return None
        for seen in (self.sigmoids, self.activated):
            found = [t for t in operands if seen.get(id(t)) is t]
            if len(found) == 1:
                args = tuple(a.detach() if a is found[0] else a for a in args)
                kwargs = {k: v.detach() if v is found[0] else v for k, v in kwargs.items()}
                return func(*args, **kwargs)
        return None


__all__ = ["GATES", "GateTracker"]

"""Bias units: the units whose rule credits none of their inputs, and what the layers that read
them make of them.

Where a rule's denominator ``z_k`` (``z+`` for :class:`~.rules.ZPlus`, ``w x`` for
:class:`~.rules.Epsilon` with ``zero_params="bias"``) is 0 while the output ``o_k`` is not, the
unit is on only because of its bias (a merged BatchNorm shift): the rule credits none of its
inputs and the relevance reaching it is lost (Montavon et al., "Explaining nonlinear
classification decisions with deep Taylor decomposition", Pattern Recognition 2017, sec. 5: the
``z+`` rule conserves only where biases are not positive). On EfficientNet-Lite0 such units hold
40%-67% of the relevance reaching each depthwise convolution that starts a stage
(``benchmarks/CONSERVATION.md``). ``Composite(bias_units=...)`` chooses what they are to the
layers that read them:

* ``"input"`` (zennit's, every named composite but the default): an input like any other,
  whose relevance its own rule then drops;
* ``"bias"`` (the default composite): a bias of the reading layer, left out of its rule's terms
  (``x_j`` set to 0), so that with ``zero_params="bias"`` the layer's relevance goes to the inputs
  that pass it on. The mark follows a unit through element-wise activations, not through sums,
  pooling or reshaping.
"""

from __future__ import annotations

import weakref

from torch import Tensor

BIAS_UNITS: tuple[str, ...] = ("input", "bias")


class Marks(dict):
    """Values attached to the tensors of one forward, by identity and in-place version, the
    tensors held weakly (the forward's tensors are not kept alive)."""

    def put(self, t: Tensor, *value: object) -> None:
        self[id(t)] = (weakref.ref(t), t._version, *value)

    def of(self, t: object) -> tuple | None:
        """``t``'s value, None unless ``t`` is the tensor marked, unchanged in place since."""
        entry = self.get(id(t)) if isinstance(t, Tensor) else None
        live = entry is not None and entry[0]() is t and entry[1] == t._version
        return entry[2:] if live else None


class BiasUnitTracker:
    """The bias units of one forward: a mask per output, ``True`` at the units whose rule
    credited no input; none under ``bias_units="input"``."""

    def __init__(self, bias_units: str):
        self.active = bias_units == "bias"
        self.marked = Marks()

    def mask(self, x: Tensor) -> Tensor | None:
        """The bias units of ``x`` (a ruled layer's output, or an activation of one), or None."""
        found = self.marked.of(x) if self.active else None
        return None if found is None else found[0]

    def kept(self, x: Tensor) -> Tensor:
        """``x`` with its bias units set to 0, for the rule of the layer that reads it (the
        gradient to those entries is 0: they get no relevance)."""
        mask = self.mask(x)
        return x if mask is None else x.masked_fill(mask, 0)

    def found(self, y: Tensor, z: Tensor | None, o: Tensor) -> None:
        """Mark the units of a ruled layer's output ``y`` (output ``o``) where the rule's
        denominator ``z`` is 0 and ``o`` is not."""
        if not self.active or z is None:
            return
        mask = (z.detach() == 0) & (o.detach() != 0)
        if bool(mask.any()):
            self.marked.put(y, mask)

    def clear(self) -> None:
        """Forget the marks (after the forward: the backward needs none of them)."""
        self.marked.clear()

    def passed(self, mask: Tensor | None, y: Tensor) -> None:
        """An element-wise activation ``y = f(x)``: ``y`` has the bias units ``mask`` of ``x``
        (:meth:`mask`, read before an in-place activation writes ``x``)."""
        if mask is not None and mask.shape == y.shape:
            self.marked.put(y, mask)


__all__ = ["BIAS_UNITS", "BiasUnitTracker", "Marks"]

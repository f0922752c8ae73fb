"""Bias units: the units whose rule credits none of their inputs, and what the layers that read
them make of them.

A parametric rule divides a unit's relevance ``R_k`` by its denominator ``z_k`` (``z+`` for
:class:`~.rules.ZPlus`, ``z = w x`` for :class:`~.rules.Epsilon` with ``zero_params="bias"``).
Where ``z_k = 0`` while the unit's output ``o_k`` is not, the unit is on only because of its bias
(a merged BatchNorm shift): every input in its window is zero (a channel switched off by the
rectifier below), or, under ``z+``, every term is negative. The rule credits none of its inputs
and the relevance that reaches the unit is lost there (Montavon et al., "Explaining nonlinear
classification decisions with deep Taylor decomposition", Pattern Recognition 2017, sec. 5:
the ``z+`` rule conserves only where biases are not positive). On an inverted-residual network
with ReLU6 (EfficientNet-Lite0) such units hold 40%-67% of the relevance reaching each
depthwise convolution that starts a stage (``benchmarks/CONSERVATION.md``).

A composite chooses what these units are to the layers that read them (``Composite(bias_units=
...)``):

* ``"input"`` (zennit's, every named composite but the default): an input like any other; the
  reading layer's rule gives it relevance in proportion to its contribution, which its own rule
  then drops.
* ``"bias"`` (the default composite, ``epsilon-plus-flat-nobias``): a bias of the layer that
  reads it, as the unit's value is its own bias carried through its activation. The reading
  layer's rule leaves it out of its terms (``x_j`` set to 0 in ``z`` and in the numerators), so
  with ``zero_params="bias"`` it gets no relevance and the layer's relevance goes to the inputs
  that pass it on (``sum_j R_j = sum_k R_k`` wherever the remaining ``z_k != 0``). The mark
  follows a unit through element-wise activations (the Pass rule), not through sums, pooling or
  reshaping.
"""

from __future__ import annotations

from torch import Tensor

from camkit.errors import ArgumentError

BIAS_UNITS: tuple[str, ...] = ("input", "bias")


def check_bias_units(bias_units: str) -> str:
    """The bias-unit rule's name, checked."""
    if bias_units not in BIAS_UNITS:
        raise ArgumentError(f"bias_units must be one of {list(BIAS_UNITS)}, got {bias_units!r}")
    return bias_units


class BiasUnitTracker:
    """The bias units of one forward: ``{id(output): (output, its version, mask)}``, the mask
    ``True`` at the units whose rule credited no input; empty under ``bias_units="input"``."""

    def __init__(self, bias_units: str):
        self.active = check_bias_units(bias_units) == "bias"
        self.marked: dict[int, tuple[Tensor, int, Tensor]] = {}

    def mask(self, x: Tensor) -> Tensor | None:
        """The bias units of ``x`` (a ruled layer's output, or an activation of one), or None."""
        entry = self.marked.get(id(x)) if self.active else None
        if entry is None or entry[0] is not x or entry[1] != x._version:
            return None
        return entry[2]

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
            self.marked[id(y)] = (y, y._version, mask)

    def clear(self) -> None:
        """Forget the marks (after the forward: the backward needs none of them)."""
        self.marked.clear()

    def passed(self, mask: Tensor | None, y: Tensor) -> None:
        """An element-wise activation ``y = f(x)``: ``y`` has the bias units ``mask`` of ``x``
        (:meth:`mask`, read before an in-place activation writes ``x``)."""
        if mask is not None and mask.shape == y.shape:
            self.marked[id(y)] = (y, y._version, mask)


__all__ = ["BIAS_UNITS", "BiasUnitTracker", "check_bias_units"]

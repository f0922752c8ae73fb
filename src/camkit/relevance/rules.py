"""LRP rules as small objects, each with its formula and paper.

Notation: a layer ``z_k = sum_j x_j w_jk + b_k`` with output ``o = z``, input ``x``, incoming
relevance ``R_k``; ``x+ = max(x, 0)``, ``x- = min(x, 0)``, likewise ``w+``, ``w-``, ``b+``,
``b-``; ``stab(z) = z + eps * (sign(z) + [z == 0])`` (zennit's stabiliser). Each rule gives the
relevance ``R_j`` of the layer's input; the numbers follow zennit 0.5.1 (``zennit.rules``).

The rules run as *modified gradients*: what flows backward is ``g = R / A`` for every tensor
``A``. A rule turns its layer's output into ``y = o.detach() + (T - T.detach())``
(:func:`~camkit.relevance.rescale.rescaled`): ``o`` bitwise in the forward, and the gradient of
``T`` is ``R_j / x_j`` for an incoming ``g = R / o``, linear in ``g``. The first layer's rules
reach the input through ``x / x``: an input entry exactly zero gets no relevance.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

import torch
from torch import Tensor

from camkit.errors import ArgumentError
from camkit.relevance.affine import Affine, lifted, lowered, same, single_output
from camkit.relevance.rescale import (
    proportional,
    rescaled,
    self_ratio,
    stabilize,
    stabilized_ratio,
)

ZeroParams = str | Sequence[str] | None


def safe_divide(a: Tensor, b: Tensor) -> Tensor:
    """``a / b`` where ``b != 0``, else 0."""
    nonzero = b != 0
    return torch.where(nonzero, a, 0) / torch.where(nonzero, b, 1)


def modified_output(o: Tensor, t: Tensor) -> Tensor:
    """``o`` in the forward (bitwise), the gradient of ``t`` in the backward."""
    return o.detach() + (t - t.detach())


def unit_path(x: Tensor) -> Tensor:
    """A tensor of value 1 (0 where ``x == 0``) whose gradient with respect to ``x`` is ``1/x``:
    how a rule whose relevance ``R_j`` is not proportional to ``x_j`` reaches ``g = R / x``."""
    return x * safe_divide(torch.ones_like(x), x).detach()


def signed_parts(x: Tensor) -> tuple[Tensor, Tensor | None]:
    """``(x+, x-)``, with ``x-`` None when ``x`` has no negative entry (the input of a layer after
    a ReLU): its terms are exactly zero, and the rules skip their convolutions."""
    if x.numel() == 0 or bool(x.amin() >= 0):  # one pass; a NaN makes the minimum NaN: signed
        return x, None
    return x.clamp(min=0), x.clamp(max=0)


def _pos(t: Tensor | None) -> Tensor | None:
    return None if t is None else t.clamp(min=0)


def _neg(t: Tensor | None) -> Tensor | None:
    return None if t is None else t.clamp(max=0)


def _plus(z: Tensor, bias: Tensor | None) -> Tensor:
    return z if bias is None else z + bias


def zeroed_params(zero_params: ZeroParams) -> tuple[str, ...]:
    """zennit's ``zero_params`` checked: ``()`` or ``("bias",)`` (a zeroed weight: nothing left)."""
    names = (zero_params,) if isinstance(zero_params, str) else zero_params or ()
    if not isinstance(names, list | tuple) or any(name != "bias" for name in names):
        raise ArgumentError(
            f"zero_params names the parameters a rule sets to zero: None or 'bias', got "
            f"{zero_params!r}"
        )
    return tuple(dict.fromkeys(names))


class Rule:
    """An LRP rule: :meth:`output` maps a layer's output ``o`` (input ``x``) to ``y``, ``o`` in
    the forward, whose gradient is the rule's ``g_x = R_x / x`` (see the module docstring).
    zennit's ``zero_params="bias"`` drops the bias (a merged BatchNorm's shift too) from every
    term: it absorbs no relevance."""

    parametric = True  # needs the layer's weight and bias (nn.Linear, nn.Conv)
    zero_params: tuple[str, ...] = ()

    def __init__(self, stabilizer: float = 1e-6, *, zero_params: ZeroParams = None):
        self.stabilizer = float(stabilizer)
        self.zero_params = zeroed_params(zero_params)

    def bias_of(self, layer: Affine) -> Tensor | None:
        """The layer's bias as the rule sees it: None when ``zero_params`` names it."""
        return None if "bias" in self.zero_params else layer.bias

    @property
    def reuses_output(self) -> bool:
        """Whether the rule's ``z`` is the layer's own output ``o`` (:meth:`reused` applies)."""
        return False

    def reused(
        self, o: Tensor, source: Tensor | None = None, scale: Tensor | None = None
    ) -> Tensor:
        """The rule's output from ``o`` carrying the layer's graph; or from ``o = scale * source
        + shift`` (a BatchNorm merged after, run without a graph), ``source`` carrying it."""
        raise NotImplementedError

    def output(self, layer: Affine | None, x: Tensor, o: Tensor) -> Tensor:
        """The rule's output (a rule defines this or :meth:`output_and_denominator`)."""
        if type(self).output_and_denominator is Rule.output_and_denominator:
            raise NotImplementedError(f"{type(self).__name__} defines no output")
        return self.output_and_denominator(layer, x, o)[0]

    def output_and_denominator(
        self, layer: Affine | None, x: Tensor, o: Tensor
    ) -> tuple[Tensor, Tensor | None]:
        """:meth:`output` and the rule's detached denominator ``z`` where it has one (ZPlus,
        Epsilon), else None (:mod:`camkit.relevance.bias_units`)."""
        return self.output(layer, x, o), None

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({fields})"


def _signed_sums(
    layer: Affine, x: Tensor, up: Callable, down: Callable, biases: tuple
) -> tuple[Tensor, Tensor]:
    """``(z_up, z_down)``: ``x+`` through ``up(w)`` plus ``x-`` through ``down(w)`` (bias
    ``biases[0]``), and with ``up`` and ``down`` swapped (bias ``biases[1]``)."""
    xp, xn = signed_parts(x)
    zp, zn = layer.derived(xp, up, biases[0]), layer.derived(xp, down, biases[1])
    if xn is not None:
        zp, zn = zp + layer.derived(xn, down), zn + layer.derived(xn, up)
    return zp, zn


class Epsilon(Rule):
    """LRP-epsilon: ``R_j = sum_k x_j w_jk / stab(z_k) R_k``, ``z = w x + b``.

    Bach et al., "On Pixel-Wise Explanations for Non-Linear Classifier Decisions by Layer-Wise
    Relevance Propagation", PLOS ONE 2015; ``epsilon=0`` is LRP-0 (gradient x input on a ReLU
    network). ``zero_params="bias"`` drops ``b`` from ``z``.
    """

    def __init__(self, epsilon: float = 1e-6, *, zero_params: ZeroParams = None):
        self.epsilon = float(epsilon)
        self.zero_params = zeroed_params(zero_params)

    @property
    def reuses_output(self) -> bool:
        return "bias" not in self.zero_params  # z = w x + b is the layer's output: no 2nd pass

    def reused(
        self, o: Tensor, source: Tensor | None = None, scale: Tensor | None = None
    ) -> Tensor:
        if source is None:
            return proportional(o, self.epsilon)
        return rescaled(o, source, self_ratio(o, self.epsilon).mul_(scale))

    def output_and_denominator(
        self, layer: Affine | None, x: Tensor, o: Tensor
    ) -> tuple[Tensor, Tensor | None]:
        z = layer.derived(x, same)
        zd = _plus(z.detach(), self.bias_of(layer))
        return rescaled(o, z, stabilized_ratio(o, zd, self.epsilon)), zd


class ZPlus(Rule):
    """LRP-z+ (alpha=1, beta=0): ``R_j = sum_k (x+_j w+_jk + x-_j w-_jk) / stab(z+_k) R_k``
    with ``z+ = w+ x+ + w- x- + b+``.

    Bach et al., PLOS ONE 2015; Montavon et al., "Explaining nonlinear classification decisions
    with deep Taylor decomposition", Pattern Recognition 2017 (zennit's form, which also
    accepts negative inputs).
    """

    def output_and_denominator(
        self, layer: Affine | None, x: Tensor, o: Tensor
    ) -> tuple[Tensor, Tensor | None]:
        xp, xn = signed_parts(x)
        z = layer.derived(xp, _pos)
        if xn is not None:
            z = z + layer.derived(xn, _neg)
        zd = _plus(z.detach(), _pos(self.bias_of(layer)))
        # z+ = x+ w+ + x- w- + b+ >= 0: its stabiliser is + eps
        return rescaled(o, z, stabilized_ratio(o, zd, self.stabilizer, nonnegative=True)), zd


class AlphaBeta(Rule):
    """LRP-alpha-beta: ``R_j = sum_k (alpha (x w)+_jk / stab(z+_k) - beta (x w)-_jk /
    stab(z-_k)) R_k``, ``alpha - beta = 1``; ``(x w)+ = x+ w+ + x- w-`` (with ``b+`` in
    ``z+``), ``(x w)- = x+ w- + x- w+`` (with ``b-`` in ``z-``).

    Bach et al., PLOS ONE 2015.
    """

    def __init__(
        self,
        alpha: float = 2.0,
        beta: float = 1.0,
        stabilizer: float = 1e-6,
        *,
        zero_params: ZeroParams = None,
    ):
        if alpha < 0 or beta < 0 or alpha - beta != 1:
            raise ArgumentError(
                f"AlphaBeta needs alpha, beta >= 0 and alpha - beta = 1, got {alpha}, {beta}"
            )
        self.alpha, self.beta = float(alpha), float(beta)
        super().__init__(stabilizer, zero_params=zero_params)

    def output(self, layer: Affine | None, x: Tensor, o: Tensor) -> Tensor:
        b = self.bias_of(layer)
        zp, zn = _signed_sums(layer, x, _pos, _neg, (_pos(b), _neg(b)))
        t = self.alpha * zp * (o / stabilize(zp.detach(), self.stabilizer)).detach()
        t = t - self.beta * zn * (o / stabilize(zn.detach(), self.stabilizer)).detach()
        return modified_output(o, t)


class Gamma(Rule):
    """LRP-gamma: ``R_j = sum_k x_j (w_jk + gamma w+_jk) / stab(z_k) R_k`` where ``o_k > 0``
    (``z_k`` the sum of ``x+ (w + gamma w+)``, ``x- (w + gamma w-)``, ``b + gamma b+``), and the
    same with ``w-``/``w+`` swapped where ``o_k < 0``.

    Montavon et al., "Layer-Wise Relevance Propagation: An Overview", 2019; the generalised form
    for signed inputs of Andéol et al., "Learning Domain Invariant Representations by Joint
    Wasserstein Distance Minimization", 2021 (zennit's ``Gamma``).
    """

    def __init__(
        self, gamma: float = 0.25, stabilizer: float = 1e-6, *, zero_params: ZeroParams = None
    ):
        self.gamma = float(gamma)
        super().__init__(stabilizer, zero_params=zero_params)

    def output(self, layer: Affine | None, x: Tensor, o: Tensor) -> Tensor:
        b = self.bias_of(layer)
        up, down = partial(lifted, gamma=self.gamma), partial(lowered, gamma=self.gamma)
        zp, zn = _signed_sums(layer, x, up, down, (None, None) if b is None else (up(b), down(b)))
        od = o.detach()
        t = zp * (od * (od > 0) / stabilize(zp.detach(), self.stabilizer))
        t = t + zn * (od * (od < 0) / stabilize(zn.detach(), self.stabilizer))
        return modified_output(o, t)


class Flat(Rule):
    """LRP-flat: ``R_j = sum_k 1 / stab(sum_i 1) R_k`` (every weight 1, no bias): relevance spread
    uniformly over the receptive field.

    Lapuschkin et al., "Unmasking Clever Hans predictors and assessing what machines really
    learn", Nature Communications 2019. For the first layer; no bias (``zero_params``: no-op).
    """

    def output(self, layer: Affine | None, x: Tensor, o: Tensor) -> Tensor:
        w = layer.weight
        if single_output(layer, x):  # every output unit has the same sums: one computed
            w = w[:1]
        return _input_free(self, layer, x, o, torch.ones_like(w))


class WSquare(Rule):
    """LRP-w^2: ``R_j = sum_k w_jk^2 / stab(sum_i w_ik^2 + b_k^2) R_k``.

    Montavon et al., "Explaining nonlinear classification decisions with deep Taylor
    decomposition", Pattern Recognition 2017. For a first layer with unbounded input.
    """

    def output(self, layer: Affine | None, x: Tensor, o: Tensor) -> Tensor:
        b = self.bias_of(layer)
        return _input_free(self, layer, x, o, layer.weight**2, None if b is None else b**2)


def _input_free(
    rule: Rule, layer: Affine, x: Tensor, o: Tensor, w: Tensor, bias: Tensor | None = None
) -> Tensor:
    """Flat's and WSquare's ``R_j = sum_k w_jk / stab(sum_i w_ik + bias_k) R_k``, ``w >= 0``."""
    with torch.no_grad():  # the same for every sample
        z = layer.op(torch.ones_like(x[:1]), w)
    ratio = stabilized_ratio(o, z, rule.stabilizer, bias=bias, nonnegative=True)
    return rescaled(o, layer.op(unit_path(x), w).expand_as(o), ratio)


class ZBox(Rule):
    """LRP-z^B for inputs bounded by ``low <= x <= high``:
    ``R_j = sum_k (x_j w_jk - l_j w+_jk - h_j w-_jk) / stab(z_k) R_k``,
    ``z_k = sum_j (x_j w_jk - l_j w+_jk - h_j w-_jk) + b_k - b+_k - b-_k``.

    Montavon et al., Pattern Recognition 2017. For the first layer. ``low``/``high``: numbers
    or tensors broadcast to the input; None: each sample's own minimum / maximum. The bias
    cancels out (``b - b+ - b- = 0``): ``zero_params`` changes nothing.
    """

    def __init__(
        self,
        low: float | Tensor | None = None,
        high: float | Tensor | None = None,
        stabilizer: float = 1e-6,
        *,
        zero_params: ZeroParams = None,
    ):
        self.low, self.high = low, high
        super().__init__(stabilizer, zero_params=zero_params)

    def _bound(self, value: float | Tensor | None, x: Tensor, extreme: Callable) -> Tensor:
        if value is None:
            dims = tuple(range(1, x.dim()))
            return extreme(x.detach(), dim=dims, keepdim=True).expand_as(x)
        return torch.as_tensor(value).to(x).expand_as(x)

    def output(self, layer: Affine | None, x: Tensor, o: Tensor) -> Tensor:
        w, b = layer.weight, self.bias_of(layer)
        low, high = self._bound(self.low, x, torch.amin), self._bound(self.high, x, torch.amax)
        unit, first, wp, wn = unit_path(x), layer(x, w, b), w.clamp(min=0), w.clamp(max=0)
        t = first - layer(low * unit, wp, _pos(b)) - layer(high * unit, wn, _neg(b))
        z = first - layer(low, wp, _pos(b)) - layer(high, wn, _neg(b))
        return rescaled(o, t, stabilized_ratio(o, z, self.stabilizer))


class Pass(Rule):
    """Pass: ``R_x = R_o`` for an element-wise layer (activations: ReLU, SiLU, GELU, ...): the
    relevance goes through unchanged. zennit's ``Pass``; Montavon et al. 2019 (activations are
    not given relevance of their own)."""

    parametric = False

    def __init__(self) -> None:  # no parameters
        pass

    def output(self, layer: Affine | None, x: Tensor, o: Tensor) -> Tensor:
        if x.shape != o.shape:
            raise ArgumentError(
                f"the Pass rule needs an element-wise layer, got {tuple(x.shape)} -> "
                f"{tuple(o.shape)}"
            )
        return rescaled(o, x, safe_divide(o.detach(), x.detach()), copy=True)


class Norm(Rule):
    """Norm: ``R_j = x_j (dz_k / dx_j) / stab(z_k) R_k`` for a parameter-free linear operation
    ``z`` (sums, residual additions, average pooling): relevance shared in proportion to each
    input's contribution. zennit's ``Norm`` (LRP-epsilon with ``epsilon`` as a stabiliser only,
    Bach et al. 2015)."""

    parametric = False

    def output(self, layer: Affine | None, x: Tensor, o: Tensor) -> Tensor:
        """``o`` must carry the operation's own graph to its inputs (``x`` is not used)."""
        return proportional(o, self.stabilizer)


__all__ = [
    "AlphaBeta",
    "Epsilon",
    "Flat",
    "Gamma",
    "Norm",
    "Pass",
    "Rule",
    "WSquare",
    "ZBox",
    "ZPlus",
    "modified_output",
    "safe_divide",
    "zeroed_params",
]

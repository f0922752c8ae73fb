"""Integrated Gradients (Sundararajan et al., ICML 2017), with the quadrature rules of captum and
zennit, over the plain gradient or any rule set of the one backward (an LRP composite: zennit's
``IntegratedGradients`` attributor with a composite)."""

from __future__ import annotations

from collections.abc import Callable
from numbers import Real
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor, nn

from camkit.core.call import Call
from camkit.core.explainer import Explanation
from camkit.core.finish import drop_axes
from camkit.core.inputs import positive_int
from camkit.core.state import model_guarded
from camkit.errors import ArgumentError
from camkit.methods.pixel.base import (
    Inputs,
    PixelAttribution,
    SampleTotals,
    as_tuple,
    finished,
    summed,
)
from camkit.registry import register
from camkit.targets.base import TargetSpec
from camkit.targets.resolver import RowScorer

Baseline = Tensor | float | tuple | Callable[[Tensor], Tensor] | None
Quadrature = Literal[
    "trapezoid",
    "riemann_left",
    "riemann_right",
    "riemann_middle",
    "riemann_trapezoid",
    "gausslegendre",
    "zennit",
]
QUADRATURES: tuple[str, ...] = Quadrature.__args__
INTEGRANDS = ("gradient", "relevance")


def quadrature_rule(
    method: Quadrature, steps: int, dtype: torch.dtype = torch.float64
) -> tuple[Tensor, Tensor]:
    """``(alphas, weights)`` (in ``dtype``) of the path integral ``int_0^1 g(a) da ~ sum_i w_i
    g(a_i)``.

    ``"trapezoid"``: ``n + 1`` points ``k / n`` weighted ``1/2, 1, ..., 1, 1/2`` over ``n``.
    captum's, ``n`` points weighted ``1/n``: ``"riemann_left"`` ``linspace(0, 1 - 1/n, n)``,
    ``"riemann_right"`` (zennit 0.5.1's, ``"zennit"``) ``linspace(1/n, 1, n)``,
    ``"riemann_middle"`` ``linspace(1/2n, 1 - 1/2n, n)``, ``"riemann_trapezoid"`` ``linspace(0,
    1, n)`` with both ends halved, ``"gausslegendre"`` the Gauss-Legendre rule on ``[0, 1]``.
    """
    if method not in QUADRATURES:
        raise ArgumentError(f"unknown quadrature {method!r}; choose from {list(QUADRATURES)}")
    n = steps
    if method == "gausslegendre":
        nodes, weights = np.polynomial.legendre.leggauss(n)
        return tuple(torch.from_numpy(0.5 * v).to(dtype) for v in (nodes + 1, weights))
    if n < 2 and method == "riemann_trapezoid":
        raise ArgumentError("the riemann_trapezoid quadrature needs steps >= 2 (captum's)")
    start, end, points = {
        "trapezoid": (0, 1, n + 1),
        "riemann_left": (0.0, 1 - 1 / n, n),
        "riemann_right": (1 / n, 1.0, n),
        "zennit": (1 / n, 1.0, n),
        "riemann_middle": (1 / (2 * n), 1 - 1 / (2 * n), n),
        "riemann_trapezoid": (0.0, 1.0, n),
    }[method]
    alphas = torch.linspace(start, end, points, dtype=dtype)
    weights = torch.full_like(alphas, 1 / n)
    if method in ("trapezoid", "riemann_trapezoid"):
        weights[[0, -1]] /= 2
    return alphas, weights


@register("ig", "Sundararajan et al., ICML 2017")
class IntegratedGradients(PixelAttribution):
    """Integrated Gradients: ``(x - x') * mean of the gradients on the path from x' to x``.

    Sundararajan et al., "Axiomatic Attribution for Deep Networks", ICML 2017. Completeness:
    ``sum(attr) ~ f(x) - f(x')``; ``return_error=True`` also gives the gap. ``composite=``: the
    rule set's gradients (zennit's ``IntegratedGradients`` with a composite; ``rule="guided"``:
    guided IG).

    Args (besides those of :class:`~camkit.methods.pixel.base.PixelAttribution`):
        steps: intervals for ``"trapezoid"`` (``steps + 1`` points), else points (captum's
            ``n_steps``, zennit's ``n_iter``).
        quadrature: one of :data:`QUADRATURES` (:func:`quadrature_rule`).
        integrand: ``"gradient"`` integrates the (rule set's) gradient ``g(x_a)``;
            ``"relevance"`` the relevance of a unit score ``x_a g(x_a) / f(x_a)`` (0 where
            ``f(x_a) = 0``), as zennit's over an LRP composite (with ``quadrature="zennit"``).
        baseline: ``x'``: None (zeros), a finite number, a tensor broadcastable to the batch, or
            a callable ``f(batch) -> baseline``; for a tuple of inputs a tuple of them (None or
            a number applies to every input; a callable gets the tuple).
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        steps: int = 50,
        baseline: Baseline = None,
        quadrature: Quadrature = "trapezoid",
        integrand: Literal["gradient", "relevance"] = "gradient",
        **options: Any,
    ):
        super().__init__(model, **options)
        self.steps = positive_int("steps", steps)
        self.baseline = baseline
        quadrature_rule(quadrature, self.steps)  # checked here, built for the input's dtype
        self.quadrature = quadrature
        if integrand not in INTEGRANDS:
            raise ArgumentError(f"unknown integrand {integrand!r}; choose from {INTEGRANDS}")
        self.integrand = integrand

    def _explain(self, call: Call, scorer: RowScorer, *, return_error: bool = False) -> Explanation:
        """Attribution shaped like ``x``; with ``return_error=True`` also the completeness error
        ``|sum(attr) - (f(x) - f(x'))|`` per sample."""
        attrs, delta = self.integrate(as_tuple(call.batch), scorer, call, return_error)
        maps, totals = finished(call.batch, attrs)
        return Explanation.of((maps, (totals - delta).abs()) if return_error else maps, scorer)

    def completeness(
        self, x: Tensor, target: TargetSpec = None, *, additional_forward_args: Any = None
    ) -> dict[str, Tensor]:
        """How well the attribution meets the completeness axiom ``sum(attr) = f(x) - f(x')``.

        ``{"delta": f(x) - f(x'), "abs": |sum(attr) - delta|, "relative": abs / |delta|,
        "relative_to_batch": abs / mean |delta|}``, each ``(B,)`` (or ``(B, K)``);
        ``relative_to_batch`` still means something where ``delta`` is close to 0.
        docs/reliability.md has the convergence in ``steps`` next to captum's rules.
        """
        batch, single = self.checked_input(x)
        inputs = as_tuple(batch)
        call = Call.of(inputs, additional_forward_args)
        scorer = self.target_scorer(target, inputs[0])
        self.check_autograd()
        with model_guarded(self.model):
            attrs, delta = self.integrate(inputs, scorer, call, with_delta=True)
        error, scale = (summed(attrs) - delta).abs(), delta.abs().mean()
        to_batch = error / scale if scale > 0 else torch.full_like(error, torch.inf)
        report = {"delta": delta, "abs": error, "relative": error / delta.abs()}
        report["relative_to_batch"] = to_batch
        return {key: drop_axes(value, single, scorer.several) for key, value in report.items()}

    def forward_rows(self, layer_shape: tuple[int, ...] | None = None) -> int:
        return len(quadrature_rule(self.quadrature, self.steps)[0])

    def attribute(self, inputs: Inputs, target: TargetSpec, call: Call) -> Inputs:
        return self.integrate(inputs, target, call)[0]

    def integrate(
        self, inputs: Inputs, target: TargetSpec, call: Call, with_delta: bool = False
    ) -> tuple[Inputs, Tensor]:
        """``(attr (B, K, ...) per input, f(x) - f(x') (B, K))``; ``with_delta`` adds the path's
        ends with weight 0 where the rule lacks them."""
        first, baselines = inputs[0], self.baselines_for(inputs)
        size = first.shape[0]
        alphas, weights = quadrature_rule(self.quadrature, self.steps, first.dtype)
        for end_point in (0.0, 1.0) if with_delta else ():
            if not (alphas == end_point).any():
                alphas = torch.cat([alphas, alphas.new_tensor([end_point])])
                weights = torch.cat([weights, weights.new_zeros(1)])
        alphas, weights = alphas.to(first.device), weights.to(first.device)
        first_step, last_step = alphas == 0, alphas == 1
        gradient, start, end = SampleTotals(size), SampleTotals(size), SampleTotals(size)

        def path(rows: Tensor, span: range) -> Inputs:
            sample, alpha = rows % size, alphas[rows // size]
            return tuple(
                torch.lerp(b[sample], t[sample], alpha.to(t.dtype).view(-1, *[1] * (t.ndim - 1)))
                for t, b in zip(inputs, baselines, strict=True)
            )

        def accumulate(rows: Tensor, grads: Inputs, scores: Tensor) -> None:
            sample, step = rows % size, rows // size
            if self.integrand == "relevance":  # x_a g / f(x_a): the relevance of a unit score
                unit = torch.where(scores != 0, 1 / torch.where(scores != 0, scores, 1), 0)
                points = path(rows, range(0))
                grads = tuple(
                    g * p.unsqueeze(1) * unit.to(g.dtype).view(*unit.shape, *[1] * (g.ndim - 2))
                    for g, p in zip(grads, points, strict=True)
                )
            weight = weights[step]
            gradient.add(
                sample, *(g * weight.to(g.dtype).view(-1, *[1] * (g.ndim - 1)) for g in grads)
            )
            start.add(sample, scores * first_step[step].unsqueeze(1))
            end.add(sample, scores * last_step[step].unsqueeze(1))

        self.over_copies(inputs, target, call, len(alphas), path, accumulate)
        parts = zip(inputs, baselines, gradient.totals, strict=True)
        attrs = tuple((t - b).unsqueeze(1) * grad for t, b, grad in parts)
        return attrs, end.totals[0] - start.totals[0]

    def baselines_for(self, inputs: Inputs) -> Inputs:
        """One finite baseline per input, shaped like it (broadcast views)."""
        given = self.baseline
        if callable(given):
            given = given(inputs[0] if len(inputs) == 1 else inputs)
        if isinstance(given, tuple | list):
            if len(given) != len(inputs):
                raise ArgumentError(
                    f"baseline is a tuple of {len(given)}, expected one baseline per input "
                    f"({len(inputs)})"
                )
            return tuple(baseline_like(b, t) for b, t in zip(given, inputs, strict=True))
        if isinstance(given, Tensor) and len(inputs) > 1:
            raise ArgumentError(
                f"with a tuple of {len(inputs)} inputs, give a tuple of baselines, one per input "
                "(None or a number applies to every input)"
            )
        return tuple(baseline_like(given, t) for t in inputs)

    def __repr__(self) -> str:
        return (
            f"IntegratedGradients(steps={self.steps}, quadrature={self.quadrature!r}, "
            f"batch_size={self.batch_size}, composite={self.backward_name()!r})"
        )


def baseline_like(baseline: object, batch: Tensor) -> Tensor:
    """``baseline`` (None: zeros) as a finite broadcast view of ``batch``'s shape."""
    if baseline is None:
        return torch.zeros_like(batch)
    if isinstance(baseline, bool) or not isinstance(baseline, Tensor | Real):
        raise ArgumentError(
            "baseline must be None, a number, a tensor or a callable returning a tensor, "
            f"got {type(baseline).__name__}"
        )
    baseline = torch.as_tensor(baseline, dtype=batch.dtype, device=batch.device).detach()
    try:
        fits = torch.broadcast_shapes(baseline.shape, batch.shape) == batch.shape
    except RuntimeError:
        fits = False
    if not fits:
        raise ArgumentError(
            f"the baseline has shape {tuple(baseline.shape)}, expected one sample's shape "
            f"{tuple(batch.shape[1:])} or the batch's {tuple(batch.shape)} "
            "(or a shape that broadcasts to it)"
        )
    if not torch.isfinite(baseline).all():
        raise ArgumentError("the baseline contains NaN or infinite values")
    return baseline.expand_as(batch)

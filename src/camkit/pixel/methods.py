"""Pixel-space attributions: gradients of the target score with respect to the input image.

Every method maps ``(C, H, W) -> (C, H, W)``, batches and ``K`` targets per sample likewise (see
:mod:`camkit.pixel.base`); :func:`~camkit.pixel.heatmap.to_heatmap` turns an attribution into a
displayable map.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from numbers import Real
from typing import Any, Literal

import torch
from torch import Tensor, nn

from camkit.core.call import Call
from camkit.core.explainer import Explanation
from camkit.core.finish import drop_axes
from camkit.core.inputs import positive_int
from camkit.core.seeds import call_seed
from camkit.core.seeds import generator as random_generator
from camkit.core.state import model_guarded
from camkit.errors import ArgumentError
from camkit.pixel.base import (
    Inputs,
    PixelAttribution,
    SampleTotals,
    as_given,
    as_tuple,
    finished,
)
from camkit.registry import register
from camkit.targets.base import TargetSpec
from camkit.targets.resolver import RowScorer

Baseline = Tensor | float | tuple | Callable[[Tensor], Tensor] | None
SMOOTHGRAD_KINDS = ("mean", "square", "var")


@register("saliency", "Simonyan et al., ICLR-W 2014")
class Saliency(PixelAttribution):
    """Saliency: the signed gradient of the target score with respect to the input pixels.

    Simonyan et al., "Deep Inside Convolutional Networks: Visualising Image Classification
    Models and Saliency Maps", ICLR 2014 workshop. ``(C, H, W) -> (C, H, W)`` (batches and K
    targets likewise); the paper's map is ``to_heatmap(attr, "abs-max")``.
    """

    def attribute(self, inputs: Inputs, target: TargetSpec, call: Call) -> Inputs:
        grads = SampleTotals(inputs[0].shape[0])

        def keep(rows: Tensor, values: Inputs, scores: Tensor) -> None:
            grads.add(rows, *values)

        self.over_copies(inputs, target, call, 1, None, keep)
        return grads.totals


@register("guided", "Springenberg et al., ICLR-W 2015")
class GuidedBackprop(Saliency):
    """Guided backpropagation: a ReLU passes back only positive gradients where its input was
    positive, ``grad_in = grad_out * (x > 0) * (grad_out > 0)``.

    Springenberg et al., "Striving for Simplicity: The All Convolutional Net", ICLR 2015
    workshop. Reaches ``nn.ReLU`` modules (in-place, reused) and functional ReLUs alike; ReLU6
    passes where ``0 < x < 6``. ``(C, H, W) -> (C, H, W)``, batches and K targets likewise.
    The same as ``Saliency(model, rule="guided")``.
    """

    default_rule = "guided"


@register("deconvnet", "Zeiler & Fergus, ECCV 2014")
class Deconvnet(Saliency):
    """Deconvnet: a ReLU passes back only positive gradients, whatever its input was,
    ``grad_in = grad_out * (grad_out > 0)``.

    Zeiler & Fergus, "Visualizing and Understanding Convolutional Networks", ECCV 2014, as a
    backward rule (Springenberg et al. 2015). ``(C, H, W) -> (C, H, W)``, batches and K targets
    likewise. The same as ``Saliency(model, rule="deconvnet")``.
    """

    default_rule = "deconvnet"


@register("smoothgrad", "Smilkov et al., 2017")
class SmoothGrad(PixelAttribution):
    """SmoothGrad: gradients averaged over noisy copies of the input.

    Smilkov et al., "SmoothGrad: removing noise by adding noise", 2017. Each sample gets
    ``samples`` copies ``x + N(0, sigma^2)`` with ``sigma = noise_level * (max(x) - min(x))`` of
    that sample (of each input of a tuple, for its own range). ``kind`` = ``"mean"``
    (SmoothGrad), ``"square"`` (mean of squared gradients, SmoothGrad^2) or ``"var"``
    (population variance of the gradients, VarGrad).
    ``(C, H, W) -> (C, H, W)``, batches and K targets likewise.

    Args:
        noise_level: noise standard deviation as a fraction of each sample's value range; 0 gives
            exactly :class:`Saliency` (one pass, all copies would be equal).
        samples: noisy copies per input sample.
        seed: seeds the noise: the noise of copy ``s`` of sample ``b`` depends only on
            ``(seed, s, b)``. None draws the seed from torch's global generator.
        kind: the statistic of the gradients, see above.
        rule, output, dtype, batch_size: as for every pixel method
            (:class:`~camkit.pixel.base.PixelAttribution`); ``batch_size`` counts noisy copies.
    """

    seeded = True

    def __init__(
        self,
        model: nn.Module,
        *,
        noise_level: float = 0.15,
        samples: int = 25,
        kind: Literal["mean", "square", "var"] = "mean",
        **options: Any,
    ):
        super().__init__(model, **options)
        if isinstance(noise_level, bool) or not isinstance(noise_level, Real):
            raise ArgumentError(f"noise_level must be a number, got {type(noise_level).__name__}")
        if not math.isfinite(noise_level) or noise_level < 0:
            raise ArgumentError(f"noise_level must be a finite number >= 0, got {noise_level}")
        if kind not in SMOOTHGRAD_KINDS:
            raise ArgumentError(f"unknown SmoothGrad kind {kind!r}; choose from {SMOOTHGRAD_KINDS}")
        self.noise_level = float(noise_level)
        self.samples = positive_int("samples", samples)
        self.kind = kind

    def forward_rows(self, layer_shape: tuple[int, ...] | None = None) -> int:
        """One noisy copy per sample (one plain copy without noise)."""
        return self.samples if self.noise_level > 0 else 1

    def attribute(self, inputs: Inputs, target: TargetSpec, call: Call) -> Inputs:
        size = inputs[0].shape[0]
        copies = self.samples if self.noise_level > 0 else 1
        flat = [t.reshape(size, -1) for t in inputs]
        sigmas = [self.noise_level * (f.amax(dim=1) - f.amin(dim=1)) for f in flat]
        seeds = self._seeds(size, copies)
        generator = random_generator(inputs[0].device)
        sums, squares = SampleTotals(size), SampleTotals(size)

        def noise(seed: int) -> Inputs:
            """One copy's noise for every input, drawn in order from the copy's seed."""
            generator.manual_seed(seed)
            device = generator.device
            return tuple(
                torch.randn(t.shape[1:], generator=generator, device=device, dtype=t.dtype)
                for t in inputs
            )

        def noisy(rows: Tensor, span: range) -> Inputs:
            sample = rows % size
            copies = map(noise, seeds[span.start : span.stop])
            draws = [torch.stack(parts) for parts in zip(*copies, strict=True)]
            return tuple(
                t[sample] + sigma[sample].view(-1, *[1] * (t.ndim - 1)) * draw.to(t.device)
                for t, sigma, draw in zip(inputs, sigmas, draws, strict=True)
            )

        def accumulate(rows: Tensor, grads: Inputs, scores: Tensor) -> None:
            sums.add(rows % size, *grads)
            if self.kind != "mean":
                squares.add(rows % size, *(grad.square() for grad in grads))

        self.over_copies(inputs, target, call, copies, noisy, accumulate)
        means = tuple(total / copies for total in sums.totals)
        if self.kind == "mean":
            return means
        mean_squares = tuple(total / copies for total in squares.totals)
        if self.kind == "square":
            return mean_squares
        pairs = zip(mean_squares, means, strict=True)
        return tuple((square - mean.square()).clamp(min=0) for square, mean in pairs)

    def _seeds(self, size: int, copies: int) -> list[int]:
        """Seed of each row ``s * B + b`` (copy s of sample b), drawn sample-major so that
        sample b's seeds are the same whatever the batch size."""
        generator = torch.Generator().manual_seed(call_seed(self.seed))
        table = torch.randint(2**62, (size, copies), generator=generator)
        return table.t().flatten().tolist()

    def __repr__(self) -> str:
        return (
            f"SmoothGrad(noise_level={self.noise_level}, samples={self.samples}, "
            f"batch_size={self.batch_size}, seed={self.seed}, kind={self.kind!r}, "
            f"rule={self.rule!r})"
        )


@register("ig", "Sundararajan et al., ICML 2017")
class IntegratedGradients(PixelAttribution):
    """Integrated Gradients: ``(x - x') * mean of the gradients on the path from x' to x``.

    Sundararajan et al., "Axiomatic Attribution for Deep Networks", ICML 2017. The path integral
    is the trapezoid rule on ``steps`` equal intervals: the gradients at ``x' + (k / steps)
    (x - x')``, ``k = 0..steps`` (``steps + 1`` points), weighted ``1/2, 1, ..., 1, 1/2`` over
    ``steps``. Completeness: ``sum(attr) ~ f(x) - f(x')``; ``return_error=True`` also gives the
    gap. ``(C, H, W) -> (C, H, W)``, batches and K targets likewise.

    Args:
        steps: intervals of the path (``steps + 1`` gradient evaluations per sample).
        baseline: ``x'``: None (zeros), a number, a tensor shaped like one sample ``(C, H, W)``
            or like the batch ``(B, C, H, W)`` (or broadcastable to it), or a callable
            ``f(batch) -> baseline``. It must be finite. For a tuple of inputs: a tuple of
            baselines, one per input (None or a number applies to every input; a callable
            gets the tuple).
        rule, output, dtype, batch_size: as for every pixel method
            (:class:`~camkit.pixel.base.PixelAttribution`); ``batch_size`` counts path points.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        steps: int = 50,
        baseline: Baseline = None,
        **options: Any,
    ):
        super().__init__(model, **options)
        self.steps = positive_int("steps", steps)
        self.baseline = baseline

    def _explain(self, call: Call, scorer: RowScorer, *, return_error: bool = False) -> Explanation:
        """Attribution shaped like ``x``; with ``return_error=True`` also the completeness error
        ``|sum(attr) - (f(x) - f(x'))|`` per sample: ``()`` for one image, ``(B,)`` or ``(B, K)``.
        """
        batch = call.batch
        attrs, delta = self.integrate(as_tuple(batch), scorer, call)
        attrs = finished(attrs)
        if not return_error:
            return Explanation.of(as_given(batch, attrs), scorer)
        return Explanation.of((as_given(batch, attrs), (total(attrs) - delta).abs()), scorer)

    def completeness(
        self, x: Tensor, target: TargetSpec = None, *, additional_forward_args: Any = None
    ) -> dict[str, Tensor]:
        """How well the attribution meets the completeness axiom ``sum(attr) = f(x) - f(x')``.

        ``{"delta": f(x) - f(x'), "abs": |sum(attr) - delta|, "relative": abs / |delta|,
        "relative_to_batch": abs / mean |delta|}``, each ``(B,)`` (or ``(B, K)``). The
        per-sample ``relative`` error is meaningless where ``delta`` is close to 0 (it is
        ``inf`` there); ``relative_to_batch`` divides by the batch's mean ``|delta|`` instead,
        the scale at which the error can be judged. docs/reliability.md has the convergence in
        ``steps`` next to captum's rules.
        """
        batch, single = self.checked_input(x)
        inputs = as_tuple(batch)
        call = Call.of(inputs, additional_forward_args)
        scorer = self.target_scorer(target, inputs[0])
        self.check_autograd()
        with model_guarded(self.model):
            attrs, delta = self.integrate(inputs, scorer, call)
        error = (total(attrs) - delta).abs()
        scale = delta.abs().mean()
        report = {
            "delta": delta,
            "abs": error,
            "relative": error / delta.abs(),
            "relative_to_batch": error / scale if scale > 0 else torch.full_like(error, torch.inf),
        }
        return {key: drop_axes(value, single, scorer.several) for key, value in report.items()}

    def forward_rows(self, layer_shape: tuple[int, ...] | None = None) -> int:
        """One copy per point of the path (``steps + 1`` points)."""
        return self.steps + 1

    def attribute(self, inputs: Inputs, target: TargetSpec, call: Call) -> Inputs:
        return self.integrate(inputs, target, call)[0]

    def integrate(self, inputs: Inputs, target: TargetSpec, call: Call) -> tuple[Inputs, Tensor]:
        """``(attr (B, K, C, H, W) per input, f(x) - f(x') (B, K))``."""
        size = inputs[0].shape[0]
        baselines = self.baselines_for(inputs)
        first = inputs[0]
        alphas = torch.linspace(0, 1, self.steps + 1, dtype=first.dtype, device=first.device)
        weights = torch.full_like(alphas, 1 / self.steps)
        weights[[0, -1]] /= 2
        gradient, start, end = SampleTotals(size), SampleTotals(size), SampleTotals(size)

        def path(rows: Tensor, span: range) -> Inputs:
            sample, alpha = rows % size, alphas[rows // size]
            return tuple(
                torch.lerp(b[sample], t[sample], alpha.to(t.dtype).view(-1, *[1] * (t.ndim - 1)))
                for t, b in zip(inputs, baselines, strict=True)
            )

        def accumulate(rows: Tensor, grads: Inputs, scores: Tensor) -> None:
            sample, step = rows % size, rows // size
            weight = weights[step]
            gradient.add(
                sample, *(g * weight.to(g.dtype).view(-1, *[1] * (g.ndim - 1)) for g in grads)
            )
            start.add(sample, scores * (step == 0).unsqueeze(1))
            end.add(sample, scores * (step == self.steps).unsqueeze(1))

        self.over_copies(inputs, target, call, self.steps + 1, path, accumulate)
        parts = zip(inputs, baselines, gradient.totals, strict=True)
        attrs = tuple((t - b).unsqueeze(1) * grad for t, b, grad in parts)
        return attrs, end.totals[0] - start.totals[0]

    def baselines_for(self, inputs: Inputs) -> Inputs:
        """One finite baseline per input, shaped like it (broadcast views).

        A callable gets the batch (the tuple of inputs when there are several); a tuple gives
        one baseline per input; None and numbers apply to every input."""
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
            f"IntegratedGradients(steps={self.steps}, batch_size={self.batch_size}, "
            f"rule={self.rule!r})"
        )


def total(attrs: Inputs) -> Tensor:
    """The sum of every input's attribution per sample and target: ``(B, K)``."""
    return sum(attr.reshape(*attr.shape[:2], -1).sum(dim=2) for attr in attrs)


def baseline_like(baseline: object, batch: Tensor) -> Tensor:
    """``baseline`` (None: zeros, a number or a tensor) as a finite tensor shaped like ``batch``
    (a broadcast view)."""
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

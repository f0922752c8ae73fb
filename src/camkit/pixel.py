"""Pixel-space attributions: gradients of the target score with respect to the input image.

Every method maps an image ``(C, H, W) -> (C, H, W)``, a batch ``(B, C, H, W) -> (B, C, H, W)``,
and ``K`` targets per sample (a ``(B, K)`` target) ``-> (B, K, C, H, W)``: signed float32
attributions on the input's device, with no autograd history. Targets are those of
:mod:`camkit.targets`; :func:`to_heatmap` turns an attribution into a displayable ``(H, W)`` map.

Gradients come from ``torch.autograd.grad`` on a detached copy of the input, so the user's tensor
and the parameters' ``.grad`` are never touched, and the methods work inside ``torch.no_grad()``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from numbers import Real
from typing import ClassVar, Literal

import torch
from torch import Tensor, nn

from camkit.cam.base import drop_axes, finish, layer_gradients
from camkit.cam.methods import GradCAM
from camkit.capture import LayerOutputError, LayerSpec
from camkit.guided import Rule, rectifier_rule
from camkit.inputs import Layout, as_batch
from camkit.targets import (
    OutputSelector,
    Target,
    class_indices,
    class_scores,
    requested_classes,
    select_output,
    target_scores,
)

Baseline = Tensor | float | Callable[[Tensor], Tensor] | None
SMOOTHGRAD_KINDS = ("mean", "square", "var")
HEATMAP_REDUCTIONS = ("abs-max", "sum", "norm")


def _count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be at least 1, got {value}")
    return value


def _batch_size(value: object) -> int | None:
    return None if value is None else _count("batch_size", value)


def _squeeze(t: Tensor, single: bool, several: bool) -> Tensor:
    """:func:`~camkit.cam.base.drop_axes`, as float32."""
    return drop_axes(t, single, several).float()


class PerSample:
    """Per-sample totals of values computed on rows ``r`` that belong to sample ``r % B``."""

    def __init__(self, samples: int):
        self.samples = samples
        self.total: Tensor | None = None

    def add(self, sample: Tensor, values: Tensor) -> None:
        if self.total is None:
            self.total = values.new_zeros((self.samples, *values.shape[1:]))
        self.total.index_add_(0, sample, values)


class PixelAttribution:
    """Base of the pixel methods: checks the input, runs forwards, takes input gradients.

    A method implements :meth:`attribute` ``(B, C, H, W) -> (B, K, C, H, W)``; the plain one is
    the gradient ``d score / d input`` of :meth:`input_gradients`.

    Args:
        model: any ``nn.Module``; it is never modified (no mode switch, no lasting hooks).
        output: picks the logits from a tuple/dict/object output (key, index or callable).
    """

    def __init__(self, model: nn.Module, *, output: OutputSelector = None):
        self.model = model
        self.output = output

    def __call__(self, x: Tensor, target: Target = None) -> Tensor:
        """Attribution for ``target`` shaped like ``x`` (``(B, K, C, H, W)`` for K targets)."""
        batch, single = as_batch(x, self.model)
        attr, several = self.attribute(batch, target)
        return _squeeze(attr, single, several)

    def attribute(self, batch: Tensor, target: Target) -> tuple[Tensor, bool]:
        """``(B, C, H, W) -> ((B, K, C, H, W), several)``: here the plain input gradient."""
        grads, _, several = self.input_gradients(batch, target)
        return grads, several

    def forward(self, inputs: Tensor) -> object:
        """The model's forward pass; the guided methods run it under their ReLU rule."""
        return self.model(inputs)

    def input_gradients(
        self, inputs: Tensor, target: Target, layout: Layout | None = None
    ) -> tuple[Tensor, Tensor, bool]:
        """One forward, one batched backward: ``(grads (B, K, C, H, W), scores (B, K), several)``.

        The gradient is taken with respect to a detached alias of ``inputs`` (the caller's tensor
        is never set to require grad); ``K`` targets are one batched vector-Jacobian product.
        The model gets a copy in the ``layout``'s memory format (channels_last on the CPU), so
        in-place operations on its input stay inside camkit.
        """
        leaf = inputs.detach().requires_grad_(True)

        def scores_in(memory_format: torch.memory_format) -> tuple[Tensor, bool]:
            with torch.enable_grad():
                output = self.forward(leaf.clone(memory_format=memory_format))
                logits = select_output(output, self.output)
                return target_scores(output, logits, target)

        scores, several = (layout or Layout(inputs)).run(scores_in)
        if not scores.requires_grad:
            raise LayerOutputError(
                "the target score does not depend on the input: the model's output is "
                "detached from it (a torch.no_grad() or .detach() inside the model?)"
            )
        (grads,) = layer_gradients(scores, [leaf], ["input"])
        return grads, scores.detach(), several

    def over_copies(
        self,
        batch: Tensor,
        target: Target,
        copies: int,
        make_inputs: Callable[[Tensor, range], Tensor],
        accumulate: Callable[[Tensor, Tensor, Tensor], None],
        batch_size: int | None,
    ) -> bool:
        """Gradients of ``copies`` modified copies of every sample, ``batch_size`` rows at a time.

        Row ``r`` (of ``copies * B``) is copy ``r // B`` of sample ``r % B``.
        ``make_inputs(rows, span)`` builds one chunk's rows (given as a tensor and as a
        ``range``); ``accumulate(rows, grads, scores)`` consumes their results. Class targets
        (``None`` = top-1 included) are fixed on the clean batch, so every copy explains the
        same class; a callable target is applied to each chunk's output. Returns ``several``.
        """
        rows_total = copies * batch.shape[0]
        step = batch_size or rows_total
        per_row, several = self._fixed_target(batch, target)
        layout = Layout(batch)
        for start in range(0, rows_total, step):
            span = range(start, min(start + step, rows_total))
            rows = torch.arange(span.start, span.stop, device=batch.device)
            inputs = make_inputs(rows, span)
            grads, scores, chunk_several = self.input_gradients(inputs, per_row(rows), layout)
            accumulate(rows, grads, scores)
            several = chunk_several if several is None else several
        return bool(several)

    def _fixed_target(
        self, batch: Tensor, target: Target
    ) -> tuple[Callable[[Tensor], Target], bool | None]:
        if callable(target):
            return (lambda rows: target), None
        size = batch.shape[0]
        if target is None:  # the top-1 class of the clean input
            with torch.no_grad():
                output = self.model(batch)
            classes, several = class_indices(None, select_output(output, self.output))
        else:  # no extra forward: the range is checked on the first chunk's logits
            classes, several = requested_classes(target, size, batch.device)

        def per_row(rows: Tensor) -> Callable[[object], Tensor]:
            chosen = classes[rows % size]
            return lambda out: class_scores(select_output(out, self.output), chosen)

        return per_row, several

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class Saliency(PixelAttribution):
    """Saliency: the signed gradient of the target score with respect to the input pixels.

    Simonyan et al., "Deep Inside Convolutional Networks: Visualising Image Classification
    Models and Saliency Maps", ICLR 2014 workshop. ``(C, H, W) -> (C, H, W)`` (batches and K
    targets likewise); the paper's map is ``to_heatmap(attr, "abs-max")``.
    """


class SmoothGrad(PixelAttribution):
    """SmoothGrad: gradients averaged over noisy copies of the input.

    Smilkov et al., "SmoothGrad: removing noise by adding noise", 2017. Each sample gets
    ``samples`` copies ``x + N(0, sigma^2)`` with ``sigma = noise_level * (max(x) - min(x))`` of
    that sample. ``kind`` = ``"mean"`` (SmoothGrad), ``"square"`` (mean of squared gradients,
    SmoothGrad^2) or ``"var"`` (population variance of the gradients, VarGrad).
    ``(C, H, W) -> (C, H, W)``, batches and K targets likewise.

    Args:
        noise_level: noise standard deviation as a fraction of each sample's value range; 0 gives
            exactly :class:`Saliency` (one pass, all copies would be equal).
        samples: noisy copies per input sample.
        batch_size: noisy copies per forward pass (``samples * B`` rows are cut in chunks of this
            many, never holding more at once); None runs them all at once. The result does not
            depend on it.
        seed: seeds the noise: the noise of copy ``s`` of sample ``b`` depends only on
            ``(seed, s, b)``. None draws the seed from torch's global generator.
        kind: the statistic of the gradients, see above.
        output: picks the logits from the model's output.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        noise_level: float = 0.15,
        samples: int = 25,
        batch_size: int | None = None,
        seed: int | None = None,
        kind: Literal["mean", "square", "var"] = "mean",
        output: OutputSelector = None,
    ):
        super().__init__(model, output=output)
        if isinstance(noise_level, bool) or not isinstance(noise_level, Real):
            raise TypeError(f"noise_level must be a number, got {type(noise_level).__name__}")
        if not math.isfinite(noise_level) or noise_level < 0:
            raise ValueError(f"noise_level must be a finite number >= 0, got {noise_level}")
        if kind not in SMOOTHGRAD_KINDS:
            raise ValueError(f"unknown SmoothGrad kind {kind!r}; choose from {SMOOTHGRAD_KINDS}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise TypeError(f"seed must be an int or None, got {type(seed).__name__}")
        self.noise_level = float(noise_level)
        self.samples = _count("samples", samples)
        self.batch_size = _batch_size(batch_size)
        self.seed = seed
        self.kind = kind

    def attribute(self, batch: Tensor, target: Target) -> tuple[Tensor, bool]:
        size = batch.shape[0]
        copies = self.samples if self.noise_level > 0 else 1
        flat = batch.flatten(1)
        sigma = self.noise_level * (flat.amax(dim=1) - flat.amin(dim=1))
        seeds = self._seeds(size, copies)
        generator = _generator(batch.device)
        sums, squares = PerSample(size), PerSample(size)

        def noisy(rows: Tensor, span: range) -> Tensor:
            sample = rows % size
            noise = torch.stack(
                [
                    torch.randn(
                        batch.shape[1:],
                        generator=generator.manual_seed(seed),
                        device=generator.device,
                        dtype=batch.dtype,
                    )
                    for seed in seeds[span.start : span.stop]
                ]
            ).to(batch.device)
            return batch[sample] + sigma[sample].view(-1, 1, 1, 1) * noise

        def accumulate(rows: Tensor, grads: Tensor, scores: Tensor) -> None:
            sums.add(rows % size, grads)
            if self.kind != "mean":
                squares.add(rows % size, grads.square())

        several = self.over_copies(batch, target, copies, noisy, accumulate, self.batch_size)
        mean = sums.total / copies
        if self.kind == "mean":
            return mean, several
        square = squares.total / copies
        if self.kind == "square":
            return square, several
        return (square - mean.square()).clamp(min=0), several

    def _seeds(self, size: int, copies: int) -> list[int]:
        """Seed of each row ``s * B + b`` (copy s of sample b), drawn sample-major so that
        sample b's seeds are the same whatever the batch size."""
        seed = self.seed
        if seed is None:
            seed = int(torch.randint(2**62, ()))
        generator = torch.Generator().manual_seed(seed)
        table = torch.randint(2**62, (size, copies), generator=generator)
        return table.t().flatten().tolist()

    def __repr__(self) -> str:
        return (
            f"SmoothGrad(noise_level={self.noise_level}, samples={self.samples}, "
            f"batch_size={self.batch_size}, seed={self.seed}, kind={self.kind!r})"
        )


def _generator(device: torch.device) -> torch.Generator:
    """A generator on ``device`` where the backend has one, else on the CPU."""
    try:
        return torch.Generator(device=device)
    except RuntimeError:
        return torch.Generator()


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
            ``f(batch) -> baseline``. It must be finite.
        batch_size: path points per forward pass (``(steps + 1) * B`` rows are cut in chunks of
            this many); None runs them all at once. The result does not depend on it.
        output: picks the logits from the model's output.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        steps: int = 50,
        baseline: Baseline = None,
        batch_size: int | None = None,
        output: OutputSelector = None,
    ):
        super().__init__(model, output=output)
        self.steps = _count("steps", steps)
        self.baseline = baseline
        self.batch_size = _batch_size(batch_size)

    def __call__(
        self, x: Tensor, target: Target = None, *, return_error: bool = False
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Attribution shaped like ``x``; with ``return_error=True`` also the completeness error
        ``|sum(attr) - (f(x) - f(x'))|`` per sample: ``()`` for one image, ``(B,)`` or ``(B, K)``.
        """
        batch, single = as_batch(x, self.model)
        attr, error, several = self.integrate(batch, target)
        attr = _squeeze(attr, single, several)
        return (attr, _squeeze(error, single, several)) if return_error else attr

    def attribute(self, batch: Tensor, target: Target) -> tuple[Tensor, bool]:
        attr, _, several = self.integrate(batch, target)
        return attr, several

    def integrate(self, batch: Tensor, target: Target) -> tuple[Tensor, Tensor, bool]:
        """``(attr (B, K, C, H, W), completeness error (B, K), several)``."""
        size = batch.shape[0]
        baseline = self.baseline_for(batch)
        alphas = torch.linspace(0, 1, self.steps + 1, dtype=batch.dtype, device=batch.device)
        weights = torch.full_like(alphas, 1 / self.steps)
        weights[[0, -1]] /= 2
        gradient, start, end = PerSample(size), PerSample(size), PerSample(size)

        def path(rows: Tensor, span: range) -> Tensor:
            sample, alpha = rows % size, alphas[rows // size].view(-1, 1, 1, 1)
            return torch.lerp(baseline[sample], batch[sample], alpha)

        def accumulate(rows: Tensor, grads: Tensor, scores: Tensor) -> None:
            sample, step = rows % size, rows // size
            gradient.add(sample, grads * weights[step].view(-1, *[1] * (grads.ndim - 1)))
            start.add(sample, scores * (step == 0).unsqueeze(1))
            end.add(sample, scores * (step == self.steps).unsqueeze(1))

        several = self.over_copies(batch, target, self.steps + 1, path, accumulate, self.batch_size)
        attr = (batch - baseline).unsqueeze(1) * gradient.total
        error = (attr.flatten(2).sum(dim=2) - (end.total - start.total)).abs()
        return attr, error, several

    def baseline_for(self, batch: Tensor) -> Tensor:
        """The baseline as a finite ``(B, C, H, W)`` tensor (a broadcast view)."""
        baseline = self.baseline
        if baseline is None:
            return torch.zeros_like(batch)
        if callable(baseline):
            baseline = baseline(batch)
        if isinstance(baseline, bool) or not isinstance(baseline, Tensor | Real):
            raise TypeError(
                "baseline must be None, a number, a tensor or a callable returning a tensor, "
                f"got {type(baseline).__name__}"
            )
        baseline = torch.as_tensor(baseline, dtype=batch.dtype, device=batch.device).detach()
        try:
            fits = torch.broadcast_shapes(baseline.shape, batch.shape) == batch.shape
        except RuntimeError:
            fits = False
        if not fits:
            raise ValueError(
                f"the baseline has shape {tuple(baseline.shape)}, expected one sample's shape "
                f"{tuple(batch.shape[1:])} or the batch's {tuple(batch.shape)} "
                "(or a shape that broadcasts to it)"
            )
        if not torch.isfinite(baseline).all():
            raise ValueError("the baseline contains NaN or infinite values")
        return baseline.expand_as(batch)

    def __repr__(self) -> str:
        return f"IntegratedGradients(steps={self.steps}, batch_size={self.batch_size})"


class RectifiedGradients(PixelAttribution):
    """Input gradients with every ReLU's backward replaced by a rule (see :mod:`camkit.guided`).

    Activations other than ReLU, ReLU6, ``hardtanh(0, max)`` and ``threshold(0, 0)`` keep their
    plain gradient; an :class:`~camkit.guided.UnmodifiedActivationWarning` names them (once per
    call), and also warns when the model applies no ReLU at all.
    """

    rule: ClassVar[Rule]

    def forward(self, inputs: Tensor) -> object:
        with rectifier_rule(self.rule) as log:
            output = self.model(inputs)
        log.warn_if_incomplete(type(self).__name__, self.model)
        return output


class GuidedBackprop(RectifiedGradients):
    """Guided backpropagation: a ReLU passes back only positive gradients where its input was
    positive, ``grad_in = grad_out * (x > 0) * (grad_out > 0)``.

    Springenberg et al., "Striving for Simplicity: The All Convolutional Net", ICLR 2015
    workshop. Reaches ``nn.ReLU`` modules (in-place, reused) and functional ReLUs alike; ReLU6
    passes where ``0 < x < 6``. ``(C, H, W) -> (C, H, W)``, batches and K targets likewise.
    """

    rule = "guided"


class Deconvnet(RectifiedGradients):
    """Deconvnet: a ReLU passes back only positive gradients, whatever its input was,
    ``grad_in = grad_out * (grad_out > 0)``.

    Zeiler & Fergus, "Visualizing and Understanding Convolutional Networks", ECCV 2014, as a
    backward rule (Springenberg et al. 2015). ``(C, H, W) -> (C, H, W)``, batches and K targets
    likewise.
    """

    rule = "deconvnet"


class GuidedGradCAM(PixelAttribution):
    """Guided Grad-CAM: guided backpropagation times the upsampled Grad-CAM map.

    Selvaraju et al., "Grad-CAM: Visual Explanations from Deep Networks via Gradient-based
    Localization", ICCV 2017. The Grad-CAM map (ReLU, bilinear upsampling to the input size,
    min-max normalisation, as :class:`camkit.GradCAM` gives it) multiplies every channel of the
    guided backpropagation: ``(C, H, W) -> (C, H, W)``, batches and K targets likewise. Two
    passes: Grad-CAM needs the plain ReLU gradients.

    Args:
        layer: Grad-CAM's layer(s), as for :class:`camkit.GradCAM`.
        reshape: turns the layer's output into ``(B, C, h, w)`` (token models).
    """

    def __init__(
        self,
        model: nn.Module,
        layer: LayerSpec,
        *,
        output: OutputSelector = None,
        reshape: Callable[[Tensor], Tensor] | None = None,
    ):
        super().__init__(model, output=output)
        self.gradcam = GradCAM(model, layer, output=output, reshape=reshape)
        self.guided = GuidedBackprop(model, output=output)

    def attribute(self, batch: Tensor, target: Target) -> tuple[Tensor, bool]:
        guided, several = self.guided.attribute(batch, target)
        maps, _ = self.gradcam.raw_maps(batch, target)
        cam = finish(
            maps,
            tuple(batch.shape[-2:]),
            relu=True,
            upsample=True,
            normalize=True,
            fuse=True,
            single=False,
            several=True,
        )
        return guided * cam.unsqueeze(2).to(guided.dtype), several

    def __repr__(self) -> str:
        return f"GuidedGradCAM(layers={self.gradcam.capture.names})"


def to_heatmap(
    attr: Tensor,
    reduce: Literal["abs-max", "sum", "norm"] = "abs-max",
    *,
    percentile: float = 100.0,
) -> Tensor:
    """Reduce an attribution over its channel axis (-3) to a map for display.

    ``(C, H, W) -> (H, W)``, ``(B, C, H, W) -> (B, H, W)``, ``(B, K, C, H, W) -> (B, K, H, W)``.

    * ``"abs-max"``: ``max_c |attr|`` (Simonyan et al.), in [0, 1];
    * ``"norm"``: the L2 norm over channels, in [0, 1];
    * ``"sum"``: the signed sum over channels, in [-1, 1] (the sign is kept).

    Each map is divided by its largest absolute value (not min-max stretched: 0 stays "no
    attribution" and ratios are kept); an all-zero map stays zero. ``percentile < 100`` divides
    by that percentile of the absolute values instead and clips above it -- gradients are
    spiky, and Smilkov et al. clip at the 99th percentile for display.
    """
    if not isinstance(attr, Tensor) or attr.ndim < 3:
        got = tuple(attr.shape) if isinstance(attr, Tensor) else type(attr).__name__
        raise ValueError(f"expected an attribution (C, H, W) or (B, C, H, W), got {got}")
    if reduce not in HEATMAP_REDUCTIONS:
        raise ValueError(f"unknown reduction {reduce!r}; choose from {HEATMAP_REDUCTIONS}")
    if not 0 < percentile <= 100:
        raise ValueError(f"percentile must be in (0, 100], got {percentile}")
    attr = attr.detach().float()
    if reduce == "abs-max":
        heat = attr.abs().amax(dim=-3)
    elif reduce == "norm":
        heat = torch.linalg.vector_norm(attr, dim=-3)
    else:
        heat = attr.sum(dim=-3)
    magnitude = heat.abs().flatten(-2)
    if percentile == 100:
        scale = magnitude.amax(dim=-1)
    else:
        scale = magnitude.quantile(percentile / 100, dim=-1)
    scale = scale[..., None, None]
    scaled = heat / torch.where(scale > 0, scale, torch.ones_like(scale))
    return scaled.clamp(-1, 1)

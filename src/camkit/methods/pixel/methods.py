"""Pixel-space attributions: gradients of the target score with respect to the input image,
``(C, H, W) -> (C, H, W)`` (see :mod:`camkit.methods.pixel.base`)."""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import Tensor, nn

from camkit.core.call import Call
from camkit.core.inputs import finite_number, positive_int
from camkit.core.seeds import call_seed
from camkit.core.seeds import generator as random_generator
from camkit.errors import ArgumentError
from camkit.methods.pixel.base import Inputs, PixelAttribution, SampleTotals
from camkit.registry import register
from camkit.targets.base import TargetSpec

SMOOTHGRAD_KINDS = ("mean", "square", "var")


@register("saliency", "Simonyan et al., ICLR-W 2014")
class Saliency(PixelAttribution):
    """Saliency: the signed gradient of the target score with respect to the input pixels.

    Simonyan et al., "Deep Inside Convolutional Networks: Visualising Image Classification
    Models and Saliency Maps", ICLR 2014 workshop; the paper's map is ``to_heatmap(attr,
    "abs-max")``.
    """

    def attribute(self, inputs: Inputs, target: TargetSpec, call: Call) -> Inputs:
        grads = SampleTotals(inputs[0].shape[0])
        self.over_copies(inputs, target, call, 1, None, lambda rows, g, _: grads.add(rows, *g))
        return grads.totals


@register("guided", "Springenberg et al., ICLR-W 2015")
class GuidedBackprop(Saliency):
    """Guided backpropagation: a ReLU passes back only positive gradients where its input was
    positive, ``grad_in = grad_out * (x > 0) * (grad_out > 0)``.

    Springenberg et al., "Striving for Simplicity: The All Convolutional Net", ICLR 2015
    workshop. ``nn.ReLU`` modules and functional ReLUs alike; ReLU6 passes where ``0 < x < 6``;
    ``Saliency(model, rule="guided")``.
    """

    default_rule = "guided"


@register("deconvnet", "Zeiler & Fergus, ECCV 2014")
class Deconvnet(Saliency):
    """Deconvnet: a ReLU passes back only positive gradients, whatever its input was,
    ``grad_in = grad_out * (grad_out > 0)``.

    Zeiler & Fergus, "Visualizing and Understanding Convolutional Networks", ECCV 2014, as a
    backward rule (Springenberg et al. 2015). The same as ``Saliency(model, rule="deconvnet")``.
    """

    default_rule = "deconvnet"


@register("smoothgrad", "Smilkov et al., 2017")
class SmoothGrad(PixelAttribution):
    """SmoothGrad: gradients averaged over noisy copies of the input.

    Smilkov et al., "SmoothGrad: removing noise by adding noise", 2017: ``samples`` copies ``x +
    N(0, sigma^2)``, ``sigma = noise_level * (max(x) - min(x))`` per sample and input.

    Args (besides those of :class:`~camkit.methods.pixel.base.PixelAttribution`):
        noise_level: the noise's standard deviation as a fraction of each sample's value range;
            0 gives exactly :class:`Saliency` (one pass).
        samples: noisy copies per input sample.
        seed: seeds the noise of copy ``s`` of sample ``b`` with ``(seed, s, b)`` (None: from
            torch's global generator).
        kind: ``"mean"`` (SmoothGrad), ``"square"`` (mean of squared gradients, SmoothGrad^2)
            or ``"var"`` (population variance of the gradients, VarGrad).
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
        if kind not in SMOOTHGRAD_KINDS:
            raise ArgumentError(f"unknown SmoothGrad kind {kind!r}; choose from {SMOOTHGRAD_KINDS}")
        self.noise_level = finite_number("noise_level", noise_level, minimum=0.0)
        self.samples = positive_int("samples", samples)
        self.kind = kind

    def forward_rows(self, layer_shape: tuple[int, ...] | None = None) -> int:
        return self.samples if self.noise_level > 0 else 1

    def attribute(self, inputs: Inputs, target: TargetSpec, call: Call) -> Inputs:
        size = inputs[0].shape[0]
        copies = self.forward_rows()
        flat = [t.reshape(size, -1) for t in inputs]
        sigmas = [self.noise_level * (f.amax(dim=1) - f.amin(dim=1)) for f in flat]
        # row s * B + b is copy s of sample b; seeds drawn sample-major do not depend on B
        drawn = torch.Generator().manual_seed(call_seed(self.seed))
        seeds = torch.randint(2**62, (size, copies), generator=drawn).t().flatten().tolist()
        generator = random_generator(inputs[0].device)
        sums, squares = SampleTotals(size), SampleTotals(size)

        def noise(seed: int) -> Inputs:  # one copy's noise for every input
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

    def __repr__(self) -> str:
        return (
            f"SmoothGrad(noise_level={self.noise_level}, samples={self.samples}, "
            f"batch_size={self.batch_size}, seed={self.seed}, kind={self.kind!r}, "
            f"composite={self.backward_name()!r})"
        )

"""Guided Grad-CAM: a pixel method made of a CAM and a ReLU rule, so it sits above both families."""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from camkit.cam.base import Reshape
from camkit.cam.gradient import GradCAM
from camkit.core.layers import LayerSpec
from camkit.core.targets import Target
from camkit.pixel.base import PixelAttribution
from camkit.pixel.methods import GuidedBackprop
from camkit.registry import register


@register("guided-gradcam", "Selvaraju et al., ICCV 2017")
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
        output, dtype, batch_size: as for every method.
    """

    needs_layer = True
    default_rule = "guided"

    def __init__(
        self, model: nn.Module, layer: LayerSpec, *, reshape: Reshape | None = None, **options: Any
    ):
        super().__init__(model, **options)
        common = {"output": self.output, "dtype": self.dtype, "batch_size": self.batch_size}
        self.gradcam = GradCAM(model, layer, reshape=reshape, **common)
        self.guided = GuidedBackprop(model, **common)

    def attribute(self, batch: Tensor, target: Target) -> tuple[Tensor, bool]:
        guided, several = self.guided.attribute(batch, target)
        cam, _ = self.gradcam.maps(batch, target)
        return guided * cam.unsqueeze(2).to(guided.dtype), several

    def __repr__(self) -> str:
        return f"GuidedGradCAM(layers={self.gradcam.capture.names})"

"""Guided Grad-CAM: a pixel method made of a CAM and a ReLU rule, so it sits above both families."""

from __future__ import annotations

from typing import Any

from torch import nn

from camkit.core.call import Call
from camkit.core.finish import Finishing
from camkit.core.layers import LayerSpec
from camkit.methods.cam.gradient import GradCAM
from camkit.methods.pixel.base import Inputs, PixelAttribution
from camkit.methods.pixel.methods import GuidedBackprop
from camkit.registry import register
from camkit.targets.base import TargetSpec


@register("guided-gradcam", "Selvaraju et al., ICCV 2017")
class GuidedGradCAM(PixelAttribution):
    """Guided Grad-CAM: guided backpropagation times the upsampled Grad-CAM map.

    Selvaraju et al., "Grad-CAM: Visual Explanations from Deep Networks via Gradient-based
    Localization", ICCV 2017: the finished :class:`camkit.GradCAM` map (``layer`` and
    ``reshape`` are its) multiplies every channel of the guided backpropagation, ``(C, H, W) ->
    (C, H, W)``. Two passes: Grad-CAM needs the plain ReLU gradients.
    """

    needs_layer = True
    several_inputs = False  # Grad-CAM explains one input
    takes_vectors = False  # Grad-CAM explains a layer of an image model
    default_rule = "guided"

    def __init__(self, model: nn.Module, layer: LayerSpec | None = None, **options: Any):
        super().__init__(model, layer=layer, **options)
        common = {"output": self.output, "dtype": self.dtype, "batch_size": self.batch_size}
        self.gradcam = GradCAM(model, layer, reshape=self.reshape, **common)
        # composed, not rewired: the template resolves the Grad-CAM's own capture and layouts
        self.capture, self.layouts = self.gradcam.capture, self.gradcam.layouts
        backward = "gradient" if self.rule_set is None else self.rule_set  # guided by default
        self.guided = GuidedBackprop(model, composite=backward, **common)

    def attribute(self, inputs: Inputs, target: TargetSpec, call: Call) -> Inputs:
        (guided,) = self.guided.attribute(inputs, target, call)
        cam = self.gradcam.maps(inputs[0], target, Finishing(), call)
        return (guided * cam.unsqueeze(2).to(guided.dtype),)

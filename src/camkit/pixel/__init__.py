"""Pixel-space attributions: saliency, SmoothGrad, Integrated Gradients, guided backpropagation
and Deconvnet (``rule=`` on any of them), and :func:`to_heatmap` for display."""

from camkit.pixel.base import PixelAttribution
from camkit.pixel.heatmap import to_heatmap
from camkit.pixel.methods import (
    Deconvnet,
    GuidedBackprop,
    IntegratedGradients,
    Saliency,
    SmoothGrad,
)
from camkit.pixel.rules import UnmodifiedActivationWarning, rectifier_rule

__all__ = [
    "Deconvnet",
    "GuidedBackprop",
    "IntegratedGradients",
    "PixelAttribution",
    "Saliency",
    "SmoothGrad",
    "UnmodifiedActivationWarning",
    "rectifier_rule",
    "to_heatmap",
]

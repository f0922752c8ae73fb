"""Pixel-space attributions: saliency, SmoothGrad, Integrated Gradients, guided backpropagation
and Deconvnet (``rule=`` on any of them, or ``composite=``: any rule set of the one backward, an
LRP composite included), and :func:`to_heatmap` for display."""

from camkit.methods.pixel.base import PixelAttribution
from camkit.methods.pixel.heatmap import to_heatmap
from camkit.methods.pixel.integrated import QUADRATURES, IntegratedGradients, quadrature_rule
from camkit.methods.pixel.methods import Deconvnet, GuidedBackprop, Saliency, SmoothGrad
from camkit.methods.pixel.rules import UnmodifiedActivationWarning, rectifier_rule

__all__ = [
    "QUADRATURES",
    "Deconvnet",
    "GuidedBackprop",
    "IntegratedGradients",
    "PixelAttribution",
    "Saliency",
    "SmoothGrad",
    "UnmodifiedActivationWarning",
    "quadrature_rule",
    "rectifier_rule",
    "to_heatmap",
]

"""camkit: where a PyTorch vision model looks.

``GradCAM(model, "features.28")(img, target=281)`` gives an ``(H, W)`` heatmap in [0, 1].
"""

from camkit import models, viz
from camkit.cam import (
    CAM,
    METHODS,
    EigenCAM,
    GradCAM,
    GradCAMPlusPlus,
    HiResCAM,
    LayerCAM,
    XGradCAM,
    cams,
)
from camkit.capture import LayerNotFoundError, LayerOutputError, find_layer, record
from camkit.perturb import AblationCAM, ScoreCAM
from camkit.pixel import (
    Deconvnet,
    GuidedBackprop,
    GuidedGradCAM,
    IntegratedGradients,
    Saliency,
    SmoothGrad,
    to_heatmap,
)
from camkit.viz import feature_grid, overlay, plot

__version__ = "0.1.0"

__all__ = [
    "AblationCAM",
    "CAM",
    "METHODS",
    "Deconvnet",
    "EigenCAM",
    "GradCAM",
    "GradCAMPlusPlus",
    "GuidedBackprop",
    "GuidedGradCAM",
    "HiResCAM",
    "IntegratedGradients",
    "LayerCAM",
    "LayerNotFoundError",
    "LayerOutputError",
    "Saliency",
    "ScoreCAM",
    "SmoothGrad",
    "XGradCAM",
    "cams",
    "feature_grid",
    "find_layer",
    "models",
    "overlay",
    "plot",
    "record",
    "to_heatmap",
    "viz",
]

"""camkit: where a PyTorch vision model looks.

``GradCAM(model, "features.28")(img, target=281)`` gives an ``(H, W)`` heatmap in [0, 1].
"""

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

__version__ = "0.1.0"

__all__ = [
    "CAM",
    "METHODS",
    "EigenCAM",
    "GradCAM",
    "GradCAMPlusPlus",
    "HiResCAM",
    "LayerCAM",
    "LayerNotFoundError",
    "LayerOutputError",
    "XGradCAM",
    "cams",
    "find_layer",
    "record",
]

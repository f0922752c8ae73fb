"""camkit: where a PyTorch vision model looks.

``GradCAM(model, "features.28")(img, target=281)`` gives an ``(H, W)`` heatmap in [0, 1].

Layout: :mod:`camkit.core` (the engine: layers and hooks, targets, the tapped forward, finishing),
:mod:`camkit.registry` (which methods exist), :mod:`camkit.cam` and :mod:`camkit.pixel` (the
methods), :mod:`camkit.models`, :mod:`camkit.viz`, :mod:`camkit.cli`; errors in
:mod:`camkit.errors`.
"""

from camkit import errors, metrics, models, registry, targets, viz
from camkit.attention import AttentionRollout, LeGrad
from camkit.cam import (
    CAM,
    FEM,
    ISCAM,
    KPCACAM,
    SESS,
    SSCAM,
    AblationCAM,
    BaseCAM,
    DeepFeatureFactorization,
    EigenCAM,
    EigenGradCAM,
    FinerCAM,
    FullGrad,
    GradCAM,
    GradCAMElementWise,
    GradCAMPlusPlus,
    HiResCAM,
    LayerCAM,
    RandomCAM,
    ReciproCAM,
    RefineCAM,
    ScoreCAM,
    ShapleyCAM,
    SmoothGradCAMPlusPlus,
    XGradCAM,
    cams,
)
from camkit.core.inputs import InputLayout, KeywordInput
from camkit.core.layers import find_layer
from camkit.core.record import record
from camkit.errors import CamkitError, LayerNotFoundError, LayerOutputError, TargetError
from camkit.guided_gradcam import GuidedGradCAM
from camkit.pixel import (
    Deconvnet,
    GuidedBackprop,
    IntegratedGradients,
    Saliency,
    SmoothGrad,
    to_heatmap,
)
from camkit.registry import METHODS
from camkit.viz import feature_grid, overlay, plot

__version__ = "0.2.0"

__all__ = [
    "CAM",
    "FEM",
    "KPCACAM",
    "METHODS",
    "AblationCAM",
    "AttentionRollout",
    "BaseCAM",
    "CamkitError",
    "Deconvnet",
    "DeepFeatureFactorization",
    "EigenCAM",
    "EigenGradCAM",
    "FinerCAM",
    "FullGrad",
    "GradCAM",
    "GradCAMElementWise",
    "GradCAMPlusPlus",
    "GuidedBackprop",
    "GuidedGradCAM",
    "HiResCAM",
    "InputLayout",
    "IntegratedGradients",
    "KeywordInput",
    "LayerCAM",
    "LeGrad",
    "LayerNotFoundError",
    "LayerOutputError",
    "RandomCAM",
    "ISCAM",
    "SSCAM",
    "ReciproCAM",
    "RefineCAM",
    "SESS",
    "Saliency",
    "ScoreCAM",
    "ShapleyCAM",
    "SmoothGrad",
    "SmoothGradCAMPlusPlus",
    "TargetError",
    "XGradCAM",
    "cams",
    "errors",
    "feature_grid",
    "find_layer",
    "metrics",
    "models",
    "overlay",
    "plot",
    "record",
    "registry",
    "targets",
    "to_heatmap",
    "viz",
]

"""camkit: where a PyTorch vision model looks.

``GradCAM(model, "features.28")(img, target=281)`` gives an ``(H, W)`` heatmap in [0, 1]. Every
method is a :class:`~camkit.core.explainer.Explainer`; :mod:`camkit.registry` lists them.
"""

from typing import TYPE_CHECKING, Any

from camkit import errors, models, registry, targets, viz
from camkit.core.explainer import Explainer, Explanation
from camkit.core.layers import find_layer
from camkit.core.record import record
from camkit.core.wrappers import ImageInput, ImageTower, InputLayout, KeywordInput, VideoPrompts
from camkit.errors import CamkitError, LayerNotFoundError, LayerOutputError, TargetError
from camkit.methods.attention import AttentionRollout, LeGrad
from camkit.methods.cam import *  # noqa: F403  (every CAM class, cams)
from camkit.methods.cam import __all__ as _cam_names
from camkit.methods.guided_gradcam import GuidedGradCAM
from camkit.methods.pixel import (
    Deconvnet,
    GuidedBackprop,
    IntegratedGradients,
    Saliency,
    SmoothGrad,
    to_heatmap,
)
from camkit.methods.pixel.lrp import LRP
from camkit.registry import METHODS
from camkit.targets import ClassTarget, Target
from camkit.viz import feature_grid, overlay, plot

if TYPE_CHECKING:
    import torch

    from camkit.serve.notebook import Exploration

__version__ = "0.2.0"

from camkit import metrics  # noqa: E402  (imported last: it imports the methods)


def explore(
    model: "torch.nn.Module | models.LoadedModel | str", images_or_run: object, **options: Any
) -> "Exploration":
    """:func:`camkit.serve.notebook.explore`: the live explorer inside a notebook (needs the
    ``serve`` extra; imported on first use, so ``import camkit`` stays light)."""
    from camkit.serve.notebook import explore as start

    return start(model, images_or_run, **options)


__all__ = [
    *_cam_names,
    "METHODS",
    "AttentionRollout",
    "CamkitError",
    "ClassTarget",
    "Deconvnet",
    "Explainer",
    "Explanation",
    "GuidedBackprop",
    "GuidedGradCAM",
    "InputLayout",
    "IntegratedGradients",
    "ImageInput",
    "ImageTower",
    "KeywordInput",
    "LayerNotFoundError",
    "LRP",
    "LayerOutputError",
    "LeGrad",
    "Saliency",
    "SmoothGrad",
    "Target",
    "TargetError",
    "VideoPrompts",
    "errors",
    "explore",
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

"""Class activation maps: the gradient CAMs, the perturbation CAMs, and :func:`cams` for several
methods in one call; also CAM (the classifier's weights), FullGrad, RefineCAM, SESS and Deep Feature
Factorization (concepts, not a map method)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from camkit import registry
from camkit.core.call import Call
from camkit.core.engine import require_autograd
from camkit.core.explainer import Explanation
from camkit.core.finish import Finishing
from camkit.core.inputs import as_batch
from camkit.core.layers import LayerSpec
from camkit.core.state import model_guarded
from camkit.errors import UnknownMethodError
from camkit.methods.cam.base import BaseCAM, Reshape, one_pass_maps
from camkit.methods.cam.classifier import CAM, find_classifier
from camkit.methods.cam.dff import DeepFeatureFactorization
from camkit.methods.cam.eigen import KPCACAM, EigenGradCAM, SegEigenCAM
from camkit.methods.cam.fullgrad import FullGrad
from camkit.methods.cam.gradient import (
    FEM,
    EigenCAM,
    GradCAM,
    GradCAMElementWise,
    GradCAMPlusPlus,
    HiResCAM,
    LayerCAM,
    XGradCAM,
)
from camkit.methods.cam.objectives import FinerCAM, ShapleyCAM
from camkit.methods.cam.perturbation import AblationCAM, PerturbationCAM, ScoreCAM
from camkit.methods.cam.refine import RefineCAM
from camkit.methods.cam.score_variants import ISCAM, SSCAM, ReciproCAM
from camkit.methods.cam.sess import SESS
from camkit.methods.cam.stochastic import RandomCAM, SmoothGradCAMPlusPlus
from camkit.targets.base import TargetSpec
from camkit.targets.outputs import OutputSelector
from camkit.targets.resolver import resolve


def cams(
    model: nn.Module,
    layer: LayerSpec | None,
    x: Tensor,
    target: TargetSpec = None,
    methods: Sequence[str] = ("gradcam", "gradcam++", "xgradcam", "layercam", "hirescam"),
    *,
    output: OutputSelector = None,
    reshape: Reshape | str | None = "auto",
    dtype: torch.dtype | None = None,
    batch_size: int | None = None,
    relu: bool = True,
    upsample: bool = True,
    normalize: bool = True,
    fuse: bool | str = True,
    additional_forward_args: Any = None,
) -> dict[str, Tensor | dict[str, Tensor]]:
    """Several CAM methods on the same input: ``{method name: map}``, each what its class
    returns; the gradient CAMs that only weigh a layer (``registry.get(name).shares_pass``)
    share one forward and one backward pass."""
    entries = [registry.get(name) for name in dict.fromkeys(methods)]
    not_cams = [entry.name for entry in entries if not issubclass(entry.cls, BaseCAM)]
    if not_cams or not entries:
        choices = [name for name, m in registry.METHODS.items() if issubclass(m.cls, BaseCAM)]
        raise UnknownMethodError(
            f"cams() takes CAM methods, got {not_cams or 'none'}; choose from {choices}"
        )
    options = {"output": output, "reshape": reshape, "dtype": dtype}
    if batch_size is not None:  # else each method's own default
        options["batch_size"] = batch_size
    explainers = {entry.name: entry.build(model, layer, **options) for entry in entries}
    finishing = {"relu": relu, "upsample": upsample, "normalize": normalize, "fuse": fuse}
    shared = {name: cam for name, cam in explainers.items() if registry.get(name).shares_pass}
    args, results = additional_forward_args, {}
    if shared:  # one tapped pass for all: the first method's capture
        first = next(iter(shared.values()))
        batch, single = as_batch(x, model)
        call = Call.of(batch, args)
        if any(cam.needs_gradients for cam in shared.values()):
            require_autograd("cams")
        with model_guarded(first.model):
            first.capture.resolve(batch, call)
            scorer = resolve(target, batch.shape[0], batch.device, first.output)
            raw = one_pass_maps(shared, batch, scorer, call, batch_size)
        size, finish = tuple(batch.shape[2:]), Finishing(**finishing)
        for name, maps in raw.items():
            results[name] = Explanation.of(finish(maps, size), scorer, single=single).shaped()
    for name, explainer in explainers.items():
        if name not in shared:  # its own passes, through the one entry
            results[name] = explainer(x, target, additional_forward_args=args, **finishing)
    return {name: results[name] for name in explainers}


__all__ = [
    "CAM",
    "FEM",
    "KPCACAM",
    "AblationCAM",
    "BaseCAM",
    "DeepFeatureFactorization",
    "EigenCAM",
    "EigenGradCAM",
    "FinerCAM",
    "FullGrad",
    "GradCAM",
    "GradCAMElementWise",
    "GradCAMPlusPlus",
    "HiResCAM",
    "LayerCAM",
    "PerturbationCAM",
    "RandomCAM",
    "RefineCAM",
    "SESS",
    "ISCAM",
    "SSCAM",
    "ReciproCAM",
    "ScoreCAM",
    "SegEigenCAM",
    "ShapleyCAM",
    "SmoothGradCAMPlusPlus",
    "XGradCAM",
    "cams",
    "find_classifier",
]

"""Class activation maps: the Grad-CAM family, and :func:`cams` for several methods in one pass."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from camkit.cam.base import CAM, Reshape, finish
from camkit.cam.methods import EigenCAM, GradCAM, GradCAMPlusPlus, HiResCAM, LayerCAM, XGradCAM
from camkit.capture import LayerSpec
from camkit.inputs import as_batch
from camkit.targets import OutputSelector, Target

METHODS: dict[str, type[CAM]] = {
    cls.name: cls for cls in (GradCAM, GradCAMPlusPlus, XGradCAM, HiResCAM, LayerCAM, EigenCAM)
}


def cams(
    model: nn.Module,
    layer: LayerSpec,
    x: Tensor,
    target: Target = None,
    methods: Sequence[str] = ("gradcam", "gradcam++", "xgradcam", "layercam", "hirescam"),
    *,
    output: OutputSelector = None,
    reshape: Reshape | None = None,
    dtype: torch.dtype | None = None,
    relu: bool = True,
    upsample: bool = True,
    normalize: bool = True,
    fuse: bool = True,
) -> dict[str, Tensor | dict[str, Tensor]]:
    """Several CAM methods from ONE forward and ONE backward pass: ``{method name: map}``.

    Each entry equals what the single-method class returns for the same arguments; names are
    those of :data:`METHODS` (``"gradcam"``, ``"gradcam++"``, ``"xgradcam"``, ``"hirescam"``,
    ``"layercam"``, ``"eigencam"``).
    """
    unknown = [name for name in methods if name not in METHODS]
    if unknown or not methods:
        raise ValueError(f"unknown CAM method(s) {unknown}; choose from {sorted(METHODS)}")
    explainers = {
        name: METHODS[name](model, layer, output=output, reshape=reshape, dtype=dtype)
        for name in dict.fromkeys(methods)
    }
    batch, single = as_batch(x, model)
    capture = next(iter(explainers.values())).capture
    gradients = any(explainer.needs_gradients for explainer in explainers.values())
    acts, grads, several = capture.run(batch, target, gradients=gradients, dtype=dtype)
    return {
        name: finish(
            explainer.maps_from(acts, grads),
            tuple(batch.shape[-2:]),
            relu=relu,
            upsample=upsample,
            normalize=normalize,
            fuse=fuse,
            single=single,
            several=several and explainer.needs_gradients,
        )
        for name, explainer in explainers.items()
    }


__all__ = [
    "CAM",
    "METHODS",
    "EigenCAM",
    "GradCAM",
    "GradCAMPlusPlus",
    "HiResCAM",
    "LayerCAM",
    "XGradCAM",
    "cams",
]

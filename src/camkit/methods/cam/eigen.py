"""The CAMs built on principal components, beside Eigen-CAM: Eigen-Grad-CAM, Seg-Eigen-CAM and
KPCA-CAM; each is a principal component already, so ``eigen_smooth`` changes nothing (as in
pytorch-grad-cam). Notation as in :mod:`camkit.methods.cam.gradient`.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import Tensor, nn

from camkit.core.inputs import finite_number, positive_int
from camkit.core.layers import LayerSpec
from camkit.errors import ArgumentError
from camkit.methods.cam.base import BaseCAM
from camkit.methods.cam.gradient import EigenCAM
from camkit.methods.cam.smoothing import principal_component
from camkit.registry import register

KPCA_KERNELS = ("linear", "poly", "rbf", "sigmoid", "cosine")


@register("eigengradcam", "Muhammad & Yeasin, IJCNN 2020 (on g·A)")
class EigenGradCAM(EigenCAM):
    """Eigen-Grad-CAM: the first principal component of ``g * A`` (pytorch-grad-cam).

    Eigen-CAM of Muhammad & Yeasin (IJCNN 2020) on the element-wise product of gradients and
    activations, as pytorch-grad-cam's ``EigenGradCAM``; the sign correlates positively with
    ``sum_c g_c A_c``. One map per target.
    """

    needs_gradients = True
    target_free = False

    def layer_map(self, act: Tensor, grad: Tensor | None) -> Tensor:
        return super().layer_map(grad * act, None)


@register("segeigencam", "Chung & Ying, Appl. Sci. 2025")
class SegEigenCAM(BaseCAM):
    """Seg-Eigen-CAM: the first principal component of ``|g| * A``, its sign set by its peak.

    Chung & Ying, "Seg-Eigen-CAM: Eigen-Value-Based Visual Explanations for Semantic
    Segmentation Models", Applied Sciences 15(13), 7562, 2025 (pytorch-grad-cam's
    ``SegEigenCAM``): the first principal component (eq. 11-12) of ``|g_c| * A_c`` (eq. 10),
    negated where ``|min| > |max|`` so that the stronger extreme is positive (eq. 13). One map
    per target.
    """

    def weighted_activations(self, act: Tensor, grad: Tensor | None) -> Tensor:
        return grad.abs() * act

    def layer_map(self, act: Tensor, grad: Tensor | None) -> Tensor:
        projection = principal_component(self.weighted_activations(act, grad))
        values = projection.flatten(2)
        below = values.amin(dim=-1).abs() > values.amax(dim=-1).abs()  # (B, K)
        below = below.view(*below.shape, *[1] * (projection.ndim - 2))
        return torch.where(below, -projection, projection)


@register("kpcacam", "Karmani et al., IEEE MMSP 2024")
class KPCACAM(BaseCAM):
    """KPCA-CAM: the activations projected on their first kernel principal component.

    Karmani et al., "KPCA-CAM: Visual Explainability of Deep Computer Vision Models using Kernel
    PCA", IEEE MMSP 2024 (pytorch-grad-cam's ``KPCA_CAM``): the first eigenvector (times the
    root of its eigenvalue, signed as :class:`~camkit.EigenCAM`) of the centred kernel matrix of
    the ``hw`` positions (centred per channel). ``kernel`` as scikit-learn's: ``sigmoid``
    ``tanh(gamma <x, y> + coef0)`` (default), ``rbf`` ``exp(-gamma |x - y|^2)``, ``poly``
    ``(gamma <x, y> + coef0)^degree``, ``linear``, ``cosine``; ``gamma=None`` is ``1 / C``.
    """

    needs_gradients = False
    target_free = True

    def __init__(
        self,
        model: nn.Module,
        layer: LayerSpec | None = None,
        *,
        kernel: Literal["linear", "poly", "rbf", "sigmoid", "cosine"] = "sigmoid",
        gamma: float | None = None,
        degree: int = 3,
        coef0: float = 1.0,
        **options: Any,
    ):
        super().__init__(model, layer, **options)
        if kernel not in KPCA_KERNELS:
            raise ArgumentError(f"unknown kernel {kernel!r}; choose from {KPCA_KERNELS}")
        self.kernel = kernel
        self.gamma = None if gamma is None else finite_number("gamma", gamma, minimum=0.0)
        self.degree = positive_int("degree", degree)
        self.coef0 = finite_number("coef0", coef0)

    def kernel_matrix(self, x: Tensor) -> Tensor:
        """``(..., n, C) -> (..., n, n)``: the kernel between the rows of ``x``."""
        gamma = 1.0 / x.shape[-1] if self.gamma is None else self.gamma
        dot = x @ x.transpose(-1, -2)
        if self.kernel == "linear":
            return dot
        if self.kernel == "poly":
            return (gamma * dot + self.coef0) ** self.degree
        if self.kernel == "sigmoid":
            return torch.tanh(gamma * dot + self.coef0)
        if self.kernel == "rbf":
            return torch.exp(-gamma * torch.cdist(x, x).square())
        unit = x / x.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        return unit @ unit.transpose(-1, -2)

    def layer_map(self, act: Tensor, grad: Tensor | None) -> Tensor:
        grid = act.shape[3:]
        positions = act.double().flatten(3).transpose(-1, -2)  # (..., hw, C)
        centred = positions - positions.mean(dim=-2, keepdim=True)
        kernel = self.kernel_matrix(centred)
        rows, columns = kernel.mean(dim=-2, keepdim=True), kernel.mean(dim=-1, keepdim=True)
        kernel = kernel - rows - columns + kernel.mean(dim=(-2, -1), keepdim=True)
        values, vectors = torch.linalg.eigh(kernel)  # ascending
        projection = vectors[..., -1] * values[..., -1:].clamp_min(0).sqrt()  # (..., hw)
        agreement = (projection * positions.mean(dim=-1)).sum(dim=-1, keepdim=True)
        projection = torch.where(agreement < 0, -projection, projection)
        return projection.unflatten(-1, grid).float()


__all__ = ["KPCA_KERNELS", "KPCACAM", "EigenGradCAM", "SegEigenCAM"]

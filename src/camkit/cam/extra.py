"""More CAM methods on :class:`~camkit.cam.base.BaseCAM`: each says how it weighs a layer.

Notation as in :mod:`camkit.cam.gradient`: ``A`` is the layer's activation ``(B, 1, C, h, w)``,
``g = dS/dA`` the gradients ``(B, K, C, h, w)`` of the ``K`` target scores per sample; a method
returns channel weights broadcastable to ``g`` or a map ``(B, K, h, w)``; the base class does
the capture, the ReLU, the bilinear upsampling and the min-max normalisation.

:class:`ShapleyCAM` and :class:`FinerCAM` override ``raw_maps`` (their own passes or target), so
:func:`camkit.cams` runs them apart (the registry reads it from the class). Methods that do not
depend on the target (:class:`KPCACAM`, :class:`FEM`) give the same map for every target
(repeated along the target axis), as :class:`~camkit.EigenCAM` does.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal

import torch
from torch import Tensor, nn

from camkit.cam.base import BaseCAM, WrapperCAM, spatial
from camkit.cam.gradient import EigenCAM, GradCAM
from camkit.cam.smoothing import principal_component
from camkit.core.attention import unfused_attention
from camkit.core.call import Call
from camkit.core.engine import over_rows
from camkit.core.inputs import finite_number, positive_int
from camkit.core.layers import LayerSpec, single_call
from camkit.core.outputs import select_output
from camkit.core.targets import RowScorer, resolve
from camkit.errors import ArgumentError, LayerOutputError, TargetError
from camkit.registry import register

KPCA_KERNELS = ("linear", "poly", "rbf", "sigmoid", "cosine")


@register("eigengradcam", "Muhammad & Yeasin, IJCNN 2020 (on g·A)")
class EigenGradCAM(EigenCAM):
    """Eigen-Grad-CAM: the first principal component of ``g * A`` (pytorch-grad-cam).

    Eigen-CAM of Muhammad & Yeasin (IJCNN 2020) applied to the element-wise product of gradients
    and activations, as in pytorch-grad-cam's ``EigenGradCAM``: the ``(hw, C)`` matrix of
    ``g * A`` is centred per channel and projected on its first right singular vector, whose
    sign is fixed to correlate positively with ``sum_c g_c A_c``. One map per target; a
    principal component already, so ``eigen_smooth`` changes nothing (as in pytorch-grad-cam).
    """

    needs_gradients = True
    target_free = False

    def layer_map(self, act: Tensor, grad: Tensor | None) -> Tensor:
        return super().layer_map(grad * act, None)


@register("gradcam-elementwise", "Draelos & Carin, 2020 (element-wise)")
class GradCAMElementWise(BaseCAM):
    """Grad-CAM element-wise: ``sum_c ReLU(g_c * A_c)`` (pytorch-grad-cam's ``GradCAMElementWise``).

    The ReLU is applied to each product before the channel sum, so negative evidence of one
    channel cannot cancel positive evidence of another (a variant of HiResCAM, Draelos & Carin
    2020). ``(B, 1, C, h, w), (B, K, C, h, w) -> (B, K, h, w)``.
    """

    def weighted_activations(self, act: Tensor, grad: Tensor | None) -> Tensor:
        return (grad * act).relu()


@register("segeigencam", "Chung & Ying, Appl. Sci. 2025")
class SegEigenCAM(BaseCAM):
    """Seg-Eigen-CAM: the first principal component of ``|g| * A``, its sign set by its peak.

    Chung & Ying, "Seg-Eigen-CAM: Eigen-Value-Based Visual Explanations for Semantic
    Segmentation Models", Applied Sciences 15(13), 7562, 2025 (pytorch-grad-cam's
    ``SegEigenCAM``). Gradient weighting (eq. 10): the element-wise ``|g_c| * A_c``; the
    ``(hw, C)`` matrix of it is centred per channel and projected on its first right singular
    vector (eq. 11-12); sign correction (eq. 13): the projection is negated where
    ``|min| > |max|``, so the stronger extreme is positive. One map per target; a principal
    component already, so ``eigen_smooth`` changes nothing (as in pytorch-grad-cam).
    ``(B, 1, C, h, w), (B, K, C, h, w) -> (B, K, h, w)``.
    """

    def weighted_activations(self, act: Tensor, grad: Tensor | None) -> Tensor:
        return grad.abs() * act

    def layer_map(self, act: Tensor, grad: Tensor | None) -> Tensor:
        projection = principal_component(self.weighted_activations(act, grad))
        values = projection.flatten(2)
        below = values.amin(dim=-1).abs() > values.amax(dim=-1).abs()  # (B, K)
        return torch.where(
            below.view(*below.shape, *[1] * (projection.ndim - 2)), -projection, projection
        )


@register("kpcacam", "Karmani et al., IEEE MMSP 2024")
class KPCACAM(BaseCAM):
    """KPCA-CAM: the activations projected on their first kernel principal component.

    Karmani et al., "KPCA-CAM: Visual Explainability of Deep Computer Vision Models using Kernel
    PCA", IEEE MMSP 2024 (pytorch-grad-cam's ``KPCA_CAM``). The ``hw`` positions (rows of the
    ``(hw, C)`` activation matrix, centred per channel) give a kernel matrix ``K (hw, hw)``,
    centred in feature space (``K - 1K - K1 + 1K1``); the map is the first eigenvector scaled by
    the square root of its eigenvalue (the projection of each position), its sign fixed to
    correlate positively with the channel-mean activation, as :class:`~camkit.EigenCAM`.
    Kernels as scikit-learn's: ``sigmoid`` ``tanh(gamma <x, y> + coef0)`` (default), ``rbf``
    ``exp(-gamma |x - y|^2)``, ``poly`` ``(gamma <x, y> + coef0)^degree``, ``linear``, ``cosine``;
    ``gamma=None`` is ``1 / C``. No gradients; the same map for every target; a (kernel)
    principal component already, so ``eigen_smooth`` changes nothing (as in pytorch-grad-cam).

    Args (besides those of :class:`~camkit.cam.base.BaseCAM`): ``kernel``, ``gamma``,
    ``degree``, ``coef0`` as above.
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
        kernel = (
            kernel
            - kernel.mean(dim=-2, keepdim=True)
            - kernel.mean(dim=-1, keepdim=True)
            + kernel.mean(dim=(-2, -1), keepdim=True)
        )
        values, vectors = torch.linalg.eigh(kernel)  # ascending
        projection = vectors[..., -1] * values[..., -1:].clamp_min(0).sqrt()  # (..., hw)
        agreement = (projection * positions.mean(dim=-1)).sum(dim=-1, keepdim=True)
        projection = torch.where(agreement < 0, -projection, projection)
        return projection.unflatten(-1, grid).float()


@register("fem", "Ahmed Fuad et al., IPTA 2020")
class FEM(BaseCAM):
    """FEM, the feature explanation method: channels weighted by their share of strong positions.

    Ahmed Fuad et al., "Features understanding in 3D CNNs for actions recognition in video",
    IPTA 2020 (pytorch-grad-cam's ``FEM``). With the per-channel mean ``mu_c`` and population
    standard deviation ``sigma_c`` over the positions, ``w_c = mean_ij [A_cij > mu_c +
    k sigma_c]`` (the k-sigma rule, ``k=2``), map ``= sum_c w_c A_c``. No gradients; the same
    map for every target. ``eigen_smooth`` projects ``w_c A_c`` as for every weighted sum
    (pytorch-grad-cam's ``FEM`` ignores the option).
    """

    needs_gradients = False
    target_free = True

    def __init__(
        self, model: nn.Module, layer: LayerSpec | None = None, *, k: float = 2.0, **options: Any
    ):
        super().__init__(model, layer, **options)
        self.k = finite_number("k", k)

    def channel_weights(self, act: Tensor, grad: Tensor | None) -> Tensor:
        dims = spatial(act)
        mean = act.mean(dim=dims, keepdim=True)
        std = act.std(dim=dims, keepdim=True, correction=0)
        return (act > mean + self.k * std).float().mean(dim=dims, keepdim=True)


@register("shapleycam", "Cai, 2025")
class ShapleyCAM(BaseCAM):
    """Shapley-CAM: Grad-CAM with the gradient corrected by the Hessian-vector product.

    Cai, "CAMs as Shapley Value-based Explainers", 2025 (arXiv:2501.06261; pytorch-grad-cam's
    ``ShapleyCAM``). A second-order approximation of the Shapley values of the channels gives
    ``w_c = mean_ij (g - H A / 2)_cij`` with ``H = d^2 S / dA^2``, map ``= sum_c w_c A_c``. ``H A``
    is one double-backward per target (0 where the score is piecewise linear in ``A``, e.g. a
    logit after ReLU layers: then Shapley-CAM equals Grad-CAM; the paper pairs it with the
    ``logit - cross-entropy`` target, pass that as a callable target).
    ``(B, 1, C, h, w) -> (B, K, h, w)``.
    """

    def raw_maps(
        self, batch: Tensor, scorer: RowScorer, call: Call
    ) -> tuple[dict[str, Tensor], bool]:
        return over_rows(
            batch, self.batch_size, lambda part, rows: self._pass(part, call, scorer, rows)
        )

    def _pass(
        self, part: Tensor, call: Call, scorer: RowScorer, rows: Tensor
    ) -> tuple[dict[str, Tensor], bool]:
        names = self.capture.names
        with unfused_attention(self.model):  # fused attention kernels have no double backward
            return self._second_order(part, call, scorer, rows, names)

    def _second_order(
        self, part: Tensor, call: Call, scorer: RowScorer, rows: Tensor, names: list[str]
    ) -> tuple[dict[str, Tensor], bool]:
        output, taps = self.capture.forward(
            part, call, start_graph=True, dtype=self.dtype, rows=rows
        )
        acts = single_call(taps)
        with torch.enable_grad():
            scores, several = scorer(output, rows)
            if not scores.requires_grad:
                raise LayerOutputError(f"the target score does not depend on layer(s) {names}")
            corrected: list[list[Tensor]] = [[] for _ in acts]
            for k in range(scores.shape[1]):
                grads = torch.autograd.grad(
                    scores[:, k].sum(), acts, create_graph=True, allow_unused=True
                )
                for i, (act, grad) in enumerate(zip(acts, grads, strict=True)):
                    if grad is None:
                        raise LayerOutputError(
                            f"the target score does not depend on layer {names[i]!r}"
                        )
                    hvp = None
                    if grad.requires_grad:
                        (hvp,) = torch.autograd.grad(
                            grad, act, grad_outputs=act.detach(), retain_graph=True,
                            allow_unused=True,
                        )  # fmt: skip
                    hvp = torch.zeros_like(grad) if hvp is None else hvp
                    corrected[i].append((grad - 0.5 * hvp).detach())
        grads = [torch.stack(per_target, dim=1) for per_target in corrected]
        acts = [act.detach().unsqueeze(1) for act in acts]
        return self.maps_from(acts, grads, scores.shape[1], tuple(part.shape[2:])), several

    def channel_weights(self, act: Tensor, grad: Tensor) -> Tensor:
        return grad.mean(dim=spatial(grad), keepdim=True)


@register("finercam", "Zhang et al., CVPR 2025")
class FinerCAM(WrapperCAM):
    """Finer-CAM: the map of the target's score relative to the most similar classes.

    Zhang et al., "Finer-CAM: Spotting the Difference Reveals Finer Details for Visual
    Explanation", CVPR 2025. A gradient CAM (``base``, Grad-CAM by default) explains, instead of
    the logit ``y_c``, the contrast with the ``references`` classes ``d_t`` whose logits are
    closest to ``y_c`` (the target excluded):

    * ``weighting="mean"`` (torchcam's ``FinerCAM``): ``y_c - gamma * mean_t y_{d_t}``;
    * ``weighting="softmax"`` (pytorch-grad-cam's ``FinerCAM``, the authors' weighted target):
      ``sum_t p_t (y_c - gamma y_{d_t}) / sum_t p_t`` with the softmax probabilities ``p``
      (differentiated too, as there).

    Class targets only (``None`` = top-1, ``(B, K)`` for K classes per sample); ``gamma=0``
    gives the base method's map. ``(C, H, W) -> (H, W)`` as every CAM.

    Args (besides those of :class:`~camkit.cam.base.BaseCAM`, also given to ``base``):
        base: a gradient CAM class; gamma: the weight of the references (>= 0);
        references: how many closest classes; weighting: ``"mean"`` or ``"softmax"``.
    """

    def __init__(
        self,
        model: nn.Module,
        layer: LayerSpec | None = None,
        *,
        base: type[BaseCAM] = GradCAM,
        gamma: float = 0.6,
        references: int = 3,
        weighting: Literal["mean", "softmax"] = "mean",
        **options: Any,
    ):
        super().__init__(model, layer, **options)
        if not (isinstance(base, type) and issubclass(base, BaseCAM)) or not base.needs_gradients:
            raise ArgumentError(f"base must be a gradient CAM class such as GradCAM, got {base!r}")
        if weighting not in ("mean", "softmax"):
            raise ArgumentError(f"weighting must be 'mean' or 'softmax', got {weighting!r}")
        self.wrap(base, model, layer, options)
        self.gamma = finite_number("gamma", gamma, minimum=0.0)
        self.references = positive_int("references", references)
        self.weighting = weighting

    def objective(self, scorer: RowScorer, rows: Tensor) -> Callable[[Any], Tensor]:
        """The contrastive score of samples ``rows`` as a callable target: ``output -> (n,)`` or
        ``(n, K)``."""

        def contrast(output: Any) -> Tensor:
            logits = select_output(output, self.output)
            classes, several = scorer.classes_of(output, rows)
            classes = classes.to(logits.device)
            count = min(self.references, logits.shape[1] - 1)
            if count < 1:
                raise TargetError("Finer-CAM needs a model with at least two classes")
            chosen = logits.gather(1, classes)  # (n, K)
            distance = (logits.detach()[:, None, :] - chosen.detach()[..., None]).abs()
            distance.scatter_(2, classes[..., None], math.inf)
            refs = distance.topk(count, dim=2, largest=False).indices  # (n, K, T)
            ref_logits = logits[:, None, :].expand(-1, refs.shape[1], -1).gather(2, refs)
            if self.weighting == "mean":
                score = chosen - self.gamma * ref_logits.mean(dim=2)
            else:
                probs = logits.softmax(dim=1)[:, None, :].expand(-1, refs.shape[1], -1)
                p = probs.gather(2, refs)
                score = (p * (chosen[..., None] - self.gamma * ref_logits)).sum(2) / (
                    p.sum(2) + 1e-9
                )
            return score if several else score[:, 0]

        return contrast

    def raw_maps(
        self, batch: Tensor, scorer: RowScorer, call: Call
    ) -> tuple[dict[str, Tensor], bool]:
        if not scorer.has_classes:
            raise TargetError(
                "Finer-CAM compares class logits: pass class indices as target, not a callable"
            )

        def one_pass(part: Tensor, rows: Tensor) -> tuple[dict[str, Tensor], bool]:
            local = resolve(self.objective(scorer, rows), part.shape[0], part.device)
            acts, grads, scores, several = self.capture.run(
                part, call, local, rows, gradients=True, dtype=self.dtype
            )
            return self.maps_from(acts, grads, scores.shape[1], tuple(part.shape[2:])), several

        return over_rows(batch, self.batch_size, one_pass)

    def layer_map(self, act: Tensor, grad: Tensor | None) -> Tensor:
        return self.base.layer_map(act, grad)


__all__ = [
    "FEM",
    "KPCACAM",
    "KPCA_KERNELS",
    "EigenGradCAM",
    "FinerCAM",
    "GradCAMElementWise",
    "SegEigenCAM",
    "ShapleyCAM",
]

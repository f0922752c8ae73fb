"""The gradient-weighted CAM methods: each says only how it weighs activations and gradients.

Notation: ``A`` is the layer's activation ``(..., C, h, w)``, ``g = dS/dA`` the gradient of the
target score ``S`` (the class logit), sums over the spatial positions ``ij``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from camkit.core.inputs import finite_number
from camkit.core.layers import LayerSpec
from camkit.errors import IllConditionedWarning, warn
from camkit.methods.cam.base import BaseCAM, spatial
from camkit.methods.cam.smoothing import principal_component
from camkit.registry import register


@register("gradcam", "Selvaraju et al., ICCV 2017")
class GradCAM(BaseCAM):
    """Grad-CAM: channel weights are the spatially averaged gradients, ``w_c = mean_ij g_cij``.

    Selvaraju et al., "Grad-CAM: Visual Explanations from Deep Networks via Gradient-based
    Localization", ICCV 2017. Map ``= ReLU(sum_c w_c A_c)``.
    """

    def channel_weights(self, act: Tensor, grad: Tensor) -> Tensor:
        return grad.mean(dim=spatial(grad), keepdim=True)


@register("gradcam++", "Chattopadhay et al., WACV 2018")
class GradCAMPlusPlus(BaseCAM):
    """Grad-CAM++: ``w_c = sum_ij alpha_cij ReLU(g_cij)`` with the closed-form alpha.

    Chattopadhay et al., "Grad-CAM++: Improved Visual Explanations for Deep Convolutional
    Networks", WACV 2018, eq. 19 with the authors' exponential score (``exp(S)`` cancels):
    ``alpha = g^2 / (2 g^2 + (sum_ab A_ab) g^3)``, not rescaled (as the paper and
    pytorch-grad-cam), in float64 (float32 where a device lacks it), 0 only where the
    denominator is exactly 0 (pytorch-grad-cam adds ``1e-6`` to every denominator).

    An :class:`~camkit.errors.IllConditionedWarning` says when the denominator nearly cancels
    (activations summing to either sign, LayerNorm outputs): its condition number ``(2 g^2 +
    |sum(A) g^3|) / |2 g^2 + sum(A) g^3|`` above :attr:`ill_conditioned` where ``g > 0``.
    """

    #: condition number of an alpha's denominator above which the map is called ill-conditioned
    ill_conditioned: float = 1e3

    def channel_weights(self, act: Tensor, grad: Tensor) -> Tensor:
        exact = torch.float32 if grad.device.type == "mps" else torch.float64
        g, a = grad.to(exact), act.to(exact)
        g2 = g.square()
        cubic = a.sum(dim=spatial(a), keepdim=True) * g2 * g
        denominator = 2 * g2 + cubic
        alpha = g2 / torch.where(denominator != 0, denominator, torch.ones_like(denominator))
        condition = (2 * g2 + cubic.abs()) / denominator.abs()
        counted = (g > 0) & (denominator != 0)
        worst = float(condition[counted].max()) if counted.any() else 0.0
        if worst > self.ill_conditioned:
            warn(
                "Grad-CAM++'s alphas are ill-conditioned at this layer: a denominator 2 g^2 + "
                f"sum(A) g^3 nearly cancels (condition number {worst:.3g}; activations of either "
                "sign, as LayerNorm outputs), so tiny changes of A or g change the map a lot; "
                "Grad-CAM or LayerCAM are stable there",
                IllConditionedWarning,
            )
        return (alpha * g.relu()).sum(dim=spatial(grad), keepdim=True).to(grad.dtype)


@register("xgradcam", "Fu et al., BMVC 2020")
class XGradCAM(BaseCAM):
    """XGrad-CAM: gradients averaged with the normalised activations as weights.

    Fu et al., "Axiom-based Grad-CAM: Towards Accurate Visualization and Explanation of CNNs",
    BMVC 2020: ``w_c = sum_ij (A_cij / sum_ab A_cab) g_cij`` (``1e-7`` guards an all-zero map).
    """

    def channel_weights(self, act: Tensor, grad: Tensor) -> Tensor:
        total = act.sum(dim=spatial(act), keepdim=True)
        return (grad * act).sum(dim=spatial(grad), keepdim=True) / (total + 1e-7)


@register("hirescam", "Draelos & Carin, 2020")
class HiResCAM(BaseCAM):
    """HiResCAM: the element-wise product of gradients and activations, ``sum_c g_c * A_c``.

    Draelos & Carin, "Use HiResCAM instead of Grad-CAM for faithful explanations of
    convolutional neural networks", 2020.
    """

    def channel_weights(self, act: Tensor, grad: Tensor) -> Tensor:
        return grad


@register("layercam", "Jiang et al., IEEE TIP 2021")
class LayerCAM(BaseCAM):
    """LayerCAM: activations weighted element-wise by positive gradients, ``sum_c ReLU(g_c) A_c``.

    Jiang et al., "LayerCAM: Exploring Hierarchical Class Activation Maps for Localization",
    IEEE TIP 2021.
    """

    def channel_weights(self, act: Tensor, grad: Tensor) -> Tensor:
        return grad.relu()


@register("eigencam", "Muhammad & Yeasin, IJCNN 2020")
class EigenCAM(BaseCAM):
    """Eigen-CAM: the activations projected on their first principal component (no gradients).

    Muhammad & Yeasin, "Eigen-CAM: Class Activation Map using Principal Components", IJCNN 2020:
    :func:`~camkit.methods.cam.smoothing.principal_component` of the activations; the same map
    for every target; ``eigen_smooth`` changes nothing (as in pytorch-grad-cam).
    """

    needs_gradients = False
    target_free = True

    def layer_map(self, act: Tensor, grad: Tensor | None) -> Tensor:
        return principal_component(act)


@register("gradcam-elementwise", "Draelos & Carin, 2020 (element-wise)")
class GradCAMElementWise(BaseCAM):
    """Grad-CAM element-wise: ``sum_c ReLU(g_c * A_c)`` (pytorch-grad-cam's ``GradCAMElementWise``).

    A variant of HiResCAM (Draelos & Carin 2020) where negative evidence of one channel cannot
    cancel positive evidence of another.
    """

    def weighted_activations(self, act: Tensor, grad: Tensor | None) -> Tensor:
        return (grad * act).relu()


@register("fem", "Ahmed Fuad et al., IPTA 2020")
class FEM(BaseCAM):
    """FEM, the feature explanation method: channels weighted by their share of strong positions.

    Ahmed Fuad et al., "Features understanding in 3D CNNs for actions recognition in video",
    IPTA 2020 (pytorch-grad-cam's ``FEM``): with each channel's mean ``mu_c`` and population
    standard deviation ``sigma_c`` over the positions, ``w_c = mean_ij [A_cij > mu_c + k
    sigma_c]`` (the k-sigma rule), map ``= sum_c w_c A_c``, the same for every target;
    ``eigen_smooth`` applies (pytorch-grad-cam's ``FEM`` ignores it).
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


__all__ = [
    "FEM",
    "EigenCAM",
    "GradCAM",
    "GradCAMElementWise",
    "GradCAMPlusPlus",
    "HiResCAM",
    "LayerCAM",
    "XGradCAM",
]

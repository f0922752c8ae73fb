"""The gradient-weighted CAM methods: each says only how it weighs activations and gradients.

Notation: ``A`` is the layer's activation ``(..., C, h, w)``, ``g = dS/dA`` the gradient of the
target score ``S`` (the class logit), sums over the spatial positions ``ij``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from camkit.cam.base import BaseCAM, spatial
from camkit.cam.smoothing import principal_component
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
    Networks", WACV 2018, eq. 19 with the exponential score of the authors' code, where the
    ``exp(S)`` factors cancel: ``alpha = g^2 / (2 g^2 + (sum_ab A_ab) g^3)``, and ``alpha = 0``
    where the denominator is 0 (then ``g = 0`` too). As in the paper and pytorch-grad-cam, the
    alphas are not rescaled afterwards (the authors' TF script also divides them by their sum).
    """

    def channel_weights(self, act: Tensor, grad: Tensor) -> Tensor:
        grad_2 = grad.square()
        denominator = 2 * grad_2 + act.sum(dim=spatial(act), keepdim=True) * grad_2 * grad
        alpha = grad_2 / torch.where(denominator != 0, denominator, torch.ones_like(denominator))
        return (alpha * grad.relu()).sum(dim=spatial(grad), keepdim=True)


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
    convolutional neural networks", 2020. Provably shows the locations the score used.
    """

    def channel_weights(self, act: Tensor, grad: Tensor) -> Tensor:
        return grad


@register("layercam", "Jiang et al., IEEE TIP 2021")
class LayerCAM(BaseCAM):
    """LayerCAM: activations weighted element-wise by positive gradients, ``sum_c ReLU(g_c) A_c``.

    Jiang et al., "LayerCAM: Exploring Hierarchical Class Activation Maps for Localization",
    IEEE TIP 2021. Works at shallow layers too; fuse several layers for finer maps.
    """

    def channel_weights(self, act: Tensor, grad: Tensor) -> Tensor:
        return grad.relu()


@register("eigencam", "Muhammad & Yeasin, IJCNN 2020")
class EigenCAM(BaseCAM):
    """Eigen-CAM: the activations projected on their first principal component (no gradients).

    Muhammad & Yeasin, "Eigen-CAM: Class Activation Map using Principal Components", IJCNN 2020.
    The ``(hw, C)`` activation matrix is centred per channel (as pytorch-grad-cam does) and
    projected on its first right singular vector. The sign of a singular vector is arbitrary,
    so it is fixed to correlate positively with the channel-mean activation: maps do not flip.
    The map is the same for every target (repeated along the target axis); it is a principal
    component already, so ``eigen_smooth`` changes nothing (as in pytorch-grad-cam).
    """

    needs_gradients = False
    target_free = True

    def layer_map(self, act: Tensor, grad: Tensor | None) -> Tensor:
        return principal_component(act)

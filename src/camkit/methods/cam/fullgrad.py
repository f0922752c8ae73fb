"""FullGrad: the input-gradient plus the bias-gradients of every convolution and batch norm.

Srinivas & Fleuret, "Full-Gradient Representation for Neural Network Visualization", NeurIPS
2019: ``S(x) = psi(grad_x f * x) + sum_l sum_c psi(grad_{z_l} f_c * b_lc)`` with ``z_l`` the
output of layer ``l`` and ``psi`` the absolute value with each channel map rescaled to [0, 1],
upsampled bilinearly to the input. Biases: every ``nn.Conv2d`` and ``nn.BatchNorm2d`` (in
evaluation mode), as the authors' code and pytorch-grad-cam's ``FullGrad``.
"""

from __future__ import annotations

import warnings
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from camkit.core.call import Call
from camkit.core.engine import layer_gradients, over_rows
from camkit.core.explainer import Explainer, Explanation
from camkit.core.finish import Finishing, minmax
from camkit.core.formats import autocast
from camkit.core.layers import capture_outputs
from camkit.core.spacetime import folded_frames
from camkit.errors import GradientError, LayerOutputError
from camkit.methods.cam.smoothing import explained
from camkit.registry import register
from camkit.targets.base import TargetSpec
from camkit.targets.resolver import RowScorer, resolve


def effective_bias(module: nn.Module) -> Tensor | None:
    """The bias ``(C,)`` a conv or batch-norm layer adds per channel, or None without one: a
    batch norm's (evaluation mode) is ``beta - mu gamma / sqrt(var + eps)``."""
    if not isinstance(module, nn.Conv2d | nn.BatchNorm2d) or module.bias is None:
        return None
    bias = module.bias.detach()
    if isinstance(module, nn.Conv2d) or module.running_mean is None or module.running_var is None:
        return bias
    scale = module.weight.detach() if module.weight is not None else torch.ones_like(bias)
    return bias - module.running_mean * scale / torch.sqrt(module.running_var + module.eps)


def bias_layers(model: nn.Module) -> list[tuple[str, nn.Module, Tensor]]:
    """``(name, tapped module, bias (C,))`` of every conv / batch norm with a bias; a batch norm
    fused with its activation (timm's ``BatchNormAct2d``: ``act(drop(bn(z)))``) is tapped at its
    ``drop``, before the activation."""
    found = []
    for name, module in model.named_modules():
        bias = effective_bias(module)
        if bias is None:
            continue
        drop = getattr(module, "drop", None)
        if isinstance(module, nn.BatchNorm2d) and isinstance(drop, nn.Module):
            module, name = drop, f"{name}.drop"
        found.append((name, module, bias))
    return found


def _psi(t: Tensor) -> Tensor:
    """Absolute value, then each channel map rescaled to [0, 1] (``1e-7`` guards a flat map)."""
    t = t.abs()
    t = t - t.amin(dim=(-2, -1), keepdim=True)
    return t / (t.amax(dim=(-2, -1), keepdim=True) + 1e-7)


@register("fullgrad", "Srinivas & Fleuret, NeurIPS 2019")
class FullGrad(Explainer):
    """FullGrad saliency (Srinivas & Fleuret, NeurIPS 2019; see the module docstring), shaped as
    a CAM's, no layer. Call options: ``normalize``, ``aug_smooth``
    (:func:`camkit.methods.cam.smoothing.explained`); no ``eigen_smooth`` (no sum ``w_c A_c``).
    """

    family: ClassVar[str] = "gradient-cam"
    display_options: ClassVar[dict[str, Any]] = {"normalize": False}  # the raw saliency

    def __init__(self, model: nn.Module, **options: Any):
        super().__init__(model, **options)
        self.bias_layers = bias_layers(self.model)
        if not self.bias_layers:
            warnings.warn(
                "the model has no conv or batch-norm bias: FullGrad reduces to |grad * input|",
                UserWarning,
                stacklevel=2,
            )

    def _explain(
        self, call: Call, scorer: RowScorer, *, normalize: bool = True, aug_smooth: bool = False
    ) -> Explanation:
        return explained(self, call, scorer, Finishing(normalize=normalize), aug_smooth)

    def maps(
        self, batch: Tensor, target: TargetSpec | RowScorer, finishing: Finishing, call: Call
    ) -> Tensor:
        """``(B, C, H, W) ->`` the summed saliency ``(B, K, H, W)``, min-max normalised where
        ``finishing.normalize`` (its other steps do not apply)."""
        scorer = resolve(target, batch.shape[0], batch.device, self.output)
        maps = over_rows(
            batch, self.batch_size, lambda part, rows: self._pass(part, call, scorer, rows)
        )
        return minmax(maps) if finishing.normalize else maps

    def display_heat(self, result: Tensor) -> Tensor:
        """The saliency min-max normalised (the raw one under :attr:`display_options`)."""
        return minmax(result.detach().float())

    def _pass(self, part: Tensor, call: Call, scorer: RowScorer, rows: Tensor) -> Tensor:
        leaf = part.detach().requires_grad_(True)
        tapped = [(name, module) for name, module, _ in self.bias_layers]
        with (
            torch.enable_grad(),
            autocast(part.device, self.dtype),
            capture_outputs(self.model, tapped, start_graph=False) as taps,
        ):
            output = call.forward(self.model, leaf.clone(), rows)
            scores = scorer(output, rows)
        if not scores.requires_grad:
            raise GradientError("the target score does not depend on the input")
        calls = [
            (bias, out)
            for (name, _, bias) in self.bias_layers
            for out in taps[name]
            if isinstance(out, Tensor) and out.requires_grad
        ]
        names = ["input"] + [f"bias {i}" for i in range(len(calls))]
        inputs = [leaf] + [out for _, out in calls]
        grads = layer_gradients(scores, inputs, names, allow_unused=True)
        size = tuple(part.shape[-2:])
        total = _psi(grads[0].float() * part[:, None].float()).sum(dim=2)  # (n, K, H, W)
        for (bias, _), grad in zip(calls, grads[1:], strict=True):
            if grad is None or grad.ndim != 5:
                continue
            grad = grad.float()
            bias = bias.to(device=grad.device, dtype=grad.dtype)[:, None, None]
            channels = _psi(grad * bias).sum(dim=2)  # (n, K, h, w)
            if channels.shape[0] != part.shape[0]:  # a frame-wise model: (n * T, K, h, w)
                frames = folded_frames(self.model, tuple(part.shape))
                if not frames or channels.shape[0] != part.shape[0] * frames:
                    raise LayerOutputError(
                        f"FullGrad: a bias layer gives {channels.shape[0]} rows for "
                        f"{part.shape[0]} inputs (not one per input); declare a frame-wise clip "
                        "model with camkit.InputLayout(model, layout, frame_wise=True)"
                    )
                channels = channels.unflatten(0, (-1, frames)).transpose(1, 2)  # (n, K, T, h, w)
            if channels.shape[-2:] != size:  # one plane per sample, target, frame
                planes = channels.flatten(0, -3).unsqueeze(1)
                planes = F.interpolate(planes, size=size, mode="bilinear", align_corners=False)
                channels = planes.squeeze(1).unflatten(0, channels.shape[:-2])
            total = total + channels
        return total.float()

    def __repr__(self) -> str:
        return f"FullGrad(bias_layers={len(self.bias_layers)})"


__all__ = ["FullGrad", "bias_layers", "effective_bias"]

"""CAM, the original class activation map: the layer's channels weighed by the classifier's
row of the target class, and :func:`find_classifier`, which finds that classifier."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from camkit.core.call import Call
from camkit.core.engine import over_rows
from camkit.core.layers import LayerSpec, find_layer, single_call
from camkit.errors import CamkitError, ClassifierNotFoundError, LayerOutputError, TargetError
from camkit.methods.cam.base import BaseCAM, RawMaps
from camkit.registry import register
from camkit.targets.resolver import RowScorer

# Names of the classifier of common heads, tried in order (torchvision, timm, others).
CLASSIFIER_NAMES = ("fc", "classifier", "head", "head.fc", "last_linear", "heads.head", "linear")


def find_classifier(model: nn.Module, fc: str | nn.Module | None = None) -> tuple[str, Tensor]:
    """The classifier after the global pooling and its weight matrix ``(num_classes, C)``.

    ``fc`` names it (a dotted name or the module); else timm's ``get_classifier()``, the head
    names :data:`CLASSIFIER_NAMES`, then the model's only ``nn.Linear``. A container of one
    ``nn.Linear`` or a 1x1 ``nn.Conv2d`` work as well. Raises
    :class:`~camkit.errors.ClassifierNotFoundError` when there is none or several.
    """
    if fc is not None:
        name, module = find_layer(model, fc)
        return _classifier_weight(model, _single_linear(name, module, explicit=True))
    getter = getattr(model, "get_classifier", None)
    head = getter() if callable(getter) else None
    if isinstance(head, nn.Linear | nn.Conv2d):
        return _classifier_weight(model, head)
    modules = dict(model.named_modules())
    for name in CLASSIFIER_NAMES:
        if name in modules:
            linear = _single_linear(name, modules[name], explicit=False)
            if linear is not None:
                return _classifier_weight(model, linear)
    linears = [name for name, m in modules.items() if isinstance(m, nn.Linear)]
    if len(linears) == 1:
        return _classifier_weight(model, modules[linears[0]])
    found = f"the model has {len(linears)} nn.Linear layers" + (
        f" ({', '.join(linears[:5])}{', ...' if len(linears) > 5 else ''})" if linears else ""
    )
    raise ClassifierNotFoundError(
        f"cannot find the classifier of the model automatically: {found}; CAM needs a model "
        "ending in global pooling and one linear layer: pass fc= its name or module"
    )


def _single_linear(name: str, module: nn.Module, *, explicit: bool) -> nn.Module | None:
    """``module`` if it is linear, else its only linear submodule; None (or an error when the
    user named it) when it holds none, an error when it holds several."""
    if isinstance(module, nn.Linear | nn.Conv2d):
        return module
    linears = [m for m in module.modules() if isinstance(m, nn.Linear | nn.Conv2d)]
    if len(linears) == 1:
        return linears[0]
    if explicit or len(linears) > 1:
        raise ClassifierNotFoundError(
            f"the classifier {name!r} ({type(module).__name__}) holds {len(linears)} linear "
            "layers; CAM needs exactly one linear layer after the global pooling (with hidden "
            "layers in the head the class weights do not apply to the features: use GradCAM)"
        )
    return None


def _classifier_weight(model: nn.Module, module: nn.Module) -> tuple[str, Tensor]:
    """The classifier's name in ``model`` and its weight matrix ``(num_classes, C)``."""
    name, _ = find_layer(model, module)
    weight = getattr(module, "weight", None)
    if isinstance(module, nn.Conv2d) and module.kernel_size != (1, 1):
        raise ClassifierNotFoundError(
            f"the classifier {name!r} is a {module.kernel_size} convolution; CAM needs a linear "
            "layer or a 1x1 convolution"
        )
    if not isinstance(weight, Tensor):
        raise ClassifierNotFoundError(f"the classifier {name!r} has no weight matrix")
    return name, weight.detach().flatten(1)


@register("cam", "Zhou et al., CVPR 2016")
class CAM(BaseCAM):
    """CAM: the layer's channels weighted by the classifier's weights of the target class.

    Zhou et al., "Learning Deep Features for Discriminative Localization", CVPR 2016: with global
    average pooling and a linear classifier ``W (N, C)``, ``M_k = sum_c W_kc A_c``. Class targets
    only; the paper (and torchcam) show the signed map: ``relu=False``.

    Args (besides those of :class:`~camkit.methods.cam.base.BaseCAM`):
        fc: the classifier (dotted name or module), whose input features are the layer's
            channels; default :func:`find_classifier`'s.
    """

    needs_gradients = False

    @classmethod
    def fits(cls, model: nn.Module) -> str | None:
        try:
            find_classifier(model)
        except CamkitError as error:
            return str(error)
        return None

    def __init__(
        self,
        model: nn.Module,
        layer: LayerSpec | None = None,
        *,
        fc: str | nn.Module | None = None,
        **options,
    ):
        super().__init__(model, layer, **options)
        self.fc_name, self.fc_weight = find_classifier(self.model, fc)

    def raw_maps(self, batch: Tensor, scorer: RowScorer, call: Call) -> RawMaps:
        if not scorer.has_classes:
            raise TargetError(
                "CAM weighs channels with the classifier's row of a class: pass class indices "
                "as target (a callable objective needs a gradient method such as GradCAM)"
            )
        weight = self.fc_weight.to(device=batch.device, dtype=torch.float32)

        def one_pass(part: Tensor, rows: Tensor) -> dict[str, Tensor]:
            output, taps = self.capture.forward(
                part, call, start_graph=False, dtype=self.dtype, rows=rows
            )
            classes = scorer.classes_of(output, rows)  # (n, K)
            size = tuple(part.shape[2:])
            maps = {}
            for name, act in zip(self.capture.names, single_call(taps), strict=True):
                act = act.unsqueeze(1)
                act = self.as_grid(act, self.grid_reader(name, act, size))
                if act.shape[2] != weight.shape[1]:
                    raise LayerOutputError(
                        f"the classifier {self.fc_name!r} takes {weight.shape[1]} features but "
                        f"layer {name!r} has {act.shape[2]} channels; CAM needs the layer whose "
                        "output is globally pooled into the classifier"
                    )
                rows_weight = weight[classes.to(weight.device)]  # (n, K, C)
                rows_weight = rows_weight.view(*rows_weight.shape, *[1] * (act.ndim - 3))
                maps[name] = self.combine(rows_weight * act)
            return maps

        return over_rows(batch, self.batch_size, one_pass)


__all__ = ["CAM", "CLASSIFIER_NAMES", "find_classifier"]

"""RefineCAM: several layers' maps of any CAM method multiplied into one finer map."""

from __future__ import annotations

from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from camkit.core.call import Call
from camkit.core.finish import RESAMPLING, minmax
from camkit.core.layers import LayerSpec
from camkit.errors import ArgumentError
from camkit.methods.cam.base import BaseCAM, RawMaps, WrapperCAM
from camkit.methods.cam.gradient import GradCAMPlusPlus
from camkit.registry import register
from camkit.targets.resolver import RowScorer


@register("refinecam", '"How to Evaluate and Refine your CAM" (arXiv:2605.14641, torchcam 0.5.0)')
class RefineCAM(WrapperCAM):
    """RefineCAM: the product of the normalised maps of several layers (torchcam's ``RefineCAM``).

    "How to Evaluate and Refine your CAM" (arXiv:2605.14641, torchcam 0.5.0): ``M = prod_l
    minmax(ReLU(M_l))`` over the ``base`` method's layer maps resized (bilinear, trilinear for
    volumes) to the largest layer resolution: a position stays where every layer agrees.

    Args (besides those of :class:`~camkit.methods.cam.base.BaseCAM`):
        layer: at least two layers (names or modules).
        base: any CAM class (gradient or not); ``**options`` go to its constructor.
    """

    def __init__(
        self,
        model: nn.Module,
        layer: LayerSpec | None = None,
        *,
        base: type[BaseCAM] = GradCAMPlusPlus,
        **options: Any,
    ):
        if not (isinstance(base, type) and issubclass(base, BaseCAM)):
            raise ArgumentError(f"base must be a CAM class such as GradCAMPlusPlus, got {base!r}")
        if layer is None or isinstance(layer, str | nn.Module) or len(layer) < 2:
            raise ArgumentError(
                "RefineCAM multiplies the maps of several layers: give at least two"
            )
        super().__init__(model, layer, base=base, **options)

    def raw_maps(self, batch: Tensor, scorer: RowScorer, call: Call) -> RawMaps:
        maps = self.base.raw_maps(batch, scorer, call)
        dims = next(iter(maps.values())).ndim - 2  # 2-D maps, or volumes
        size = tuple(max(m.shape[d] for m in maps.values()) for d in range(-dims, 0))
        refined = None
        for cam in maps.values():
            cam = minmax(cam.float().relu(), dims)
            if cam.shape[-dims:] != size:
                cam = F.interpolate(cam, size=size, mode=RESAMPLING[dims], align_corners=False)
            refined = cam if refined is None else refined * cam
        return {"refined": refined}


__all__ = ["RefineCAM"]

"""Finishing raw maps, 2-D or 3-D: ReLU, upsampling to the input, min-max normalisation, fusing
layers; results keep the axes ``(B, K, ...)`` until :func:`drop_axes`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from camkit.errors import ArgumentError, EmptyMapWarning, NonFiniteWarning, warn

RESAMPLING = {2: "bilinear", 3: "trilinear"}


#: The flat-map policy (:func:`flat`): a map whose values span less than this fraction of their
#: magnitude is flat. float32 values carry 1e-6 to 1e-5 of their magnitude in rounding after a
#: network's depth, so below a spread of 1e-3 min-max normalised entries are noise at the 1e-3
#: to 1e-2 level (and change with the batch's kernels). Recipro-CAM on a near-uniform random
#: classifier varies by 1e-4 to 6e-4; the least varied real maps of the conformance matrix 5e-3.
FLAT_SPREAD = 1e-3


def flat(maps: Tensor, dims: int = 2) -> Tensor:
    """Which maps are flat: ``(B, K, *spatial) -> (B, K, 1, ...)``, True where the spread over
    the last ``dims`` dims is at most :data:`FLAT_SPREAD` of the largest magnitude. The one
    test every method applies before normalising: flat maps become zeros."""
    return flat_between(*extremes(maps, dims))


def extremes(maps: Tensor, dims: int = 2) -> tuple[Tensor, Tensor]:
    """``(low, high)``: each map's min and max over its last ``dims`` dims (kept)."""
    axes = tuple(range(-dims, 0))
    return maps.amin(dim=axes, keepdim=True), maps.amax(dim=axes, keepdim=True)


def flat_between(low: Tensor, high: Tensor) -> Tensor:
    """:func:`flat` from maps' already computed extremes (:func:`extremes`)."""
    return (high - low) <= FLAT_SPREAD * torch.maximum(low.abs(), high.abs())


def checked(maps: Tensor, *, warn_empty: bool = True) -> Tensor:
    """``(B, K, ...)`` maps with non-finite entries set to 0, warning about those and (unless
    not ``warn_empty``) about maps that are zero everywhere: never a NaN or silently empty map."""
    finite = torch.isfinite(maps)
    if not finite.all():
        warn(
            "the model produced non-finite (inf/NaN) values for this input; those map entries "
            "are set to 0 and the map is not meaningful: check the model's output (an overflow "
            "in a narrow dtype=?)",
            NonFiniteWarning,
        )
        maps = torch.where(finite, maps, torch.zeros_like(maps))
    empty = (maps.reshape(*maps.shape[:2], -1) == 0).all(dim=2)
    if warn_empty and empty.any():
        warn(
            f"{int(empty.sum())} of {empty.numel()} map(s) are empty (all zero): the target "
            "score's gradient is zero there, the layer's activations are constant or all cut "
            f"by the ReLU, or the map was flat (its values vary by less than {FLAT_SPREAD:g} of "
            "their size: float noise, not a map); try another layer or target",
            EmptyMapWarning,
        )
    return maps


def minmax(maps: Tensor, dims: int = 2) -> Tensor:
    """Min-max normalise each map over its last ``dims`` dims to [0, 1]; a :func:`flat` map
    (constant, or varying within float noise) gives zeros."""
    low, high = extremes(maps, dims)
    is_flat = flat_between(low, high)
    span = high - low
    return torch.where(is_flat, torch.zeros_like(maps), (maps - low) / span.masked_fill(is_flat, 1))


FUSIONS = ("mean", "max", "tanh")


@dataclass(frozen=True)
class Finishing:
    """How raw ``(B, K, *spatial)`` maps are finished: ``relu``, ``upsample`` to the input size
    (bilinear or trilinear, ``align_corners=False``), min-max ``normalize`` to [0, 1], and
    ``fuse`` several layers' finished maps (normalised again): ``True`` or ``"mean"`` (as
    pytorch-grad-cam), ``"max"`` (as torchcam), ``"tanh"`` (torchcam's LayerCAM fusion:
    ``tanh(2 M)`` before the maximum, Jiang et al., TIP 2021, eq. 9), or ``False`` (one map
    per layer, ``{layer: map}``)."""

    relu: bool = True
    upsample: bool = True
    normalize: bool = True
    fuse: bool | str = True

    def __post_init__(self) -> None:
        if not isinstance(self.fuse, bool) and self.fuse not in FUSIONS:
            raise ArgumentError(
                f"fuse must be True, False or one of {', '.join(FUSIONS)}; got {self.fuse!r}"
            )

    def __call__(
        self, maps: dict[str, Tensor], size: tuple[int, ...]
    ) -> Tensor | dict[str, Tensor]:
        dims = len(size)
        finished = {}
        for name, cam in maps.items():
            cam = cam.float()
            if self.relu:
                cam = cam.relu()
            if self.upsample:
                cam = F.interpolate(cam, size=size, mode=RESAMPLING[dims], align_corners=False)
            if self.normalize:
                cam = minmax(cam, dims)
            finished[name] = checked(cam)
        if not self.fuse:
            return finished
        if len(finished) == 1:
            return next(iter(finished.values()))
        if len({tuple(cam.shape) for cam in finished.values()}) > 1:
            raise ArgumentError(
                "layers of different resolutions can only be fused with upsample=True; "
                "pass fuse=False to get one map per layer"
            )
        stacked = torch.stack(list(finished.values()))
        if self.fuse == "tanh":
            stacked = torch.tanh(2 * stacked)
        fused = stacked.mean(0) if self.fuse in (True, "mean") else stacked.amax(0)
        return minmax(fused, dims) if self.normalize else fused


def drop_axes(result: Any, single: bool, several: bool) -> Any:
    """Drop the target axis (1) unless K targets were asked and the batch axis (0) for one
    image, detached (in each map of a dict or tuple)."""
    if isinstance(result, tuple):
        return tuple(drop_axes(part, single, several) for part in result)
    if isinstance(result, dict):
        return {name: drop_axes(t, single, several) for name, t in result.items()}
    result = result if several else result.squeeze(1)
    return (result.squeeze(0) if single else result).detach()

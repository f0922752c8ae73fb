"""Does the map point at the object? Localisation scores against ground-truth masks or boxes.

* :func:`pointing_game` -- Zhang et al., "Top-down Neural Attention by Excitation Backprop",
  ECCV 2016: a hit when the map's maximum lies within ``tolerance`` pixels of the object;
* :func:`energy_pointing_game` -- Wang et al., "Score-CAM", CVPR-W 2020: the share of the map's
  energy (its sum) inside the object.

Both take maps ``(B, H, W)`` and masks ``(B, H, W)`` (bool or 0/1) or boxes ``x1, y1, x2, y2``
in pixels: ``(B, 4)`` or a list of ``B`` lists of boxes. A box covers the pixels whose centres
lie inside it (an integer box: ``map[y1:y2, x1:x2]``). An image without object scores NaN, left
out by ``torch.nanmean``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from camkit.core.inputs import finite_number
from camkit.errors import InputError

Regions = Tensor | Sequence[Sequence[Sequence[float]]]


def _as_maps(maps: object) -> Tensor:
    if not isinstance(maps, Tensor):
        raise InputError(f"expected the maps as a tensor (B, H, W), got {type(maps).__name__}")
    if maps.ndim == 2:
        maps = maps.unsqueeze(0)
    if maps.ndim != 3 or maps.numel() == 0:
        raise InputError(f"expected maps of shape (B, H, W), got {tuple(maps.shape)}")
    maps = maps.detach().float()
    if not torch.isfinite(maps).all():
        raise InputError("the maps contain NaN or infinite values")
    return maps


def _boxes_mask(boxes: Sequence[Tensor], height: int, width: int, device: torch.device) -> Tensor:
    """``B`` tensors of boxes ``(n_i, 4)`` xyxy -> masks ``(B, H, W)`` of the covered pixels."""
    ys = torch.arange(height, device=device, dtype=torch.float32) + 0.5
    xs = torch.arange(width, device=device, dtype=torch.float32) + 0.5
    masks = []
    for image_boxes in boxes:
        b = image_boxes.to(device=device, dtype=torch.float32).reshape(-1, 4)
        inside_y = (ys >= b[:, 1:2]) & (ys <= b[:, 3:4])  # (n, H)
        inside_x = (xs >= b[:, 0:1]) & (xs <= b[:, 2:3])  # (n, W)
        masks.append((inside_y[:, :, None] & inside_x[:, None, :]).any(dim=0))
    return torch.stack(masks)


def _as_regions(regions: object, maps: Tensor) -> Tensor:
    """Masks or boxes as bool masks ``(B, H, W)`` on the maps' device."""
    b, height, width = maps.shape
    if isinstance(regions, Tensor):
        if regions.shape == (4,) and b == 1:
            regions = regions.unsqueeze(0)
        if regions.ndim == 2 and regions.shape == (b, 4) and (height, width) != (b, 4):
            return _boxes_mask(list(regions), height, width, maps.device)
        if regions.ndim == 2 and b == 1:
            regions = regions.unsqueeze(0)
        if regions.shape != maps.shape:
            raise InputError(
                f"expected masks of the maps' shape {tuple(maps.shape)} or boxes ({b}, 4), "
                f"got {tuple(regions.shape)}"
            )
        if regions.dtype != torch.bool:
            if not torch.isin(regions.detach(), regions.new_tensor([0, 1])).all():
                raise InputError("masks must be bool or 0/1 tensors")
            regions = regions != 0
        return regions.to(maps.device)
    if isinstance(regions, Sequence) and not isinstance(regions, str | bytes):
        if len(regions) != b:
            raise InputError(
                f"expected a list of boxes for each of the {b} images, got {len(regions)}"
            )
        boxes = []
        for image_boxes in regions:
            try:
                t = torch.as_tensor(image_boxes, dtype=torch.float32)
            except (TypeError, ValueError):
                raise InputError(
                    f"boxes must be [x1, y1, x2, y2] numbers, got {image_boxes!r}"
                ) from None
            if t.numel() and (t.ndim != 2 or t.shape[1] != 4):
                raise InputError(f"expected each image's boxes as (n, 4) xyxy, got {t.shape}")
            boxes.append(t)
        return _boxes_mask(boxes, height, width, maps.device)
    raise InputError(
        f"expected masks (B, H, W) or boxes ((B, 4) tensor or lists), got {type(regions).__name__}"
    )


def pointing_game(maps: Tensor, masks: Regions, tolerance: float = 15) -> Tensor:
    """Pointing game (Zhang et al., ECCV 2016): ``(B, H, W), masks -> (B,)`` float: 1 when the
    map's maximum (the first in row-major order when several) lies within ``tolerance`` pixels
    (Euclidean) of a mask pixel, else 0; NaN for an empty mask. **Higher is better**; the
    accuracy is ``torch.nanmean``."""
    tolerance = finite_number("tolerance", tolerance, minimum=0.0)
    maps = _as_maps(maps)
    regions = _as_regions(masks, maps)
    _, height, width = maps.shape
    top = maps.flatten(1).argmax(dim=1)
    rows = torch.arange(height, device=maps.device).view(1, -1, 1) - (top // width).view(-1, 1, 1)
    columns = torch.arange(width, device=maps.device).view(1, 1, -1) - (top % width).view(-1, 1, 1)
    near = (regions & (rows**2 + columns**2 <= tolerance**2)).flatten(1).any(dim=1)
    return torch.where(regions.flatten(1).any(dim=1), near.float(), torch.nan)


def energy_pointing_game(maps: Tensor, masks_or_boxes: Regions) -> Tensor:
    """Energy-based pointing game (Wang et al., Score-CAM, CVPR-W 2020): ``(B, H, W), masks or
    boxes -> (B,)``: ``sum(map inside) / sum(map)`` in [0, 1] for non-negative maps. **Higher is
    better.** NaN for an empty mask or a map that sums to 0."""
    maps = _as_maps(maps)
    if (maps < 0).any():
        raise InputError("the energy pointing game needs non-negative maps (e.g. after ReLU)")
    regions = _as_regions(masks_or_boxes, maps)
    total = maps.flatten(1).sum(dim=1)
    inside = (maps * regions).flatten(1).sum(dim=1)
    valid = regions.flatten(1).any(dim=1) & (total > 0)
    return torch.where(valid, inside / total, torch.nan)

"""When, not only where: how a clip's explanation and the model's score spread over its frames.

:func:`frame_importance` is the map's mass per frame; :func:`frame_drop` the drop in the
target's score when one frame is replaced by a baseline frame: occlusion (Zeiler & Fergus,
"Visualizing and Understanding Convolutional Networks", ECCV 2014) along the time axis, as the
temporal occlusion of video explanations (Li et al., "Towards Visually Explaining Video
Understanding Networks with Perturbation", WACV 2021). It needs no map: it is the model's own
answer to "which frames matter", to compare :func:`frame_importance` with.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from camkit.core.finish import flat
from camkit.errors import InputError
from camkit.metrics.faithfulness import image_scorer, make_baseline, metric_images
from camkit.targets.base import TargetSpec


def frame_importance(maps: Tensor) -> Tensor:
    """Each frame's share of the map's mass: ``(B, T, H, W) -> (B, T)`` (``(T, H, W) -> (T,)``;
    ``(B, K, T, H, W) -> (B, K, T)``), ``sum_hw M_t / sum_thw M``.

    The map must be non-negative (a CAM after its ReLU, a pixel method's heat, an absolute
    attribution); a flat map (:func:`~camkit.core.finish.flat`) gives zeros, not a uniform spread.
    """
    if not isinstance(maps, Tensor) or maps.ndim not in (3, 4, 5):
        got = tuple(maps.shape) if isinstance(maps, Tensor) else type(maps).__name__
        raise InputError(
            f"expected a clip's map (T, H, W), (B, T, H, W) or (B, K, T, H, W), got {got}"
        )
    maps = maps.detach().float()
    if not torch.isfinite(maps).all() or (maps < 0).any():
        raise InputError(
            "frame_importance takes non-negative, finite maps (a CAM after its ReLU, a pixel "
            "method's heat, or attribution.abs()); got negative or non-finite values"
        )
    shares = mass_shares(maps.sum(dim=(-2, -1)))
    return torch.where(flat(maps.flatten(-3), dims=1), torch.zeros_like(shares), shares)


def mass_shares(mass: Tensor) -> Tensor:
    """Each frame's share of the total ``(..., T) -> (..., T)``, zeros where the total is 0:
    :func:`frame_importance`'s last step, for a streamed video (only each frame's mass kept)."""
    total = mass.sum(dim=-1, keepdim=True)
    return torch.where(total == 0, torch.zeros_like(mass), mass / total.masked_fill(total == 0, 1))


def frame_drop(
    model: nn.Module,
    x: Tensor,
    target: TargetSpec = None,
    *,
    baseline: str | Tensor = "zero",
    batch_size: int = 64,
    additional_forward_args: Any = None,
) -> Tensor:
    """The drop in the target's score when frame ``t`` is removed: ``(B, C, T, H, W) -> (B,
    T)``, ``score(clip) - score(clip with frame t replaced by the baseline's frame t)``.

    ``baseline``: ``"zero"``, ``"mean"`` or a tensor broadcastable to the clips
    (:func:`~camkit.metrics.faithfulness.make_baseline`). ``target``: as for every method
    (None: each clip's clean top-1 class, pinned). Positive values: frames the prediction
    needs; negative: frames that speak against it. ``batch_size``: rows per forward pass.
    """
    batch, _ = metric_images(x, model)
    if batch.ndim != 5:
        raise InputError(
            f"frame_drop removes frames of clips (B, C, T, H, W), got {tuple(batch.shape)}"
        )
    with torch.inference_mode():
        base = make_baseline(batch, baseline)
    scorer, clean = image_scorer(model, batch, target, batch_size, additional_forward_args)
    frames = batch.shape[2]

    def build(indices: Tensor) -> tuple[Tensor, Tensor]:
        rows, removed = indices // frames, indices % frames
        copies = batch[rows].clone()
        picked = torch.arange(len(indices), device=batch.device)
        copies[picked, :, removed] = base[rows, :, removed]
        return copies, rows

    scores = scorer.over(batch.shape[0] * frames, build)[:, 0].view(-1, frames)
    return clean[:, None] - scores


__all__ = ["frame_drop", "frame_importance", "mass_shares"]

"""ROAD, RemOve And Debias: Rong et al., "A Consistent and Efficient Evaluation Strategy for
Attribution Methods", ICML 2022. The removed pixels are filled in by noisy linear imputation,
so the model cannot read the removal's shape; MoRF (most relevant first) and LeRF orders.
Inputs, targets and conventions as the other faithfulness metrics
(:mod:`camkit.metrics.faithfulness`, docs/metrics.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from camkit.core.inputs import finite_number
from camkit.core.progress import progress_bar
from camkit.core.seeds import seed_value
from camkit.errors import ArgumentError
from camkit.metrics.faithfulness import (
    image_scorer,
    maps_like,
    metric_images,
    pixel_ranks,
    unbatched,
)
from camkit.targets.base import TargetSpec

ROAD_NOISE = 0.01
"""Standard deviation of the noise added to imputed pixels (ROAD's and pytorch-grad-cam's)."""
ROAD_PERCENTILES = (10, 20, 30, 40, 50, 60, 70, 80, 90)
# ROAD's 8 neighbours, in pytorch-grad-cam's order (the order of the sums): weight
# 1/6 for the 4 direct ones, 1/12 for the 4 diagonal ones
_ROAD_NEIGHBOURS = ((1, 1), (0, 1), (-1, 1), (1, -1), (0, -1), (-1, -1), (1, 0), (-1, 0))


def _imputation_system(known: np.ndarray, image: np.ndarray) -> tuple[Any, np.ndarray, np.ndarray]:
    """ROAD's linear system for one image: each unknown pixel equals the weighted mean of its
    8 neighbours (weights 1/6 direct, 1/12 diagonal, renormalised at the borders).
    ``known (H, W)`` bool, ``image (C, H, W)`` -> ``(A (M, M) csc, b (M, C), unknown (M,))``."""
    from scipy.sparse import coo_matrix

    height, width = known.shape
    flat_known = known.reshape(-1)
    flat_image = image.reshape(image.shape[0], -1).astype(np.float64)
    unknown = np.flatnonzero(~flat_known)
    count = unknown.size
    variable = np.zeros(flat_known.size, dtype=np.int64)
    variable[unknown] = np.arange(count)
    row, col = unknown // width, unknown % width
    rhs = np.zeros((count, image.shape[0]))
    weight_sum = np.zeros(count)
    entries = []  # (rows, columns, weights) of the matrix
    for dy, dx in _ROAD_NEIGHBOURS:
        weight = 1 / 12 if dy and dx else 1 / 6
        r, c = row + dy, col + dx
        inside = (r >= 0) & (r < height) & (c >= 0) & (c < width)
        ids = np.flatnonzero(inside)
        neighbour = r[inside] * width + c[inside]
        weight_sum[ids] += weight
        has_value = flat_known[neighbour]
        rhs[ids[has_value]] -= weight * flat_image[:, neighbour[has_value]].T
        free = ~has_value
        entries.append((ids[free], variable[neighbour[free]], np.full(int(free.sum()), weight)))
    entries.append((np.arange(count), np.arange(count), -weight_sum))
    rows, columns, weights = (np.concatenate(part) for part in zip(*entries, strict=True))
    matrix = coo_matrix((weights, (rows, columns)), shape=(count, count)).tocsc()
    return matrix, rhs, unknown


def _impute(
    image: Tensor, known: Tensor, noise: float, generator: torch.Generator | None
) -> Tensor:
    """Noisy linear imputation (ROAD): the unknown pixels of ``image (C, H, W)`` solved from
    their neighbours (a sparse direct solve, SciPy on the CPU), plus Gaussian noise of
    standard deviation ``noise`` drawn on the CPU as ``randn(C, M)``."""
    from scipy.sparse.linalg import spsolve

    channels = image.shape[0]
    matrix, rhs, unknown = _imputation_system(
        known.cpu().numpy(), image.detach().float().cpu().numpy()
    )
    if unknown.size == 0:
        return image.clone()
    solved = torch.as_tensor(spsolve(matrix, rhs), dtype=torch.float32).reshape(-1, channels).t()
    filled = solved + noise * torch.randn(solved.shape, generator=generator)
    flat = image.reshape(channels, -1).clone()
    flat[:, torch.as_tensor(unknown, device=image.device)] = filled.to(image)
    return flat.view_as(image)


def road_removed(pixels: int, percentile: float) -> int:
    """How many of ``pixels`` ROAD removes at ``percentile``: ``pixels - ceil((1 - p/100)
    (pixels - 1))``, the count pytorch-grad-cam's percentile threshold removes from a map
    without ties (so the two agree)."""
    kept = math.ceil((100 - percentile) * (pixels - 1) / 100 - 1e-9)
    return pixels - kept


def road(
    model: nn.Module,
    x: Tensor,
    maps: Tensor,
    target: TargetSpec = None,
    *,
    percentiles: Sequence[float] = ROAD_PERCENTILES,
    order: str = "morf",
    noise: float = ROAD_NOISE,
    seed: int | None = None,
    batch_size: int = 64,
    progress: bool = False,
    additional_forward_args: Any = None,
) -> Tensor:
    """ROAD (Rong et al., ICML 2022): ``(B, C, H, W), (B, h, w) -> (B, len(percentiles))``, the
    target's probability once the ``p`` % (in (0, 100)) most (``order="morf"``, **lower is
    better**) or least (``"lerf"``, **higher is better**) relevant pixels (ties row-major) are
    replaced by noisy linear imputation: the weighted mean of their 8 neighbours plus Gaussian
    noise of standard deviation ``noise``, drawn on the CPU (``seed``; None: torch's global
    generator) percentile by percentile, image by image, as pytorch-grad-cam's
    ``ROADMostRelevantFirst(100 - p)`` after ``torch.manual_seed(seed)``.
    """
    if order not in ("morf", "lerf"):
        raise ArgumentError(f"order must be 'morf' or 'lerf', got {order!r}")
    noise = finite_number("noise", noise, minimum=0.0)
    seed = seed_value(seed, optional=True)
    if isinstance(percentiles, str | bytes) or not isinstance(percentiles, Sequence):
        raise ArgumentError(f"percentiles must be a sequence of numbers, got {percentiles!r}")
    if not percentiles:
        raise ArgumentError("percentiles is empty")
    percentiles = [finite_number("each percentile", p) for p in percentiles]
    if any(not 0 < p < 100 for p in percentiles):
        raise ArgumentError(f"percentiles must be in (0, 100) (share removed), got {percentiles}")
    batch, single = metric_images(x, model, volumes=False)
    maps = maps_like(maps, batch, single)
    scorer, _ = image_scorer(model, batch, target, batch_size, additional_forward_args)
    b, _, height, width = batch.shape
    pixels = height * width
    ranks = pixel_ranks(maps, descending=order == "morf").view(b, height, width)
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    imputed = []
    with progress_bar(len(percentiles) * b, "ROAD", "image", enabled=progress) as bar:
        for percentile in percentiles:
            removed = road_removed(pixels, percentile)
            for i in range(b):
                imputed.append(_impute(batch[i], ranks[i] >= removed, noise, generator))
                bar.update(1)
    stacked = torch.stack(imputed)  # (P * B, C, H, W), percentile major
    scores = scorer.over(len(percentiles) * b, lambda rows: (stacked[rows], rows % b))[:, 0]
    scores = scores.view(len(percentiles), b).t()
    return unbatched(scores.contiguous(), single)

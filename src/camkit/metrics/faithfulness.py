"""Is the map faithful to the model? Scores that perturb the image where the map points.

:func:`deletion` / :func:`insertion` (Petsiuk et al., "RISE", BMVC 2018) and
:func:`average_drop` / :func:`increase_in_confidence` (Chattopadhay et al., "Grad-CAM++", WACV
2018); ROAD (Rong et al., ICML 2022) is :mod:`camkit.metrics.road`.

Every function takes the model, images ``(B, C, H, W)`` (or one ``(C, H, W)``), the maps
``(B, h, w)`` (smaller ones upsampled bilinearly) and a target as the methods take it (None:
each image's top-1 class; a class is scored by its softmax probability, a callable by its own
scores). Models run in inference mode, ``batch_size`` rows at a time (results do not depend on
it); ``additional_forward_args``: the model's other inputs. Conventions: docs/metrics.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchvision.transforms.functional import gaussian_blur

from camkit.core.call import Call
from camkit.core.copies import CopyScorer
from camkit.core.finish import RESAMPLING
from camkit.core.inputs import as_batch, positive_int
from camkit.core.progress import progress_bar
from camkit.errors import ArgumentError, InputError, TargetError
from camkit.targets.base import TargetSpec
from camkit.targets.resolver import resolve

BLUR_KERNEL = 11
"""Side of the Gaussian kernel of the ``"blur"`` baseline (RISE's evaluation code: 11)."""
BLUR_SIGMA = 5.0
"""Standard deviation of the ``"blur"`` baseline's kernel, in pixels (RISE's: 5)."""
BASELINES = ("blur", "zero", "mean")


def metric_images(x: object, model: nn.Module, *, volumes: bool = True) -> tuple[Tensor, bool]:
    """``(batch (B, C, H, W) or (B, C, D, H, W), was_single)``; ``volumes=False``: 2-D only."""
    batch, single = as_batch(x, model)
    if batch.ndim != 4 and not volumes:
        raise InputError(
            f"this metric takes images (B, C, H, W) or one image (C, H, W), got a batch of "
            f"volumes {tuple(batch.shape)}"
        )
    return batch, single


def maps_like(maps: object, batch: Tensor, single: bool) -> Tensor:
    """The maps as ``(B, *spatial)`` float on the input's device, a smaller map upsampled as
    camkit's methods do."""
    if not isinstance(maps, Tensor):
        raise InputError(f"expected the maps as a tensor (B, H, W), got {type(maps).__name__}")
    b, spatial = batch.shape[0], tuple(batch.shape[2:])
    dims = len(spatial)
    if maps.ndim == dims and single:
        maps = maps.unsqueeze(0)
    if maps.ndim == dims + 2 and maps.shape[1] == 1:
        maps = maps.squeeze(1)
    if maps.ndim != dims + 1 or maps.shape[0] != b:
        shape = ", ".join(("B", *("D", "H", "W")[-dims:]))
        what = "image" if dims == 2 else "volume"
        raise InputError(
            f"expected one map per {what}, shape ({shape}) with B = {b}, got "
            f"{tuple(maps.shape)}; pass one target per {what} (a (B, K, ...) result holds K "
            "maps each)"
        )
    size = tuple(maps.shape[1:])
    if any(m > n for m, n in zip(size, spatial, strict=True)) or 0 in size:
        raise InputError(
            f"the maps are {'x'.join(map(str, size))} but the inputs are "
            f"{'x'.join(map(str, spatial))}: expected maps of the input's size, or smaller ones "
            "(upsampled)"
        )
    maps = maps.detach().to(device=batch.device, dtype=torch.float32)
    if not torch.isfinite(maps).all():
        raise InputError("the maps contain NaN or infinite values")
    if size != spatial:
        mode = RESAMPLING[dims]
        maps = F.interpolate(maps[:, None], spatial, mode=mode, align_corners=False).squeeze(1)
    return maps


def image_scorer(
    model: nn.Module,
    batch: Tensor,
    target: TargetSpec,
    batch_size: int,
    additional_forward_args: Any = None,
) -> tuple[CopyScorer, Tensor]:
    """The copy scorer of ``batch`` for one target per image (``batch_size`` rows a pass) and
    the clean images' scores ``(B,)``; rows' scores: ``scorer.over(count, build)[:, 0]``."""
    batch_size = positive_int("batch_size", batch_size)
    call = Call.of(batch, additional_forward_args)  # rows follow their images
    scorer = resolve(target, batch.shape[0], batch.device)
    copies = CopyScorer.clean(model, batch, scorer, call, batch_size=batch_size, probabilities=True)
    if copies.scores.shape[1] != 1:
        raise TargetError(
            f"metrics score one target per image, got {copies.scores.shape[1]} per image; "
            "pass an int, one class per image or a callable returning (B,) scores"
        )
    return copies, copies.scores[:, 0]


def unbatched(result: Tensor, single: bool) -> Tensor:
    """A metric's ``(B, ...)`` result without the batch axis when one image was given."""
    return result[0] if single else result


def make_baseline(x: Tensor, baseline: str | Tensor) -> Tensor:
    """The image that removed pixels take: ``"blur"`` (Gaussian, :data:`BLUR_KERNEL`,
    :data:`BLUR_SIGMA`, reflected borders), ``"zero"`` (a normalised input's mean colour),
    ``"mean"`` (each image's channel means) or a tensor broadcastable to the batch."""
    if isinstance(baseline, Tensor):
        try:
            return torch.broadcast_to(baseline.to(x), x.shape)
        except RuntimeError:
            raise InputError(
                f"a baseline tensor must broadcast to the input {tuple(x.shape)}, got "
                f"{tuple(baseline.shape)}"
            ) from None
    if baseline == "blur":
        if x.ndim != 4:
            raise InputError(
                "the blur baseline blurs 2-D images; for volumes pass baseline='zero', 'mean' "
                "or a tensor"
            )
        if min(x.shape[-2:]) <= BLUR_KERNEL // 2:
            raise InputError(
                f"the blur baseline ({BLUR_KERNEL}x{BLUR_KERNEL} kernel, reflected borders) "
                f"needs images of at least {BLUR_KERNEL // 2 + 1} px per side, got "
                f"{x.shape[-2]}x{x.shape[-1]}; pass baseline='zero' or 'mean'"
            )
        return gaussian_blur(x, [BLUR_KERNEL, BLUR_KERNEL], [BLUR_SIGMA, BLUR_SIGMA])
    if baseline == "zero":
        return torch.zeros_like(x)
    if baseline == "mean":
        return x.mean(dim=tuple(range(2, x.ndim)), keepdim=True).expand_as(x)
    raise ArgumentError(f"baseline must be one of {BASELINES} or a tensor, got {baseline!r}")


def pixel_ranks(maps: Tensor, descending: bool) -> Tensor:
    """Each pixel's rank ``(B, H*W)`` in the map's order; ties keep the row-major order (a
    stable sort), so equal values are taken top-left first."""
    order = torch.argsort(maps.flatten(1), dim=1, descending=descending, stable=True)
    return torch.argsort(order, dim=1)


def curve(
    model: nn.Module,
    x: Tensor,
    maps: object,
    target: TargetSpec = None,
    *,
    insert: bool,
    steps: int = 50,
    baseline: str | Tensor = "blur",
    batch_size: int = 64,
    return_curves: bool = False,
    progress: bool = False,
    additional_forward_args: Any = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """The deletion (``insert=False``) or insertion curve's AUC (Petsiuk et al., RISE, BMVC
    2018): ``(B, C, H, W), (B, h, w) -> (B,)``; ``return_curves=True``: ``(auc, curves (B, steps
    + 1))``. Deletion replaces the pixels, in the map's decreasing order (ties: row-major), by
    the ``baseline`` (:func:`make_baseline`) in ``steps`` equal chunks; insertion puts them back
    onto the baseline in that order. The curve is the target's probability at the ``steps + 1``
    points, the AUC its trapezoid over ``x = k / steps``."""
    steps = positive_int("steps", steps)
    batch, single = metric_images(x, model)
    maps = maps_like(maps, batch, single)
    with torch.inference_mode():
        base = make_baseline(batch, baseline)
    scorer, clean = image_scorer(model, batch, target, batch_size, additional_forward_args)
    b, channels, *spatial = batch.shape
    pixels = math.prod(spatial)
    ranks = pixel_ranks(maps, descending=True)
    # point k of the curve: the first (k * pixels) // steps pixels of the order removed/inserted
    counts = torch.arange(steps + 1, device=batch.device) * pixels // steps
    # rows to score: every (image, point) but the clean image (already scored)
    points = torch.arange(steps, device=batch.device) + (0 if insert else 1)
    flat_x, flat_base = batch.flatten(2), base.flatten(2)

    def build(indices: Tensor) -> tuple[Tensor, Tensor]:
        rows = indices // steps
        chosen = ranks[rows] < counts[points[indices % steps]][:, None]
        take_image = chosen if insert else ~chosen
        images = torch.where(take_image[:, None], flat_x[rows], flat_base[rows])
        return images.view(-1, channels, *spatial), rows

    name = "insertion" if insert else "deletion"
    with progress_bar(b * steps, name, "image", enabled=progress) as bar:
        scores = scorer.over(b * steps, build, bar)[:, 0].view(b, steps)
    clean = clean[:, None]
    curves = torch.cat([scores, clean] if insert else [clean, scores], dim=1)
    auc = unbatched(torch.trapezoid(curves, dx=1.0 / steps, dim=1), single)
    return (auc, unbatched(curves, single)) if return_curves else auc


def deletion(
    model: nn.Module, x: Tensor, maps: Tensor, target: TargetSpec = None, **options: Any
) -> Tensor | tuple[Tensor, Tensor]:
    """Deletion AUC (Petsiuk et al., RISE, BMVC 2018): ``(B, C, H, W), (B, h, w) -> (B,)``, the
    map's most important pixels removed first. **Lower is better.** Options as :func:`curve`."""
    return curve(model, x, maps, target, insert=False, **options)


def insertion(
    model: nn.Module, x: Tensor, maps: Tensor, target: TargetSpec = None, **options: Any
) -> Tensor | tuple[Tensor, Tensor]:
    """Insertion AUC (Petsiuk et al., RISE, BMVC 2018): ``(B, C, H, W), (B, h, w) -> (B,)``, the
    map's most important pixels put back first. **Higher is better.** Options as :func:`curve`."""
    return curve(model, x, maps, target, insert=True, **options)


def _masked_confidence(
    model: nn.Module,
    x: Tensor,
    maps: Tensor,
    target: TargetSpec,
    compare: Callable[[Tensor, Tensor], Tensor],
    *,
    batch_size: int = 64,
    additional_forward_args: Any = None,
) -> Tensor:
    """``compare(Y, O) (B,)``: the target's probability on the images, and on them times the
    maps."""
    batch, single = metric_images(x, model)
    maps = maps_like(maps, batch, single)
    if maps.min() < -1e-6 or maps.max() > 1 + 1e-6:
        raise InputError(
            f"the maps multiply the image, so they must be in [0, 1] (camkit's methods give "
            f"such maps); got values in [{maps.min().item():.3g}, {maps.max().item():.3g}]"
        )
    scorer, clean = image_scorer(model, batch, target, batch_size, additional_forward_args)
    masked = batch * maps[:, None]
    scores = scorer.over(batch.shape[0], lambda rows: (masked[rows], rows))[:, 0]
    return unbatched(compare(clean, scores), single)


def average_drop(
    model: nn.Module, x: Tensor, maps: Tensor, target: TargetSpec = None, **options: Any
) -> Tensor:
    """Average Drop (Chattopadhay et al., Grad-CAM++, WACV 2018): ``max(0, Y - O) / Y`` per
    image, ``(B,)`` in [0, 1] (the paper's "%" is this times 100; torchcam's convention).
    ``Y``: the target's probability on the image, ``O``: on the image times the map. **Lower is
    better**; the paper's score is the batch mean. Options: ``batch_size=64``,
    ``additional_forward_args``."""

    def drop(clean: Tensor, masked: Tensor) -> Tensor:
        return (clean - masked).clamp_min(0) / clean.clamp_min(torch.finfo(clean.dtype).tiny)

    return _masked_confidence(model, x, maps, target, drop, **options)


def increase_in_confidence(
    model: nn.Module, x: Tensor, maps: Tensor, target: TargetSpec = None, **options: Any
) -> Tensor:
    """Increase in Confidence (Chattopadhay et al., Grad-CAM++, WACV 2018): ``1[O > Y]`` per
    image as a float ``(B,)`` (0 or 1; the batch mean is the paper's rate). **Higher is
    better.** Options as :func:`average_drop`."""
    return _masked_confidence(model, x, maps, target, lambda y, o: (o > y).float(), **options)

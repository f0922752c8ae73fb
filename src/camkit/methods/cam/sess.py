"""SESS: any CAM method applied to patches of the image at several scales, then fused."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchvision.transforms.functional import gaussian_blur

from camkit import registry
from camkit.core.call import Call
from camkit.core.copies import CopyScorer
from camkit.core.finish import Finishing
from camkit.core.inputs import boolean, finite_number, positive_int
from camkit.core.layers import LayerSpec
from camkit.errors import ArgumentError, EmptyMapWarning, InputError
from camkit.methods.cam.base import BaseCAM, RawMaps, WrapperCAM
from camkit.methods.cam.gradient import GradCAM
from camkit.registry import register
from camkit.targets.resolver import RowScorer

_Scale = tuple[tuple[int, int], list[tuple[int, int]]]  # resized size, window corners


def _starts(length: int, window: int, stride: int) -> list[int]:
    """Starts ``0, stride, ...`` and one flush with the end (the authors' ``sliding_window``)."""
    return [*range(0, length - window, stride), length - window]


@register("sess", "Tursun et al., ECCV 2022")
class SESS(WrapperCAM):
    """SESS: Saliency Enhancing with Scaling and Sliding.

    Tursun, Denman, Sridharan and Fookes, "SESS: Saliency Enhancing with Scaling and Sliding",
    ECCV 2022 (arXiv:2207.01769, code: github.com/neouyghur/SESS). The ``base`` CAM maps
    window-sized patches of the image at several scales, fused; shapes as every CAM's.

    1. Scaling: the image resized (bilinear) to each shorter side of ``scales`` (the longer
       side rounded down as torchvision's ``Resize(int)``).
    2. Sliding: ``window``-sized patches every ``stride`` pixels, plus a last one flush with
       the right and bottom edges.
    3. Pre-filtering: each patch scored without gradients (a class's softmax probability, as
       the authors' code, or a callable's score); the ``int(P * pre_filter_ratio)`` lowest of
       an image's ``P`` patches are dropped.
    4. Saliency extraction: the base method's finished map of each kept patch.
    5. Fusion: each patch map times its score over the image's best (0 for a score <= 0), in a
       zero canvas of its scale resized (bilinear) to the input; each pixel gets the mean of
       the canvas values above ``1e-6`` there, over all scales (the authors' ``mean_pool``,
       ``theta=0``).

    The top-1 target is the whole image's prediction; ``K`` targets run steps 3-5 per target.
    Per-sample ``additional_forward_args`` follow their sample's patches.

    Args (besides those of :class:`~camkit.methods.cam.base.BaseCAM`):
        base: any CAM class or its registry name; ``**options`` go to its constructor
            (``batch_size`` also bounds the patches scored per forward pass).
        scales: shorter-side sizes, each at least the window; default 6 from the window size up
            in steps of 64 (the authors' spacing; their code defaults to 12 such scales).
        window: patch size, an int or ``(h, w)``: the base model's input size.
        stride: step between patches, an int or ``(h, w)``; default the window.
        pre_filter_ratio: fraction of each image's patches dropped before mapping, in [0, 1).
        smooth: blur the fused map with an 11x11 Gaussian of sigma 5 (reflected borders), as
            the authors' code does by default; not part of the paper's fusion, so off.
    """

    def __init__(
        self,
        model: nn.Module,
        layer: LayerSpec | None = None,
        *,
        base: type[BaseCAM] | str = GradCAM,
        scales: Sequence[int] | None = None,
        window: int | tuple[int, int] = 224,
        stride: int | tuple[int, int] | None = None,
        pre_filter_ratio: float = 0.0,
        smooth: bool = False,
        **options: Any,
    ):
        if isinstance(base, str):
            base = registry.get(base).cls
        if not (isinstance(base, type) and issubclass(base, BaseCAM)) or base is SESS:
            raise ArgumentError(
                f"base must be a CAM class (or its registry name) such as GradCAM, got {base!r}"
            )
        super().__init__(model, layer, base=base, **options)
        self.window = _pair("window", window)
        self.stride = self.window if stride is None else _pair("stride", stride)
        if scales is None:
            scales = [max(self.window) + 64 * i for i in range(6)]  # the authors' spacing
        if isinstance(scales, int | str) or not isinstance(scales, Sequence) or not scales:
            raise ArgumentError(f"scales must be a non-empty list of sizes, got {scales!r}")
        self.scales = tuple(positive_int("scales", s) for s in scales)
        ratio = finite_number("pre_filter_ratio", pre_filter_ratio, minimum=0.0)
        if ratio >= 1:
            raise ArgumentError(
                f"pre_filter_ratio is the fraction of patches dropped, in [0, 1), got {ratio}"
            )
        self.pre_filter_ratio = ratio
        self.smooth = boolean("smooth", smooth)

    def raw_maps(self, batch: Tensor, scorer: RowScorer, call: Call) -> RawMaps:
        if batch.ndim != 4:
            raise InputError(f"SESS maps images (B, C, H, W), got shape {tuple(batch.shape)}")
        scorer = self.pinned(batch, scorer, call)  # the whole image's prediction
        grid = [self._scale(tuple(batch.shape[2:]), s) for s in self.scales]
        fused = self._fused(batch, call, scorer, grid, self._scores(batch, call, scorer, grid))
        if self.smooth:
            fused = _gaussian_blur(fused)
        return {"sess": fused}

    def _scale(self, size: tuple[int, int], scale: int) -> _Scale:
        """One scale: the resized image's size ``(H_s, W_s)`` and its window corners ``(y, x)``."""
        (h, w), (wh, ww), (sh, sw) = size, self.window, self.stride
        resized = (scale, int(scale * w / h)) if h <= w else (int(scale * h / w), scale)
        if resized[0] < wh or resized[1] < ww:
            raise ArgumentError(
                f"scale {scale} resizes the {h}x{w} input to {resized[0]}x{resized[1]}, smaller "
                f"than the {wh}x{ww} window: every scale must be at least the window size"
            )
        ys, xs = _starts(resized[0], wh, sh), _starts(resized[1], ww, sw)
        return resized, [(y, x) for y in ys for x in xs]

    def _patches(self, batch: Tensor, scale: _Scale) -> Tensor:
        """``(B, C, H, W) -> (B, P_s, C, h, w)``: the windows of the resized batch."""
        (size, corners), image = scale, batch
        if tuple(batch.shape[2:]) != size:
            image = F.interpolate(
                batch, size=size, mode="bilinear", align_corners=False, antialias=True
            )
        wh, ww = self.window
        return torch.stack([image[:, :, y : y + wh, x : x + ww] for y, x in corners], 1)

    def _scores(self, batch: Tensor, call: Call, scorer: RowScorer, grid: list[_Scale]) -> Tensor:
        """Every patch's target score ``(B, P, K)``, all scales in order."""
        size, parts = batch.shape[0], []
        copies = CopyScorer(
            self.model,
            batch,
            scorer,
            call,
            dtype=self.dtype,
            batch_size=self.batch_size,
            probabilities=True,
        )
        for scale in grid:
            patches = self._patches(batch, scale).flatten(0, 1)  # (B * P_s, C, h, w)
            count = patches.shape[0] // size
            samples = torch.arange(size, device=batch.device).repeat_interleave(count)
            scores = copies.over(patches.shape[0], lambda i, p=patches, s=samples: (p[i], s[i]))
            parts.append(scores.unflatten(0, (size, count)))
        return torch.cat(parts, dim=1)

    def _kept(self, scores: Tensor) -> Tensor:
        """``(B, P, K)`` bool: all but the ``int(P * ratio)`` lowest scores of each image and
        target (ties: the earlier patch ranks higher)."""
        total = scores.shape[1]
        rank = scores.argsort(dim=1, descending=True, stable=True).argsort(dim=1)
        return rank < total - int(total * self.pre_filter_ratio)

    def _fused(
        self, batch: Tensor, call: Call, scorer: RowScorer, grid: list[_Scale], scores: Tensor
    ) -> Tensor:
        """``(B, K, H, W)``: the per-pixel mean of the kept patches' calibrated positive maps."""
        best = scores.amax(dim=1, keepdim=True)
        weights = torch.where(best > 0, scores.relu() / best.clamp_min(1e-30), 0.0)
        kept = self._kept(scores)
        targets, out_size = weights.shape[2], tuple(batch.shape[2:])
        total = torch.zeros(batch.shape[0], targets, *out_size, device=batch.device)
        count = torch.zeros_like(total)
        offset = 0
        for size, corners in grid:
            patches = self._patches(batch, (size, corners))
            span = slice(offset, offset + patches.shape[1])
            offset = span.stop
            for k in range(targets):
                sample, patch = kept[:, span, k].nonzero(as_tuple=True)
                if sample.numel() == 0:
                    continue
                maps = self._patch_maps(patches[sample, patch], call, scorer, sample, k)
                maps = maps * weights[:, span, k][sample, patch].view(-1, 1, 1)
                canvas = maps.new_zeros(maps.shape[0], *size)
                for i, corner in enumerate(patch.tolist()):
                    y, x = corners[corner]
                    canvas[i, y : y + maps.shape[1], x : x + maps.shape[2]] = maps[i]
                if size != out_size:
                    canvas = F.interpolate(
                        canvas[:, None], size=out_size, mode="bilinear", align_corners=False
                    )[:, 0]
                positive = canvas > 1e-6  # the authors' theta = 0; float noise is not a vote
                total[:, k].index_add_(0, sample, torch.where(positive, canvas, 0.0))
                count[:, k].index_add_(0, sample, positive.float())
        return total / count.clamp_min(1)  # 0 where no canvas value counts

    def _patch_maps(
        self, patches: Tensor, call: Call, scorer: RowScorer, sample: Tensor, k: int
    ) -> Tensor:
        """The base method's finished maps ``(n, h, w)`` of ``patches`` for target ``k``."""
        target = scorer.target_of(sample, k)
        with warnings.catch_warnings():
            # a blank patch map is expected (a background patch); the fused map is checked
            warnings.simplefilter("ignore", EmptyMapWarning)
            following = call.following(sample, patches)
            maps = self.base.maps(patches, target, Finishing(), following)
        return maps[:, 0]  # the default finishing fuses several layers into one map

    def __repr__(self) -> str:
        return (
            f"SESS(base={type(self.base).__name__}, layers={self.capture.names}, "
            f"scales={self.scales}, window={self.window}, stride={self.stride}, "
            f"pre_filter_ratio={self.pre_filter_ratio})"
        )


def _pair(name: str, value: object) -> tuple[int, int]:
    """An int or ``(h, w)`` of positive ints, else :class:`ArgumentError`."""
    pair = value if isinstance(value, Sequence) and not isinstance(value, str) else (value, value)
    if len(pair) != 2:
        raise ArgumentError(f"{name} must be a positive int or (h, w), got {value!r}")
    return (positive_int(name, pair[0]), positive_int(name, pair[1]))


def _gaussian_blur(maps: Tensor, size: int = 11, sigma: float = 5.0) -> Tensor:
    """``(B, K, H, W)`` blurred with reflected borders (the authors' OpenCV ``GaussianBlur``);
    maps smaller than the kernel's reach are left as they are."""
    if min(maps.shape[-2:]) <= size // 2:
        return maps
    flat = gaussian_blur(maps.flatten(0, 1)[:, None], [size, size], [sigma, sigma])
    return flat[:, 0].unflatten(0, maps.shape[:2])


__all__ = ["SESS"]

"""The explorer's concept views (:mod:`camkit.methods.concepts`' public API, on the batcher's
model thread): an image's top channels for a class in the image, a clicked cell or a dragged box,
their shares, conditional heatmaps (Concept Relevance Propagation, Achtibat et al., Nature
Machine Intelligence 5, 2023) and reference patches; a channel's feature visualisation (Olah et
al., "Feature Visualization", Distill 2017); the concepts that dominate a strategies cluster."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from camkit import io, viz
from camkit.core.engine import batched_backward
from camkit.errors import ArgumentError
from camkit.methods.concepts import (
    ChannelObjective,
    ConceptAttribution,
    InRegion,
    feature_images,
    region_weights,
)
from camkit.runs.concepts import ConceptsRecord, channel_references
from camkit.serve.cache import LRU
from camkit.serve.explorer import Explorer
from camkit.viz.colour import DIVERGING_COLORMAP, signed_scale

MAX_K = 20
IMAGES_PER_PASS = 16  # a cluster's images per forward pass
FEATURE_STEPS = 64
FEATURE_RATE = 0.1  # a short run: twice feature_images' default step size
FEATURE_SEED = 0
FEATURE_SIDE = 128  # the largest side a feature visualisation is optimised at


@dataclass(frozen=True)
class Region:
    """Where relevance is counted: ``kind`` ``"image"``, ``"cell"`` (under a click) or ``"box"``
    (dragged); ``box``: ``(top, left, bottom, right)`` in input pixels (None: everywhere)."""

    kind: str
    box: tuple[int, int, int, int] | None = None

    def mask(self, size: tuple[int, int]) -> torch.Tensor | None:
        """The ``(H, W)`` boolean mask at the input's size (None: the whole image)."""
        if self.box is None:
            return None
        top, left, bottom, right = self.box
        mask = torch.zeros(size, dtype=torch.bool)
        mask[top:bottom, left:right] = True
        return mask


WHOLE = Region("image")


def layer_grid(shape: Sequence[int]) -> tuple[int, int]:
    """The ``(h, w)`` grid of a layer's shape: a map ``(1, C, h, w)``, a channels-last map
    ``(1, h, w, C)`` (Swin's stages) or tokens ``(1, N, C)`` on a square grid (a class or
    register token left out)."""
    if len(shape) == 3:
        side = max(math.isqrt(int(shape[1])), 1)
        return side, side
    if len(shape) == 4 and shape[1] == shape[2] != shape[3]:
        return int(shape[1]), int(shape[2])
    return int(shape[-2]), int(shape[-1])


def region_of(
    point: tuple[float, float] | None,
    box: tuple[float, float, float, float] | None,
    size: tuple[int, int],
    grid: tuple[int, int],
) -> Region:
    """A click ``point = (x, y)`` or a dragged ``box = (x0, y0, x1, y1)``, in fractions of the
    image's width and height -> the :class:`Region` in input pixels; a click selects the whole
    cell of the layer's ``grid`` under it."""
    height, width = size
    if point is not None and box is not None:
        raise ArgumentError("give a point (x, y) or a box, not both")
    values = point if point is not None else box
    if values is None:
        return WHOLE
    if not all(math.isfinite(v) and 0.0 <= v <= 1.0 for v in values):
        raise ArgumentError(
            f"x, y and box are fractions of the image's width and height in [0, 1], got {values}"
        )
    if point is not None:
        x, y = point
        row, column = min(int(y * grid[0]), grid[0] - 1), min(int(x * grid[1]), grid[1] - 1)
        top, bottom = round(row * height / grid[0]), round((row + 1) * height / grid[0])
        left, right = round(column * width / grid[1]), round((column + 1) * width / grid[1])
        kind = "cell"
    else:
        x0, y0, x1, y1 = box
        top, bottom = sorted((round(y0 * height), round(y1 * height)))
        left, right = sorted((round(x0 * width), round(x1 * width)))
        kind = "box"
    return Region(kind, (top, left, max(bottom, top + 1), max(right, left + 1)))


def check_k(k: int) -> int:
    """``k``, the number of concepts asked for, when in 1..:data:`MAX_K`."""
    if not 1 <= k <= MAX_K:
        raise ArgumentError(f"k must be between 1 and {MAX_K}, got {k}")
    return k


def concept_png(photo: np.ndarray, heat: np.ndarray, alpha: float) -> bytes:
    """A conditional heatmap over the model's view, PNG, coloured as :func:`viz.plot` colours."""
    shown, _ = signed_scale(heat)
    return io.encode_image(viz.overlay(photo, shown, alpha=alpha, colormap=DIVERGING_COLORMAP))


class ConceptViews:
    """The concept views of an explorer, with the served run's ``camkit concepts`` results."""

    def __init__(self, explorer: Explorer, references: ConceptsRecord | None = None) -> None:
        self.explorer = explorer
        self.references = references
        self.attributions = LRU(16)
        self.heatmaps = LRU(1024)  # (checkpoint, layer, image, class, channel) -> (H, W)
        self.features = LRU(64)
        self.dominants = LRU(64)

    def attribution(
        self, checkpoint: str, layer: str, *, images: bool = False
    ) -> ConceptAttribution:
        """The layer's :class:`~camkit.methods.concepts.ConceptAttribution` (cached): for
        :meth:`dominant` (``images``), :data:`IMAGES_PER_PASS` images a pass; else one condition
        at a time where the device runs vector-Jacobian products one by one (the CPU)."""
        self.images_only()
        one_by_one = not batched_backward(self.explorer.device)
        rows = IMAGES_PER_PASS if images else (1 if one_by_one else None)
        model = self.explorer.checkpoints[checkpoint].model
        return self.attributions.fetch(
            (checkpoint, layer, images), lambda: ConceptAttribution(model, layer, batch_size=rows)
        )

    def images_only(self) -> None:
        if self.explorer.clip_length is not None:
            raise ArgumentError(
                "the explorer's concepts are for images; explain a video's clips with "
                "camkit.methods.concepts.ConceptAttribution (heatmaps (B, K, T, H, W))"
            )

    def grid(self, layer: str) -> tuple[int, int]:
        self.images_only()
        return layer_grid(self.explorer.layer_shapes[layer])

    def top(
        self, checkpoint: str, layer: str, image: int, target: int, region: Region, k: int
    ) -> dict:
        """The ``k`` most relevant channels of ``layer`` for class ``target`` in ``region``,
        with their reference images: one forward and one backward to the layer. Each channel's
        conditional heatmap is one more backward, made when the page asks (:meth:`heatmap`)."""
        check_k(k)
        concepts = self.attribution(checkpoint, layer)
        x = self.explorer.batch([image], checkpoint)
        mask = region.mask(self.explorer.size)
        target_row = torch.tensor([target], device=x.device)
        found = concepts.top(x, k=k, target=target_row, region=mask, heatmaps=False)
        return {
            "layer": layer,
            "class": target,
            "size": list(self.explorer.size),
            "region": dataclasses.asdict(region),
            "concepts": self.rows(layer, found.channels[0], found.relevance[0], found.share[0]),
            "references": self.references is not None and self.references.layer == layer,
        }

    def rows(self, layer: str, channels: Tensor, relevance: Tensor, share: Tensor) -> list[dict]:
        """The page's rows of channels with their relevance, share and reference patches."""
        return [
            {
                "channel": channel,
                "relevance": float(value),
                "share": float(part),
                "references": channel_references(self.references, layer, channel),
                "no_references": self.why_no_references(layer, channel),
            }
            for channel, value, part in zip(channels.tolist(), relevance, share, strict=True)
        ]

    def why_no_references(self, layer: str, channel: int) -> str | None:
        """Why ``channel`` has no reference patches although the run's ``camkit concepts``
        results are of ``layer`` (they hold the ``--channels`` told or the most relevant ones);
        None where it has them, or the results are of another layer or absent."""
        found = self.references
        if found is None or found.layer != layer or channel in found.channels:
            return None
        listed = sorted(found.channels)
        shown = ", ".join(map(str, listed[:8])) + (", ..." if len(listed) > 8 else "")
        told = "--channels" in ((found.run or {}).get("arguments") or [])
        which = "the channels its --channels named" if told else "the most relevant ones"
        over = f" over {found.images} images" if found.images and not told else ""
        return (
            f"channel {channel} has no reference patches: camkit concepts wrote them for "
            f"{len(listed)} channel(s) of {layer} only, {which}{over} ({shown}); its "
            "--channels option picks others"
        )

    def heatmap(
        self,
        checkpoint: str,
        layer: str,
        image: int,
        target: int,
        channel: int,
        region: Region = WHOLE,
    ) -> np.ndarray:
        """``(H, W)`` conditional heatmap of one channel (cached), of its relevance in
        ``region`` only (:class:`~camkit.methods.concepts.InRegion`, weighed as :meth:`top`
        counts the region) when one is given."""

        def make() -> np.ndarray:
            x = self.explorer.batch([image], checkpoint)
            mask = region.mask(self.explorer.size)
            concept = (
                channel
                if mask is None
                else InRegion(channel, region_weights(mask, self.grid(layer), x))
            )
            maps = self.attribution(checkpoint, layer).heatmaps(
                x, [concept], torch.tensor([target], device=x.device)
            )
            return maps[0, 0].float().cpu().numpy()

        return self.heatmaps.fetch((checkpoint, layer, image, target, channel, region), make)

    def feature(self, checkpoint: str, layer: str, channel: int) -> tuple[np.ndarray, bool]:
        """``(H, W, 3)`` uint8: the image that maximises the channel's mean activation
        (:data:`FEATURE_STEPS` Adam steps of rate :data:`FEATURE_RATE` from seed
        :data:`FEATURE_SEED`; cached), and whether its objective moved from its grey start."""

        def make() -> tuple[np.ndarray, bool]:
            side = min(max(self.explorer.size), FEATURE_SIDE)
            result = feature_images(
                self.explorer.checkpoints[checkpoint].model,
                ChannelObjective(layer, channel),
                size=side,
                steps=FEATURE_STEPS,
                lr=FEATURE_RATE,
                seed=FEATURE_SEED,
                mean=self.explorer.preprocess.mean,
                std=self.explorer.preprocess.std,
            )
            pixels = result.images[0].permute(1, 2, 0).clamp(0, 1) * 255
            return pixels.round().byte().cpu().numpy(), bool(result.moved.all())

        return self.features.fetch((checkpoint, layer, channel), make)

    def dominant(
        self, checkpoint: str, layer: str, images: Sequence[int], target: int, k: int
    ) -> list[dict]:
        """The ``k`` channels that dominate ``images`` for class ``target`` (mean shares)."""

        def make() -> list[dict]:
            if not images:
                raise ArgumentError("the cluster has no image in this gallery")
            x = self.explorer.batch(list(images), checkpoint)
            target_rows = torch.full((len(images),), target, device=x.device)
            attribution = self.attribution(checkpoint, layer, images=True)
            top = attribution.dominant(x, k=k, target=target_rows)
            return self.rows(layer, top.channels, top.relevance, top.share)

        return self.dominants.fetch((checkpoint, layer, tuple(images), target, k), make)

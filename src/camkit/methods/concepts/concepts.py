"""What a concept is: a linear selection of a layer's channels, applied to the gradient.

Concept Relevance Propagation (Achtibat et al., "From attribution maps to human-understandable
explanations through Concept Relevance Propagation", Nature Machine Intelligence 5, 2023)
conditions the backward pass on a concept by masking the gradient at the concept's layer. A
concept is a linear map ``P`` over the channel axis at every position (:meth:`Concept.project`),
so the conditional backward stays linear: concepts whose maps sum to the identity give
conditional heatmaps that sum to the unconditional one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from camkit.errors import ArgumentError


class Concept:
    """Base of the concepts: a linear map over a layer's channels (:meth:`project`)."""

    def project(self, grad: Tensor) -> Tensor:
        """``(n, C, ...) -> (n, C, ...)``: the concept's part of the gradient."""
        raise NotImplementedError

    def check(self, channels: int) -> None:
        """Raise :class:`~camkit.errors.ArgumentError` unless it fits ``channels`` channels."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class Channels(Concept):
    """A channel (``Channels(7)``) or a group (``Channels([3, 7, 9])``), zennit-crp's
    ``ChannelConcept``: ``P g = g * 1[c in group]``."""

    def __init__(self, channels: int | Sequence[int]):
        group = [channels] if isinstance(channels, int) else list(channels)
        if not group or not all(isinstance(c, int) and not isinstance(c, bool) for c in group):
            raise ArgumentError(
                f"a Channels concept needs a channel index or a non-empty list of them, "
                f"got {channels!r}"
            )
        if len(set(group)) != len(group):
            raise ArgumentError(f"the channel group {group} lists a channel twice")
        self.channels = tuple(group)

    def check(self, channels: int) -> None:
        bad = [c for c in self.channels if not 0 <= c < channels]
        if bad:
            raise ArgumentError(
                f"channel(s) {bad} out of range: the layer has {channels} channels "
                f"(0..{channels - 1})"
            )

    def project(self, grad: Tensor) -> Tensor:
        mask = grad.new_zeros(grad.shape[1])
        mask[list(self.channels)] = 1
        return grad * mask.view(-1, *([1] * (grad.ndim - 2)))

    def __repr__(self) -> str:
        inner = self.channels[0] if len(self.channels) == 1 else list(self.channels)
        return f"Channels({inner})"


class Direction(Concept):
    """A direction ``v (C,)`` of the layer's channel space (a linear probe's weights): ``P g =
    v (v . g) / |v|^2`` at every position."""

    def __init__(self, vector: Tensor | Sequence[float]):
        v = torch.as_tensor(vector)
        if v.ndim != 1 or v.dtype == torch.bool or v.is_complex():
            raise ArgumentError(
                "a Direction needs a real 1-D vector over the layer's channels, got "
                f"{v.dtype} of shape {tuple(v.shape)}"
            )
        v = v.double() if v.dtype == torch.float64 else v.float()
        norm = torch.linalg.vector_norm(v)
        if not torch.isfinite(v).all() or norm == 0:
            raise ArgumentError("a Direction's vector must be finite and not zero")
        self.vector = v / norm

    def check(self, channels: int) -> None:
        if self.vector.shape[0] != channels:
            raise ArgumentError(
                f"the direction has {self.vector.shape[0]} entries but the layer has "
                f"{channels} channels"
            )

    def project(self, grad: Tensor) -> Tensor:
        v = self.vector.to(grad).view(-1, *([1] * (grad.ndim - 2)))
        return v * (grad * v).sum(dim=1, keepdim=True)

    def __repr__(self) -> str:
        return f"Direction({self.vector.shape[0]} channels)"


class InRegion(Concept):
    """A concept counted inside a region of the layer's grid only (CRP's "Local analysis",
    Achtibat et al. 2023): ``P g = w * P_concept g``, ``weights`` ``(h, w)`` or ``(B, 1, h,
    w)`` in ``[0, 1]`` at the layer's grid (:func:`~camkit.methods.concepts.region_weights`).
    On tokens ``(n, C, N)`` the last ``h * w`` tokens are the grid's (prefix tokens weighed 0)."""

    def __init__(self, concept: ConceptSpec, weights: Tensor):
        self.concept = as_concept(concept)
        w = torch.as_tensor(weights, dtype=torch.float32)
        w = w.view(1, 1, *w.shape) if w.ndim == 2 else w
        if w.ndim != 4 or w.shape[1] != 1:
            raise ArgumentError(
                f"InRegion weights are (h, w) or (B, 1, h, w) at the layer's grid, got "
                f"{tuple(w.shape)}"
            )
        if not torch.isfinite(w).all() or w.min() < 0 or w.max() > 1:
            raise ArgumentError("InRegion weights must lie in [0, 1] (a mask)")
        self.weights = w

    def check(self, channels: int) -> None:
        self.concept.check(channels)

    def project(self, grad: Tensor) -> Tensor:
        w = self.weights.to(grad)
        grid = tuple(w.shape[2:])
        if grad.ndim == 3 and grad.shape[2] >= w.shape[2] * w.shape[3]:  # tokens
            w = F.pad(w.flatten(2), (grad.shape[2] - grid[0] * grid[1], 0))
        elif tuple(grad.shape[2:]) != grid:
            raise ArgumentError(
                f"the region's weights are for a {grid} grid; the layer's positions are "
                f"{tuple(grad.shape[2:])}"
            )
        return self.concept.project(grad) * w

    def __repr__(self) -> str:
        return f"InRegion({self.concept!r}, {tuple(self.weights.shape[2:])} grid)"


ConceptSpec = int | Sequence[int] | Concept
Mask = Callable[[Tensor], Tensor]  # a gradient (n, C, ...), channels on axis 1 -> same


def sample_channels(channels: Tensor) -> Mask:
    """Keep channel ``channels[b]`` of sample ``b``: ``(B, C, ...) -> (B, C, ...)``."""

    def mask(grad: Tensor) -> Tensor:
        keep = F.one_hot(channels.to(grad.device), grad.shape[1]).to(grad.dtype)
        return grad * keep.view(*keep.shape, *([1] * (grad.ndim - 2)))

    return mask


def abs_norm(scores: Tensor) -> Tensor:
    """zennit-crp's ``abs_norm`` over the channels: ``x / (|x|.sum(1) + 1e-10)``."""
    return scores / (scores.abs().sum(dim=1, keepdim=True) + 1e-10)


@dataclass(frozen=True)
class TopConcepts:
    """The ``k`` most relevant channels of a layer per sample (:meth:`ConceptAttribution.top`).

    Attributes:
        layer: the layer's name.
        channels: ``(B, k)`` channel indices, most relevant first.
        relevance: ``(B, k)`` their relevance (inside the region, when one was given).
        share: ``(B, k)`` relevance divided by the sum of the absolute relevances of all the
            layer's channels (zennit-crp's ``abs_norm``).
        heatmaps: ``(B, k, H, W)`` their conditional heatmaps, or None when not asked.
        classes: ``(B,)`` the explained classes, None for a callable target.
    """

    layer: str
    channels: Tensor
    relevance: Tensor
    share: Tensor
    heatmaps: Tensor | None
    classes: Tensor | None


def as_concept(spec: object) -> Concept:
    """A concept from a channel index, a list of channels (one group) or a :class:`Concept`."""
    if isinstance(spec, Concept):
        return spec
    if isinstance(spec, int | Sequence) and not isinstance(spec, str | bool):
        return Channels(spec)
    raise ArgumentError(
        f"a concept is a channel index, a list of channels or a camkit.methods.concepts.Concept, "
        f"got {type(spec).__name__}"
    )


def as_concepts(specs: object) -> list[Concept]:
    """A list of concepts: one spec or a list of them; ``range(C)``: every channel."""
    if isinstance(specs, Concept | int) and not isinstance(specs, bool):
        return [as_concept(specs)]
    if isinstance(specs, Tensor):
        specs = specs.tolist()
    if isinstance(specs, Sequence | range) and not isinstance(specs, str) and len(specs) > 0:
        return [as_concept(spec) for spec in specs]
    raise ArgumentError(
        f"concepts must be a channel index, a concept, or a non-empty list of them, got {specs!r}"
    )


def region_weights(region: object, grid: tuple[int, ...], like: Tensor) -> Tensor:
    """``(B, 1, *grid)`` weights of a region mask at the input's size (each cell: its share
    inside the region) or at the layer grid's."""
    if not isinstance(region, Tensor):
        raise ArgumentError(f"region must be a mask tensor (H, W) or (B, H, W), got {region!r}")
    size, batch, dims = tuple(like.shape[2:]), like.shape[0], len(grid)
    r = region.to(like.device, torch.float32)
    if r.ndim == dims:
        r = r.expand(batch, *r.shape)
    if r.ndim != dims + 1 or r.shape[0] != batch or tuple(r.shape[1:]) not in (size, grid):
        raise ArgumentError(
            f"region has shape {tuple(region.shape)}; expected a mask of the input's size "
            f"{size} or of the layer grid's {grid}, alone or with the batch's {batch} first"
        )
    if not torch.isfinite(r).all() or r.min() < 0 or r.max() > 1:
        raise ArgumentError("region must hold weights in [0, 1] (a boolean mask)")
    r = r.unsqueeze(1)
    return r if tuple(r.shape[2:]) == grid else F.interpolate(r, size=grid, mode="area")


__all__ = [
    "Channels",
    "Concept",
    "ConceptSpec",
    "Direction",
    "InRegion",
    "Mask",
    "TopConcepts",
    "abs_norm",
    "as_concept",
    "as_concepts",
    "region_weights",
    "sample_channels",
]

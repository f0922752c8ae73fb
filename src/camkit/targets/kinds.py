"""Target objects for outputs other than one logit vector: each is a callable on the model's
whole output returning ``(B,)`` scores (``(B, K)`` for ``K`` maps per sample) that checks the
output's structure and says what it expected. A class's logit or probability, a segmentation
mask's logits, a span of frames, a reference embedding's cosine; detections are
:class:`~camkit.targets.boxes.BoxTarget`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from camkit.errors import OutputError, TargetError
from camkit.targets.base import Target
from camkit.targets.outputs import OutputSelector, describe, field, select_output, target_logits
from camkit.targets.resolver import resolve

ClassSpec = int | Sequence[int] | Sequence[Sequence[int]] | Tensor


class ClassTarget(Target):
    """The logit of a class: ``logits (B, N) -> (B,)``, or ``(B, K)`` for K classes per sample.

    ``idx``: an int (every sample), ``B`` ints or a ``(B,)`` tensor (one per sample), or ``B``
    lists of ``K`` ints / a ``(B, K)`` tensor. The score is the logit before softmax, as in the
    Grad-CAM paper (Selvaraju et al., ICCV 2017, eq. 1).
    """

    def __init__(self, idx: ClassSpec):
        self.idx = idx

    def classes(self) -> ClassSpec:
        """The class indices: methods and metrics read them as data (exactly as ``idx``)."""
        return self.idx

    def __call__(self, output: Any) -> Tensor:
        hint = "for dense outputs use SegmentationTarget, for embeddings EmbeddingTarget"
        logits = target_logits(output, type(self).__name__, "(B, num_classes)", hint)
        scorer = resolve(self, logits.shape[0], logits.device)  # softmax when probability
        scores = scorer(logits, torch.arange(logits.shape[0]))
        return scores if scorer.several else scores[:, 0]


class SoftmaxTarget(ClassTarget):
    """The softmax probability of a class: ``logits (B, N) -> softmax(logits)[idx]`` ``(B,)``
    (or ``(B, K)``). Unlike the logit, it also falls when other classes rise (the paper's
    discussion of why Grad-CAM uses the logit, Selvaraju et al. 2017, sec. 3)."""

    probability = True


def _dense_logits(output: Any) -> Tensor:
    keys = ("out", "logits")  # torchvision's dict, HuggingFace's segmentation outputs
    found = (value for key in keys if isinstance(value := field(output, key), Tensor))
    picked = next(found, output)
    if not isinstance(picked, Tensor) or picked.ndim not in (4, 5):
        raise TargetError(
            "SegmentationTarget needs (B, K, H, W) or (B, K, D, H, W) logits, a dict with 'out' "
            f"(torchvision) or a dict or object with 'logits', got {describe(picked)}"
        )
    return picked


class SegmentationTarget(Target):
    """Sum of category ``category``'s logits inside a boolean pixel mask: ``(B, K, H, W) ->
    (B,)``, volumes ``(B, K, D, H, W)`` likewise (Vinogradova et al., "Towards interpretable
    semantic segmentation via gradient-weighted class activation mapping", AAAI 2020;
    pytorch-grad-cam's ``SemanticSegmentationTarget``). Outputs: a tensor, a torchvision dict
    ``{"out": ...}`` or an object/dict with ``logits``.

    ``mask``: ``([B,] H, W)`` or ``([B,] D, H, W)``, bool or 0/1, None for the whole image; one
    of another size than the logits (drawn on the input) is resized to their grid by nearest
    neighbour (pixel centres, ``nearest-exact``).
    """

    def __init__(self, category: int, mask: Tensor | None = None):
        if isinstance(category, bool) or not isinstance(category, int):
            raise TargetError(f"category must be an int, got {type(category).__name__}")
        if mask is not None:
            mask = torch.as_tensor(mask)
            if mask.dtype != torch.bool:
                if mask.is_complex() or not torch.all((mask == 0) | (mask == 1)):
                    raise TargetError("mask must be boolean (or hold only 0 and 1)")
                mask = mask.bool()
            if mask.ndim not in (2, 3, 4):
                raise TargetError(
                    f"mask must be (H, W), (B, H, W), (D, H, W) or (B, D, H, W), "
                    f"got {tuple(mask.shape)}"
                )
            if not mask.any():
                raise TargetError("the mask selects no pixel: the score would be 0, the map blank")
        self.category = category
        self.mask = mask

    def __call__(self, output: Any) -> Tensor:
        logits = _dense_logits(output)
        batch, classes, *grid = logits.shape
        if not 0 <= self.category < classes:
            raise TargetError(
                f"category {self.category} is out of range: the output has {classes} "
                f"categories (0..{classes - 1})"
            )
        plane = logits[:, self.category]
        if self.mask is not None:
            plane = plane * self._fitted(self.mask.to(plane.device), batch, tuple(grid))
        return plane.sum(dim=tuple(range(1, plane.ndim)))

    @staticmethod
    def _fitted(mask: Tensor, batch: int, grid: tuple[int, ...]) -> Tensor:
        """The mask ``(B or 1, *grid)``, resized to the logits' grid (nearest) where needed."""
        per_sample = mask.ndim == len(grid) + 1
        if mask.ndim not in (len(grid), len(grid) + 1) or (per_sample and mask.shape[0] != batch):
            dims = ", ".join(map(str, grid))
            raise TargetError(
                f"the mask has shape {tuple(mask.shape)} but the output's grid is ({dims}) for "
                f"a batch of {batch}: give ({dims}) or ({batch}, {dims}) (any size: it is "
                "resized to the logits' grid)"
            )
        mask = mask if per_sample else mask[None]
        if tuple(mask.shape[1:]) != grid:
            resized = F.interpolate(mask[:, None].float(), size=grid, mode="nearest-exact")
            mask = resized[:, 0] > 0.5
        if not mask.flatten(1).any(dim=1).all():
            raise TargetError(
                "the mask selects no pixel of the logits' grid for some samples (too small to "
                "survive the resizing, or empty): their maps would be 0"
            )
        return mask


class FrameSpanTarget(Target):
    """The mean of class ``category``'s logits over frames ``start <= t < stop`` of per-frame
    logits ``(B, T, K) -> (B,)``: explains a prediction over a span of frames (the frames
    outside the span do not count, so a frame-wise model's map is blank there). Outputs: a
    tensor or a dict / object with ``logits``."""

    def __init__(self, category: int, start: int, stop: int):
        values = (category, start, stop)
        if any(isinstance(v, bool) or not isinstance(v, int) for v in values):
            raise TargetError(f"category, start and stop must be ints, got {values!r}")
        if not 0 <= start < stop:
            raise TargetError(f"expected 0 <= start < stop, got start={start}, stop={stop}")
        self.category, self.start, self.stop = category, start, stop

    def __call__(self, output: Any) -> Tensor:
        logits = select_output(output)
        if logits.ndim != 3:
            raise TargetError(
                f"FrameSpanTarget needs per-frame logits (B, T, K), got {describe(output)}"
            )
        _, frames, classes = logits.shape
        if self.stop > frames or not 0 <= self.category < classes:
            raise TargetError(
                f"frames {self.start}..{self.stop - 1} of class {self.category} do not fit "
                f"per-frame logits of {frames} frames and {classes} classes"
            )
        return logits[:, self.start : self.stop, self.category].mean(dim=1)


class EmbeddingTarget(Target):
    """Cosine similarity to a reference embedding ``(D,)`` or ``(B, D)``: ``(B, D) -> (B,)``,
    for re-identification and CLIP-style image towers. The embedding: ``output=`` (a key,
    attribute, index or callable, as the methods' ``output=``), else a ``(B, D)`` tensor (or
    ``(B, D, 1, 1)`` pooled maps), else the first of ``image_embeds`` (CLIP), ``pooler_output``
    (HuggingFace ViT / ConvNeXt / DINOv2), ``embeddings`` on a dict or object, else its
    ``logits`` or first element.
    """

    def __init__(self, reference: Tensor, output: OutputSelector = None):
        reference = torch.as_tensor(reference)
        if not reference.is_floating_point() or reference.ndim not in (1, 2):
            raise TargetError("reference must be a float (D,) or (B, D) embedding")
        if not torch.isfinite(reference).all() or (reference.norm(dim=-1) == 0).any():
            raise TargetError("reference must be finite and non-zero (cosine needs a direction)")
        self.reference = reference
        self.output = output

    def _embedding(self, output: Any) -> Tensor:
        keys = ("image_embeds", "pooler_output", "embeddings")
        found = (value for key in keys if isinstance(value := field(output, key), Tensor))
        try:
            if self.output is None and (embedding := next(found, None)) is not None:
                return embedding
            return select_output(output, self.output)
        except OutputError as err:
            raise TargetError(
                f"EmbeddingTarget(output={self.output!r}) needs (B, D) embeddings, got "
                f"{describe(output)} ({err}); pass output= the key or a callable that picks them"
            ) from None

    def __call__(self, output: Any) -> Tensor:
        embedding = self._embedding(output)
        if embedding.ndim == 4 and embedding.shape[2:] == (1, 1):
            embedding = embedding.flatten(1)
        reference = self.reference.to(embedding.device, embedding.dtype)
        if embedding.ndim != 2 or embedding.shape[1] != reference.shape[-1]:
            raise TargetError(
                f"EmbeddingTarget needs (B, {reference.shape[-1]}) embeddings like its "
                f"reference, got shape {tuple(embedding.shape)}"
            )
        if reference.ndim == 2 and reference.shape[0] != embedding.shape[0]:
            raise TargetError(
                f"the reference has {reference.shape[0]} rows but the batch has "
                f"{embedding.shape[0]} samples: give (D,) or (B, D)"
            )
        return F.cosine_similarity(embedding, reference.expand_as(embedding), dim=1, eps=1e-8)


__all__ = [
    "ClassTarget",
    "EmbeddingTarget",
    "SegmentationTarget",
    "SoftmaxTarget",
]

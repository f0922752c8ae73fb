"""Target objects: what score a map explains, for outputs other than one logit vector.

Each target is a callable ``output -> scores`` on the model's whole output (a tensor, a dict, a
list of detections) returning ``(B,)`` scores, or ``(B, K)`` for ``K`` maps per sample; so each
works wherever camkit accepts a callable target. Every target checks the output's structure and
says what it expected.

* :class:`ClassTarget` / :class:`SoftmaxTarget`: a class's logit (as in Grad-CAM, Selvaraju et
  al., ICCV 2017) or its softmax probability;
* :class:`SegmentationTarget`: the sum of a category's logits inside a pixel mask (the
  semantic-segmentation Grad-CAM of Vinogradova et al., AAAI 2020; pytorch-grad-cam's
  ``SemanticSegmentationTarget``);
* :class:`BoxTarget`: a detector's score for the detection that best matches a given box and
  label (pytorch-grad-cam's ``FasterRCNNBoxScoreTarget`` without its IoU term);
* :class:`EmbeddingTarget`: cosine similarity to a reference embedding (the "similarity to
  concept" target used for re-identification and CLIP-style towers).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torchvision.ops import box_iou

from camkit.core.targets import Target, resolve, select_output
from camkit.errors import OutputError, TargetError

ClassSpec = int | Sequence[int] | Sequence[Sequence[int]] | Tensor


def _describe(output: object) -> str:
    if isinstance(output, Tensor):
        return f"a tensor of shape {tuple(output.shape)}"
    if isinstance(output, Mapping):
        return f"a {type(output).__name__} with keys {list(output)}"
    if isinstance(output, list | tuple):
        items = type(output[0]).__name__ if output else "items"
        return f"a {type(output).__name__} of {len(output)} {items}"
    return type(output).__name__


def _logits(output: Any, who: str) -> Tensor:
    try:
        logits = select_output(output)
    except OutputError as err:
        raise TargetError(
            f"{who} needs (B, num_classes) logits (a tensor, a dict or object with 'logits', or a "
            f"tuple starting with them), got {_describe(output)}: {err}"
        ) from None
    if logits.ndim != 2:
        raise TargetError(
            f"{who} needs (B, num_classes) logits, got shape {tuple(logits.shape)}; for dense "
            "outputs use SegmentationTarget, for embeddings EmbeddingTarget"
        )
    return logits


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

    def _scores(self, logits: Tensor) -> Tensor:
        scorer = resolve(self.idx, logits.shape[0], logits.device)
        scores, several = scorer(logits, torch.arange(logits.shape[0]))
        return scores if several else scores[:, 0]

    def __call__(self, output: Any) -> Tensor:
        return self._scores(_logits(output, type(self).__name__))


class SoftmaxTarget(ClassTarget):
    """The softmax probability of a class: ``logits (B, N) -> softmax(logits)[idx]`` ``(B,)``
    (or ``(B, K)``). Unlike the logit, it also falls when other classes rise (the paper's
    discussion of why Grad-CAM uses the logit, Selvaraju et al. 2017, sec. 3)."""

    probability = True

    def __call__(self, output: Any) -> Tensor:
        logits = _logits(output, type(self).__name__)
        return self._scores(logits.softmax(dim=1))


def _dense_logits(output: Any) -> Tensor:
    picked = output
    if isinstance(output, Mapping):
        key = "out" if "out" in output else "logits" if "logits" in output else None
        if key is None:
            raise TargetError(
                f"SegmentationTarget needs (B, K, H, W) logits or a dict with 'out' (torchvision) "
                f"or 'logits', got {_describe(output)}"
            )
        picked = output[key]
    elif not isinstance(output, Tensor) and isinstance(getattr(output, "logits", None), Tensor):
        picked = output.logits  # HuggingFace segmentation outputs
    if not isinstance(picked, Tensor) or picked.ndim != 4:
        raise TargetError(
            f"SegmentationTarget needs (B, K, H, W) logits or a dict with 'out', got "
            f"{_describe(picked)}"
        )
    return picked


class SegmentationTarget(Target):
    """Sum of category ``category``'s logits inside a boolean pixel mask: ``(B, K, H, W) ->
    (B,)`` (Vinogradova et al., "Towards interpretable semantic segmentation via gradient-
    weighted class activation mapping", AAAI 2020).

    ``mask``: ``(H, W)`` for every sample or ``(B, H, W)``, bool (or 0/1) on the output's pixel
    grid; None means the whole image. Outputs: a ``(B, K, H, W)`` tensor, a torchvision dict
    ``{"out": ...}`` or an object/dict with ``logits``.
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
            if mask.ndim not in (2, 3):
                raise TargetError(f"mask must be (H, W) or (B, H, W), got {tuple(mask.shape)}")
            if not mask.any():
                raise TargetError("the mask selects no pixel: the score would be 0, the map blank")
        self.category = category
        self.mask = mask

    def __call__(self, output: Any) -> Tensor:
        logits = _dense_logits(output)
        batch, classes, height, width = logits.shape
        if not 0 <= self.category < classes:
            raise TargetError(
                f"category {self.category} is out of range: the output has {classes} "
                f"categories (0..{classes - 1})"
            )
        plane = logits[:, self.category]
        if self.mask is None:
            return plane.sum(dim=(1, 2))
        mask = self.mask.to(plane.device)
        if mask.shape[-2:] != (height, width) or (mask.ndim == 3 and mask.shape[0] != batch):
            raise TargetError(
                f"the mask has shape {tuple(mask.shape)} but the output's pixel grid is "
                f"({height}, {width}) for a batch of {batch}: give (H, W) or (B, H, W) = "
                f"({batch}, {height}, {width})"
            )
        if mask.ndim == 3 and not mask.flatten(1).any(dim=1).all():
            raise TargetError("the mask selects no pixel for some samples: their maps would be 0")
        return (plane * mask).sum(dim=(1, 2))


def _detections(output: Any) -> list[Mapping[str, Tensor]]:
    expected = (
        "a detector's list of B dicts with 'boxes' (N, 4), 'labels' (N,) and 'scores' (N,) "
        "(torchvision Faster R-CNN / RetinaNet / FCOS / SSD in eval mode)"
    )
    if not isinstance(output, list | tuple) or not output:
        raise TargetError(f"BoxTarget needs {expected}, got {_describe(output)}")
    for i, found in enumerate(output):
        if not isinstance(found, Mapping) or not {"boxes", "labels", "scores"} <= set(found):
            raise TargetError(f"BoxTarget needs {expected}; item {i} is {_describe(found)}")
        boxes = found["boxes"]
        if not isinstance(boxes, Tensor) or boxes.ndim != 2 or boxes.shape[1] != 4:
            raise TargetError(f"detection {i}: 'boxes' must be (N, 4), got {_describe(boxes)}")
    return list(output)


class BoxTarget(Target):
    """A detector's score for each given box: ``detections -> (B,)``, or ``(B, M)`` for M boxes.

    For each given box and label, among the sample's detections with that label and
    IoU >= ``iou_threshold`` the one with the highest IoU is chosen and its score returned
    (pytorch-grad-cam's ``FasterRCNNBoxScoreTarget`` sums the IoU and the score; camkit keeps the
    score alone, the model's confidence, so the map explains the detection's class score).
    When no detection matches, :class:`TargetError` names the best IoU found.

    ``labels``: an int (one box ``(4,)``) or ``M`` ints (boxes ``(M, 4)``), ``x1, y1, x2, y2``
    in the input's pixels; the same boxes are looked for in every sample of the batch.
    """

    def __init__(
        self,
        labels: int | Sequence[int] | Tensor,
        boxes: Sequence[float] | Sequence[Sequence[float]] | Tensor,
        iou_threshold: float = 0.5,
    ):
        self.several = not (
            isinstance(labels, int) or (isinstance(labels, Tensor) and labels.ndim == 0)
        )
        label_tensor = torch.as_tensor(labels).reshape(-1)
        box_tensor = torch.as_tensor(boxes, dtype=torch.float32)
        box_tensor = box_tensor.reshape(1, 4) if box_tensor.shape == (4,) else box_tensor
        if label_tensor.is_floating_point() or label_tensor.numel() == 0:
            raise TargetError("labels must be an int or a non-empty sequence of ints")
        if box_tensor.ndim != 2 or box_tensor.shape != (label_tensor.numel(), 4):
            raise TargetError(
                f"boxes must be (M, 4) (x1, y1, x2, y2) for M = {label_tensor.numel()} labels, "
                f"got shape {tuple(box_tensor.shape)}"
            )
        if not (box_tensor[:, 2:] > box_tensor[:, :2]).all():
            raise TargetError("each box must have x2 > x1 and y2 > y1")
        if not 0 < iou_threshold <= 1:
            raise TargetError(f"iou_threshold must be in (0, 1], got {iou_threshold}")
        self.labels = label_tensor.long()
        self.boxes = box_tensor
        self.iou_threshold = float(iou_threshold)

    def __call__(self, output: Any) -> Tensor:
        rows = []
        for sample, found in enumerate(_detections(output)):
            boxes, labels, scores = found["boxes"], found["labels"], found["scores"]
            wanted = self.boxes.to(boxes.device, boxes.dtype)
            ious = (
                box_iou(wanted, boxes.detach()) if len(boxes) else boxes.new_zeros(len(wanted), 0)
            )
            same = labels.to(self.labels.device)[None, :] == self.labels[:, None]
            ious = ious.where(same.to(ious.device), ious.new_tensor(-1.0))
            picked = []
            for m in range(len(wanted)):
                best = int(ious[m].argmax()) if ious.shape[1] else -1
                iou = float(ious[m, best]) if best >= 0 else -1.0
                if iou < self.iou_threshold:
                    raise TargetError(
                        f"sample {sample}: no detection of label {int(self.labels[m])} overlaps "
                        f"box {self.boxes[m].tolist()} with IoU >= {self.iou_threshold} "
                        f"(best IoU among the {int(same[m].sum())} detections of that label: "
                        f"{max(iou, 0.0):.2f}; {len(boxes)} detections in all)"
                    )
                picked.append(scores[best])
            rows.append(torch.stack(picked))
        result = torch.stack(rows)
        return result if self.several else result[:, 0]


class EmbeddingTarget(Target):
    """Cosine similarity to a reference embedding: ``(B, D) -> (B,)``.

    ``reference``: ``(D,)`` for every sample or ``(B, D)``; the output is a ``(B, D)`` tensor (or
    ``(B, D, 1, 1)`` pooled maps, flattened), a dict/object with ``logits``/``image_embeds``,
    or a tuple starting with it. Re-identification and CLIP-style image towers.
    """

    def __init__(self, reference: Tensor):
        reference = torch.as_tensor(reference)
        if not reference.is_floating_point() or reference.ndim not in (1, 2):
            raise TargetError("reference must be a float (D,) or (B, D) embedding")
        if not torch.isfinite(reference).all() or (reference.norm(dim=-1) == 0).any():
            raise TargetError("reference must be finite and non-zero (cosine needs a direction)")
        self.reference = reference

    def __call__(self, output: Any) -> Tensor:
        embedding = output
        if isinstance(output, Mapping) and "image_embeds" in output:
            embedding = output["image_embeds"]
        elif not isinstance(output, Tensor) and hasattr(output, "image_embeds"):
            embedding = output.image_embeds
        elif not isinstance(output, Tensor):
            try:
                embedding = select_output(output)
            except OutputError:
                raise TargetError(
                    f"EmbeddingTarget needs (B, D) embeddings, got {_describe(output)}"
                ) from None
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
    "BoxTarget",
    "ClassTarget",
    "EmbeddingTarget",
    "SegmentationTarget",
    "SoftmaxTarget",
    "Target",
    "TargetError",
]

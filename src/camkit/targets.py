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
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor
from torchvision.ops import box_convert, box_iou

from camkit.core.outputs import OutputSelector, select_output
from camkit.core.targets import Target, resolve
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
    expected = "(B, K, H, W) or (B, K, D, H, W) logits or a dict with 'out' (torchvision)"
    if isinstance(output, Mapping):
        key = "out" if "out" in output else "logits" if "logits" in output else None
        if key is None:
            raise TargetError(
                f"SegmentationTarget needs {expected} or 'logits', got {_describe(output)}"
            )
        picked = output[key]
    elif not isinstance(output, Tensor) and isinstance(getattr(output, "logits", None), Tensor):
        picked = output.logits  # HuggingFace segmentation outputs
    if not isinstance(picked, Tensor) or picked.ndim not in (4, 5):
        raise TargetError(f"SegmentationTarget needs {expected}, got {_describe(picked)}")
    return picked


class SegmentationTarget(Target):
    """Sum of category ``category``'s logits inside a boolean pixel mask: ``(B, K, H, W) ->
    (B,)``, volumes ``(B, K, D, H, W)`` likewise (Vinogradova et al., "Towards interpretable
    semantic segmentation via gradient-weighted class activation mapping", AAAI 2020).

    ``mask``: ``(H, W)`` for every sample or ``(B, H, W)`` (volumes: ``(D, H, W)`` or ``(B, D,
    H, W)``), bool (or 0/1); None means the whole image. A mask of another size than the
    logits (drawn on the input, while the model gives logits at a lower resolution) is
    resized to the logits' grid by nearest neighbour (pixel centres, ``nearest-exact``).
    Outputs: a tensor, a torchvision dict ``{"out": ...}`` or an object/dict with ``logits``.
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
        axes = tuple(range(1, plane.ndim))
        if self.mask is None:
            return plane.sum(dim=axes)
        mask = self._fitted(self.mask.to(plane.device), batch, tuple(grid))
        return (plane * mask).sum(dim=axes)

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


_DETECTIONS = (
    "a torchvision detector's list of B dicts with 'boxes' (N, 4), 'labels' (N,) and 'scores' "
    "(N,) (Faster R-CNN / RetinaNet / FCOS / SSD in eval mode), a DETR-style output with "
    "'logits' (B, Q, C + 1) and 'pred_boxes' (B, Q, 4), or a YOLO-style (B, N, 4 + C) tensor"
)


def _field(output: Any, key: str) -> object:
    return output.get(key) if isinstance(output, Mapping) else getattr(output, key, None)


def _candidates(output: Any, image_size: tuple[int, int] | None) -> list[tuple[Tensor, ...]]:
    """Each sample's detections as ``(boxes (N, 4) x1 y1 x2 y2 in pixels, labels (N,), scores
    (N,))``: torchvision's lists of dicts as they are; DETR queries (Carion et al., ECCV 2020)
    with their most probable class other than "no object" (the last logit) and its softmax
    probability, boxes ``(cx, cy, w, h)`` relative to the image; YOLO rows ``(cx, cy, w, h,
    class scores...)`` in pixels with their best class and its score."""
    logits, pred_boxes = _field(output, "logits"), _field(output, "pred_boxes")
    if isinstance(logits, Tensor) and isinstance(pred_boxes, Tensor):
        if image_size is None:
            raise TargetError(
                "BoxTarget on a DETR-style output needs image_size=(H, W): its pred_boxes are "
                "relative to the image"
            )
        if logits.ndim != 3 or pred_boxes.shape != (*logits.shape[:2], 4):
            raise TargetError(f"BoxTarget needs {_DETECTIONS}, got {_describe(output)}")
        height, width = image_size
        scale = pred_boxes.new_tensor([width, height, width, height])
        boxes = box_convert(pred_boxes * scale, "cxcywh", "xyxy")
        scores, labels = logits.softmax(dim=-1)[..., :-1].max(dim=-1)
        return list(zip(boxes, labels, scores, strict=True))
    if isinstance(output, Tensor):
        if output.ndim != 3 or output.shape[2] < 5:
            raise TargetError(f"BoxTarget needs {_DETECTIONS}, got {_describe(output)}")
        boxes = box_convert(output[..., :4], "cxcywh", "xyxy")
        scores, labels = output[..., 4:].max(dim=-1)
        return list(zip(boxes, labels, scores, strict=True))
    if not isinstance(output, list | tuple) or not output:
        raise TargetError(f"BoxTarget needs {_DETECTIONS}, got {_describe(output)}")
    found = []
    for i, sample in enumerate(output):
        if not isinstance(sample, Mapping) or not {"boxes", "labels", "scores"} <= set(sample):
            raise TargetError(f"BoxTarget needs {_DETECTIONS}; item {i} is {_describe(sample)}")
        boxes = sample["boxes"]
        if not isinstance(boxes, Tensor) or boxes.ndim != 2 or boxes.shape[1] != 4:
            raise TargetError(f"detection {i}: 'boxes' must be (N, 4), got {_describe(boxes)}")
        found.append((boxes, sample["labels"], sample["scores"]))
    return found


class BoxTarget(Target):
    """A detector's score for each given box: ``detections -> (B,)``, or ``(B, M)`` for M boxes.

    For each given box and label, among the sample's detections with that label and
    IoU >= ``iou_threshold`` the one with the highest IoU is chosen and its score returned
    (pytorch-grad-cam's ``FasterRCNNBoxScoreTarget`` sums the IoU and the score; camkit keeps the
    score alone, the model's confidence, so the map explains the detection's class score).
    Outputs: torchvision detectors' lists of dicts; DETR-style ``logits`` / ``pred_boxes`` (a
    query's label is its most probable class, its score that probability; pass ``image_size``);
    YOLO-style ``(B, N, 4 + C)`` rows ``(cx, cy, w, h, class scores)`` in pixels.

    ``lost``: when no detection matches, ``"raise"`` (default) raises :class:`TargetError`
    naming the sample and the best IoU found; ``"zero"`` scores 0. Perturbed copies (Score-CAM,
    Ablation-CAM, the deletion metric) are always scored with ``"zero"`` (:meth:`for_copies`):
    a lost detection has no confidence left.

    ``labels``: an int (one box ``(4,)``) or ``M`` ints (boxes ``(M, 4)``), ``x1, y1, x2, y2``
    in the input's pixels; the same boxes are looked for in every sample of the batch.
    """

    def __init__(
        self,
        labels: int | Sequence[int] | Tensor,
        boxes: Sequence[float] | Sequence[Sequence[float]] | Tensor,
        iou_threshold: float = 0.5,
        *,
        lost: Literal["raise", "zero"] = "raise",
        image_size: tuple[int, int] | None = None,
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
        if lost not in ("raise", "zero"):
            raise TargetError(f'lost must be "raise" or "zero", got {lost!r}')
        self.labels = label_tensor.long()
        self.boxes = box_tensor
        self.iou_threshold = float(iou_threshold)
        self.lost = lost
        self.image_size = image_size

    def for_copies(self) -> BoxTarget:
        """In perturbed copies a lost detection scores 0 (it has no confidence left), as in
        pytorch-grad-cam; on the explained images themselves it stays an error."""
        copy = BoxTarget.__new__(BoxTarget)
        copy.__dict__.update(self.__dict__, lost="zero")
        return copy

    def __call__(self, output: Any) -> Tensor:
        rows = []
        for sample, (boxes, labels, scores) in enumerate(_candidates(output, self.image_size)):
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
                if iou < self.iou_threshold and self.lost == "zero":
                    picked.append(scores.sum() * 0)  # lost: 0, still part of the graph
                    continue
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


_EMBEDDING_KEYS = ("image_embeds", "pooler_output", "embeddings")


class EmbeddingTarget(Target):
    """Cosine similarity to a reference embedding: ``(B, D) -> (B,)``.

    ``reference``: ``(D,)`` for every sample or ``(B, D)``. The embedding is ``output=`` of the
    model's output when given (a key, attribute, index or callable, as the methods' ``output=``);
    else a ``(B, D)`` tensor (or ``(B, D, 1, 1)`` pooled maps, flattened), the first of
    ``image_embeds`` (CLIP), ``pooler_output`` (HuggingFace ViT / ConvNeXt / DINOv2 models),
    ``embeddings`` found on a dict or object, else its ``logits`` or first element.
    Re-identification and CLIP-style image towers.
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
        if self.output is not None:
            try:
                return select_output(output, self.output)
            except OutputError as err:
                raise TargetError(f"EmbeddingTarget(output={self.output!r}): {err}") from None
        if isinstance(output, Tensor):
            return output
        for key in _EMBEDDING_KEYS:
            found = output.get(key) if isinstance(output, Mapping) else getattr(output, key, None)
            if isinstance(found, Tensor):
                return found
        try:
            return select_output(output)
        except OutputError:
            raise TargetError(
                f"EmbeddingTarget needs (B, D) embeddings, got {_describe(output)}; pass "
                "output= the key or a callable that picks them"
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
    "BoxTarget",
    "ClassTarget",
    "EmbeddingTarget",
    "SegmentationTarget",
    "SoftmaxTarget",
    "Target",
    "TargetError",
]

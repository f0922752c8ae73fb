"""Detection targets: a detector's score for a given box, scored the way the detector does
(its post-processing's score), read from the output's type or declared (``scoring=``):

* ``"softmax"``: DETR (Carion et al., ECCV 2020), YOLOS (Fang et al., NeurIPS 2021): a softmax
  over ``C + 1`` logits whose last is "no object"; a query's label is its most probable real
  class, its score that probability;
* ``"sigmoid"``: Conditional DETR (Meng et al., ICCV 2021), Deformable DETR (Zhu et al., ICLR
  2021), RT-DETR and other focal-loss heads: an independent sigmoid per class over
  ``num_labels`` logits, no "no object" class;
* ``"raw"``: YOLO-style tensors ``(cx, cy, w, h, class scores...)`` whose class scores are
  already probabilities (ultralytics YOLOv8 applies the sigmoid inside its head);
* ``"objectness"``: YOLOv5-style rows ``(cx, cy, w, h, objectness, class scores...)``: the score
  is ``objectness x class score``, as its non-maximum suppression ranks them;
* torchvision detectors' ``scores`` are used as they are.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any, Literal, get_args

import torch
from torch import Tensor
from torchvision.ops import box_convert, box_iou

from camkit.errors import TargetError
from camkit.targets.base import Target
from camkit.targets.outputs import describe, field

Scoring = Literal["auto", "softmax", "sigmoid", "raw", "objectness"]
Layout = Literal["auto", "rows", "columns"]
# HuggingFace output classes whose heads score with a sigmoid per class (focal loss)
_SIGMOID_HEADS = ("ConditionalDetr", "DeformableDetr", "DabDetr", "RTDetr", "GroundingDino")

_DETECTIONS = (
    "a torchvision detector's list of B dicts with 'boxes' (N, 4), 'labels' (N,) and 'scores' "
    "(N,) (Faster R-CNN / RetinaNet / FCOS / SSD in eval mode), a DETR-style output with "
    "'logits' (B, Q, C) and 'pred_boxes' (B, Q, 4), a YOLO-style (B, N, 4 + C) tensor, or "
    "ultralytics' (B, 4 + C, N) (with layout='columns', found by itself in its (y, feature "
    "maps) eval output)"
)


def _ultralytics(output: Any) -> bool:
    """ultralytics' eval output: ``(y (B, 4 + C, N), [feature maps (B, no, h, w)])`` (8.0 to
    8.3) or ``(y, {"boxes", "scores", "feats"})`` (8.4)."""
    if not (isinstance(output, tuple) and len(output) == 2 and isinstance(output[0], Tensor)):
        return False
    rest = output[1]
    if output[0].ndim != 3 or not isinstance(rest, Mapping | list | tuple) or not rest:
        return False
    if isinstance(rest, Mapping):
        return {"boxes", "scores", "feats"} <= set(rest)
    return all(isinstance(t, Tensor) and t.ndim == 4 for t in rest)


def detections(
    output: Any, image_size: tuple[int, int] | None, scoring: str, layout: str
) -> tuple[list[tuple[Tensor, Tensor, Tensor]], str]:
    """Each sample's ``(boxes (N, 4) x1 y1 x2 y2 in pixels, labels (N,), scores (N,))``, and
    how they were read and scored."""
    logits, pred_boxes = field(output, "logits"), field(output, "pred_boxes")
    if isinstance(logits, Tensor) and isinstance(pred_boxes, Tensor):
        return _detr(output, logits, pred_boxes, image_size, scoring)
    if _ultralytics(output):
        layout = "columns" if layout == "auto" else layout
        return _yolo(output[0], scoring, layout, "ultralytics (y, feature maps) output")
    if isinstance(output, Tensor):
        return _yolo(output, scoring, "rows" if layout == "auto" else layout, "a tensor")
    if not isinstance(output, list | tuple) or not output:
        raise TargetError(f"BoxTarget needs {_DETECTIONS}, got {describe(output)}")
    if scoring not in ("auto", "raw"):
        raise TargetError(
            f"scoring={scoring!r} does not apply to a torchvision detector's 'scores' (already "
            "its post-processed scores): use scoring='auto'"
        )
    found = []
    for i, sample in enumerate(output):
        if not isinstance(sample, Mapping) or not {"boxes", "labels", "scores"} <= set(sample):
            raise TargetError(f"BoxTarget needs {_DETECTIONS}; item {i} is {describe(sample)}")
        boxes = sample["boxes"]
        if not isinstance(boxes, Tensor) or boxes.ndim != 2 or boxes.shape[1] != 4:
            raise TargetError(f"detection {i}: 'boxes' must be (N, 4), got {describe(boxes)}")
        found.append((boxes, sample["labels"], sample["scores"]))
    return found, "torchvision detections: their 'scores' as they are"


def _detr(
    output: Any,
    logits: Tensor,
    pred_boxes: Tensor,
    image_size: tuple[int, int] | None,
    scoring: str,
) -> tuple[list[tuple[Tensor, Tensor, Tensor]], str]:
    if image_size is None:
        raise TargetError(
            "BoxTarget on a DETR-style output needs image_size=(H, W): its pred_boxes are "
            "relative to the image"
        )
    if logits.ndim != 3 or pred_boxes.shape != (*logits.shape[:2], 4):
        raise TargetError(f"BoxTarget needs {_DETECTIONS}, got {describe(output)}")
    kind, why = type(output).__name__, "declared"
    if scoring == "auto" and kind.startswith(_SIGMOID_HEADS):
        scoring, why = "sigmoid", f"{kind}: a sigmoid per class, no 'no object' class"
    elif scoring == "auto":
        scoring = "softmax"
        why = (
            f"{kind}: DETR's softmax with a last 'no object' class (pass scoring='sigmoid' for "
            "a focal-loss head such as Conditional or Deformable DETR)"
        )
    if scoring == "softmax":
        scores, labels = logits.softmax(dim=-1)[..., :-1].max(dim=-1)
    elif scoring == "sigmoid":
        scores, labels = logits.sigmoid().max(dim=-1)
    else:
        raise TargetError(
            f"scoring={scoring!r} does not apply to DETR-style logits: use 'softmax' (DETR, "
            "YOLOS), 'sigmoid' (Conditional / Deformable DETR) or 'auto'"
        )
    height, width = image_size
    scale = pred_boxes.new_tensor([width, height, width, height])
    boxes = box_convert(pred_boxes * scale, "cxcywh", "xyxy")
    return list(zip(boxes, labels, scores, strict=True)), f"{scoring} ({why})"


def _yolo(
    output: Tensor, scoring: str, layout: str, what: str
) -> tuple[list[tuple[Tensor, Tensor, Tensor]], str]:
    if output.ndim != 3:
        raise TargetError(f"BoxTarget needs {_DETECTIONS}, got {describe(output)}")
    rows = output.transpose(1, 2) if layout == "columns" else output
    scoring = "raw" if scoring == "auto" else scoring
    first = 5 if scoring == "objectness" else 4
    if rows.shape[2] <= first:
        raise TargetError(
            f"BoxTarget read {what} {tuple(output.shape)} as {layout} of (cx, cy, w, h"
            f"{', objectness' if first == 5 else ''}, class scores...) but its rows have "
            f"{rows.shape[2]} values; {_LAYOUT_HINT}"
        )
    boxes = box_convert(rows[..., :4], "cxcywh", "xyxy")
    if scoring == "objectness":
        scores, labels = (rows[..., 5:] * rows[..., 4:5]).max(dim=-1)
    elif scoring == "raw":
        scores, labels = rows[..., 4:].max(dim=-1)
    else:
        raise TargetError(
            f"scoring={scoring!r} does not apply to a YOLO-style tensor: use 'raw' (class "
            "scores already probabilities, ultralytics), 'objectness' (YOLOv5 rows) or 'auto'"
        )
    shape = "(B, 4 + C, N) columns" if layout == "columns" else "(B, N, 4 + C) rows"
    how = "objectness x class score" if scoring == "objectness" else "class scores as given"
    return list(zip(boxes, labels, scores, strict=True)), f"{what} read as {shape}, {how}"


_LAYOUT_HINT = (
    "a YOLO tensor is read as (B, N, 4 + C) rows by default: pass layout='columns' for "
    "ultralytics YOLOv8's (B, 4 + C, N), scoring='objectness' for YOLOv5's (B, N, 5 + C)"
)


class BoxTarget(Target):
    """A detector's score for each given box: ``detections -> (B,)``, or ``(B, M)`` for M boxes:
    that of the sample's detection with the box's label and the highest IoU (at least
    ``iou_threshold``). pytorch-grad-cam's ``FasterRCNNBoxScoreTarget`` adds the IoU; camkit
    keeps the model's confidence alone, so the map explains the detection's class score.

    ``labels``: an int (one box ``(4,)``) or ``M`` ints (boxes ``(M, 4)``), ``x1, y1, x2, y2``
    in input pixels, looked for in every sample. ``scoring``: see the module docstring;
    ``"auto"`` reads it from the output's type; :attr:`used` then says how the last call read
    and scored. ``layout``: a YOLO tensor's ``"rows"`` ``(B, N, 4 + C)`` or ``"columns"``
    ``(B, 4 + C, N)`` (ultralytics YOLOv8); ``"auto"``: columns for ultralytics' eval output
    ``(y, feature maps)``, else rows. ``lost``: no matching detection ``"raise"``s a
    :class:`TargetError` (row, best IoU) or scores ``"zero"``. Perturbed copies (Score-CAM,
    Ablation-CAM, deletion) always score it 0 (:meth:`for_copies`); Integrated Gradients'
    path points lose the detection near the baseline: pass ``lost="zero"`` there.
    """

    def __init__(
        self,
        labels: int | Sequence[int] | Tensor,
        boxes: Sequence[float] | Sequence[Sequence[float]] | Tensor,
        iou_threshold: float = 0.5,
        *,
        lost: Literal["raise", "zero"] = "raise",
        image_size: tuple[int, int] | None = None,
        scoring: Scoring = "auto",
        layout: Layout = "auto",
    ):
        label_tensor = torch.as_tensor(labels)
        self.several = label_tensor.ndim > 0
        label_tensor = label_tensor.reshape(-1)
        box_tensor = torch.as_tensor(boxes, dtype=torch.float32)
        box_tensor = box_tensor.reshape(1, 4) if box_tensor.shape == (4,) else box_tensor
        if label_tensor.is_floating_point() or label_tensor.numel() == 0:
            raise TargetError("labels must be an int or a non-empty sequence of ints")
        if box_tensor.shape != (label_tensor.numel(), 4):
            raise TargetError(
                f"boxes must be (M, 4) (x1, y1, x2, y2) for M = {label_tensor.numel()} labels, "
                f"got shape {tuple(box_tensor.shape)}"
            )
        if not (box_tensor[:, 2:] > box_tensor[:, :2]).all():
            raise TargetError("each box must have x2 > x1 and y2 > y1")
        if not 0 < iou_threshold <= 1:
            raise TargetError(f"iou_threshold must be in (0, 1], got {iou_threshold}")
        choices = (("lost", lost, ("raise", "zero")), ("scoring", scoring, get_args(Scoring)))
        for name, value, allowed in (*choices, ("layout", layout, get_args(Layout))):
            if value not in allowed:
                raise TargetError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")
        self.labels = label_tensor.long()
        self.boxes = box_tensor
        self.iou_threshold = float(iou_threshold)
        self.lost = lost
        self.image_size = image_size
        self.scoring = scoring
        self.layout = layout
        self.used: str | None = None  # how the last call read and scored the detections

    def for_copies(self) -> BoxTarget:
        """In perturbed copies a lost detection scores 0 (it has no confidence left), as in
        pytorch-grad-cam; on the explained images themselves it stays an error."""
        twin = copy.copy(self)
        twin.lost = "zero"
        return twin

    def __call__(self, output: Any) -> Tensor:
        found, self.used = detections(output, self.image_size, self.scoring, self.layout)
        rows = [self._row(row, len(found), *detected) for row, detected in enumerate(found)]
        result = torch.stack(rows)
        return result if self.several else result[:, 0]

    def _row(self, row: int, total: int, boxes: Tensor, labels: Tensor, scores: Tensor) -> Tensor:
        wanted = self.boxes.to(boxes.device, boxes.dtype)
        ious = box_iou(wanted, boxes.detach()) if len(boxes) else boxes.new_zeros(len(wanted), 0)
        same = labels.to(self.labels.device)[None, :] == self.labels[:, None]
        ious = ious.where(same.to(ious.device), ious.new_tensor(-1.0))
        ious = torch.cat([ious, ious.new_full((len(wanted), 1), -1.0)], dim=1)  # none found
        best_iou, best = ious.max(dim=1)  # ties: the first detection
        found = best_iou >= self.iou_threshold
        if self.lost == "raise" and not found.all():
            m = int((~found).nonzero()[0])
            where = f"row {row} of the {total} scored (sample {row} of the batch, or"
            where = "the image (or" if total == 1 else where
            hint = f"; {_LAYOUT_HINT}" if "tensor" in self.used or "ultra" in self.used else ""
            raise TargetError(
                f"{where} a copy that the method scores): no detection of label "
                f"{int(self.labels[m])} overlaps box {self.boxes[m].tolist()} with IoU >= "
                f"{self.iou_threshold} (best IoU among the {int(same[m].sum())} detections "
                f"of that label: {max(float(best_iou[m]), 0.0):.2f}; {len(boxes)} detections in "
                f"all; read as {self.used}). Methods that score copies of the image with the "
                "target itself (Integrated Gradients' path points, SmoothGrad's noise) lose "
                "detections near the baseline: pass BoxTarget(..., lost='zero') to score a "
                f"lost detection 0{hint}"
            )
        lost = scores.sum()[None] * 0  # a lost detection scores 0, still part of the graph
        return torch.cat([scores, lost])[best.where(found, len(scores)).to(scores.device)]

    def __repr__(self) -> str:
        return (
            f"BoxTarget(labels={self.labels.tolist()}, boxes={self.boxes.tolist()}, "
            f"scoring={self.scoring!r}, layout={self.layout!r}, used={self.used!r})"
        )


__all__ = ["BoxTarget"]

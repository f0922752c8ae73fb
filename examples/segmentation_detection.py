"""Grad-CAM for a segmentation mask and for one detected box (torchvision models).

    python examples/segmentation_detection.py

No weights are downloaded (random weights): the point is the API.
:class:`camkit.target_types.SegmentationTarget` sums a category's logits inside a pixel mask of
DeepLabV3's ``{"out": (B, K, H, W)}``; :class:`camkit.target_types.BoxTarget` takes Faster
R-CNN's score for the detection that best matches a given box and label.
"""

from __future__ import annotations

import torch
from torchvision.models.detection import fasterrcnn_mobilenet_v3_large_fpn
from torchvision.models.segmentation import deeplabv3_mobilenet_v3_large

from camkit import GradCAM
from camkit.targets import BoxTarget, SegmentationTarget


def main() -> None:
    torch.manual_seed(0)
    x = torch.rand(3, 224, 224)

    segmenter = deeplabv3_mobilenet_v3_large(weights=None, weights_backbone=None).eval()
    with torch.no_grad():
        predicted = segmenter(x[None])["out"][0].argmax(0)
    category = int(predicted.flatten().mode().values)
    target = SegmentationTarget(category, mask=predicted == category)
    heat = GradCAM(segmenter, "backbone.16", output="out")(x, target=target)
    print(f"segmentation: category {category}, map {tuple(heat.shape)}")

    detector = fasterrcnn_mobilenet_v3_large_fpn(
        weights=None, weights_backbone=None, box_score_thresh=0.0, min_size=224, max_size=224
    ).eval()
    with torch.no_grad():
        found = detector([x])[0]
    label, box = int(found["labels"][0]), found["boxes"][0]
    # output= only tells the engine the batch size: the target reads the list of detections
    cam = GradCAM(detector, "backbone.body.16", output=lambda out: torch.zeros(len(out), 1))
    heat = cam(x, target=BoxTarget(label, box))
    print(
        f"detection: label {label} at {[round(v) for v in box.tolist()]}, map {tuple(heat.shape)}"
    )


if __name__ == "__main__":
    main()

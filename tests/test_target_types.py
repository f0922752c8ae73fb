"""Target objects (camkit.target_types): hand-computed scores on synthetic outputs, and maps on
real segmentation, detection and embedding networks (random weights, no download)."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import X, assert_untouched, model_state
from torch import Tensor, nn

import camkit
from camkit.targets import (
    BoxTarget,
    ClassTarget,
    EmbeddingTarget,
    SegmentationTarget,
    SoftmaxTarget,
    TargetError,
)

RAW = {"relu": False, "upsample": False, "normalize": False}


def _correlation(a: Tensor, b: Tensor) -> float:
    return float(torch.corrcoef(torch.stack([a.flatten().float(), b.flatten().float()]))[0, 1])


# ----------------------------------------------------------------------------- class targets

LOGITS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])


def test_class_target_picks_logits():
    assert torch.equal(ClassTarget(2)(LOGITS), torch.tensor([3.0, 6.0]))
    assert torch.equal(ClassTarget([0, 1])(LOGITS), torch.tensor([1.0, 5.0]))
    assert torch.equal(
        ClassTarget([[0, 2], [1, 1]])(LOGITS), torch.tensor([[1.0, 3.0], [5.0, 5.0]])
    )
    assert torch.equal(ClassTarget(1)({"logits": LOGITS}), torch.tensor([2.0, 5.0]))
    assert torch.equal(ClassTarget(1)((LOGITS, "aux")), torch.tensor([2.0, 5.0]))


def test_class_target_errors():
    with pytest.raises(TargetError, match="out of range"):
        ClassTarget(3)(LOGITS)
    with pytest.raises(TargetError, match=r"\(B, num_classes\) logits, got shape \(2, 3, 4, 4\)"):
        ClassTarget(0)(torch.zeros(2, 3, 4, 4))
    with pytest.raises(TargetError, match="got a dict with keys"):
        ClassTarget(0)({"out": LOGITS})
    with pytest.raises(ValueError, match="one target per sample"):
        ClassTarget([0, 1, 2])(LOGITS)


def test_softmax_target_hand_values():
    # softmax([1, 2, 3]) = e^k / (e + e^2 + e^3)
    expected = math.exp(3) / (math.exp(1) + math.exp(2) + math.exp(3))
    got = SoftmaxTarget(2)(LOGITS)
    torch.testing.assert_close(got, torch.tensor([expected, expected]))  # shift-invariant


def test_class_target_in_the_engine_equals_an_int_target(tiny):
    before = model_state(tiny)
    by_object = camkit.GradCAM(tiny, "conv")(X, target=ClassTarget(1), **RAW)
    assert_untouched(tiny, before)
    torch.testing.assert_close(by_object, camkit.GradCAM(tiny, "conv")(X, target=1, **RAW))


def test_softmax_grad_cam_is_the_chain_rule_of_the_logit_maps(tiny):
    """Grad-CAM's raw map is linear in dS/dA, and d p_c / d z_k = p_c (delta_ck - p_k): the
    softmax map is ``p_c (1 - p_c) M_c - p_c p_k M_k`` (TinyNet has two classes)."""
    probs = tiny(X[None]).softmax(1)[0].detach()
    maps = [camkit.GradCAM(tiny, "conv")(X, target=k, **RAW) for k in (0, 1)]
    expected = probs[0] * (1 - probs[0]) * maps[0] - probs[0] * probs[1] * maps[1]
    got = camkit.GradCAM(tiny, "conv")(X, target=SoftmaxTarget(0), **RAW)
    torch.testing.assert_close(got, expected)


# ----------------------------------------------------------------------------- segmentation

DENSE = torch.arange(2 * 3 * 2 * 2, dtype=torch.float32).reshape(2, 3, 2, 2)
DIAGONAL = torch.tensor([[True, False], [False, True]])


def test_segmentation_target_sums_inside_the_mask():
    # category 1: sample 0 holds [[4, 5], [6, 7]], sample 1 [[16, 17], [18, 19]]
    torch.testing.assert_close(SegmentationTarget(1, DIAGONAL)(DENSE), torch.tensor([11.0, 35.0]))
    torch.testing.assert_close(SegmentationTarget(1)(DENSE), torch.tensor([22.0, 70.0]))
    torch.testing.assert_close(
        SegmentationTarget(1, DIAGONAL)({"out": DENSE, "aux": DENSE}), torch.tensor([11.0, 35.0])
    )
    per_sample = torch.tensor([[[True, False], [False, False]], [[False, False], [False, True]]])
    torch.testing.assert_close(SegmentationTarget(1, per_sample)(DENSE), torch.tensor([4.0, 19.0]))
    as_numbers = torch.tensor([[1, 0], [0, 1]])
    torch.testing.assert_close(SegmentationTarget(0, as_numbers)(DENSE), torch.tensor([3.0, 27.0]))


def test_segmentation_target_errors():
    with pytest.raises(TargetError, match=r"mask has shape \(3, 2, 2\).*\(2, 2\)"):
        SegmentationTarget(0, torch.ones(3, 2, 2, dtype=torch.bool))(DENSE)
    with pytest.raises(TargetError, match="category 3 is out of range.*3 categories"):
        SegmentationTarget(3)(DENSE)
    with pytest.raises(TargetError, match=r"\(B, K, H, W\).*shape \(2, 3\)"):
        SegmentationTarget(0)(LOGITS)
    with pytest.raises(TargetError, match="keys \\['aux'\\]"):
        SegmentationTarget(0)({"aux": DENSE})
    with pytest.raises(ValueError, match="selects no pixel"):
        SegmentationTarget(0, torch.zeros(2, 2, dtype=torch.bool))
    with pytest.raises(TargetError, match="boolean"):
        SegmentationTarget(0, torch.full((2, 2), 0.5))


def _calibrate_batchnorm(model: nn.Module, shape: tuple[int, ...]) -> None:
    """Give a random-weight network the batch-norm statistics of random inputs, then eval():
    with the init statistics (mean 0, variance 1) DeepLab's output barely depends on its input
    (gradients ~1e-8, one class everywhere)."""
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.momentum = None  # cumulative average
    model.train()
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(shape))
    model.eval()


def test_segmentation_equals_pytorch_grad_cam_on_deeplab():
    pgc = pytest.importorskip("pytorch_grad_cam")
    from pytorch_grad_cam.utils.model_targets import SemanticSegmentationTarget
    from torchvision.models.segmentation import deeplabv3_mobilenet_v3_large

    torch.manual_seed(0)
    model = deeplabv3_mobilenet_v3_large(weights=None, weights_backbone=None)
    _calibrate_batchnorm(model, (4, 3, 128, 128))
    x = torch.randn(1, 3, 128, 128)
    with torch.no_grad():
        predicted = model(x)["out"][0].argmax(0)
    category = int(predicted.flatten().mode().values)
    mask = predicted == category

    before = model_state(model)
    ours = camkit.GradCAM(model, "backbone.16", output=lambda out: out["out"])(
        x, target=SegmentationTarget(category, mask)
    )[0]
    assert_untouched(model, before)

    class Out(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, x):
            return self.model(x)["out"]

    reference_target = SemanticSegmentationTarget(category, mask.float().numpy())
    with pgc.GradCAM(Out(), [model.get_submodule("backbone.16")]) as reference:
        theirs = torch.from_numpy(reference(x, targets=[reference_target]))[0]
    model.zero_grad(set_to_none=True)
    assert ours.max() - ours.min() > 0.5
    assert _correlation(ours, theirs) >= 0.999


# ----------------------------------------------------------------------------- detection


def _detections(boxes, labels, scores) -> dict[str, Tensor]:
    return {
        "boxes": torch.tensor(boxes, dtype=torch.float32),
        "labels": torch.tensor(labels),
        "scores": torch.tensor(scores),
    }


DETECTIONS = [
    _detections([[0, 0, 10, 10], [20, 20, 30, 30], [0, 0, 10, 9]], [1, 2, 1], [0.9, 0.4, 0.7]),
    _detections([[20, 20, 30, 30]], [1], [0.3]),
]


def test_box_target_picks_the_best_matching_detection():
    # [0, 0, 10, 8] vs [0, 0, 10, 10]: IoU 80/100 = 0.8; vs [0, 0, 10, 9]: 80/90 = 0.89 -> 0.7
    first = BoxTarget(1, [0, 0, 10, 8])([DETECTIONS[0]])
    torch.testing.assert_close(first, torch.tensor([0.7]))
    # label 2 at [21, 21, 31, 31]: IoU 81 / 119 = 0.68 with [20, 20, 30, 30]
    second = BoxTarget([1, 2], [[0, 0, 10, 10], [21, 21, 31, 31]])([DETECTIONS[0]])
    torch.testing.assert_close(second, torch.tensor([[0.9, 0.4]]))
    both = BoxTarget(1, [20, 20, 30, 30], iou_threshold=0.3)
    with pytest.raises(
        TargetError,
        match=r"row 0 of the 2 scored \(sample 0 .*no detection of label 1.*best IoU.*0.00",
    ):
        both(DETECTIONS)  # sample 0's label-1 boxes do not overlap [20, 20, 30, 30]
    torch.testing.assert_close(both([DETECTIONS[1]]), torch.tensor([0.3]))


def test_box_target_errors():
    with pytest.raises(
        TargetError, match=r"IoU >= 0.9 \(best IoU .* 2 detections of that label: 0.89"
    ):
        BoxTarget(1, [0, 0, 10, 8], iou_threshold=0.9)([DETECTIONS[0]])
    with pytest.raises(TargetError, match="list of B dicts.*got a tensor"):
        BoxTarget(1, [0, 0, 10, 8])(LOGITS)
    with pytest.raises(TargetError, match="item 0 is a dict with keys \\['boxes'\\]"):
        BoxTarget(1, [0, 0, 10, 8])([{"boxes": torch.zeros(0, 4)}])
    with pytest.raises(ValueError, match=r"\(M, 4\).*M = 2"):
        BoxTarget([1, 2], [0, 0, 10, 8])
    with pytest.raises(ValueError, match="x2 > x1"):
        BoxTarget(1, [10, 0, 0, 8])
    empty = {"boxes": torch.zeros(0, 4), "labels": torch.zeros(0).long(), "scores": torch.zeros(0)}
    with pytest.raises(TargetError, match="0 detections in all"):
        BoxTarget(1, [0, 0, 10, 8])([empty])


def test_box_target_on_faster_rcnn_with_a_planted_box():
    from torchvision.models.detection import fasterrcnn_mobilenet_v3_large_fpn
    from torchvision.ops import box_iou

    torch.manual_seed(0)
    model = fasterrcnn_mobilenet_v3_large_fpn(
        weights=None,
        weights_backbone=None,
        min_size=224,
        max_size=224,
        rpn_pre_nms_top_n_test=100,
        rpn_post_nms_top_n_test=30,
        box_detections_per_img=10,
        box_score_thresh=0.0,
    ).eval()
    x = torch.rand(3, 224, 224)
    with torch.no_grad():
        found = model([x])[0]
    label = int(found["labels"][0])
    planted = found["boxes"][0] + torch.tensor([1.0, 1.0, 1.0, 1.0])  # shifted by one pixel
    target = BoxTarget(label, planted)
    score = target([found])
    ious = box_iou(planted[None], found["boxes"])[0].where(found["labels"] == label, -1)
    assert score.item() == found["scores"][ious.argmax()].item()

    before = model_state(model)
    # until the engine hands callable targets the whole output, ``output=`` gives the batch size
    cam = camkit.GradCAM(model, "backbone.body.16", output=lambda out: torch.zeros(len(out), 1))
    heat = cam(x, target=target)
    assert_untouched(model, before)
    assert heat.shape == (224, 224) and torch.isfinite(heat).all()
    assert heat.max() - heat.min() > 0.5


# ----------------------------------------------------------------------------- embeddings


def test_embedding_target_hand_values_and_errors():
    out = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    torch.testing.assert_close(
        EmbeddingTarget(torch.tensor([1.0, 0.0]))(out), torch.tensor([1.0, 1 / math.sqrt(2)])
    )
    per_sample = EmbeddingTarget(torch.tensor([[0.0, 1.0], [-1.0, -1.0]]))(out)
    torch.testing.assert_close(per_sample, torch.tensor([0.0, -1.0]))
    torch.testing.assert_close(
        EmbeddingTarget(torch.tensor([2.0, 0.0]))(out[:, :, None, None]),
        torch.tensor([1.0, 1 / math.sqrt(2)]),
    )
    with pytest.raises(TargetError, match=r"\(B, 3\) embeddings.*shape \(2, 2\)"):
        EmbeddingTarget(torch.ones(3))(out)
    with pytest.raises(TargetError, match="3 rows but the batch has 2"):
        EmbeddingTarget(torch.ones(3, 2))(out)
    with pytest.raises(ValueError, match="non-zero"):
        EmbeddingTarget(torch.zeros(2))


def test_embedding_target_on_a_resnet18_trunk():
    """Grad-CAM's raw map is linear in dS/de: for ``S = cos(e, r)``,
    ``dS/de = r / (|r| |e|) - S e / |e|^2``, so the map is that weighting of the 512 maps of the
    embedding's coordinates (one batched call with 512 targets)."""
    from torchvision.models import resnet18

    torch.manual_seed(0)
    trunk = resnet18(weights=None)
    trunk.fc = nn.Identity()
    trunk.eval()
    x = torch.randn(1, 3, 96, 96)
    reference = torch.randn(512)
    with torch.no_grad():
        e = trunk(x)[0]
    cos = torch.dot(e, reference) / (e.norm() * reference.norm())
    weights = reference / (reference.norm() * e.norm()) - cos * e / e.norm() ** 2

    before = model_state(trunk)
    got = camkit.GradCAM(trunk, "layer4")(x, target=EmbeddingTarget(reference), **RAW)[0]
    assert_untouched(trunk, before)
    coordinates = camkit.GradCAM(trunk, "layer4")(x, target=[list(range(512))], **RAW)[0]
    expected = torch.einsum("d,dhw->hw", weights, coordinates)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)

    pgc = pytest.importorskip("pytorch_grad_cam")

    class SimilarityToConceptTarget:  # pytorch-grad-cam's embeddings tutorial
        def __init__(self, features):
            self.features = features

        def __call__(self, model_output):
            cos = torch.nn.CosineSimilarity(dim=0)
            return cos(model_output, self.features)

    with pgc.GradCAM(trunk, [trunk.layer4]) as cam:
        theirs = torch.from_numpy(cam(x, targets=[SimilarityToConceptTarget(reference)]))[0]
    trunk.zero_grad(set_to_none=True)
    ours = camkit.GradCAM(trunk, "layer4")(x, target=EmbeddingTarget(reference))[0]
    assert _correlation(ours, theirs) >= 0.999

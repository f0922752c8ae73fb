"""Issue 25: research models camkit must never get silently wrong (shared layers, train mode,
tokens after the patches, sigmoid detectors, Grad-CAM++ on token layers, defaults, refusals).
Each case on a small model with random or known weights, against a hand-written reference."""

from __future__ import annotations

import copy
import importlib.util
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from conftest import assert_untouched, model_state
from torch import nn

import camkit
from camkit import GradCAM, LayerCAM, Saliency
from camkit.errors import LayerOutputError

RAW = {"relu": False, "upsample": False, "normalize": False}


class _SharedHead(nn.Module):
    """One 1x1 conv head applied to two pyramid levels (RetinaNet's shared heads)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.down = nn.Conv2d(4, 4, 3, stride=2, padding=1)
        self.head = nn.Conv2d(4, 3, 1)

    def forward(self, x):
        p1 = self.stem(x)
        p2 = self.down(p1)
        return self.head(p1).mean(dim=(2, 3)) + self.head(p2).mean(dim=(2, 3))


@pytest.mark.parametrize("method", ["gradcam", "layercam", "scorecam", "ablationcam", "eigencam"])
def test_a_layer_called_twice_is_refused_by_every_cam_with_its_calls(method):
    model = _SharedHead().eval()
    x = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    before = model_state(model)
    with pytest.raises(LayerOutputError, match="runs 2 times") as err:
        camkit.registry.get(method).build(model, "head")(x, 0)
    text = str(err.value)
    assert "call 0: (1, 3, 8, 8)" in text and "call 1: (1, 3, 4, 4)" in text
    assert "Choose a layer that runs once" in text and "camkit.record" in text
    assert_untouched(model, before)


def test_the_default_layer_is_never_a_shared_one():
    model = _SharedHead().eval()
    skipped = camkit.models.skipped_layers(model, (8, 8))
    assert "runs 2 times" in skipped["head"]
    assert camkit.models.default_layer(model, (8, 8)) == "down"


class _BatchNormNet(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(self.bn(self.conv(x)).relu().mean(dim=(2, 3)))


@pytest.mark.parametrize("method", ["gradcam", "scorecam", "smoothgrad", "ig", "saliency"])
def test_train_mode_buffers_are_restored_bitwise_after_every_call(method):
    model = _BatchNormNet().train()
    before = model_state(model)
    stats = {k: v.clone() for k, v in model.state_dict().items() if "running" in k or "num" in k}
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    entry = camkit.registry.get(method)
    explainer = entry.build(model, "bn")
    with pytest.warns(UserWarning, match="restores the running statistics"):
        explainer(x, 0)
    for key, value in stats.items():
        assert torch.equal(model.state_dict()[key], value), key
    assert model.training and model.bn.training
    assert_untouched(model, before)


def test_train_mode_gradcam_is_the_train_mode_models_gradcam():
    """The map explains the model as it is (batch statistics), and its statistics stay put."""
    model = _BatchNormNet().train()
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    mean = model.bn.running_mean.clone()
    with pytest.warns(UserWarning):
        maps = GradCAM(model, "bn")(x, 1, **RAW)
    assert torch.equal(model.bn.running_mean, mean)
    probe = _BatchNormNet().train()
    probe.load_state_dict(model.state_dict())
    act = probe.bn(probe.conv(x)).detach().requires_grad_(True)
    score = probe.fc(act.relu().mean(dim=(2, 3)))[:, 1].sum()
    (grad,) = torch.autograd.grad(score, act)
    expected = (grad.mean(dim=(2, 3), keepdim=True) * act).sum(dim=1).detach()
    torch.testing.assert_close(maps, expected, atol=1e-6, rtol=1e-5)


def test_train_mode_buffers_are_restored_when_the_call_raises():
    model = _BatchNormNet().train()
    mean = model.bn.running_mean.clone()
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    with pytest.warns(UserWarning), pytest.raises(camkit.errors.TargetError):
        LayerCAM(model, "bn")(x, 7)
    assert torch.equal(model.bn.running_mean, mean)
    with pytest.warns(UserWarning):
        Saliency(model)(x, 0)
    assert torch.equal(model.bn.running_mean, mean)


def _buffers_kept_through(run) -> None:
    """``run(model)`` on a train-mode batch-norm model leaves its buffers bitwise unchanged."""
    model = _BatchNormNet().train()
    before = model_state(model)
    buffers = [b.clone() for b in model.buffers()]
    run(model, torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(1)))
    assert all(torch.equal(a, b) for a, b in zip(buffers, model.buffers(), strict=True))
    assert model.training and model.bn.training
    assert_untouched(model, before)


@pytest.mark.filterwarnings("ignore:the model is in training mode")
@pytest.mark.parametrize(
    "run",
    [
        lambda model, x: GradCAM(model, "bn").explain_batch(x, 0),
        lambda model, x: camkit.ScoreCAM(model, "bn").explain_batch(x, 0),
        lambda model, x: camkit.FullGrad(model).explain_batch(x, 0),
        lambda model, x: Saliency(model).explain_batch(x, 0),
        lambda model, x: camkit.SmoothGrad(model, samples=2).explain_batch(x, 0),
        lambda model, x: camkit.LRP(model).explain_batch(x, 0),
        lambda model, x: camkit.LRP(model).explain_batch(x, 0),
        lambda model, x: camkit.IntegratedGradients(model, steps=2).completeness(x, 0),
    ],
    ids=["gradcam", "scorecam", "fullgrad", "saliency", "smoothgrad", "lrp", "lrp-relevance", "ig"],
)
def test_train_mode_buffers_are_restored_by_heatmaps_and_the_other_entry_points(run):
    """explain_batch() (what the CLI calls; LRP's layer relevance) and Integrated Gradients'
    completeness() run the model outside a call: the same guards hold."""
    _buffers_kept_through(run)


def test_deep_feature_factorization_restores_train_mode_buffers():
    with pytest.warns(UserWarning, match="restores the running statistics"):
        _buffers_kept_through(lambda model, x: camkit.DeepFeatureFactorization(model, "bn")(x, 2))


def test_attention_heatmaps_restore_train_mode_buffers():
    timm = pytest.importorskip("timm")

    class Normalised(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.bn = nn.BatchNorm2d(3)
            self.vit = timm.create_model(
                "vit_tiny_patch16_224", pretrained=False, img_size=32, depth=2
            )

        def forward(self, x):
            return self.vit(self.bn(x))

    model = Normalised().train()
    buffers = [b.clone() for b in model.buffers()]
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    heat = camkit.AttentionRollout(model).explain_batch(x, 0).maps
    assert heat.shape == (2, 1, 32, 32)
    assert all(torch.equal(a, b) for a, b in zip(buffers, model.buffers(), strict=True))


# ----------------------------------------------------------------- tokens after the patches


def _yolos() -> nn.Module:
    transformers = pytest.importorskip("transformers", reason="transformers builds YOLOS")
    torch.manual_seed(0)
    config = transformers.YolosConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        image_size=[32, 48],
        patch_size=8,
        num_detection_tokens=5,
        num_labels=3,
    )
    return transformers.YolosForObjectDetection(config).eval()


def test_yolos_detection_tokens_after_the_patches_are_dropped_not_laid_on_the_grid():
    model = _yolos()
    x = torch.randn(1, 3, 32, 48, generator=torch.Generator().manual_seed(0))
    layer = "vit.encoder.layer.1.layernorm_before"
    before = model_state(model)
    cam = GradCAM(model)
    maps = cam(x, lambda out: out.logits[:, 2, 1], **RAW)
    assert cam.layers == [layer]
    layout = cam.layouts[layer]
    assert (layout.prefix, layout.grid, layout.suffix) == (1, (4, 6), 5)
    assert "5 token(s) after the patches dropped" in str(layout)
    with camkit.record(model, layer) as rec:
        model(x).logits[:, 2, 1].sum().backward()
    tokens, grads = rec.activations[layer], rec.gradients[layer]  # (1, 1 + 24 + 5, 32)
    model.zero_grad(set_to_none=True)
    act = tokens[:, 1:25].unflatten(1, (4, 6)).movedim(-1, 1)
    grad = grads[:, 1:25].unflatten(1, (4, 6)).movedim(-1, 1)
    expected = (grad.mean(dim=(2, 3), keepdim=True) * act).sum(dim=1)
    torch.testing.assert_close(maps, expected, atol=1e-6, rtol=1e-4)
    assert_untouched(model, before)


def test_a_token_count_the_model_does_not_explain_is_refused_not_guessed():
    class ClsOnly(nn.Module):
        def __init__(self):
            super().__init__()
            self.cls_token = nn.Parameter(torch.zeros(1, 1, 8))
            self.patch_size = 4

    # 1 class token + 16 patches + 3 unknown tokens: the old rule guessed prefix = 20 - 16
    with pytest.raises(camkit.errors.LayoutError, match="never guesses") as err:
        camkit.core.layouts.infer_layout((1, 20, 8), ClsOnly(), 16)
    assert "1 before the patches" in str(err.value) and "reshape=" in str(err.value)
    # the patch embedding's own output (every token a patch) is read as it is
    assert camkit.core.layouts.infer_layout((1, 16, 8), ClsOnly(), 16).prefix == 0


def test_a_model_without_prefix_tokens_gets_no_prefix_reading():
    """Swin v2 stage 2 at 64 px / LeViT: 16 tokens; no '12 prefix tokens' reading."""
    stage = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8))
    layout = camkit.core.layouts.infer_layout((1, 16, 8), stage, 64)
    assert (layout.prefix, layout.suffix, layout.grid) == (0, 0, (4, 4))
    with pytest.raises(camkit.errors.LayoutError, match="several ways") as err:
        camkit.core.layouts.infer_layout((1, 16, 8), None, 64)
    assert "12 prefix token(s)" in str(err.value)  # geometry alone: every reading listed


# ----------------------------------------------------------------- how a detection is scored


def _detr_output(kind: str, logits: torch.Tensor, boxes: torch.Tensor):
    transformers = pytest.importorskip("transformers", reason="the HuggingFace output classes")
    module = {"ConditionalDetr": "conditional_detr", "Detr": "detr"}[kind]
    models = getattr(transformers.models, module)
    output = getattr(getattr(models, f"modeling_{module}"), f"{kind}ObjectDetectionOutput")
    return output(logits=logits, pred_boxes=boxes)


BOXES = torch.tensor([[[0.25, 0.25, 0.5, 0.5], [0.75, 0.75, 0.5, 0.5]]])


def test_conditional_detr_is_scored_with_a_sigmoid_and_every_class_can_be_matched():
    from camkit.targets import BoxTarget

    # 2 queries, num_labels = 3, no "no object" class: query 0 -> class 2 at logit 0 (p = 0.5)
    logits = torch.tensor([[[-3.0, -2.0, 0.0], [1.0, -1.0, -4.0]]])
    output = _detr_output("ConditionalDetr", logits, BOXES)
    target = BoxTarget(2, [0, 0, 50, 50], image_size=(100, 100))
    torch.testing.assert_close(target(output), torch.tensor([0.5]))
    assert target.used.startswith("sigmoid (ConditionalDetrObjectDetectionOutput")
    second = BoxTarget(0, [50, 50, 100, 100], image_size=(100, 100))(output)
    torch.testing.assert_close(second, torch.tensor([1.0]).sigmoid())
    # DETR: softmax over C + 1 with the last "no object" dropped (the same numbers, other head)
    detr = BoxTarget(0, [50, 50, 100, 100], image_size=(100, 100))
    torch.testing.assert_close(
        detr(_detr_output("Detr", logits, BOXES)), logits[0, 1].softmax(0)[:1]
    )
    assert detr.used.startswith("softmax (DetrObjectDetectionOutput")
    # declared: a plain dict from a focal-loss head
    declared = BoxTarget(2, [0, 0, 50, 50], image_size=(100, 100), scoring="sigmoid")
    plain = {"logits": logits, "pred_boxes": BOXES}
    torch.testing.assert_close(declared(plain), torch.tensor([0.5]))
    assert declared.used.startswith("sigmoid (declared")
    with pytest.raises(camkit.errors.TargetError, match="scoring must be one of"):
        BoxTarget(2, [0, 0, 50, 50], scoring="focal")


class _SigmoidDetector(nn.Module):
    """Two convs, global pooling, 2 queries x 3 classes, fixed boxes: a Conditional DETR head."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.stem = nn.Conv2d(3, 3, 1)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.head = nn.Linear(4, 6)

    def forward(self, x):
        logits = self.head(self.conv(self.stem(x)).relu().mean(dim=(2, 3))).view(-1, 2, 3)
        return _detr_output("ConditionalDetr", logits, BOXES.expand(x.shape[0], 2, 4))


def test_gradcam_on_a_sigmoid_detector_explains_the_sigmoid_score():
    from camkit.targets import BoxTarget

    model = _SigmoidDetector().eval()
    x = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(2))
    logits = model(x).logits[0, 0]
    label = int(logits.argmax())
    target = BoxTarget(label, [0, 0, 4, 4], image_size=(8, 8))
    maps = GradCAM(model, "conv")(x, target, **RAW)
    act = model.conv(model.stem(x)).detach().requires_grad_(True)
    score = model.head(act.relu().mean(dim=(2, 3))).view(-1, 2, 3)[0, 0, label].sigmoid()
    (grad,) = torch.autograd.grad(score, act)
    expected = (grad.mean(dim=(2, 3), keepdim=True) * act).sum(dim=1).detach()
    torch.testing.assert_close(maps, expected, atol=1e-7, rtol=1e-5)


def test_ultralytics_columns_are_read_from_its_eval_output_and_hinted_for_a_tensor():
    from camkit.targets import BoxTarget

    # (B, 4 + C, N): 2 anchors, 2 classes; anchor 1 is (75, 75, 50, 50) with class 0 at 0.9
    y = torch.tensor(
        [[[25.0, 75.0], [25.0, 75.0], [50.0, 50.0], [50.0, 50.0], [0.1, 0.9], [0.7, 0.2]]]
    )
    feats = [torch.zeros(1, 6, 2, 2)]
    target = BoxTarget(0, [50, 50, 100, 100])
    torch.testing.assert_close(target((y, feats)), torch.tensor([0.9]))
    assert "(B, 4 + C, N) columns" in target.used
    torch.testing.assert_close(
        BoxTarget(0, [50, 50, 100, 100], layout="columns")(y), torch.tensor([0.9])
    )
    with pytest.raises(camkit.errors.TargetError, match="layout='columns'"):
        BoxTarget(0, [50, 50, 100, 100])(y)  # rows: 6 "detections" of 2 values
    # YOLOv5 rows (cx, cy, w, h, objectness, classes): objectness x class score
    v5 = torch.tensor([[[75.0, 75.0, 50.0, 50.0, 0.5, 0.9, 0.2]]])
    v5_target = BoxTarget(0, [50, 50, 100, 100], scoring="objectness")
    torch.testing.assert_close(v5_target(v5), torch.tensor([0.45]))


def test_integrated_gradients_losing_the_detection_suggests_lost_zero():
    from camkit.targets import BoxTarget

    model = _SigmoidDetector().eval()
    x = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(2))
    label = int(model(x).logits[0, 0].argmax())
    box = [0, 0, 4, 4]

    def moving(x):  # the box follows the image's mean: lost near the zero baseline
        out = model(x)
        shift = (x.mean(dim=(1, 2, 3)) < 0.05).float()[:, None, None] * 0.5
        return _detr_output("ConditionalDetr", out.logits, out.pred_boxes + shift)

    class Moving(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = model

        def forward(self, x):
            return moving(x)

    image = x.abs() + 0.5
    with pytest.raises(camkit.errors.TargetError, match="lost='zero'") as err:
        camkit.IntegratedGradients(Moving())(image, BoxTarget(label, box, image_size=(8, 8)))
    assert "Integrated Gradients" in str(err.value)
    attr = camkit.IntegratedGradients(Moving())(
        image, BoxTarget(label, box, image_size=(8, 8), lost="zero")
    )
    assert torch.isfinite(attr).all() and attr.abs().sum() > 0


# ----------------------------------------------------------------- Grad-CAM++ on token layers


def _gradcam_pp_reference(act: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """Chattopadhay et al. 2018, eq. 19 in float64: the map ``sum_c w_c A_c`` ``(B, h, w)``."""
    act, grad = act.double(), grad.double()
    total = act.sum(dim=(2, 3), keepdim=True)
    denominator = 2 * grad**2 + total * grad**3
    alpha = torch.where(denominator != 0, grad**2 / denominator, 0.0)
    weights = (alpha * grad.relu()).sum(dim=(2, 3), keepdim=True)
    return (weights * act).sum(dim=1)


def test_gradcam_plus_plus_on_vit_tokens_is_the_papers_formula_in_float64():
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    model = timm.create_model(
        "vit_tiny_patch16_224",
        img_size=32,
        patch_size=8,
        embed_dim=32,
        depth=2,
        num_heads=2,
        num_classes=5,
    ).eval()
    double = copy.deepcopy(model).double()
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0)).double()
    layer = "blocks.1.norm1"
    with warnings.catch_warnings():
        warnings.simplefilter("error", camkit.errors.IllConditionedWarning)  # well-conditioned
        maps = camkit.GradCAMPlusPlus(double, layer)(x, [1, 3], **RAW)
    with camkit.record(double, layer) as rec:
        out = double(x)
        (out[0, 1] + out[1, 3]).backward()
    double.zero_grad(set_to_none=True)
    act = rec.activations[layer][:, 1:].unflatten(1, (4, 4)).movedim(-1, 1)
    grad = rec.gradients[layer][:, 1:].unflatten(1, (4, 4)).movedim(-1, 1)
    expected = _gradcam_pp_reference(act, grad)
    # float64 throughout; the result is returned in float32 (its rounding: ~6e-8 relative)
    torch.testing.assert_close(maps.double(), expected, atol=1e-6 * expected.abs().max(), rtol=0)


def test_gradcam_plus_plus_warns_where_its_alphas_are_ill_conditioned():
    """``sum(A) = -2.0001`` and ``g = 1`` at one position: the denominator ``2 + sum(A)`` is
    ``-1e-4``, its condition number ``4e4``. The float32 inputs are evaluated in float64."""
    cam = camkit.GradCAMPlusPlus(nn.Conv2d(1, 1, 1), "")
    act = torch.tensor([[-1.0, -0.5], [-0.3, -0.2001]]).view(1, 1, 1, 2, 2)
    grad = torch.tensor([[1.0, 0.5], [-0.25, 0.125]]).view(1, 1, 1, 2, 2)
    with pytest.warns(camkit.errors.IllConditionedWarning, match="condition number 4"):
        weights = cam.channel_weights(act, grad)
    total = act.double().sum()
    g = grad.double().flatten()
    alpha = g**2 / (2 * g**2 + total * g**3)
    torch.testing.assert_close(weights.double().flatten(), (alpha * g.relu()).sum()[None])
    # a well-conditioned layer (a CNN's non-negative activations) does not warn
    with warnings.catch_warnings():
        warnings.simplefilter("error", camkit.errors.IllConditionedWarning)
        cam.channel_weights(act.abs(), grad)


# ----------------------------------------------------------------- defaults


@pytest.mark.parametrize("builder", ["deeplabv3_mobilenet_v3_large", "lraspp_mobilenet_v3_large"])
def test_segmentation_default_is_the_backbones_last_stage_whatever_the_weights(builder):
    from torchvision.models import segmentation

    torch.manual_seed(0)
    model = getattr(segmentation, builder)(weights=None, weights_backbone=None, num_classes=3)
    model.eval()
    assert camkit.models.default_layer(model, 64) == "backbone.16"
    with torch.no_grad():  # other head weights: the same default
        for parameter in model.classifier.parameters():
            parameter.zero_()
    assert camkit.models.default_layer(model, 64) == "backbone.16"


def test_a_monai_3d_unet_gets_a_default_layer_without_example():
    monai = pytest.importorskip("monai", reason="MONAI is a test extra")
    torch.manual_seed(0)
    unet = monai.networks.nets.UNet(
        spatial_dims=3, in_channels=1, out_channels=2, channels=(4, 8, 16), strides=(2, 2)
    ).eval()
    x = torch.randn(1, 1, 16, 16, 16, generator=torch.Generator().manual_seed(0))
    assert camkit.models.default_layer(unet) == camkit.models.default_layer(unet, example=x)


def test_the_default_layer_is_traced_with_the_calls_keyword_arguments():
    """HuggingFace ViT at another size needs interpolate_pos_encoding=True: the trace that
    finds the default layer gets it too (it failed and suggested example=)."""
    transformers = pytest.importorskip("transformers", reason="transformers builds the ViT")
    torch.manual_seed(0)
    config = transformers.ViTConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        image_size=32,
        patch_size=8,
        num_labels=3,
    )
    model = transformers.ViTForImageClassification(config).eval()
    x = torch.randn(1, 3, 48, 48, generator=torch.Generator().manual_seed(0))
    extra = {"interpolate_pos_encoding": True}
    cam = GradCAM(model)
    maps = cam(x, 1, additional_forward_args=extra, **RAW)
    layer = cam.layers[0]
    assert layer.endswith("1.layernorm_before") and cam.layouts[layer].grid == (6, 6)
    with camkit.record(model, layer) as rec:
        model(x, **extra).logits[:, 1].sum().backward()
    model.zero_grad(set_to_none=True)
    act = rec.activations[layer][:, 1:].unflatten(1, (6, 6)).movedim(-1, 1)
    grad = rec.gradients[layer][:, 1:].unflatten(1, (6, 6)).movedim(-1, 1)
    expected = (grad.mean(dim=(2, 3), keepdim=True) * act).sum(dim=1)
    torch.testing.assert_close(maps, expected, atol=1e-6, rtol=1e-4)


_YOLOV8 = """
import torch
from torchvision.ops import box_convert
from ultralytics.nn.tasks import DetectionModel

import camkit
from camkit.targets import BoxTarget

torch.manual_seed(0)
model = DetectionModel("yolov8n.yaml", nc=3, verbose=False).eval()
x = torch.rand(1, 3, 64, 64, generator=torch.Generator().manual_seed(0))
assert camkit.models.default_layer(model, example=x) == "model.21"
with torch.no_grad():
    y = model(x)[0]  # (1, 4 + 3, 84)
anchor = int(y[0, 4:].amax(0).argmax())
label = int(y[0, 4:, anchor].argmax())
box = box_convert(y[0, :4, anchor][None], "cxcywh", "xyxy")[0].tolist()
target = BoxTarget(label, box)
cam = camkit.GradCAM(model)
maps = cam(x, target, relu=False, upsample=False, normalize=False)
assert cam.layers == ["model.21"] and "(B, 4 + C, N) columns" in target.used, target.used
with camkit.record(model, "model.21") as rec:
    model(x)[0][0, 4 + label, anchor].backward()
model.zero_grad(set_to_none=True)
act, grad = rec.activations["model.21"], rec.gradients["model.21"]
expected = (grad.mean(dim=(2, 3), keepdim=True) * act).sum(dim=1)
assert expected.abs().max() > 0
torch.testing.assert_close(maps, expected, atol=1e-5 * expected.abs().max(), rtol=1e-4)
print("ok")
"""


def test_ultralytics_yolov8_defaults_before_its_head_and_its_boxes_are_read_as_columns(tmp_path):
    """Built from its yaml (random weights): the default is never the DFL box decoder
    ``model.22.dfl.conv`` (box sides x anchors), and a box target reads ``(B, 4 + C, N)``.
    In a child process: importing ultralytics patches PIL and cv2 for the whole process."""
    if importlib.util.find_spec("ultralytics") is None:
        pytest.skip("ultralytics is a test extra")
    source = str(Path(camkit.__file__).parents[1])
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([source, os.environ.get("PYTHONPATH", "")]),
        "YOLO_CONFIG_DIR": str(tmp_path),
        "YOLO_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
    }
    run = subprocess.run(
        [sys.executable, "-c", _YOLOV8], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr[-3000:]


# ----------------------------------------------------------------- refusals that say what to do


def test_a_detector_without_a_box_target_is_told_to_use_one():
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    detection = torchvision.models.detection
    model = detection.fasterrcnn_mobilenet_v3_large_320_fpn(
        weights=None, weights_backbone=None, num_classes=3
    ).eval()
    x = torch.rand(3, 64, 64, generator=torch.Generator().manual_seed(0))
    for target in (None, 1):
        with pytest.raises(camkit.errors.TargetError, match="the model is a detector") as err:
            GradCAM(model)(x, target)
        assert "BoxTarget(label, [x1, y1, x2, y2])" in str(err.value)
    detr = _detr_output("Detr", torch.zeros(1, 2, 3), BOXES)
    with pytest.raises(camkit.errors.TargetError, match="DETR-style detections"):
        camkit.targets.outputs.class_logits(detr, None)


def test_clip_texts_split_from_their_images_by_batch_size_say_so():
    transformers = pytest.importorskip("transformers", reason="transformers builds CLIP")
    torch.manual_seed(0)
    text = transformers.CLIPTextConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        vocab_size=100,
        max_position_embeddings=16,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=1,
    )
    vision = transformers.CLIPVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=32,
        patch_size=8,
    )
    config = transformers.CLIPConfig(
        text_config=text.to_dict(), vision_config=vision.to_dict(), projection_dim=16
    )
    model = camkit.KeywordInput(transformers.CLIPModel(config).eval(), "pixel_values")
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    texts = {"input_ids": torch.randint(2, 100, (2, 5), generator=torch.Generator().manual_seed(0))}
    chunked = GradCAM(model, output="logits_per_image", batch_size=1)
    with pytest.raises(camkit.errors.TargetError, match="split with their images") as err:
        chunked(x, [0, 1], additional_forward_args=texts)
    assert "batch_size=None" in str(err.value)
    cam = GradCAM(model, output="logits_per_image")
    maps = cam(x, [0, 1], additional_forward_args=texts)
    layer = cam.layers[0]
    assert layer.endswith("layers.1.layer_norm1") and cam.layouts[layer].prefix == 1
    assert maps.shape == (2, 32, 32) and torch.isfinite(maps).all()


def test_a_hybrid_vits_layout_names_its_real_stride_not_the_patch_size():
    """timm's ResNet-stem hybrid: 8x8 patches on a stride-4 stem's map, so 64 px -> 2x2."""
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_r_s16_p8_224", img_size=64, num_classes=3).eval()
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    cam = GradCAM(model)
    cam(x, 1)
    layout = cam.layouts[cam.layers[0]]
    assert layout.grid == (2, 2) and layout.prefix == 1
    assert "stride 32" in str(layout) and "patch (8, 8)" not in str(layout)


# ----------------------------------------------------------------- the matrix's new kinds

LAYERED = [name for name, entry in camkit.METHODS.items() if entry.needs_layer]


@pytest.mark.parametrize("method", LAYERED)
def test_every_layered_method_refuses_the_shared_kinds_shared_module(method):
    from matrix_kit import KINDS

    spec = KINDS["shared-layer"]
    model, x = spec.model(), spec.input()
    before = model_state(model)
    layer = ["act", "features.2"] if method == "refinecam" else "act"
    options = {"seed": 0} if camkit.METHODS[method].seeded else {}
    with pytest.raises(LayerOutputError, match="runs 2 times in one forward pass"):
        camkit.METHODS[method].build(model, layer, **options)(x, 1)
    assert_untouched(model, before)


def test_the_train_mode_kind_writes_its_buffers_on_a_plain_forward():
    """What the matrix's "untouched" cells catch on the train-mode kind is real: a forward
    writes its buffers, and camkit's calls put them back."""
    from matrix_kit import KINDS

    spec = KINDS["train-mode"]
    model, x = spec.model(), spec.input()
    assert model.training
    with torch.no_grad():
        model(x)
    assert int(model.features[3].calls) == 1
    before = model_state(model)
    with pytest.warns(UserWarning, match="training mode"):
        GradCAM(model)(x, 1)
    assert_untouched(model, before)


def test_the_tokens_after_kinds_gradcam_reads_the_patches_only():
    from matrix_kit import KINDS

    spec = KINDS["tokens-after"]
    model, x = spec.model(), spec.input()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", camkit.errors.EmptyMapWarning)
        maps = GradCAM(model, spec.layer)(x, 3, **RAW)
    with camkit.record(model, spec.layer) as rec:
        model(x)[:, 3].sum().backward()
    model.zero_grad(set_to_none=True)
    act = rec.activations[spec.layer][:, 1:17].unflatten(1, (4, 4)).movedim(-1, 1)
    grad = rec.gradients[spec.layer][:, 1:17].unflatten(1, (4, 4)).movedim(-1, 1)
    expected = (grad.mean(dim=(2, 3), keepdim=True) * act).sum(dim=1)
    torch.testing.assert_close(maps, expected, atol=1e-6, rtol=1e-4)


# every method on a sigmoid detection head (Conditional DETR style) with a box target: a finite
# map, the model untouched; these refuse with a clear camkit error instead
SIGMOID_REFUSALS = {
    "rollout": "has no supported attention blocks",
    "legrad": "has no supported attention blocks",
    "cam": "classifier",
    "finercam": "Finer-CAM compares class logits",
}


@pytest.mark.parametrize("method", list(camkit.METHODS))
def test_every_method_on_a_sigmoid_detection_head(method):
    from camkit.targets import BoxTarget

    model = _SigmoidDetector().eval()
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(2))
    label = int(model(x).logits[:, 0].sum(0).argmax())
    target = BoxTarget(label, [0, 0, 4, 4], image_size=(8, 8), lost="zero")
    before = model_state(model)
    entry = camkit.METHODS[method]
    options = {"seed": 0} if entry.seeded else {}
    layer = ["stem", "conv"] if method == "refinecam" else "conv"
    if method in SIGMOID_REFUSALS:
        with pytest.raises(camkit.errors.CamkitError, match=SIGMOID_REFUSALS[method]):
            entry.build(model, layer if entry.needs_layer else None, **options)(x, target)
    else:
        explainer = entry.build(model, layer if entry.needs_layer else None, **options)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", camkit.errors.EmptyMapWarning)
            maps = explainer(x, target)
        assert torch.isfinite(maps).all() and maps.shape[0] == 2
        assert target.used.startswith("sigmoid")
    assert_untouched(model, before)


# ----------------------------------------------------------------- the PyTorch batch-norm bug


class _RefusesChannelsLast(nn.Module):
    """A ``.view`` that only a contiguous input allows: camkit falls back to the contiguous
    format, the path where PyTorch's batch-norm backward goes wrong."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x):
        b, c, h, w = x.shape
        return self.model(x.view(b, c, h * w).view(b, c, h, w))


def test_gradients_through_levits_batch_norms_match_finite_differences_on_the_contiguous_path():
    """timm LeViT (batch norms before the tokens are flattened): on torch 2.14 a plain
    contiguous backward is wrong (see docs/reliability.md); camkit's gradients on the
    contiguous fallback path agree with central finite differences in float64."""
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    levit = timm.create_model("levit_128s", img_size=64, num_classes=5).eval()
    with torch.no_grad():
        for module in levit.modules():
            if isinstance(module, nn.BatchNorm2d | nn.BatchNorm1d):
                module.running_mean.uniform_(-0.1, 0.1)
                module.running_var.uniform_(0.5, 1.5)
    model = _RefusesChannelsLast(levit).double()
    x = torch.randn(1, 3, 64, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    before = model_state(model)
    attr = Saliency(model)(x, 1)
    assert_untouched(model, before)
    # the pixels where torch's own contiguous and channels-last backward disagree most
    plain, last = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    (wrong,) = torch.autograd.grad(model.model(plain)[0, 1], plain)
    (right,) = torch.autograd.grad(
        model.model(last.contiguous(memory_format=torch.channels_last))[0, 1], last
    )
    model.zero_grad(set_to_none=True)
    pixels = (wrong - right).abs().flatten().topk(3).indices.tolist()
    scale = right.abs().max()
    with torch.no_grad():
        for i in pixels:
            step = torch.zeros(x.numel(), dtype=x.dtype)
            step[i] = 1e-5
            step = step.view_as(x)
            fd = (model(x + step)[0, 1] - model(x - step)[0, 1]) / 2e-5
            assert abs(float(attr.flatten()[i]) - float(fd)) < 1e-3 * float(scale), i


def test_retinanets_shared_classification_head_is_refused_with_its_five_calls():
    """The head shared by the 5 pyramid levels: Grad-CAM used its last call (the 1x1 P7
    level) without a word, while Score-CAM refused; now every method refuses, listing them."""
    torchvision = pytest.importorskip("torchvision")
    from camkit.targets import BoxTarget

    torch.manual_seed(0)
    model = torchvision.models.detection.retinanet_resnet50_fpn(
        weights=None, weights_backbone=None, num_classes=3, min_size=64, max_size=64
    ).eval()
    x = torch.rand(3, 64, 64, generator=torch.Generator().manual_seed(0))
    layer = "head.classification_head.conv.0"
    for method in (camkit.GradCAM, camkit.ScoreCAM):
        with pytest.raises(LayerOutputError, match="runs 5 times") as err:
            method(model, layer)(x, BoxTarget(1, [0, 0, 32, 32], lost="zero"))
        assert "call 4:" in str(err.value) and "FPN output" in str(err.value)
    assert "runs 5 times" in camkit.models.skipped_layers(model, example=x[None])[layer]


def test_cams_shared_pass_restores_train_mode_buffers_too():
    model = _BatchNormNet().train()
    before = model_state(model)
    stats = {k: v.clone() for k, v in model.state_dict().items() if "running" in k or "num" in k}
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    with pytest.warns(UserWarning, match="training mode"):
        maps = camkit.cams(model, "bn", x, 1, methods=["gradcam", "gradcam++", "scorecam"])
    assert set(maps) == {"gradcam", "gradcam++", "scorecam"}
    for key, value in stats.items():
        assert torch.equal(model.state_dict()[key], value), key
    assert_untouched(model, before)


def test_the_deletion_metric_restores_train_mode_buffers():
    model = _BatchNormNet().train()
    mean = model.bn.running_mean.clone()
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    maps = torch.rand(2, 8, 8, generator=torch.Generator().manual_seed(2))
    with pytest.warns(UserWarning, match="training mode"):
        scores = camkit.metrics.deletion(model, x, maps, target=1, steps=4)
    assert torch.isfinite(torch.as_tensor(scores)).all()
    assert torch.equal(model.bn.running_mean, mean)
    assert int(model.bn.num_batches_tracked) == 0

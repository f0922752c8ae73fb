"""Any model, any input: layers whose first axis is not the batch, clip layouts, discovery."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import camkit
from camkit.errors import InputError, LayerOutputError


class _Proposals(nn.Module):
    """A head that turns each image's 2x2 map into 4 rows (one per 'proposal')."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.permute(0, 2, 3, 1).reshape(-1, x.shape[1], 1, 1)


class _Detector(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(2)
        self.roi = _Proposals()
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = self.roi(self.pool(self.conv(x))).flatten(1)
        return self.head(rows).reshape(x.shape[0], -1, 2).amax(dim=1)


def test_a_layer_whose_first_axis_is_not_the_batch_is_refused_by_name() -> None:
    model = _Detector().eval()
    x = torch.rand(1, 3, 8, 8)
    with pytest.raises(LayerOutputError, match=r"'roi' gives 4 rows .* input batch of 1"):
        camkit.GradCAM(model, "roi")(x, target=0)
    with pytest.raises(LayerOutputError, match="'roi' gives 8 rows .* batch of 2"):
        camkit.ScoreCAM(model, "roi")(torch.rand(2, 3, 8, 8), target=0)
    assert not model._forward_hooks and not model.roi._forward_hooks
    assert camkit.GradCAM(model, "conv")(x, target=0, relu=False).shape == (1, 8, 8)


class _FrameWise(nn.Module):
    """A 2-D CNN on every frame of a (B, T, C, H, W) clip, frame logits averaged."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.head = nn.Linear(4, 2)

    def forward(self, clip: torch.Tensor) -> torch.Tensor:
        b, t = clip.shape[:2]
        frames = self.conv(clip.flatten(0, 1)).relu().mean(dim=(2, 3))
        return self.head(frames).unflatten(0, (b, t)).mean(dim=1)


class _ClipTransformerStem(nn.Module):
    """VideoMAE-style: takes (B, T, C, H, W) and permutes it for its Conv3d tubelet embedding."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Conv3d(3, 4, (2, 2, 2), stride=2)
        self.head = nn.Linear(4, 2)

    def forward(self, clip: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(clip.permute(0, 2, 1, 3, 4)).mean(dim=(2, 3, 4)))


def test_a_btchw_clip_is_refused_until_its_layout_is_declared() -> None:
    model = _ClipTransformerStem().eval()
    clip = torch.rand(1, 4, 3, 8, 8)  # (B, T, C, H, W)
    with pytest.raises(InputError, match=r"looks like clips \(B, T, C, H, W\).*InputLayout"):
        camkit.GradCAM(model, "embed")(clip, target=0)
    declared = camkit.InputLayout(model, "BTCHW")
    cam = camkit.GradCAM(declared, "embed")(
        clip.transpose(1, 2), target=0, relu=False, normalize=False
    )
    assert cam.shape == (1, 4, 8, 8)  # (B, T, H, W): time from axis 1, never the channels
    # the declared model computes exactly the original on the original clip
    torch.testing.assert_close(declared(clip.transpose(1, 2)), model(clip))
    # the map is the one computed by hand from the tubelet embedding: the gradient of logit 0
    # w.r.t. the (B, 4, 2, 4, 4) embedding is head.weight[0] / 32 at every position
    with torch.no_grad():
        act = model.embed(clip.permute(0, 2, 1, 3, 4))
    raw = (model.head.weight[0][:, None, None, None] / 32 * act[0]).sum(0)
    expected = torch.nn.functional.interpolate(raw[None, None], size=(4, 8, 8), mode="trilinear")
    expected = expected[0, 0]
    torch.testing.assert_close(cam[0], expected, atol=1e-5, rtol=1e-5)


def test_a_wrapped_model_reports_its_own_layer_names() -> None:
    """``InputLayout`` / ``KeywordInput`` add no ``module.`` prefix to the names camkit reports
    (the trace, the default layer, the layers a CAM can read, ``cam.layers``), and both the
    user's names and the prefixed ones are accepted."""
    model = _ClipTransformerStem().eval()
    declared = camkit.InputLayout(model, "BTCHW")
    own = {name for name, _ in model.named_modules() if name}
    clip = torch.rand(1, 3, 4, 8, 8)  # (B, C, T, H, W)
    traced = {name for name, *_ in camkit.models.layer_shapes(declared, example=clip)}
    assert traced <= own and "embed" in traced
    assert camkit.models.default_layer(declared, example=clip) in own
    for given in ("embed", "module.embed", model.embed):
        assert camkit.GradCAM(declared, given).layers == ["embed"]
    keyword = camkit.KeywordInput(camkit.InputLayout(model, "BTCHW"), "x")
    assert camkit.core.layers.user_name(keyword, "module.module.embed") == "embed"
    assert camkit.core.layers.user_name(keyword, "module") is None


def test_a_frame_wise_model_is_explained_by_pixel_methods_and_refused_by_cams() -> None:
    model = _FrameWise().eval()
    clip = torch.rand(2, 3, 8, 8, 8)  # (B, C, T, H, W) for the declared layout
    declared = camkit.InputLayout(model, "BTCHW")
    with pytest.raises(InputError, match="frame-wise"):
        camkit.Saliency(model)(torch.rand(2, 3, 5, 8, 8), target=0)
    grads = camkit.Saliency(declared)(clip, target=1)
    assert grads.shape == clip.shape
    leaf = clip.transpose(1, 2).clone().requires_grad_(True)
    model(leaf)[:, 1].sum().backward()
    torch.testing.assert_close(grads, leaf.grad.transpose(1, 2))
    with pytest.raises(LayerOutputError, match=r"conv' gives 16 rows .* batch of 2"):
        camkit.GradCAM(declared, "conv")(clip, target=0)


def test_input_layout_rejects_a_wrong_declaration() -> None:
    with pytest.raises(ValueError, match="B, C, T"):
        camkit.InputLayout(_FrameWise(), "BTHW")


# ----------------------------------------------------------------------------- layer discovery


def _one_channel_cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 6, 3, stride=2, padding=1),
        nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, 2),
    )  # fmt: skip


def test_discovery_shapes_its_input_after_the_first_convolution() -> None:
    model = _one_channel_cnn().eval()
    assert camkit.models.default_layer(model, 16) == "3"
    rows = camkit.models.layer_shapes(model, (16, 12))
    assert rows[0] == ("0", "Conv2d", (1, 4, 16, 12)) and rows[2] == ("2", "Conv2d", (1, 6, 8, 6))
    double = _one_channel_cnn().double().eval()
    example = torch.rand(3, 1, 10, 10, dtype=torch.float64)
    assert camkit.models.layer_shapes(double, example=example)[3] == ("3", "ReLU", (3, 6, 5, 5))
    with pytest.raises(InputError, match=r"cannot run on the traced input \(2, 3, 8, 8\)"):
        camkit.models.default_layer(model, example=torch.rand(1, 3, 8, 8))


class _Embedding(nn.Module):
    """A learned map added to every image: the same output whatever the input."""

    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.randn(1, 4, 4, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.table.expand(x.shape[0], -1, -1, -1)


class _WithMetadata(nn.Module):
    """An image and a metadata vector; a position embedding after the last convolution."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.position = _Embedding()
        self.meta = nn.Linear(5, 4)
        self.head = nn.Linear(4, 2)

    def forward(self, image: torch.Tensor, metadata: torch.Tensor) -> torch.Tensor:
        maps = self.conv(image) + self.position(image)
        return self.head(maps.mean(dim=(2, 3)) + self.meta(metadata))


def test_discovery_skips_layers_that_do_not_depend_on_the_input_and_says_why() -> None:
    model = _WithMetadata().eval()
    example = (torch.rand(1, 3, 4, 4), torch.rand(1, 5))
    assert camkit.models.default_layer(model, example=example) == "conv"
    skipped = camkit.models.skipped_layers(model, example=example)
    assert skipped["position"].endswith("does not depend on the input")
    assert "model's output" in skipped["head"]
    keywords = {"image": torch.rand(1, 3, 4, 4), "metadata": torch.rand(1, 5)}
    assert camkit.models.default_layer(model, example=keywords) == "conv"


def test_discovery_skips_rows_that_are_not_the_batch() -> None:
    skipped = camkit.models.skipped_layers(_Detector().eval(), 8)
    assert skipped["roi"].startswith("its first axis has 8 rows for a batch of 2 inputs")
    assert camkit.models.default_layer(_Detector().eval(), 8) == "pool"


class _TinyUNet3d(nn.Module):
    """A monai-style 3-D segmentation net: 1 channel in, 2 classes per voxel out."""

    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Sequential(nn.Conv3d(1, 4, 3, padding=1), nn.ReLU())
        self.down = nn.Conv3d(4, 8, 3, stride=2, padding=1)
        self.up = nn.ConvTranspose3d(8, 4, 2, stride=2)
        self.out = nn.Conv3d(4, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skip = self.enc(x)
        return self.out(self.up(self.down(skip)) + skip)


def test_a_3d_segmentation_net_defaults_to_its_last_feature_volume() -> None:
    model = _TinyUNet3d().eval()
    assert camkit.models.default_layer(model, (4, 8, 8)) == "up"
    assert "model's output" in camkit.models.skipped_layers(model, (4, 8, 8))["out"]
    with pytest.raises(ValueError, match="3-D convolution: input_size must be an int or 3 ints"):
        camkit.models.default_layer(model, (8, 8))


def test_torchvision_video_and_detection_defaults() -> None:
    from torchvision.models.detection import fasterrcnn_mobilenet_v3_large_fpn
    from torchvision.models.video import r3d_18

    assert camkit.models.default_layer(r3d_18().eval(), (8, 32, 32)) == "layer4"
    detector = fasterrcnn_mobilenet_v3_large_fpn(
        weights=None, weights_backbone=None, min_size=64, max_size=64
    ).eval()
    skipped = camkit.models.skipped_layers(detector, 64)
    assert "not the batch axis" in skipped["roi_heads.box_roi_pool"]
    assert "shared by pyramid levels" in skipped["rpn.head.conv"]
    assert camkit.models.default_layer(detector, 64) == "backbone.fpn.layer_blocks.0"
    with pytest.raises(LayerOutputError, match=r"box_roi_pool' gives \d+ rows .* batch of 1"):
        camkit.GradCAM(detector, "roi_heads.box_roi_pool")(
            torch.rand(1, 3, 64, 64), target=lambda out: out[0]["boxes"].sum()[None]
        )


def test_huggingface_convnext_and_detr_defaults() -> None:
    transformers = pytest.importorskip("transformers")
    convnext = transformers.ConvNextForImageClassification(
        transformers.ConvNextConfig(hidden_sizes=[8, 8, 8, 8], depths=[1, 1, 1, 1], num_labels=3)
    ).eval()
    example = {"pixel_values": torch.rand(1, 3, 64, 64)}
    assert camkit.models.default_layer(convnext, example=example) == "convnext.encoder.stages.3"
    assert "not a tensor" in camkit.models.skipped_layers(convnext, 64)["convnext"]
    backbone = transformers.ResNetConfig(
        embedding_size=8, hidden_sizes=[8, 8, 8, 8], depths=[1, 1, 1, 1], out_features=["stage4"]
    )
    config = transformers.DetrConfig(
        use_timm_backbone=False, use_pretrained_backbone=False, backbone=None,
        backbone_config=backbone, d_model=16, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=16,
        decoder_ffn_dim=16, num_queries=5, num_labels=3,
    )  # fmt: skip
    detr = transformers.DetrForObjectDetection(config).eval()
    with pytest.warns(UserWarning, match="token sequences"):
        assert camkit.models.default_layer(detr, example=example) == "model.input_projection"
    skipped = camkit.models.skipped_layers(detr, example=example)
    assert skipped["model.position_embedding"].endswith("does not depend on the input")


# ----------------------------------------------------------------------------- targets


def _classifier() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(4, 3),
    ).eval()  # fmt: skip


def test_a_list_of_target_objects_is_one_per_sample_or_the_target_axis() -> None:
    from camkit.targets import ClassTarget, SoftmaxTarget

    model, x = _classifier(), torch.rand(2, 3, 6, 6)
    for method in (camkit.GradCAM, camkit.ScoreCAM):
        cam = method(model, "0")
        torch.testing.assert_close(cam(x, [ClassTarget(2), ClassTarget(0)]), cam(x, [2, 0]))
        several = [[ClassTarget(0), ClassTarget(1)], [ClassTarget(2), ClassTarget(0)]]
        torch.testing.assert_close(cam(x, several), cam(x, [[0, 1], [2, 0]]))
    grads = camkit.Saliency(model)(x, [SoftmaxTarget(1), ClassTarget(0)])
    leaf = x.clone().requires_grad_(True)
    out = model(leaf)
    (out.softmax(dim=1)[0, 1] + out[1, 0]).backward()
    torch.testing.assert_close(grads, leaf.grad)
    with pytest.raises(camkit.TargetError, match=r"one target per sample \(2,\).*got shape \(3,\)"):
        camkit.GradCAM(model, "0")(x, [ClassTarget(0)] * 3)
    with pytest.raises(camkit.TargetError, match="only callables"):
        camkit.GradCAM(model, "0")(x, [ClassTarget(0), 1])


class _ListOutput(nn.Module):
    """A detector-like output (a list of dicts) that no class target can read."""

    def __init__(self, body: nn.Module) -> None:
        super().__init__()
        self.body = body

    def forward(self, x: torch.Tensor) -> list:
        return [{"features": row} for row in self.body(x)]


def test_target_free_methods_never_read_the_output() -> None:
    model = _classifier()
    x = torch.rand(2, 3, 6, 6)
    wrapped = _ListOutput(model).eval()
    for method in (camkit.EigenCAM, camkit.FEM):
        torch.testing.assert_close(method(wrapped, "body.0")(x), method(model, "0")(x))
    with pytest.raises(camkit.CamkitError, match="not a tensor"):
        camkit.GradCAM(wrapped, "body.0")(x)


def test_segmentation_masks_are_resized_to_the_logits_and_may_be_volumes() -> None:
    from camkit.targets import SegmentationTarget

    logits = torch.arange(2 * 2 * 2 * 2, dtype=torch.float32).reshape(2, 2, 2, 2)
    mask = torch.zeros(8, 8, dtype=torch.bool)
    mask[:4, 4:] = True  # the top-right quarter of the input: logit (0, 1)
    torch.testing.assert_close(SegmentationTarget(1, mask)(logits), torch.tensor([5.0, 13.0]))
    volume = torch.arange(1 * 2 * 2 * 2 * 2, dtype=torch.float32).reshape(1, 2, 2, 2, 2)
    cube = torch.zeros(4, 4, 4, dtype=torch.bool)
    cube[2:, :2, :2] = True  # the second slice's first voxel
    torch.testing.assert_close(SegmentationTarget(1, cube)(volume), torch.tensor([12.0]))
    tiny = torch.zeros(8, 8, dtype=torch.bool)
    tiny[0, 0] = True  # off every pixel centre of the 2x2 grid
    with pytest.raises(camkit.TargetError, match="survive the resizing"):
        SegmentationTarget(0, tiny)(logits)


def test_embedding_target_finds_pooler_output_and_honours_output() -> None:
    from camkit.targets import EmbeddingTarget

    pooled, other = torch.tensor([[3.0, 4.0]]), torch.tensor([[1.0, 0.0]])
    hf_like = {"last_hidden_state": torch.zeros(1, 4, 2), "pooler_output": pooled}
    torch.testing.assert_close(
        EmbeddingTarget(torch.tensor([1.0, 0.0]))(hf_like), torch.tensor([0.6])
    )
    picked = EmbeddingTarget(torch.tensor([0.0, 1.0]), output="other")
    torch.testing.assert_close(picked({"pooler_output": pooled, "other": other}), torch.zeros(1))
    with pytest.raises(camkit.TargetError, match="output='missing'"):
        EmbeddingTarget(torch.ones(2), output="missing")(hf_like)


def test_box_targets_on_detr_and_yolo_outputs_and_lost_detections() -> None:
    from camkit.targets import BoxTarget

    # DETR: 2 queries, 2 classes + "no object"; image 100x100
    logits = torch.tensor([[[2.0, 0.0, 0.0], [0.0, 0.0, 3.0]]])
    pred_boxes = torch.tensor([[[0.25, 0.25, 0.5, 0.5], [0.75, 0.75, 0.5, 0.5]]])
    detr = {"logits": logits, "pred_boxes": pred_boxes}
    expected = logits[0, 0].softmax(0)[0]  # query 0 covers (0, 0, 50, 50) with class 0
    target = BoxTarget(0, [0, 0, 50, 50], image_size=(100, 100))
    torch.testing.assert_close(target(detr), expected[None])
    with pytest.raises(camkit.TargetError, match="image_size"):
        BoxTarget(0, [0, 0, 50, 50])(detr)
    # YOLO: rows (cx, cy, w, h, scores of 2 classes) in pixels
    yolo = torch.tensor([[[25.0, 25.0, 50.0, 50.0, 0.1, 0.7], [75.0, 75.0, 50, 50, 0.9, 0.2]]])
    torch.testing.assert_close(BoxTarget(1, [0, 0, 50, 50])(yolo), torch.tensor([0.7]))
    both = BoxTarget([1, 0], [[0, 0, 50, 50], [50, 50, 100, 100]])(yolo)
    torch.testing.assert_close(both, torch.tensor([[0.7, 0.9]]))
    far = [60, 0, 100, 40]
    with pytest.raises(camkit.TargetError, match="no detection of label 1"):
        BoxTarget(1, far)(yolo)
    torch.testing.assert_close(BoxTarget(1, far, lost="zero")(yolo), torch.zeros(1))


# ----------------------------------------------------------------------------- attention


def _hf_vit(kind: str) -> nn.Module:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = getattr(transformers, f"{kind}Config")(
        hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=16,
        image_size=16, patch_size=8, num_labels=3,
    )  # fmt: skip
    return getattr(transformers, f"{kind}ForImageClassification")(config).eval()


@pytest.mark.parametrize("kind", ["ViT", "DeiT", "Dinov2"])
def test_attention_methods_read_huggingface_blocks(kind: str) -> None:
    import copy

    from camkit.methods.attention import rollout

    model = _hf_vit(kind)
    x = torch.rand(2, 3, 16, 16)
    kernel = model.config._attn_implementation
    maps = camkit.AttentionRollout(model)(x, upsample=False, normalize=False)
    legrad = camkit.LeGrad(model)(x, target=2, upsample=False, normalize=False)
    assert model.config._attn_implementation == kernel  # the kernel is set back
    eager = copy.deepcopy(model)
    eager.config._attn_implementation = "eager"
    leaf = x.clone().requires_grad_(True)
    out = eager(pixel_values=leaf, output_attentions=True, output_hidden_states=True)
    prefix = 2 if kind == "DeiT" else 1  # DeiT: class and distillation tokens
    expected = rollout(out.attentions)[:, 0, prefix:].reshape(2, 2, 2)  # class row, 2x2 grid
    torch.testing.assert_close(maps, expected)
    # LeGrad by hand: per block, the block's tokens through the head, the class-2 logit's
    # gradient on the probabilities, relu, mean over heads and queries; blocks averaged
    base = getattr(eager, eager.base_model_prefix)
    relevances = []
    for attention, tokens in zip(out.attentions, out.hidden_states[1:], strict=True):
        if kind == "Dinov2":  # its classifier reads the class and the mean patch token
            normed = base.layernorm(tokens)
            pooled = torch.cat([normed[:, 0], normed[:, 1:].mean(1)], 1)
        else:  # the mean token through the final norm (LeGrad's authors' projection)
            pooled = base.layernorm(tokens.mean(1))
        (grad,) = torch.autograd.grad(
            eager.classifier(pooled)[:, 2].sum(), attention, retain_graph=True
        )
        relevances.append(grad.relu().mean(dim=(1, 2)))
    torch.testing.assert_close(legrad, torch.stack(relevances).mean(0)[:, prefix:].reshape(2, 2, 2))


# ----------------------------------------------------------------------------- keyword inputs


class _TextAndImage(nn.Module):
    """CLIP-like: the first positional argument is not the image."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.words = nn.Embedding(5, 4)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, input_ids: torch.Tensor, pixel_values: torch.Tensor, scale: float = 1.0):
        image = self.conv(pixel_values).mean(dim=(2, 3))
        return {"logits_per_image": scale * image @ self.words(input_ids).T}


def test_keyword_inputs_and_keyword_additional_forward_args() -> None:
    model = _TextAndImage().eval()
    x, ids = torch.rand(2, 3, 6, 6), torch.tensor([1, 3])
    wrapped = camkit.KeywordInput(model, "pixel_values")
    extra = {"input_ids": ids, "scale": 2.0}
    grads = camkit.Saliency(wrapped, output="logits_per_image")(
        x, target=1, additional_forward_args=extra
    )
    leaf = x.clone().requires_grad_(True)
    model(ids, pixel_values=leaf, scale=2.0)["logits_per_image"][:, 1].sum().backward()
    torch.testing.assert_close(grads, leaf.grad)
    cam = camkit.GradCAM(wrapped, "conv", output="logits_per_image")
    maps = cam(x, target=[0, 1], additional_forward_args=extra, relu=False, normalize=False)
    # by hand: d logit_k / d conv = 2 * words(ids)[k] / 36 at every position
    with torch.no_grad():
        act, words = model.conv(x), model.words(ids)
    weights = 2 * words[[0, 1]] / 36  # (B, C): sample b explains text b
    torch.testing.assert_close(maps, (weights[:, :, None, None] * act).sum(1))
    with pytest.raises(ValueError, match="name of a keyword argument"):
        camkit.KeywordInput(model, "pixel values")


def test_metrics_are_reachable_after_import_camkit() -> None:
    import subprocess
    import sys

    code = "import camkit; print(camkit.metrics.deletion.__name__)"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "deletion"


def test_only_the_target_free_methods_skip_the_target() -> None:
    free = {name for name, method in camkit.METHODS.items() if method.target_free}
    # the class-agnostic maps: Eigen-CAM's kin, the random baseline, attention rollout
    assert free == {"eigencam", "kpcacam", "fem", "random", "rollout"}

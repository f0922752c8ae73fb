"""Video models' layer layouts (camkit.core.spacetime): tubelet tokens, TimeSformer's patch-major
tokens, MViT's pooled tokens, Swin3D's channels-last volumes, 3-D CNNs and frame-wise 2-D CNNs.

Each Grad-CAM is compared with a hand-written reference in float64: the layer hooked, its
gradient taken by autograd, the weights the mean gradient per channel, the map ``relu(sum_c w_c
A_c)``, laid out in the token order read off each model's source by hand (HuggingFace's
``flatten(2)`` of a ``Conv3d`` output: time-major; ``TimesformerEmbeddings``: patch by patch,
each patch's frames together; torchvision MViT: class token, then time-major).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from conftest import assert_untouched, model_state
from torch import Tensor, nn

import camkit
from camkit.core.layouts import infer_layout
from camkit.errors import LayerOutputError, LayoutError

transformers = pytest.importorskip("transformers")
torchvision = pytest.importorskip("torchvision")

HF_COMMON = dict(
    hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
    num_labels=3, image_size=32, num_frames=4,
)  # fmt: skip


def videomae() -> nn.Module:
    config = transformers.VideoMAEConfig(patch_size=8, tubelet_size=2, **HF_COMMON)
    return transformers.VideoMAEForVideoClassification(config)


def timesformer() -> nn.Module:
    config = transformers.TimesformerConfig(patch_size=8, **HF_COMMON)
    return transformers.TimesformerForVideoClassification(config)


def vivit() -> nn.Module:
    config = transformers.VivitConfig(tubelet_size=[2, 8, 8], **HF_COMMON)
    return transformers.VivitForVideoClassification(config)


def mvit() -> nn.Module:
    from torchvision.models.video.mvit import MSBlockConfig, MViT

    def block(heads: int, cin: int, cout: int, stride_q: list[int]) -> MSBlockConfig:
        return MSBlockConfig(heads, cin, cout, [3, 3, 3], [3, 3, 3], stride_q, [1, 2, 2])

    blocks = [block(1, 8, 8, [1, 1, 1]), block(2, 8, 16, [1, 2, 2]), block(2, 16, 16, [1, 1, 1])]
    return MViT((32, 32), 4, blocks, True, False, True, True, num_classes=3)


class FrameWise(nn.Module):
    """TSN-style: a 2-D CNN on every frame of a (B, C, T, H, W) clip, frame logits averaged."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 3, padding=1)
        self.conv2 = nn.Conv2d(6, 8, 3, stride=2, padding=1)
        self.head = nn.Linear(8, 3)

    def forward(self, clip: Tensor) -> Tensor:
        b, _, t = clip.shape[:3]
        frames = clip.transpose(1, 2).flatten(0, 1)  # row b * T + t
        features = self.conv2(self.conv1(frames).relu()).relu().mean(dim=(2, 3))
        return self.head(features).unflatten(0, (b, t)).mean(dim=1)


def hf(model: nn.Module) -> nn.Module:
    """A HuggingFace video model takes (B, T, C, H, W): declared as such."""
    return camkit.InputLayout(model.double().eval(), "BTCHW")


def logits(model: nn.Module, x: Tensor) -> Tensor:
    out = model(x)
    return getattr(out, "logits", out)


def tokens_thw(prefix: int, grid: tuple[int, int, int]) -> Callable[[Tensor], Tensor]:
    """Time-major tokens after ``prefix`` non-patch tokens -> (B, C, t, h, w)."""
    return lambda a: a[:, prefix:].reshape(a.shape[0], *grid, a.shape[-1]).permute(0, 4, 1, 2, 3)


def tokens_hwt(grid: tuple[int, int, int]) -> Callable[[Tensor], Tensor]:
    """TimeSformer: token p * T + t for patch p = i * w + j -> (B, C, t, h, w)."""
    t, h, w = grid
    return lambda a: a.reshape(a.shape[0], h, w, t, a.shape[-1]).permute(0, 4, 3, 1, 2)


def reference_gradcam(
    model: nn.Module, layer: str, x: Tensor, classes: list[int], to_grid: Callable
) -> Tensor:
    """Grad-CAM by hand: (B, t, h, w) in float64."""
    kept = []
    modules = dict(model.named_modules())
    module = modules.get(layer) or modules[f"module.{layer}"]  # InputLayout's inner names
    handle = module.register_forward_hook(lambda m, args, out: kept.append(out))
    try:
        scores = logits(model, x)
    finally:
        handle.remove()
    (act,) = kept
    score = scores[torch.arange(len(classes)), classes].sum()
    (grad,) = torch.autograd.grad(score, act)
    a, g = to_grid(act.detach()), to_grid(grad)
    weights = g.mean(dim=(2, 3, 4), keepdim=True)
    return (weights * a).sum(dim=1).relu()


CASES = {
    # name: (model builder, wrapped?, layer, the layer's reading by hand, map grid)
    "videomae": (videomae, hf, "videomae.encoder.layer.1.layernorm_before",
                 tokens_thw(0, (2, 4, 4)), (2, 4, 4)),
    "vivit": (vivit, hf, "vivit.layers.1.layernorm_before", tokens_thw(1, (2, 4, 4)), (2, 4, 4)),
    "timesformer": (timesformer, hf, "timesformer.encoder.layer.1.temporal_dense",
                    tokens_hwt((4, 4, 4)), (4, 4, 4)),
    "mvit": (mvit, lambda m: m.double().eval(), "blocks.2.norm1", tokens_thw(1, (2, 4, 4)),
             (2, 4, 4)),
    "r3d": (lambda: torchvision.models.video.r3d_18(num_classes=3),
            lambda m: m.double().eval(), "layer3", lambda a: a, (1, 4, 4)),
}  # fmt: skip


@pytest.mark.parametrize("name", list(CASES))
def test_gradcam_equals_the_hand_written_reference_in_the_model_token_order(name: str) -> None:
    build, wrap, layer, by_hand, grid = CASES[name]
    torch.manual_seed(0)
    model = wrap(build())
    x = torch.randn(2, 3, 4, 32, 32, dtype=torch.float64)
    expected = reference_gradcam(model, layer, x, [0, 2], by_hand)
    before = model_state(model)
    cam = camkit.GradCAM(model, layer, output="logits" if wrap is hf else None)
    got = cam(x, target=[0, 2], upsample=False, normalize=False)
    assert_untouched(model, before)
    assert got.shape == (2, *grid)
    assert expected.amax() > 0
    torch.testing.assert_close(got.double(), expected, rtol=1e-4, atol=1e-6 * expected.amax())


DEFAULTS = {
    "videomae": "videomae.encoder.layer.1.layernorm_before",
    "vivit": "vivit.layers.1.layernorm_before",
    "timesformer": "timesformer.encoder.layer.1.temporal_dense",
    "mvit": "blocks.2.norm1",
}


def user_names(names: list[str]) -> list[str]:
    """Layer names as the wrapped model spells them (InputLayout's inner ``module.``)."""
    return [name.removeprefix("module.") for name in names]


@pytest.mark.parametrize("name", list(DEFAULTS))
def test_the_default_layer_gives_a_map_for_the_class_token_target(name: str) -> None:
    build, wrap, *_ = CASES[name]
    torch.manual_seed(1)
    model = wrap(build()).float()
    cam = camkit.GradCAM(model, output="logits" if wrap is hf else None)
    got = cam(torch.randn(1, 3, 4, 32, 32), target=1, upsample=False, normalize=False)[0]
    assert user_names(cam.layers) == [DEFAULTS[name]]
    assert got.shape[0] in (2, 4) and (got > 0).any() and got.amax() > 2 * got.amin()
    full = cam(torch.randn(1, 3, 4, 32, 32), target=1)
    assert full.shape == (1, 4, 32, 32)  # (B, T, H, W): one map per input frame


def test_swin3d_channels_last_volumes_are_read_as_clips() -> None:
    torch.manual_seed(0)
    model = torchvision.models.video.swin3d_t(num_classes=3).eval()
    layer = "features.6.1.norm1"
    x = torch.randn(1, 3, 4, 64, 64)
    cam = camkit.GradCAM(model)
    assert cam(x, target=0).shape == (1, 4, 64, 64)
    assert cam.layers == [layer]
    assert "channels-last (B, 2, 2, 2, 768)" in str(cam.layouts[layer])
    model.double()
    expected = reference_gradcam(model, layer, x.double(), [0], lambda a: a.permute(0, 4, 1, 2, 3))
    got = cam(x.double(), target=0, upsample=False, normalize=False)
    torch.testing.assert_close(got.double(), expected, rtol=1e-4, atol=1e-6 * expected.amax())


def test_a_frame_wise_cnn_is_read_as_frames_once_declared() -> None:
    torch.manual_seed(0)
    model = FrameWise().double().eval()
    x = torch.randn(2, 3, 5, 16, 16, dtype=torch.float64)
    undeclared = camkit.InputLayout(model, "BCTHW")
    with pytest.raises(LayerOutputError, match=r"10 rows .* frame_wise=True"):
        camkit.GradCAM(undeclared, "conv2")(x, target=0)
    declared = camkit.InputLayout(model, "BCTHW", frame_wise=True)
    before = model_state(declared)
    cam = camkit.GradCAM(declared)
    got = cam(x, target=[1, 2], upsample=False, normalize=False)
    assert_untouched(declared, before)
    assert user_names(cam.layers) == ["conv2"]  # the last frame-wise map, found by the trace
    assert "frame-wise, 5 frames per sample" in str(cam.layouts[cam.layers[0]])

    def frames(a: Tensor) -> Tensor:  # rows b * T + t -> (B, C, T, h, w)
        return a.unflatten(0, (2, 5)).transpose(1, 2)

    expected = reference_gradcam(model, "conv2", x, [1, 2], frames)
    assert got.shape == (2, 5, 8, 8)
    torch.testing.assert_close(got.double(), expected, rtol=1e-4, atol=1e-6 * expected.amax())
    assert camkit.GradCAM(declared)(x, target=0).shape == (2, 5, 16, 16)


def test_timesformer_frame_wise_spatial_layers_are_read_per_frame() -> None:
    """The divided attention's layernorm_before sees (B * T, 1 + h * w, C): once the model is
    declared frame-wise, each frame's tokens (class token dropped) make one frame's map."""
    torch.manual_seed(0)
    model = camkit.InputLayout(timesformer().double().eval(), "BTCHW", frame_wise=True)
    layer = "timesformer.encoder.layer.1.layernorm_before"
    x = torch.randn(1, 3, 4, 32, 32, dtype=torch.float64)
    got = camkit.GradCAM(model, layer, output="logits")(
        x, target=2, upsample=False, normalize=False
    )

    def frames(a: Tensor) -> Tensor:
        return a[:, 1:].reshape(1, 4, 4, 4, 16).permute(0, 4, 1, 2, 3)

    expected = reference_gradcam(model, layer, x, [2], frames)
    torch.testing.assert_close(got.double(), expected, rtol=1e-4, atol=1e-6 * expected.amax())


def test_video_tokens_the_model_does_not_declare_are_refused_with_what_to_pass() -> None:
    class Flat(nn.Module):  # tokens from a linear patch embedding: no grid to read
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Linear(3 * 8 * 8, 8)

        def forward(self, x: Tensor) -> Tensor:
            return self.embed(x.unfold(3, 8, 8).unfold(4, 8, 8).flatten(2, 4).permute(0, 2, 1, 3))

    with pytest.raises(LayoutError, match=r"no space-time token grid.*reshape="):
        infer_layout((1, 64, 8), Flat(), (4, 32, 32))
    with pytest.raises(LayoutError, match=r"65 tokens .* 2x4x4 \(tubelet"):
        infer_layout((1, 65, 16), videomae(), (4, 32, 32))


def test_fullgrad_of_a_frame_wise_clip_is_each_frame_s_fullgrad() -> None:
    """Frame t's map is the 2-D FullGrad of frame t alone, scored as its share of the clip's
    mean over frames (1/T of its logits: psi's 1e-7 guard keeps FullGrad from being exactly
    scale-free)."""
    torch.manual_seed(0)
    model = FrameWise().double().eval()
    x = torch.randn(2, 3, 5, 16, 16, dtype=torch.float64)
    declared = camkit.InputLayout(model, "BCTHW", frame_wise=True)
    got = camkit.FullGrad(declared)(x, target=[1, 2], normalize=False)
    assert got.shape == (2, 5, 16, 16)

    class OneFrame(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.clips = model  # its biases are FullGrad's

        def forward(self, image: Tensor) -> Tensor:
            return self.clips(image[:, :, None]) / 5  # a clip of one frame, 1/T of the mean

    per_frame = camkit.FullGrad(OneFrame())
    for t in range(5):
        expected = per_frame(x[:, :, t], target=[1, 2], normalize=False)
        torch.testing.assert_close(got[:, t], expected, rtol=1e-4, atol=1e-5)


def test_cams_that_do_not_read_frame_wise_layers_refuse_them_by_name() -> None:
    declared = camkit.InputLayout(FrameWise().eval(), "BCTHW", frame_wise=True)
    with pytest.raises(LayerOutputError, match="SESS does not read the layers of a frame-wise"):
        camkit.SESS(declared, "conv2")(torch.randn(1, 3, 4, 16, 16), target=0)


def test_saliency_of_a_video_transformer_is_the_clip_gradient() -> None:
    torch.manual_seed(0)
    model = hf(videomae())
    x = torch.randn(1, 3, 4, 32, 32, dtype=torch.float64)
    got = camkit.Saliency(model, output="logits")(x, target=2)
    leaf = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(logits(model, leaf)[0, 2], leaf)
    assert got.shape == x.shape  # (B, C, T, H, W): the clip's own shape
    torch.testing.assert_close(got.double(), grad, rtol=1e-4, atol=1e-6 * grad.abs().max())

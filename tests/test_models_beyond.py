"""Beyond plain CNN classifiers: wrappers, compiled models, volumes, frozen / bfloat16 models,
calls inside no_grad, zero gradients, and the automatic token reading."""

from __future__ import annotations

import pytest
import torch
import torchvision
from conftest import X, assert_untouched, model_state
from torch import nn

import camkit
from camkit import GradCAM, LayerCAM, Saliency
from camkit.errors import InputError, LayerOutputError, ZeroGradientWarning

RAW = {"relu": False, "upsample": False, "normalize": False}


def test_data_parallel_names_with_or_without_module_prefix(tiny):
    wrapped = nn.DataParallel(tiny)
    before = model_state(wrapped)
    expected = GradCAM(tiny, "conv")(X, 1)
    for name in ("conv", "module.conv"):
        torch.testing.assert_close(GradCAM(wrapped, name)(X, 1), expected)
    torch.testing.assert_close(Saliency(wrapped)(X, 1), Saliency(tiny)(X, 1))
    with camkit.record(wrapped, "module.conv") as rec:
        wrapped(X[None])
    assert rec.activations["conv"].shape == (1, 2, 2, 2)
    assert_untouched(wrapped, before)


def test_a_compiled_model_is_explained_through_its_eager_module(tiny):
    compiled = torch.compile(tiny)
    expected = GradCAM(tiny, "conv")(X, 1, **RAW)
    for name in ("conv", "_orig_mod.conv"):
        torch.testing.assert_close(GradCAM(compiled, name)(X, 1, **RAW), expected)


def test_frozen_parameters_and_calls_inside_no_grad(tiny):
    frozen = torchvision.models.resnet18(num_classes=4).eval()
    for parameter in frozen.parameters():
        parameter.requires_grad_(False)
    x = torch.randn(2, 3, 96, 96, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        maps = GradCAM(frozen, "layer4")(x, [0, 3])
        attr = Saliency(frozen)(x, [0, 3])
    assert maps.shape == (2, 96, 96) and torch.isfinite(maps).all() and maps.amax() > 0
    assert attr.abs().sum() > 0
    assert all(not p.requires_grad and p.grad is None for p in frozen.parameters())


def test_a_bfloat16_model_works_and_a_dtype_mismatch_says_what_to_do():
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=4).eval()
    x = torch.randn(2, 3, 96, 96, generator=torch.Generator().manual_seed(0))
    exact = GradCAM(model, "layer4")(x, [0, 3])
    low = GradCAM(model.bfloat16(), "layer4")(x.bfloat16(), [0, 3])
    assert low.dtype == torch.float32
    for a, b in zip(exact, low, strict=True):
        assert torch.corrcoef(torch.stack([a.flatten(), b.flatten()]))[0, 1] > 0.95
    with pytest.raises(InputError, match=r"parameters are torch.bfloat16.*x.to"):
        GradCAM(model, "layer4")(x, 0)


class Volumes(nn.Module):
    """(B, 1, D, H, W) -> Conv3d with 2 kernels (1 and 2) -> flatten -> linear, like TinyNet."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(1, 2, kernel_size=1, bias=False)
        self.fc = nn.Linear(2 * 8, 2, bias=False)
        with torch.no_grad():
            self.conv.weight.copy_(torch.tensor([1.0, 2.0]).view(2, 1, 1, 1, 1))
            self.fc.weight.copy_(torch.arange(32.0).view(2, 16) % 5 - 2)

    def forward(self, x):
        return self.fc(self.conv(x).flatten(1))


def test_volumes_get_volume_maps_by_hand_and_trilinear_upsampling():
    model = Volumes()
    x = torch.arange(1.0, 9.0).view(1, 1, 2, 2, 2)
    # Grad-CAM: w_c = mean_dhw dy/dA_c, map = sum_c w_c A_c with A_0 = x, A_1 = 2x
    w = model.fc.weight[1].view(2, 8).mean(1)
    expected = (w[0] * x + w[1] * 2 * x)[0, 0]
    torch.testing.assert_close(GradCAM(model, "conv")(x, 1, **RAW), expected[None])
    attr = Saliency(model)(x, 1)
    assert attr.shape == x.shape  # a 5-D input is a batch
    torch.manual_seed(0)
    strided = nn.Sequential(
        nn.Conv3d(1, 2, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool3d(1),
        nn.Flatten(),
        nn.Linear(2, 3),
    )
    clips = torch.rand(2, 1, 4, 8, 8)
    raw = LayerCAM(strided, "1")(clips, 2, relu=False, upsample=False, normalize=False)
    assert raw.shape == (2, 2, 4, 4)
    finished = LayerCAM(strided, "1")(clips, 2)
    upsampled = torch.nn.functional.interpolate(
        raw.relu()[:, None], size=(4, 8, 8), mode="trilinear", align_corners=False
    )[:, 0]
    low = upsampled.flatten(1).amin(1).view(2, 1, 1, 1)
    high = upsampled.flatten(1).amax(1).view(2, 1, 1, 1)
    torch.testing.assert_close(finished, (upsampled - low) / (high - low))


def test_a_layer_with_zero_gradient_warns(tiny):
    class Unused(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = tiny
            self.side = nn.Conv2d(1, 1, 1)

        def forward(self, x):
            return self.net(x) + 0 * self.side(x).sum()

    with pytest.warns(ZeroGradientWarning, match=r"\['side'\]"):
        GradCAM(Unused(), "side")(X, 1)


def test_auto_reshape_reads_tokens_without_a_reshape_function():
    class Tokens(nn.Module):
        """Conv features as 4 tokens (B, 4, 2) with no model information about the grid."""

        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(1, 2, 1, bias=False)
            self.tokens = nn.Identity()
            self.fc = nn.Linear(8, 2, bias=False)

        def forward(self, x):
            tokens = self.tokens(self.conv(x).flatten(2).transpose(1, 2))
            return self.fc(tokens.flatten(1))

    model = Tokens()
    cam = GradCAM(model, "tokens")
    assert cam(X, 1).shape == (2, 2)
    assert cam.layouts["tokens"].kind == "tokens"
    by_hand = GradCAM(model, "tokens", reshape=lambda t: t.transpose(1, 2).unflatten(2, (2, 2)))
    torch.testing.assert_close(cam(X, 1), by_hand(X, 1))
    with pytest.raises(LayerOutputError, match="reshape="):
        GradCAM(model, "tokens", reshape=None)(X, 1)


class WithMeta(nn.Module):
    """TinyNet whose logits are scaled per sample by a second input: ``model(x, meta)``."""

    def __init__(self, tiny):
        super().__init__()
        self.net = tiny

    def forward(self, x, meta, offset=0.0):
        return self.net(x) * meta[:, None] + offset


def test_additional_forward_args_follow_their_samples(tiny):
    model, plain = WithMeta(tiny), tiny
    batch = torch.stack([X, 2 * X])
    meta = torch.tensor([3.0, -1.0])
    args = {"additional_forward_args": (meta, 0.5)}
    # the score of sample b is meta_b * y_b (+ 0.5): its gradients are meta_b times TinyNet's
    for method in (GradCAM(model, "net.conv"), camkit.HiResCAM(model, "net.conv")):
        got = method(batch, 1, **RAW, **args)
        expected = type(method)(plain, "conv")(batch, 1, **RAW) * meta.view(2, 1, 1)
        torch.testing.assert_close(got, expected)
    torch.testing.assert_close(
        Saliency(model)(batch, 1, **args), Saliency(plain)(batch, 1) * meta.view(2, 1, 1, 1)
    )
    smooth = camkit.SmoothGrad(model, samples=4, seed=0, batch_size=3)  # copies cut across samples
    expected = camkit.SmoothGrad(plain, samples=4, seed=0)(batch, 1) * meta.view(2, 1, 1, 1)
    torch.testing.assert_close(smooth(batch, 1, **args), expected)
    ig = camkit.IntegratedGradients(model, steps=4, batch_size=3)(batch, 1, **args)
    expected = camkit.IntegratedGradients(plain, steps=4)(batch, 1) * meta.view(2, 1, 1, 1)
    torch.testing.assert_close(ig, expected)
    maps = camkit.cams(model, "net.conv", batch, 1, methods=["gradcam"], **RAW, **args)
    torch.testing.assert_close(maps["gradcam"], GradCAM(model, "net.conv")(batch, 1, **RAW, **args))

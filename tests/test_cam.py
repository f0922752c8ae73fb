"""The Grad-CAM family against maps computed by hand on TinyNet (see conftest).

TinyNet on X = [[1, 2], [3, 4]]: A_0 = X, A_1 = 2X; the gradient of logit k at the conv output
is W[k] reshaped (2, 2, 2):
  class 0: g_0 = [[1, 0], [0, 1]], g_1 = [[0, -1], [1, 0]]
  class 1: g_0 = ones,             g_1 = 2 * ones
"""

from __future__ import annotations

import copy
import math
from types import SimpleNamespace

import pytest
import torch
from conftest import TinyNet, X, assert_untouched, model_state
from torch import nn

import camkit
from camkit import (
    EigenCAM,
    GradCAM,
    GradCAMPlusPlus,
    HiResCAM,
    LayerCAM,
    LayerNotFoundError,
    LayerOutputError,
    XGradCAM,
)
from camkit.errors import GradientError, InputError, OutputError, TargetError, UnknownMethodError

RAW = {"relu": False, "upsample": False, "normalize": False}
A0 = X[0]

# The raw maps sum_c w_c A_c, worked out by hand in the module docstring's notation.
HAND_CLASS0 = {
    GradCAM: 0.5 * A0,  # w = (mean g_0, mean g_1) = (0.5, 0)
    HiResCAM: torch.tensor([[1.0, -4.0], [6.0, 4.0]]),  # g_0*A_0 + g_1*A_1
    LayerCAM: torch.tensor([[1.0, 0.0], [6.0, 4.0]]),  # relu(g_0)*A_0 + relu(g_1)*A_1
    XGradCAM: 0.7 * A0,  # w_0 = (1+4)/10, w_1 = (-4+6)/20
    GradCAMPlusPlus: 17 / 66 * A0,  # w_0 = 2 * 1/(2+10), w_1 = 1/(2+20): A_0/6 + 2A_0/22
}
HAND_CLASS1 = {
    GradCAM: 5 * A0,  # w = (1, 2)
    HiResCAM: 5 * A0,
    LayerCAM: 5 * A0,
    XGradCAM: 5 * A0,
    GradCAMPlusPlus: 5 / 7 * A0,  # w_0 = 4 * 1/12, w_1 = 4 * 2 * 4/(8 + 20*8) = 4/21
}


@pytest.mark.parametrize("method", list(HAND_CLASS0))
def test_raw_maps_match_hand_computation(tiny, method):
    cam = method(tiny, "conv")
    torch.testing.assert_close(cam(X, target=0, **RAW), HAND_CLASS0[method])
    torch.testing.assert_close(cam(X, target=1, **RAW), HAND_CLASS1[method])


def test_eigencam_is_the_first_principal_component_with_a_fixed_sign(tiny):
    # positions (A_0, A_1) = (1,2), (2,4), (3,6), (4,8): centred along (1, 2)/sqrt(5)
    expected = torch.tensor([[-7.5, -2.5], [2.5, 7.5]]) / math.sqrt(5)
    torch.testing.assert_close(EigenCAM(tiny, "conv")(X, **RAW), expected)
    # the sign does not depend on the target, nor flip for a rescaled input
    torch.testing.assert_close(EigenCAM(tiny, "conv")(3 * X, target=0, **RAW), 3 * expected)
    finished = EigenCAM(tiny, "conv")(X)
    torch.testing.assert_close(finished, torch.tensor([[0.0, 0.0], [1 / 3, 1.0]]))


def test_finishing_relu_and_minmax(tiny):
    torch.testing.assert_close(
        GradCAM(tiny, "conv")(X, target=0), torch.tensor([[0.0, 1 / 3], [2 / 3, 1.0]])
    )
    torch.testing.assert_close(
        HiResCAM(tiny, "conv")(X, target=0), torch.tensor([[1 / 6, 0.0], [1.0, 2 / 3]])
    )


def test_upsampling_is_bilinear_to_the_input_size():
    model = nn.Sequential(nn.Conv2d(1, 1, 2, stride=2, bias=False), nn.Flatten(), nn.Linear(4, 1))
    x = torch.arange(16.0).view(1, 4, 4)
    raw = GradCAM(model, "0")(x, target=0, upsample=False, normalize=False)
    up = GradCAM(model, "0")(x, target=0, normalize=False)
    assert raw.shape == (2, 2) and up.shape == (4, 4)
    torch.testing.assert_close(
        up, nn.functional.interpolate(raw[None, None], size=(4, 4), mode="bilinear")[0, 0]
    )


def test_constant_map_gives_zeros_not_nan(tiny):
    # the score -(y_0 + y_1) has negative weights everywhere: ReLU leaves a constant zero map
    heat = GradCAM(tiny, "conv")(X, target=lambda out: -out.sum(1))
    assert torch.equal(heat, torch.zeros(2, 2))


def test_per_sample_targets_and_top1(tiny):
    batch = torch.stack([X, 2 * X])
    raw = GradCAM(tiny, "conv")(batch, target=[0, 1], **RAW)
    torch.testing.assert_close(raw, torch.stack([0.5 * A0, 10 * A0]))
    # logits for X are (7, 50): the top-1 is class 1
    torch.testing.assert_close(GradCAM(tiny, "conv")(X, **RAW), 5 * A0)
    torch.testing.assert_close(
        GradCAM(tiny, "conv")(batch, target=torch.tensor([0, 1]), **RAW), raw
    )


def test_callable_target(tiny):
    # d(y_0 - y_1)/dA: g_0 mean -0.5, g_1 mean -2 -> -0.5 A_0 - 4 A_0
    raw = GradCAM(tiny, "conv")(X, target=lambda out: out[:, 0] - out[:, 1], **RAW)
    torch.testing.assert_close(raw, -4.5 * A0)


def test_several_targets_per_sample_equal_single_calls(tiny):
    batch = torch.stack([X, 2 * X, -X])
    cam = GradCAMPlusPlus(tiny, "conv")
    targets = [[0, 1], [1, 0], [1, 1]]
    many = cam(batch, target=targets)
    assert many.shape == (3, 2, 2, 2)
    for k in range(2):
        torch.testing.assert_close(many[:, k], cam(batch, target=[row[k] for row in targets]))
    torch.testing.assert_close(cam(batch, target=torch.tensor(targets)), many)
    assert cam(X, target=[[0, 1]]).shape == (2, 2, 2)


def test_no_grad_and_input_without_grad(tiny):
    with torch.no_grad():
        raw = GradCAM(tiny, "conv")(X, target=1, **RAW)
    torch.testing.assert_close(raw, 5 * A0)
    assert not raw.requires_grad and raw.dtype == torch.float32


def test_inplace_relu_after_the_layer_does_not_change_the_captured_map():
    x = torch.tensor([[[1.0, -2.0], [3.0, 4.0]]])
    # ReLU blocks the gradient at (0, 1): g_0 = [[1,0],[1,1]], g_1 = 2 g_0 -> w = (0.75, 1.5)
    for model in (TinyNet(inplace_relu=False), TinyNet(inplace_relu=True)):
        torch.testing.assert_close(GradCAM(model, "conv")(x, target=1, **RAW), 3.75 * x[0])


@pytest.mark.parametrize(
    ("arch", "layer"),
    [
        ("resnet18", "layer4"),
        ("resnet18", "layer4.1.bn2"),  # followed by the in-place `out += identity` and ReLU
        ("densenet121", "features.denseblock4"),
        ("densenet121", "features.denseblock4.denselayer16.norm1"),  # then ReLU(inplace=True)
    ],
)
def test_torchvision_models_with_inplace_relu(arch, layer):
    import torchvision

    torch.manual_seed(0)
    model = getattr(torchvision.models, arch)(weights=None).eval()
    x = torch.randn(2, 3, 64, 64)
    before = model_state(model)
    raw = GradCAM(model, layer)(x, target=[1, 2], **RAW)
    assert_untouched(model, before)
    # the same maps as the model with every ReLU out of place
    out_of_place = copy.deepcopy(model)
    for module in out_of_place.modules():
        if getattr(module, "inplace", False):
            module.inplace = False
    expected = GradCAM(out_of_place, layer)(x, target=[1, 2], **RAW)
    assert raw.abs().amax() > 0
    torch.testing.assert_close(raw, expected)


def test_layers_fused_or_kept_apart():
    x = torch.tensor([[[1.0, -2.0], [3.0, 4.0]]])
    model = TinyNet()
    apart = GradCAM(model, ["conv", "relu"])(x, target=1, fuse=False)
    assert set(apart) == {"conv", "relu"}
    for name in apart:
        torch.testing.assert_close(apart[name], GradCAM(model, name)(x, target=1))
    mean = (apart["conv"] + apart["relu"]) / 2
    expected = (mean - mean.min()) / (mean.max() - mean.min())
    torch.testing.assert_close(GradCAM(model, ["conv", "relu"])(x, target=1), expected)
    # modules work as layer specs too
    torch.testing.assert_close(GradCAM(model, [model.conv, model.relu])(x, target=1), expected)


def test_model_left_untouched(tiny):
    tiny.fc.weight.requires_grad_(False)
    before = model_state(tiny)
    for method in [*HAND_CLASS0, EigenCAM]:
        method(tiny, "conv")(X, target=1)
    camkit.cams(tiny, "conv", X, target=1)
    assert_untouched(tiny, before)


def test_training_mode_is_kept_and_warned_about():
    model = nn.Sequential(nn.Conv2d(1, 2, 1), nn.Dropout(0.5), nn.Flatten(), nn.Linear(8, 2))
    before = model_state(model)
    with pytest.warns(UserWarning, match="training mode"):
        GradCAM(model, "0")(X, target=1)
    assert_untouched(model, before)
    assert model.training


class Boom(Exception):
    pass


class ExplodingNet(TinyNet):
    def forward(self, x):
        self.relu(self.conv(x))
        raise Boom


def test_hooks_removed_and_grad_mode_restored_when_the_forward_raises():
    model = ExplodingNet()
    before = model_state(model)
    with pytest.raises(Boom):
        GradCAM(model, "conv")(X, target=0)
    assert_untouched(model, before)


def test_hooks_removed_after_a_bad_target(tiny):
    before = model_state(tiny)
    with pytest.raises(TargetError):
        GradCAM(tiny, "conv")(X, target=7)
    assert_untouched(tiny, before)


def test_misspelt_layer_names_the_closest_layers(tiny):
    with pytest.raises(LayerNotFoundError, match="did you mean 'conv'"):
        GradCAM(tiny, "cnv")
    with pytest.raises(LayerNotFoundError, match="not a submodule"):
        GradCAM(tiny, nn.Conv2d(1, 1, 1))


@pytest.mark.parametrize(
    ("target", "error", "match"),
    [
        (2, TargetError, r"0\.\.1"),
        (-1, TargetError, "out of range"),
        ([0, 1, 0], TargetError, "one target per sample"),
        ([0], TargetError, "one target per sample"),
        (torch.tensor([0.5, 1.0]), TargetError, "integers"),
        ("cat", TargetError, "target must be"),
        ([[0, 1], [1]], TargetError, "rectangular"),
        (lambda out: out.sum(), TargetError, "callable target must return"),
    ],
)
def test_bad_targets(tiny, target, error, match):
    with pytest.raises(error, match=match):
        GradCAM(tiny, "conv")(torch.stack([X, X]), target=target)


@pytest.mark.parametrize(
    ("x", "error", "match"),
    [
        (torch.ones(2, 2), InputError, r"\(3, H, W\)"),
        (torch.ones(1, 1, 1, 2, 2), InputError, "no 3-D layer"),
        (torch.ones(1, 1, 1, 1, 2, 2), InputError, "got shape"),
        (torch.ones(1, 2, 2, dtype=torch.uint8), InputError, "floating-point"),
        (torch.tensor([[[1.0, float("nan")], [0.0, 0.0]]]), InputError, "NaN"),
        (X.numpy(), InputError, "tensor"),
    ],
)
def test_bad_inputs(tiny, x, error, match):
    with pytest.raises(error, match=match):
        GradCAM(tiny, "conv")(x, target=0)


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.used = nn.Conv2d(1, 1, 1)
        self.unused = nn.Conv2d(1, 1, 1)
        self.never = nn.Conv2d(1, 1, 1)
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        self.unused(x)
        return self.head(self.used(x).flatten(1))


def test_layer_that_does_not_reach_the_score():
    with pytest.raises(LayerOutputError, match="does not depend"):
        GradCAM(Branchy(), "unused")(X, target=0)
    with pytest.raises(LayerOutputError, match="does not depend"):
        GradCAM(Branchy(), ["used", "unused"])(X, target=0)
    with pytest.raises(LayerOutputError, match="did not run"):
        GradCAM(Branchy(), "never")(X, target=0)


class Wrapped(nn.Module):
    def __init__(self, style):
        super().__init__()
        self.net, self.style = TinyNet(), style

    def forward(self, x):
        logits = self.net(x)
        return {
            "tuple": (logits, logits * 0),
            "dict": {"logits": logits, "aux": logits * 0},
            "object": SimpleNamespace(logits=logits, hidden=logits * 0),
        }[self.style]


@pytest.mark.parametrize("style", ["tuple", "dict", "object"])
def test_tuple_dict_and_object_outputs(style):
    model = Wrapped(style)
    torch.testing.assert_close(GradCAM(model, "net.conv")(X, target=1, **RAW), 5 * A0)
    selector = {"tuple": 0, "dict": "logits", "object": lambda out: out.logits}[style]
    cam = GradCAM(model, "net.conv", output=selector)
    torch.testing.assert_close(cam(X, target=1, **RAW), 5 * A0)


def test_unknown_output_key():
    with pytest.raises(OutputError, match="no 'scores'"):
        GradCAM(Wrapped("dict"), "net.conv", output="scores")(X, target=0)


def test_reshape_for_token_layers():
    class Tokens(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = TinyNet()
            self.tokens = nn.Identity()

        def forward(self, x):
            a = self.net.relu(self.net.conv(x))
            t = self.tokens(a.flatten(2).transpose(1, 2))  # (B, 4 tokens, 2 channels)
            return self.net.fc(t.transpose(1, 2).flatten(1))

    def to_grid(t):
        return t.transpose(1, 2).unflatten(2, (2, 2))

    raw = GradCAM(Tokens(), "tokens", reshape=to_grid)(X, target=1, **RAW)
    torch.testing.assert_close(raw, 5 * A0)
    with pytest.raises(LayerOutputError, match="reshape="):
        GradCAM(Tokens(), "tokens", reshape=None)(X, target=1)


def test_cams_matches_each_single_method(tiny):
    batch = torch.stack([X, -X])
    # not on TinyNet's one conv: CAM (TinyNet's classifier does not follow a global pooling),
    # RefineCAM (two layers or more), Smooth Grad-CAM++ (cams() does not seed its noise) and
    # FullGrad (no layer: not a CAM for cams()); see test_methods_extra.py
    unfit = ("cam", "refinecam", "smoothgradcam++", "fullgrad", "sess")
    names = [n for n in camkit.registry.names("gradient-cam") if n not in unfit]
    names += ["scorecam", "ablationcam"]
    together = camkit.cams(tiny, "conv", batch, target=[1, 0], methods=names)
    for name in names:
        single = camkit.METHODS[name].cls(tiny, "conv")(batch, target=[1, 0])
        torch.testing.assert_close(together[name], single)
    with pytest.raises(UnknownMethodError, match="did you mean gradcam"):
        camkit.cams(tiny, "conv", X, methods=["gradcamm"])
    with pytest.raises(UnknownMethodError, match="takes CAM methods"):
        camkit.cams(tiny, "conv", X, methods=["saliency"])


def test_inference_mode_at_the_call_site_is_a_clear_error(tiny):
    with torch.inference_mode(), pytest.raises(GradientError, match="inference_mode"):
        GradCAM(tiny, "conv")(X, target=1)


def test_a_target_tensor_made_in_inference_mode_works(tiny):
    with torch.inference_mode():
        target = torch.tensor([1])
    expected = GradCAM(tiny, "conv")(X, target=[1])
    torch.testing.assert_close(GradCAM(tiny, "conv")(X, target=target), expected)

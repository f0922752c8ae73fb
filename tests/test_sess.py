"""SESS (Tursun et al., ECCV 2022): the base method on patches at several scales, fused.

The hand-checked cases use MeanNet (logits ``[m, -m]`` with ``m`` the mean pixel, so the
softmax probability of class 0 is ``sigmoid(2 m)``) and PixelCAM, a base whose map is the
patch itself: each patch map is ``minmax(patch)``, known by hand.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_untouched, model_state
from test_batched import SmallNet  # x (B, 3, 16, 16) -> "block2" (16 ch, 4x4) -> fc(6)
from torch import Tensor, nn

import camkit
from camkit import registry
from camkit.errors import ArgumentError, TargetError, UnknownMethodError
from camkit.methods.cam.base import BaseCAM
from camkit.methods.cam.sess import SESS, _gaussian_blur, _starts

RAW = {"normalize": False}


class MeanNet(nn.Module):
    """x (B, 1, H, W) -> conv (weight 1) -> logits [m, -m], m the mean of the pixels less
    ``shift``."""

    def __init__(self, shift: float = 0.0):
        super().__init__()
        self.shift = shift
        self.conv = nn.Conv2d(1, 1, kernel_size=1, bias=False)
        with torch.no_grad():
            self.conv.weight.fill_(1.0)

    def forward(self, x: Tensor) -> Tensor:
        m = self.conv(x).mean(dim=(1, 2, 3)) - self.shift
        return torch.stack([m, -m], dim=1)


class PixelCAM(BaseCAM):
    """The map is the layer's activation itself (MeanNet's conv: the patch)."""

    needs_gradients = False

    def channel_weights(self, act: Tensor, grad: Tensor | None) -> Tensor:
        return torch.ones_like(act)


@pytest.fixture
def small() -> SmallNet:
    return SmallNet()


@pytest.fixture
def images() -> Tensor:
    return torch.randn(3, 3, 16, 16, generator=torch.Generator().manual_seed(3))


def sigmoid(v: float) -> float:
    return 1 / (1 + math.exp(-v))


# the image [[1, 2, 4], [3, 5, 6]]: two 2x2 windows (stride 1) overlapping in the middle column
#   A = [[1, 2], [3, 5]], mean 2.75, map (A - 1) / 4 = [[0, .25], [.5, 1]]
#   B = [[2, 4], [5, 6]], mean 4.25, map (B - 2) / 4 = [[0, .5], [.75, 1]]
IMAGE = torch.tensor([[[1.0, 2.0, 4.0], [3.0, 5.0, 6.0]]])
HAND = {"base": PixelCAM, "scales": [2], "window": 2, "stride": 1}


def test_one_scale_and_one_window_equal_to_the_input_is_the_base_method(small, images):
    for base in (camkit.GradCAM, camkit.HiResCAM):
        sess = SESS(small, "block2", base=base, scales=[16], window=16)
        plain = base(small, "block2")
        for target in (None, [0, 3, 5], [[0, 4], [2, 2], [5, 1]]):
            torch.testing.assert_close(sess(images, target), plain(images, target), rtol=0, atol=0)
        unfinished = {"relu": False, "normalize": False}
        torch.testing.assert_close(sess(images, 2, **unfinished), plain(images, 2), rtol=0, atol=0)


def test_fusion_is_the_mean_of_the_positive_calibrated_patch_maps():
    w_a = sigmoid(5.5) / sigmoid(8.5)  # class 0: B is the best patch, A weighs pA / pB
    expected = torch.tensor([[0.0, 0.25 * w_a, 0.5], [0.5 * w_a, (w_a + 0.75) / 2, 1.0]])
    got = SESS(MeanNet(), "conv", **HAND)(IMAGE, 0, **RAW)
    torch.testing.assert_close(got, expected)
    # the top-1 class of the whole image is class 0 (a positive mean)
    torch.testing.assert_close(SESS(MeanNet(), "conv", **HAND)(IMAGE, **RAW), expected)
    # finished: min-max normalised (its minimum is already 0, its maximum 1)
    torch.testing.assert_close(SESS(MeanNet(), "conv", **HAND)(IMAGE, 0), expected)
    # class 1: A is now the best patch (sigmoid(-5.5) > sigmoid(-8.5)), B weighs pB / pA
    w_b = sigmoid(-8.5) / sigmoid(-5.5)
    expected_1 = torch.tensor([[0.0, 0.25, 0.5 * w_b], [0.5, (1 + 0.75 * w_b) / 2, w_b]])
    torch.testing.assert_close(SESS(MeanNet(), "conv", **HAND)(IMAGE, 1, **RAW), expected_1)


def test_pre_filtering_drops_the_lowest_scoring_patches_per_target():
    sess = SESS(MeanNet(), "conv", **HAND, pre_filter_ratio=0.5)  # int(2 * 0.5) = 1 dropped
    both = sess(IMAGE, [[0, 1]], **RAW)
    only_b = torch.tensor([[0.0, 0.0, 0.5], [0.0, 0.75, 1.0]])  # class 0 keeps B
    only_a = torch.tensor([[0.0, 0.25, 0.0], [0.5, 1.0, 0.0]])  # class 1 keeps A
    torch.testing.assert_close(both, torch.stack([only_b, only_a]))
    # a ratio that drops less than one patch keeps them all
    keep_all = SESS(MeanNet(), "conv", **HAND, pre_filter_ratio=0.49)(IMAGE, 0, **RAW)
    torch.testing.assert_close(keep_all, SESS(MeanNet(), "conv", **HAND)(IMAGE, 0, **RAW))


def test_windows_cover_the_image_with_a_last_window_flush_with_the_edge():
    assert _starts(3, 2, 1) == [0, 1]
    assert _starts(10, 4, 4) == [0, 4, 6]
    assert _starts(8, 4, 4) == [0, 4]
    assert _starts(4, 4, 2) == [0]


def test_a_scale_resizes_the_image_and_the_canvas_comes_back_to_the_input():
    x = torch.rand(2, 1, 4, 6, generator=torch.Generator().manual_seed(1)) + 0.1
    for scale in (8, 2):  # up, then down (antialiased)
        size = (scale, scale * 6 // 4)
        sess = SESS(MeanNet(), "conv", base=PixelCAM, scales=[scale], window=size)
        resized = F.interpolate(x, size=size, mode="bilinear", align_corners=False, antialias=True)
        low = resized.amin(dim=(-2, -1), keepdim=True)
        high = resized.amax(dim=(-2, -1), keepdim=True)
        patch_map = (resized - low) / (high - low)  # one window: the whole resized image
        back = F.interpolate(patch_map, size=(4, 6), mode="bilinear", align_corners=False)
        torch.testing.assert_close(sess(x, 0, **RAW), back[:, 0])


def test_inputs_larger_than_the_window_at_several_scales(small, images):
    sess = SESS(small, "block2", scales=[16, 20, 24], window=8, stride=5, pre_filter_ratio=0.3)
    targets = [[0, 4], [2, 2], [5, 1]]
    many = sess(images, targets)
    assert many.shape == (3, 2, 16, 16)
    assert many.min() == 0 and many.max() == 1 and torch.isfinite(many).all()
    for k in range(2):  # each target ranks and weighs the patches itself
        torch.testing.assert_close(many[:, k], sess(images, [row[k] for row in targets]))
    torch.testing.assert_close(sess(images, torch.tensor(targets)), many)
    # not the base method's map of the whole image
    assert not torch.allclose(many[:, 0], camkit.GradCAM(small, "block2")(images, [0, 2, 5]))
    # rectangular inputs: the shorter side is the scale
    wide = torch.randn(2, 3, 12, 20, generator=torch.Generator().manual_seed(5))
    assert sess(wide, 1).shape == (2, 12, 20)


def test_results_do_not_depend_on_the_batch_or_batch_size(small, images):
    options = {"scales": [16, 24], "window": 8, "stride": 6, "pre_filter_ratio": 0.25}
    whole = SESS(small, "block2", **options)(images, [1, 4, 0])
    for i, target in enumerate([1, 4, 0]):
        alone = SESS(small, "block2", **options)(images[i], target)
        torch.testing.assert_close(alone, whole[i], rtol=1e-5, atol=1e-6)
    chunked = SESS(small, "block2", batch_size=2, **options)(images, [1, 4, 0])
    torch.testing.assert_close(chunked, whole, rtol=1e-5, atol=1e-6)
    sess = SESS(small, "block2", **options)
    raw = sess.explain_batch(images, [1, 4, 0], **sess.display_options).maps
    heat = sess.display_heat(raw)
    torch.testing.assert_close(heat, whole[:, None])  # what the CLI draws
    torch.testing.assert_close(raw, whole[:, None])


def test_callable_targets_score_and_weigh_the_patches(small, images):
    options = {"scales": [16, 20], "window": 8, "stride": 8}
    sess = SESS(small, "block2", **options)
    pair = sess(images, lambda out: out.softmax(dim=1)[:, [3, 1]])
    assert pair.shape == (3, 2, 16, 16)
    torch.testing.assert_close(pair[:, 1], sess(images, lambda out: out.softmax(dim=1)[:, 1]))


def test_top1_is_the_whole_images_class_for_every_patch():
    # [[1, 2, 5, 6]] less 3 predicts class 0 (m = 0.5); its left patch alone predicts class 1
    x = torch.tensor([[[1.0, 2.0, 5.0, 6.0]]])
    sess = SESS(MeanNet(shift=3.0), "conv", base=PixelCAM, scales=[1], window=(1, 2))
    left = sigmoid(-3.0) / sigmoid(5.0)  # class 0: the right patch is the best one
    torch.testing.assert_close(sess(x, **RAW), torch.tensor([[0.0, left, 0.0, 1.0]]))
    torch.testing.assert_close(sess(x, 0, **RAW), sess(x, **RAW))
    right = sigmoid(-5.0) / sigmoid(3.0)
    torch.testing.assert_close(sess(x, 1, **RAW), torch.tensor([[0.0, 1.0, 0.0, right]]))


def test_target_errors(small, images):
    sess = SESS(small, "block2", scales=[16], window=8)
    with pytest.raises(TargetError, match="one target per sample"):
        sess(images, [0, 1])
    with pytest.raises(TargetError, match="out of range"):
        sess(images, 6)
    with pytest.raises(TargetError, match="integers"):
        sess(images, torch.tensor([0.0, 1.0, 2.0]))
    with pytest.raises(TargetError, match="callable target must return"):
        sess(images, lambda out: out[:2, 0])


def test_argument_errors(small, images):
    bad = [
        ({"window": 0}, "window must be a positive int"),
        ({"window": (8, 8, 8)}, r"window must be a positive int or \(h, w\)"),
        ({"stride": 0}, "stride must be a positive int"),
        ({"scales": []}, "scales must be a non-empty list"),
        ({"scales": 16}, "scales must be a non-empty list"),
        ({"scales": [16, 0]}, "scales must be a positive int"),
        ({"pre_filter_ratio": 1.0}, r"in \[0, 1\)"),
        ({"pre_filter_ratio": -0.1}, ">= 0.0"),
        ({"smooth": 1}, "smooth must be True or False"),
        ({"base": nn.Linear}, "base must be a CAM class"),
        ({"base": SESS}, "base must be a CAM class"),
    ]
    for options, message in bad:
        with pytest.raises(ArgumentError, match=message):
            SESS(small, "block2", **options)
    with pytest.raises(UnknownMethodError, match="did you mean gradcam"):
        SESS(small, "block2", base="gradcan")
    with pytest.raises(ArgumentError, match="smaller than the 16x16 window"):
        SESS(small, "block2", scales=[12], window=16)(images, 0)


class Scaled(nn.Module):
    """``net(x) * scale``, the scale per sample as a second input or fixed."""

    def __init__(self, net: nn.Module, scale: Tensor | None = None):
        super().__init__()
        self.net, self.scale = net, scale

    def forward(self, x: Tensor, scale: Tensor | None = None) -> Tensor:
        scale = self.scale if scale is None else scale
        return self.net(x) * scale.view(-1, 1)


def test_per_sample_forward_arguments_follow_the_patches(small, images):
    scale = torch.tensor([1.0, 3.0, 0.2])
    options = {"scales": [16, 24], "window": 12, "stride": 6}
    got = SESS(Scaled(small), "net.block2", **options)(images, 1, additional_forward_args=scale)
    for i in range(3):  # each sample alone, its scale fixed in the model
        alone = SESS(Scaled(small, scale[i : i + 1]), "net.block2", **options)(images[i], 1)
        torch.testing.assert_close(got[i], alone, atol=1e-5, rtol=1e-4)
    # the scale changes the softmax probabilities that weigh the patches
    plain = SESS(small, "block2", **options)(images, 1)
    assert not torch.allclose(got[1], plain[1], atol=1e-3)


def test_base_by_registry_name_and_registry_entry(small, images):
    by_name = SESS(small, "block2", base="hirescam", scales=[16], window=16)
    assert isinstance(by_name.base, camkit.HiResCAM)
    torch.testing.assert_close(by_name(images, 1), camkit.HiResCAM(small, "block2")(images, 1))
    entry = registry.get("sess")
    assert entry.cls is SESS and entry.reference == "Tursun et al., ECCV 2022"
    assert entry.family == "gradient-cam" and entry.needs_layer and not entry.shares_pass
    explainer = entry.build(small, "block2", scales=[16], window=8)
    assert explainer(images, 0).shape == (3, 16, 16)
    assert "SESS(base=GradCAM" in repr(explainer)
    # a perturbation base: no gradients needed, and the class's flags are not rewritten
    wrapper = SESS(small, "block2", base=camkit.ScoreCAM, scales=[16], window=16)
    assert wrapper.needs_gradients == entry.needs_gradients
    with torch.inference_mode():
        assert wrapper(images, 0).shape == (3, 16, 16)
    # the defaults: 224 windows without overlap, six scales 64 apart from the window up
    default = SESS(small, "block2")
    assert default.window == default.stride == (224, 224)
    assert default.scales == (224, 288, 352, 416, 480, 544) and default.pre_filter_ratio == 0
    assert SESS(small, "block2", window=(8, 12), stride=(2, 3)).scales[:2] == (12, 76)


def test_smoothing_is_a_normalised_gaussian_blur(small, images):
    ones = torch.ones(1, 2, 12, 12)
    torch.testing.assert_close(_gaussian_blur(ones), ones)
    spike = torch.zeros(1, 1, 21, 21)
    spike[0, 0, 10, 10] = 1
    blurred = _gaussian_blur(spike)[0, 0]
    g = torch.exp(-((torch.arange(11.0) - 5) ** 2) / 50)
    g = g / g.sum()
    torch.testing.assert_close(blurred[5:16, 5:16], g[:, None] * g[None, :])
    options = {"scales": [16], "window": 8, "stride": 4}
    smooth = SESS(small, "block2", smooth=True, **options)(images, 2)
    sharp = SESS(small, "block2", **options)(images, 2)
    assert smooth.shape == sharp.shape and not torch.allclose(smooth, sharp)


def test_the_users_model_is_untouched(small, images):
    small.train()  # a mode camkit must not change
    before = model_state(small)
    SESS(small, "block2", scales=[16, 20], window=8)(images, [0, 1, 2])
    assert_untouched(small, before)
    with torch.no_grad():
        SESS(small, "block2", scales=[16], window=8)(images, 0)
    assert_untouched(small, before)

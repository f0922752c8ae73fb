"""The call options every CAM takes: ``aug_smooth``, ``eigen_smooth``; Seg-Eigen-CAM; refusals.

Maps computed by hand on TinyNet (see conftest and tests/test_cam.py: ``A_0 = X``, ``A_1 = 2X``;
class 0: ``g_0 = [[1, 0], [0, 1]]``, ``g_1 = [[0, -1], [1, 0]]``; class 1: ``g_0 = 1``,
``g_1 = 2``) and on a one-channel model; parity with pytorch-grad-cam is in
tests/test_references.py.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import X, assert_untouched, model_state, small_cnn
from torch import nn

import camkit
from camkit import GradCAM, HiResCAM, ReciproCAM, Saliency, SegEigenCAM
from camkit.core.finish import minmax
from camkit.errors import ArgumentError
from camkit.methods.cam.smoothing import FACTORS, principal_component

RAW = {"relu": False, "upsample": False, "normalize": False}
A0 = X[0]


def one_channel() -> nn.Module:
    """x (B, 1, 2, 2) -> identity 1x1 conv ``"0"`` -> linear with rows (1, 1, 1, 1) and
    (-1, -1, -1, -1): ``g = 1`` for class 0 and ``g = -1`` for class 1 at every position."""
    model = nn.Sequential(nn.Conv2d(1, 1, 1, bias=False), nn.Flatten(), nn.Linear(4, 2, bias=False))
    with torch.no_grad():
        model[0].weight.fill_(1.0)
        model[2].weight.copy_(torch.tensor([[1.0] * 4, [-1.0] * 4]))
    return model.eval()


PEAKED = torch.tensor([[[3.0, 3.0], [3.0, 0.0]]])  # centred: 0.75 three times, -2.25 once


# ------------------------------------------------------------------ eigen_smooth


def test_principal_component_by_hand_and_its_sign():
    # positions (c0, c1) = (0, 0), (1, 2), (2, 4): centred along (1, 2) / sqrt(5)
    weighted = torch.tensor([[0.0, 1.0, 2.0], [0.0, 2.0, 4.0]]).view(1, 1, 2, 1, 3)
    expected = torch.tensor([-1.0, 0.0, 1.0]).view(1, 1, 1, 3) * math.sqrt(5)
    torch.testing.assert_close(principal_component(weighted), expected)
    # the sign follows the plain map sum_c w_c A_c, whatever sign the SVD returns
    torch.testing.assert_close(principal_component(-weighted), -expected)


def test_eigen_smooth_is_the_first_component_of_the_weighted_activations(tiny):
    cam = GradCAM(tiny, "conv")
    # class 1: w = (1, 2), weighted (A_0, 2 A_1) = (X, 4X): positions along (1, 4) / sqrt(17)
    expected = math.sqrt(17) * torch.tensor([[-1.5, -0.5], [0.5, 1.5]])
    torch.testing.assert_close(cam(X, target=1, eigen_smooth=True, **RAW), expected)
    # class 0: w = (0.5, 0): one channel carries everything, the component is 0.5 X centred
    expected = torch.tensor([[-0.75, -0.25], [0.25, 0.75]])
    torch.testing.assert_close(cam(X, target=0, eigen_smooth=True, **RAW), expected)
    assert not cam.eigen_smooth  # the call used a copy: the instance is unchanged
    torch.testing.assert_close(cam(X, target=1, **RAW), 5 * A0)


def test_eigen_smooth_of_one_channel_is_the_centred_map_signed_as_the_map():
    model = one_channel()
    cam = GradCAM(model, "0")
    # class 0: weighted = A = (3, 3, 3, 0); class 1: weighted = -A, the map's sign kept
    smoothed = cam(PEAKED, target=[[0, 1]], eigen_smooth=True, **RAW)
    centred = torch.tensor([[0.75, 0.75], [0.75, -2.25]])
    torch.testing.assert_close(smoothed, torch.stack([centred, -centred]))


def test_segeigencam_takes_abs_gradients_and_makes_the_larger_extreme_positive():
    cam = SegEigenCAM(one_channel(), "0")
    # |g| A = (3, 3, 3, 0) for both classes; centred (0.75, 0.75, 0.75, -2.25): |min| > |max|
    expected = torch.tensor([[-0.75, -0.75], [-0.75, 2.25]])
    got = cam(PEAKED, target=[[0, 1]], **RAW)
    torch.testing.assert_close(got, torch.stack([expected, expected]))
    # a principal component already: eigen_smooth changes nothing (as in pytorch-grad-cam)
    torch.testing.assert_close(cam(PEAKED, target=[[0, 1]], eigen_smooth=True, **RAW), got)


def test_eigen_smooth_leaves_eigencam_unchanged_and_reaches_wrapped_methods(tiny):
    torch.testing.assert_close(
        camkit.EigenCAM(tiny, "conv")(X, eigen_smooth=True), camkit.EigenCAM(tiny, "conv")(X)
    )
    model, x = small_cnn(), torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    refine = camkit.RefineCAM(model, ["0", "2"], base=GradCAM)
    by_layer = GradCAM(model, ["0", "2"])(x, 3, eigen_smooth=True, fuse=False, normalize=False)
    expected = minmax(minmax(by_layer["0"]) * minmax(by_layer["2"]))
    torch.testing.assert_close(refine(x, 3, eigen_smooth=True), expected)


def test_eigen_smooth_on_perturbation_and_classifier_cams():
    model, x = small_cnn(), torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    for method in (camkit.AblationCAM, camkit.ScoreCAM, camkit.CAM):
        cam = method(model, "2")
        plain = cam(x, [1, 2], **RAW)
        smoothed = cam(x, [1, 2], eigen_smooth=True, **RAW)
        assert smoothed.shape == plain.shape and not torch.allclose(smoothed, plain)
        # the component agrees in sign with the plain map
        centred = plain - plain.mean(dim=(-2, -1), keepdim=True)
        assert ((smoothed * centred).sum(dim=(-2, -1)) > 0).all()


# ------------------------------------------------------------------ aug_smooth


def test_aug_smooth_by_hand(tiny):
    """The raw maps scale with the intensity factor (A = f X, g constant) and the factors
    average to 1; the mirror moves the gradients against the activations: HiResCAM's map of
    class 0 is ``X (g_0 + flip g_0) / 2 + 2X (g_1 + flip g_1) / 2``."""
    assert sum(FACTORS) / len(FACTORS) == pytest.approx(1.0)
    torch.testing.assert_close(GradCAM(tiny, "conv")(X, 1, aug_smooth=True, **RAW), 5 * A0)
    expected = torch.tensor([[-0.5, -1.0], [4.5, 6.0]])
    torch.testing.assert_close(HiResCAM(tiny, "conv")(X, 0, aug_smooth=True, **RAW), expected)


def test_aug_smooth_averages_the_six_augmented_maps_of_the_clean_top1():
    model = small_cnn()
    x = torch.randn(2, 3, 10, 10, generator=torch.Generator().manual_seed(2))
    top1 = model(x).argmax(dim=1)
    cam = GradCAM(model, "2")
    maps = [
        cam(x.flip(-1) * f, top1).flip(-1) if flip else cam(x * f, top1)
        for flip in (False, True)
        for f in FACTORS
    ]
    expected = minmax(torch.stack(maps).mean(0))
    before = model_state(model)
    torch.testing.assert_close(cam(x, aug_smooth=True), expected)
    assert_untouched(model, before)
    layers = GradCAM(model, ["0", "2"])(x, top1, aug_smooth=True, fuse=False)
    assert set(layers) == {"0", "2"} and layers["2"].shape == (2, 10, 10)


# ------------------------------------------------------------------ refusals


def test_options_a_method_does_not_take_are_refused_with_the_ones_it_takes(tiny):
    with pytest.raises(ArgumentError, match="takes no call option smooth; its call options are: "
                       "relu, upsample, normalize, fuse, aug_smooth, eigen_smooth"):  # fmt: skip
        GradCAM(tiny, "conv")(X, 0, smooth=True)
    with pytest.raises(ArgumentError, match="Saliency takes no call option eigen_smooth"):
        Saliency(tiny)(X, 0, eigen_smooth=True)
    with pytest.raises(ArgumentError, match="ReciproCAM takes no eigen_smooth: its map is a "):
        ReciproCAM(tiny, "conv")(X, 0, eigen_smooth=True)
    with pytest.raises(ArgumentError, match="aug_smooth must be True or False"):
        GradCAM(tiny, "conv")(X, 0, aug_smooth="yes")
    assert "aug_smooth" in ReciproCAM.call_options()
    with pytest.raises(ArgumentError, match="its call options are: normalize, aug_smooth"):
        camkit.FullGrad(tiny)(X, 0, eigen_smooth=True)
    with pytest.raises(ArgumentError, match="aug_smooth must be True or False"):
        camkit.FullGrad(tiny)(X, 0, aug_smooth=1)

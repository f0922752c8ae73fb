"""Pixel methods on a tuple of inputs (captum's tuples): one attribution per input.

The hand-made model ``f(image, meta) = w[t] * sum(image) * sum(meta)`` has known gradients:
``d f / d image = w[t] * sum(meta)`` at every pixel and ``d f / d meta = w[t] * sum(image)``.
Along the straight path from the zero baselines the integrand of Integrated Gradients is linear
in the path position, so the trapezoid rule is exact: ``IG(image) = image * w[t] * S_m / 2``,
``IG(meta) = meta * w[t] * S_x / 2`` (``S`` the sums), and both add up to ``f(x) - f(0)``.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import Tensor, nn

import camkit
from camkit.errors import ArgumentError, InputError, ZeroGradientWarning

WEIGHTS = torch.tensor([1.0, -2.0, 0.5])


class Product(nn.Module):
    """``f(image, meta)[:, t] = WEIGHTS[t] * sum(image) * sum(meta)``, per sample."""

    def forward(self, image: Tensor, meta: Tensor) -> Tensor:
        return WEIGHTS * (image.flatten(1).sum(1) * meta.sum(1)).unsqueeze(1)


class ImageAndMeta(nn.Module):
    """A small CNN on the image plus a linear head on a metadata vector (a multi-modal model)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.relu = nn.ReLU()  # a module: captum's guided backpropagation reaches only those
        self.head = nn.Linear(4 + 5, 3)

    def forward(self, image: Tensor, meta: Tensor) -> Tensor:
        pooled = self.relu(self.conv(image)).mean((2, 3))
        return self.head(torch.cat([pooled, torch.tanh(meta)], 1))


def _inputs() -> tuple[Tensor, Tensor]:
    generator = torch.Generator().manual_seed(1)
    return torch.rand(2, 3, 4, 4, generator=generator), torch.rand(2, 5, generator=generator)


def test_saliency_of_each_input_by_hand() -> None:
    image, meta = _inputs()
    grad_image, grad_meta = camkit.Saliency(Product())((image, meta), [1, 2])
    w = WEIGHTS[[1, 2]]
    expected_image = (w * meta.sum(1)).view(2, 1, 1, 1).expand_as(image)
    expected_meta = (w * image.flatten(1).sum(1)).view(2, 1).expand_as(meta)
    torch.testing.assert_close(grad_image, expected_image)
    torch.testing.assert_close(grad_meta, expected_meta)


def test_integrated_gradients_of_each_input_by_hand_and_complete() -> None:
    image, meta = _inputs()
    ig = camkit.IntegratedGradients(Product(), steps=3)
    (attr_image, attr_meta), error = ig((image, meta), 0, return_error=True)
    s_x, s_m = image.flatten(1).sum(1), meta.sum(1)
    torch.testing.assert_close(attr_image, image * (s_m / 2).view(2, 1, 1, 1))
    torch.testing.assert_close(attr_meta, meta * (s_x / 2).view(2, 1))
    assert float(error.max()) < 1e-5  # completeness over both inputs together
    report = ig.completeness((image, meta), 0)
    torch.testing.assert_close(report["delta"], s_x * s_m)


def test_integrated_gradients_with_a_baseline_per_input() -> None:
    image, meta = _inputs()
    ones = torch.ones(5)
    ig = camkit.IntegratedGradients(Product(), steps=4, baseline=(0.0, ones))
    (attr_image, attr_meta), error = ig((image, meta), 0, return_error=True)
    # the path x(a) = a * image, m(a) = 1 + a * (meta - 1): f's gradient is linear in a again
    s_x, s_m = image.flatten(1).sum(1), meta.sum(1)
    torch.testing.assert_close(attr_image, image * ((5 + s_m) / 2).view(2, 1, 1, 1))
    torch.testing.assert_close(attr_meta, (meta - 1) * (s_x / 2).view(2, 1))
    assert float(error.max()) < 1e-5


def test_smoothgrad_noise_of_the_image_is_that_of_a_single_input() -> None:
    """The image's noise is drawn first from each copy's seed, as for a single input, so on a
    model additive in the metadata the image's SmoothGrad is the single-input one, and the
    metadata's (a linear head after tanh) averages the gradients at the noisy metadata."""
    image, meta = _inputs()

    class Additive(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.cnn = ImageAndMeta()

        def forward(self, image: Tensor, meta: Tensor) -> Tensor:
            return self.cnn(image, torch.zeros_like(meta)) + meta.sum(1, keepdim=True).square()

    model = Additive()
    smooth = camkit.SmoothGrad(model, samples=4, seed=3)
    attr_image, attr_meta = smooth((image, meta), 1)
    alone = smooth(image, 1, additional_forward_args=(meta,))
    torch.testing.assert_close(attr_image, alone)
    assert attr_meta.shape == meta.shape and not torch.equal(attr_meta, 2 * meta.sum(1, True))


@pytest.mark.parametrize("name", ["Saliency", "GuidedBackprop", "IntegratedGradients"])
def test_tuples_agree_with_captum(name: str) -> None:
    captum_attr = pytest.importorskip("captum.attr")
    model = ImageAndMeta().eval()
    image, meta = _inputs()
    targets = torch.tensor([0, 2])
    if name == "IntegratedGradients":
        steps = 8  # captum's riemann_trapezoid on n points weighs them 1/n: times n / (n - 1)
        peer = captum_attr.IntegratedGradients(model).attribute(
            (image, meta), target=targets, n_steps=steps + 1, method="riemann_trapezoid"
        )
        peer = tuple(p * (steps + 1) / steps for p in peer)
        ours = camkit.IntegratedGradients(model, steps=steps)((image, meta), targets)
    else:
        options = {"abs": False} if name == "Saliency" else {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # captum: "did not require gradients"
            peer = getattr(captum_attr, name)(model).attribute(
                (image, meta), target=targets, **options
            )
        ours = getattr(camkit, name)(model)((image, meta), targets)
    assert len(ours) == 2
    for mine, theirs in zip(ours, peer, strict=True):
        torch.testing.assert_close(mine, theirs, atol=1e-6, rtol=1e-5)


def test_k_targets_and_additional_forward_args_with_a_tuple() -> None:
    image, meta = _inputs()

    class Scaled(nn.Module):
        def forward(self, image: Tensor, meta: Tensor, scale: Tensor) -> Tensor:
            return Product()(image, meta) * scale.view(-1, 1)

    scale = torch.tensor([2.0, 3.0])
    grad_image, grad_meta = camkit.Saliency(Scaled())(
        (image, meta), [[0, 1], [2, 2]], additional_forward_args=(scale,)
    )
    assert grad_image.shape == (2, 2, 3, 4, 4) and grad_meta.shape == (2, 2, 5)
    expected = WEIGHTS[1] * scale[0] * meta[0].sum()
    torch.testing.assert_close(grad_image[0, 1], expected.expand(3, 4, 4))


def test_an_input_the_score_ignores_gets_zeros_and_a_warning() -> None:
    image, meta = _inputs()

    class ImageOnly(nn.Module):
        def forward(self, image: Tensor, meta: Tensor) -> Tensor:
            return image.flatten(1)[:, :3]

    with pytest.warns(ZeroGradientWarning, match="input 1"):
        _, grad_meta = camkit.Saliency(ImageOnly())((image, meta), 0)
    assert torch.equal(grad_meta, torch.zeros_like(meta))


def test_a_tuple_leaves_the_inputs_untouched() -> None:
    image, meta = _inputs()
    before = (image.clone(), meta.clone())
    camkit.IntegratedGradients(ImageAndMeta(), steps=2)((image, meta), 0)
    for t, copy in zip((image, meta), before, strict=True):
        assert torch.equal(t, copy) and t.grad is None and not t.requires_grad


@pytest.mark.parametrize(
    ("inputs", "pattern"),
    [
        (lambda i, m: (i, m[:1]), r"input 1 has shape \(1, 5\).*batch's 2 samples"),
        (lambda i, m: (i, m.long()), "input 1 is torch.int64.*additional_forward_args"),
        (lambda i, m: (i, m * torch.nan), "input 1 contains NaN"),
        (lambda i, m: (i, m.tolist()), r"must hold tensors \(image first\)"),
        (lambda i, m: (), "must hold tensors"),
        # a 2-D first input is a batch of vectors (B, F) for this model without convolutions
        (lambda i, m: (i[None, None], m), r"expected an image \(3, H, W\).* or vectors"),
        (lambda i, m: (i, m[0, 0]), r"input 1 has shape \(\)"),
    ],
)
def test_bad_tuples_are_refused_clearly(inputs, pattern: str) -> None:
    image, meta = _inputs()
    with pytest.raises(InputError, match=pattern):
        camkit.Saliency(Product())(inputs(image, meta), 0)


def test_baselines_must_match_the_inputs() -> None:
    image, meta = _inputs()
    with pytest.raises(ArgumentError, match="give a tuple of baselines, one per input"):
        camkit.IntegratedGradients(Product(), baseline=torch.zeros(3, 4, 4))((image, meta), 0)
    with pytest.raises(ArgumentError, match="tuple of 1, expected one baseline per input \\(2\\)"):
        camkit.IntegratedGradients(Product(), baseline=(0.0,))((image, meta), 0)


def test_a_cam_refuses_a_tuple_and_says_where_the_inputs_go() -> None:
    image, meta = _inputs()
    with pytest.raises(InputError, match="GradCAM explains one input tensor.*additional_forward"):
        camkit.GradCAM(ImageAndMeta(), "conv")((image, meta), 0)
    assert camkit.METHODS["saliency"].several_inputs
    assert not camkit.METHODS["guided-gradcam"].several_inputs

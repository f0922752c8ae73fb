"""Saliency, SmoothGrad, Integrated Gradients and to_heatmap, checked against hand calculations."""

from __future__ import annotations

import pytest
import torch
from conftest import TinyNet, X, assert_untouched, model_state
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor, nn

from camkit import IntegratedGradients, Saliency, SmoothGrad, to_heatmap
from camkit.errors import ArgumentError, GradientError, InputError, TargetError


def linear_model() -> nn.Module:
    """(B, 3, 2, 2) -> flatten -> Linear(12, 3): the saliency of class k is weight row k."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(12, 3))


class Quadratic(nn.Module):
    """f(x) = sum(a * x^2) as a single logit: df/dx = 2 a x."""

    def __init__(self, a: Tensor):
        super().__init__()
        self.a = nn.Parameter(a)

    def forward(self, x):
        return (self.a * x.square()).flatten(1).sum(1, keepdim=True)


class ReLUNet(nn.Module):
    """A small piecewise-linear conv net (known random weights)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(5)
        self.body = nn.Sequential(
            nn.Conv2d(3, 6, 3, padding=1), nn.ReLU(), nn.Conv2d(6, 6, 3), nn.ReLU()
        )
        self.head = nn.Linear(6 * 4 * 4, 4)

    def forward(self, x):
        return self.head(self.body(x).flatten(1))


class BatchLog(nn.Module):
    """Records the size of every batch that runs with gradients (the noisy / path copies)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.sizes: list[int] = []

    def forward(self, x):
        if x.requires_grad:
            self.sizes.append(x.shape[0])
        return self.model(x)


IMAGES = torch.randn(2, 3, 2, 2, generator=torch.Generator().manual_seed(2))
PICTURES = torch.randn(3, 3, 6, 6, generator=torch.Generator().manual_seed(6))


# --- Saliency ------------------------------------------------------------------------------


def test_saliency_of_a_linear_model_is_its_weight_row():
    model = linear_model()
    weight = model[1].weight.detach()
    before = model_state(model)
    assert torch.equal(Saliency(model)(IMAGES[0], target=2), weight[2].view(3, 2, 2))
    batch = Saliency(model)(IMAGES, target=[1, 0])
    assert torch.equal(batch, torch.stack([weight[1], weight[0]]).view(2, 3, 2, 2))
    several = Saliency(model)(IMAGES, target=[[0, 2], [1, 1]])
    assert several.shape == (2, 2, 3, 2, 2)
    assert torch.equal(several[0, 1], weight[2].view(3, 2, 2))
    assert torch.equal(several[1, 0], weight[1].view(3, 2, 2))
    called = Saliency(model)(IMAGES, target=lambda out: out[:, 1] - out[:, 0])
    assert torch.allclose(called, (weight[1] - weight[0]).view(1, 3, 2, 2).expand(2, -1, -1, -1))
    assert_untouched(model, before)


def test_saliency_of_the_tiny_conv_relu_net_by_hand():
    # dy_k/dx_ij = sum_c W[k, 4c + 2i + j] * kernel_c * (kernel_c x_ij > 0), kernels (1, 2)
    model = TinyNet()
    assert torch.equal(Saliency(model)(X, target=0), torch.tensor([[[1.0, -2.0], [2.0, 1.0]]]))
    assert torch.equal(Saliency(model)(X, target=1), torch.full((1, 2, 2), 5.0))
    negative = torch.tensor([[[1.0, -2.0], [3.0, 4.0]]])  # the ReLU blocks pixel (0, 1)
    assert torch.equal(
        Saliency(model)(negative, target=0), torch.tensor([[[1.0, 0.0], [2.0, 1.0]]])
    )
    top1 = Saliency(model)(X)  # class 1 has the larger logit (50 vs 4)
    assert torch.equal(top1, torch.full((1, 2, 2), 5.0))


def test_output_is_float32_detached_and_the_input_is_left_alone():
    class InPlace(nn.Module):
        def forward(self, x):
            x.mul_(2)  # a model that scales its input in place
            return x.flatten(1)[:, :3]

    x = IMAGES.double()
    kept = x.clone()
    with torch.no_grad():
        attr = Saliency(InPlace())(x, target=1)
    assert attr.dtype == torch.float32 and attr.device == x.device
    assert not attr.requires_grad and attr.grad_fn is None
    assert torch.equal(x, kept) and not x.requires_grad
    assert attr[0].flatten()[1] == 2 and attr.sum() == 4


def test_a_score_that_ignores_the_input_is_an_error():
    class Detached(nn.Module):
        def forward(self, x):
            return x.detach().flatten(1)

    with pytest.raises(GradientError, match="does not depend on the input"):
        Saliency(Detached())(IMAGES, target=0)


# --- SmoothGrad ----------------------------------------------------------------------------


def test_smoothgrad_does_not_depend_on_batch_size():
    model = ReLUNet()
    results = []
    for batch_size in (None, 1, 4, 7):
        logged = BatchLog(model)
        smooth = SmoothGrad(logged, noise_level=0.2, samples=5, batch_size=batch_size, seed=3)
        results.append(smooth(PICTURES, target=[0, 1, 3]))
        assert max(logged.sizes) == (batch_size or 15)  # never more noisy copies at once
    for result in results[1:]:
        assert torch.allclose(result, results[0], rtol=1e-6, atol=1e-7)
    again = SmoothGrad(model, noise_level=0.2, samples=5, seed=3)(PICTURES, target=[0, 1, 3])
    assert torch.equal(again, results[0])
    other = SmoothGrad(model, noise_level=0.2, samples=5, seed=4)(PICTURES, target=[0, 1, 3])
    assert not torch.allclose(other, results[0])


def test_smoothgrad_noise_of_a_sample_does_not_depend_on_its_batch():
    model = ReLUNet()
    smooth = SmoothGrad(model, noise_level=0.3, samples=4, batch_size=3, seed=0)
    alone = smooth(PICTURES[0], target=2)
    assert torch.allclose(smooth(PICTURES, target=2)[0], alone, atol=1e-7)


@pytest.mark.parametrize("kind", ["mean", "square", "var"])
def test_smoothgrad_without_noise_is_saliency(kind):
    model = ReLUNet()
    saliency = Saliency(model)(PICTURES, target=1)
    smooth = SmoothGrad(model, noise_level=0, samples=8, kind=kind)(PICTURES, target=1)
    expected = {"mean": saliency, "square": saliency.square(), "var": torch.zeros_like(saliency)}
    assert torch.equal(smooth, expected[kind])


def test_smoothgrad_of_a_linear_model_is_the_weight():
    model = linear_model()
    weight = model[1].weight.detach()[2].view(3, 2, 2)
    mean = SmoothGrad(model, noise_level=0.5, samples=6, seed=1)(IMAGES[1], target=2)
    square = SmoothGrad(model, noise_level=0.5, samples=6, kind="square")(IMAGES[1], target=2)
    var = SmoothGrad(model, noise_level=0.5, samples=6, kind="var")(IMAGES[1], target=2)
    assert torch.allclose(mean, weight, atol=1e-7)
    assert torch.allclose(square, weight.square(), atol=1e-7)
    assert torch.allclose(var, torch.zeros_like(var), atol=1e-7)


def test_smoothgrad_sigma_is_noise_level_times_each_samples_range():
    # grad = 2a (x + sigma eps): var = 4 a^2 sigma^2 Var(eps); with the same noise (same seed,
    # same sample index), 3x + 5 has 3x the range, so exactly 9x the variance
    a = torch.tensor([[[1.0, 2.0], [0.5, 3.0]]])
    model = Quadratic(a)
    x = torch.tensor([[[0.0, 1.0], [2.0, 4.0]]])  # range 4
    smooth = SmoothGrad(model, noise_level=0.1, samples=16, kind="var", seed=9)
    assert torch.allclose(smooth(3 * x + 5, target=0), 9 * smooth(x, target=0), rtol=1e-4)
    # and in absolute terms, with many samples: sigma = 0.1 * range for each sample
    big = SmoothGrad(model, noise_level=0.1, samples=4000, kind="var", seed=0)
    batch = torch.stack([x, 10 * x])  # ranges 4 and 40
    var = big(batch, target=0)
    sigma = torch.tensor([0.4, 4.0]).view(2, 1, 1, 1)
    ratio = var / (4 * a.square() * sigma.square())
    assert torch.allclose(ratio.mean(dim=(1, 2, 3)), torch.ones(2), rtol=0.05)
    mean = SmoothGrad(model, noise_level=0.1, samples=4000, seed=0)(batch, target=0)
    standard_error = 2 * a * sigma / 4000**0.5
    assert ((mean - 2 * a * batch).abs() < 4 * standard_error).all()


def test_smoothgrad_explains_the_clean_top1_class_for_every_copy():
    model = linear_model()
    weight = model[1].weight.detach()
    top1 = model(IMAGES).argmax(1)
    smooth = SmoothGrad(model, noise_level=5.0, samples=6, seed=0)(IMAGES)
    assert torch.allclose(smooth, weight[top1].view(2, 3, 2, 2), atol=1e-6)


@pytest.mark.parametrize(("target", "passes"), [(None, 1 + 3), ([0, 2], 3), (lambda o: o[:, 1], 3)])
def test_smoothgrad_runs_one_pass_per_chunk_and_a_clean_one_only_for_top1(target, passes):
    model = linear_model()
    calls = []
    handle = model.register_forward_hook(lambda mod, args, out: calls.append(out.shape[0]))
    try:
        SmoothGrad(model, noise_level=0.1, samples=5, batch_size=4, seed=0)(IMAGES, target)
    finally:
        handle.remove()
    assert len(calls) == passes  # 2 images x 5 copies = 10 rows in chunks of 4, 4, 2
    assert calls[-3:] == [4, 4, 2]


# --- Integrated Gradients ------------------------------------------------------------------


def test_integrated_gradients_of_a_linear_model_is_exact():
    model = linear_model()
    weight = model[1].weight.detach()
    baseline = torch.full((3, 2, 2), 0.5)
    attr, error = IntegratedGradients(model, steps=3, baseline=baseline)(
        IMAGES, target=[0, 2], return_error=True
    )
    expected = (IMAGES - baseline) * torch.stack([weight[0], weight[2]]).view(2, 3, 2, 2)
    assert torch.allclose(attr, expected, atol=1e-6)
    assert error.shape == (2,) and (error < 1e-5).all()


def test_integrated_gradients_trapezoid_rule_by_hand():
    # f(x) = ReLU(x - 1) at x = 3, baseline 0: the path gradient is 1 for alpha > 1/3.
    # steps=3 -> alphas 0, 1/3, 2/3, 1 with gradients 0, 0, 1, 1 and weights 1/2, 1, 1, 1/2 (/3):
    # attr = 3 * (1 + 1/2) / 3 = 1.5, while f(x) - f(0) = 2
    class Kink(nn.Module):
        def forward(self, x):
            return (x - 1).relu().flatten(1)

    x = torch.full((1, 1, 1), 3.0)
    attr, error = IntegratedGradients(Kink(), steps=3)(x, target=0, return_error=True)
    assert torch.allclose(attr, torch.full((1, 1, 1), 1.5))
    assert error.shape == () and torch.isclose(error, torch.tensor(0.5))
    fine = IntegratedGradients(Kink(), steps=300)(x, target=0)
    assert torch.allclose(fine, torch.full((1, 1, 1), 2.0), rtol=0.01)


def test_integrated_gradients_completeness_on_a_relu_net():
    model = ReLUNet()
    x, target = 3 * PICTURES, [2, 1, 0]
    before = model_state(model)
    attr, error = IntegratedGradients(model, steps=256, batch_size=200)(
        x, target=target, return_error=True
    )
    with torch.no_grad():
        difference = (model(x) - model(torch.zeros_like(x)))[torch.arange(3), target]
    assert (difference.abs() > 0.2).all()
    total = attr.sum(dim=(1, 2, 3))
    assert torch.allclose(total, difference, rtol=0.01)
    assert torch.allclose(error, (total - difference).abs(), atol=1e-5)
    assert (error < 0.01 * difference.abs()).all()
    assert_untouched(model, before)


def test_integrated_gradients_does_not_depend_on_batch_size():
    model = ReLUNet()
    results = []
    for batch_size in (None, 1, 5, 13):
        logged = BatchLog(model)
        ig = IntegratedGradients(logged, steps=8, batch_size=batch_size)
        results.append(ig(PICTURES, target=[[0, 3], [1, 1], [2, 0]], return_error=True))
        assert max(logged.sizes) == (batch_size or 27)
    for attr, error in results[1:]:
        assert torch.allclose(attr, results[0][0], rtol=1e-5, atol=1e-7)
        assert torch.allclose(error, results[0][1], atol=1e-6)
    assert results[0][0].shape == (3, 2, 3, 6, 6) and results[0][1].shape == (3, 2)


def test_integrated_gradients_baseline_forms():
    model = ReLUNet()
    half = IntegratedGradients(model, steps=4, baseline=0.5)(PICTURES, target=1)
    for baseline in (
        torch.full((3, 6, 6), 0.5),
        torch.full((3, 3, 6, 6), 0.5),
        torch.full((1, 6, 1), 0.5),
        lambda batch: torch.full_like(batch, 0.5),
    ):
        other = IntegratedGradients(model, steps=4, baseline=baseline)(PICTURES, target=1)
        assert torch.equal(other, half)
    # a baseline equal to the input explains nothing
    same = IntegratedGradients(model, steps=4, baseline=lambda batch: batch)(PICTURES, target=1)
    assert torch.equal(same, torch.zeros_like(same))


@settings(max_examples=25, deadline=None)
@given(
    values=st.lists(st.floats(-10, 10), min_size=12, max_size=12),
    start=st.floats(-10, 10),
    steps=st.integers(1, 6),
)
def test_integrated_gradients_linear_property(values, start, steps):
    model = linear_model()
    x = torch.tensor(values).view(3, 2, 2)
    attr, error = IntegratedGradients(model, steps=steps, baseline=start)(
        x, target=1, return_error=True
    )
    expected = (x - start) * model[1].weight.detach()[1].view(3, 2, 2)
    assert torch.allclose(attr, expected, atol=1e-4)
    assert error < 1e-3


# --- to_heatmap ----------------------------------------------------------------------------


def test_to_heatmap_reductions_by_hand():
    attr = torch.tensor([[[1.0, -4.0, 0.5]], [[2.0, 1.0, -0.5]]])  # (2, 1, 3)
    assert torch.allclose(to_heatmap(attr), torch.tensor([[0.5, 1.0, 0.125]]))
    assert torch.allclose(to_heatmap(attr, "sum"), torch.tensor([[1.0, -1.0, 0.0]]))
    norms = torch.tensor([[5.0, 17.0, 0.5]]).sqrt()
    assert torch.allclose(to_heatmap(attr, "norm"), norms / 17**0.5)
    batch = torch.stack([attr, 2 * attr, torch.zeros_like(attr)])
    maps = to_heatmap(batch)
    assert maps.shape == (3, 1, 3)
    assert torch.allclose(maps[0], maps[1]) and torch.equal(maps[2], torch.zeros(1, 3))
    assert to_heatmap(torch.zeros(2, 2, 3, 4, 5)).shape == (2, 2, 4, 5)


def test_to_heatmap_of_volumes_reduces_the_channels_and_scales_each_volume():
    attr = torch.zeros(2, 3, 2, 1, 2)  # (B, C, D, H, W)
    attr[0, 1, 0, 0, 1] = -4.0  # sample 0: the largest value lies in slice 0 ...
    attr[0, 2, 1, 0, 0] = 2.0  # ... a smaller one in slice 1, another channel
    attr[1, 0, 1, 0, 1] = 0.5
    heat = to_heatmap(attr, volume=True)
    assert heat.shape == (2, 2, 1, 2)
    assert torch.equal(heat[0], torch.tensor([[[0.0, 1.0]], [[0.5, 0.0]]]))
    assert torch.equal(heat[1], torch.tensor([[[0.0, 0.0]], [[0.0, 1.0]]]))
    with pytest.raises(ValueError, match=r"\(C, D, H, W\) or \(B, C, D, H, W\)"):
        to_heatmap(torch.zeros(3, 4, 4), volume=True)


def test_to_heatmap_percentile_clips():
    attr = torch.arange(101.0).view(1, 1, 101)  # |values| 0..100, median 50
    heat = to_heatmap(attr, percentile=50)
    assert torch.allclose(heat[0, :51], torch.arange(51.0) / 50)
    assert torch.equal(heat[0, 51:], torch.ones(50))


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(-1e3, 1e3), min_size=12, max_size=12))
def test_to_heatmap_ranges(values):
    attr = torch.tensor(values).view(3, 2, 2)
    for reduce, low in (("abs-max", 0.0), ("norm", 0.0), ("sum", -1.0)):
        heat = to_heatmap(attr, reduce)
        assert heat.shape == (2, 2) and heat.min() >= low and heat.max() <= 1
        if heat.abs().max() > 0:
            assert torch.isclose(heat.abs().max(), torch.tensor(1.0))


# --- bad input -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda m: SmoothGrad(m, samples=0), ValueError, "samples"),
        (lambda m: SmoothGrad(m, samples=2.5), ArgumentError, "samples"),
        (lambda m: SmoothGrad(m, batch_size=0), ValueError, "batch_size"),
        (lambda m: SmoothGrad(m, noise_level=-0.1), ValueError, "noise_level"),
        (lambda m: SmoothGrad(m, noise_level=float("nan")), ValueError, "noise_level"),
        (lambda m: SmoothGrad(m, kind="max"), ValueError, "kind"),
        (lambda m: IntegratedGradients(m, steps=0), ValueError, "steps"),
        (lambda m: IntegratedGradients(m, batch_size=-1), ValueError, "batch_size"),
    ],
)
def test_bad_settings(make, error, match):
    with pytest.raises(error, match=match):
        make(linear_model())


@pytest.mark.parametrize(
    ("baseline", "match"),
    [
        (torch.zeros(3, 3, 3), r"expected one sample's shape \(3, 2, 2\)"),
        (torch.zeros(4, 3, 2, 2), r"or the batch's \(2, 3, 2, 2\)"),
        (torch.full((3, 2, 2), float("nan")), "NaN or infinite"),
        (float("inf"), "NaN or infinite"),
        (lambda batch: batch[:1, :1, :1, :1].squeeze(0) * torch.ones(5), "shape"),
    ],
)
def test_bad_baselines(baseline, match):
    with pytest.raises(ValueError, match=match):
        IntegratedGradients(linear_model(), baseline=baseline)(IMAGES, target=0)


def test_bad_inputs():
    model = linear_model()
    for method in (
        Saliency(model),
        SmoothGrad(model, samples=2),
        IntegratedGradients(model, steps=2),
    ):
        with pytest.raises(ValueError, match="expected an image"):
            method(torch.zeros(2, 2), target=0)
        with pytest.raises(ValueError, match="NaN"):
            method(torch.full((3, 2, 2), float("nan")), target=0)
        with pytest.raises(InputError, match="floating-point"):
            method(torch.zeros(3, 2, 2, dtype=torch.long), target=0)
        with pytest.raises(TargetError, match="out of range"):
            method(IMAGES, target=3)
        with pytest.raises(ValueError, match="one target per sample"):
            method(IMAGES, target=[0, 1, 2])
    with pytest.raises(ArgumentError, match="baseline must be"):
        IntegratedGradients(model, baseline="zeros")(IMAGES, target=0)
    with pytest.raises(ValueError, match="reduction"):
        to_heatmap(torch.zeros(3, 2, 2), "max")
    with pytest.raises(ValueError, match=r"\(C, H, W\)"):
        to_heatmap(torch.zeros(2, 2))


# --- across methods ------------------------------------------------------------------------


def _methods(model: nn.Module) -> dict[str, object]:
    return {
        "saliency": Saliency(model),
        "smoothgrad": SmoothGrad(model, noise_level=0.2, samples=3, batch_size=4, seed=0),
        "vargrad": SmoothGrad(model, noise_level=0.2, samples=3, seed=0, kind="var"),
        "ig": IntegratedGradients(model, steps=4, batch_size=5),
    }


def test_every_method_works_under_no_grad_and_leaves_no_trace():
    model = ReLUNet()
    before = model_state(model)
    for name, method in _methods(model).items():
        expected = method(PICTURES, target=[0, 1, 2])
        with torch.no_grad():
            result = method(PICTURES, target=[0, 1, 2])
        assert torch.equal(result, expected), name
        assert result.shape == PICTURES.shape and result.dtype == torch.float32
        assert not result.requires_grad and not PICTURES.requires_grad
        assert_untouched(model, before)


def test_every_method_answers_several_targets_per_sample():
    model = ReLUNet()
    targets = [[0, 3], [1, 1], [2, 0]]
    for name, method in _methods(model).items():
        both = method(PICTURES, target=targets)
        assert both.shape == (3, 2, 3, 6, 6), name
        for k in range(2):
            one = method(PICTURES, target=[row[k] for row in targets])
            assert torch.allclose(both[:, k], one, rtol=1e-5, atol=1e-7), name


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_results_stay_on_the_cuda_device():
    model = ReLUNet()
    cpu = {name: method(PICTURES, target=1) for name, method in _methods(model).items()}
    model.cuda()
    for name, method in _methods(model).items():
        result = method(PICTURES.cuda(), target=1)
        assert result.device.type == "cuda" and result.dtype == torch.float32, name
        if name in ("saliency", "ig"):  # the noise is drawn on the device: it differs
            assert torch.allclose(result.cpu(), cpu[name], rtol=1e-4, atol=1e-5), name


def test_completeness_report_relative_to_the_batch():
    # f(x) = (w.x)^3 on a 1-D "image": sum(attr) - delta is the trapezoid rule's error, which
    # is exactly |c|^3 / (2 n^2) for c = w.x (the integrand 3 c^3 a^2 on a in [0, 1])
    class Cube(nn.Module):
        def forward(self, x):
            return (x.flatten(1).sum(1, keepdim=True)) ** 3

    x = torch.tensor([[[[1.0]]], [[[0.001]]]])  # c = 1 and c = 0.001
    report = IntegratedGradients(Cube(), steps=10).completeness(x, target=0)
    torch.testing.assert_close(report["delta"], torch.tensor([1.0, 1e-9]))
    expected = torch.tensor([1.0, 1e-9]) / (2 * 10**2)
    torch.testing.assert_close(report["abs"], expected, rtol=1e-4, atol=1e-12)
    torch.testing.assert_close(
        report["relative_to_batch"], expected / 0.5000000005, rtol=1e-4, atol=1e-9
    )
    torch.testing.assert_close(report["relative"], torch.full((2,), 1 / 200), rtol=1e-3, atol=0)

"""The added methods: closed forms on tiny models with known weights, K targets, peer agreement.

Tiny models (see conftest): TinyNet on X = [[1, 2], [3, 4]] has A_0 = X, A_1 = 2X at ``conv``;
the gradient of logit k there is W[k] reshaped (2, 2, 2):
  class 0: g_0 = [[1, 0], [0, 1]], g_1 = [[0, -1], [1, 0]]
  class 1: g_0 = ones,             g_1 = 2 * ones
The reference tests (pytorch-grad-cam 1.5.7, torchcam 0.5.0, scikit-learn) skip when the peer is
absent; where camkit deliberately differs from a peer, the test says how and why.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import TinyNet, X, assert_untouched, model_state
from torch import Tensor, nn

import camkit
from camkit import registry
from camkit.errors import ArgumentError, ClassifierNotFoundError, LayerOutputError, TargetError
from camkit.methods.cam import FEM, KPCACAM, EigenGradCAM, FinerCAM, GradCAMElementWise, ShapleyCAM
from camkit.methods.cam.classifier import CAM, find_classifier
from camkit.methods.cam.dff import DeepFeatureFactorization, nmf
from camkit.methods.cam.fullgrad import FullGrad, bias_layers, effective_bias
from camkit.methods.cam.stochastic import RandomCAM, SmoothGradCAMPlusPlus
from camkit.viz import concept_image

RAW = {"relu": False, "upsample": False, "normalize": False}
A0 = X[0]


def _correlation(a: Tensor, b: Tensor) -> float:
    return float(torch.corrcoef(torch.stack([a.flatten().float(), b.flatten().float()]))[0, 1])


class Square(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return x * x


class QuadraticNet(TinyNet):
    """TinyNet with the ReLU replaced by a square: y_k = sum W[k] * A^2, so g = 2 W A and the
    Hessian-vector product H A = 2 W A."""

    def __init__(self):
        super().__init__()
        self.relu = Square()


class PooledNet(nn.Module):
    """conv (kernels 1, 2) -> global average pooling -> linear(2 -> 2) with a bias: a CAM net."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 2, kernel_size=1, bias=False)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(2, 2)
        with torch.no_grad():
            self.conv.weight.copy_(torch.tensor([1.0, 2.0]).view(2, 1, 1, 1))
            self.fc.weight.copy_(torch.tensor([[1.0, -1.0], [0.5, 2.0]]))
            self.fc.bias.fill_(5.0)

    def forward(self, x):
        return self.fc(self.pool(self.conv(x)).flatten(1))


# --- CAM (Zhou et al. 2016) ---------------------------------------------------------------


def test_cam_weights_are_the_classifier_rows():
    model = PooledNet()
    cam = CAM(model, "conv")
    assert cam.fc_name == "fc"
    # class 0: A_0 - A_1 = X - 2X; class 1: 0.5 A_0 + 2 A_1 = 4.5 X (the bias plays no part)
    torch.testing.assert_close(cam(X, target=0, **RAW), -A0)
    torch.testing.assert_close(cam(X, target=1, **RAW), 4.5 * A0)
    many = cam(torch.stack([X, 2 * X]), target=[[0, 1], [1, 1]], **RAW)
    torch.testing.assert_close(
        many, torch.stack([torch.stack([-A0, 4.5 * A0]), 9 * A0[None] * torch.ones(2, 1, 1)])
    )
    # with global average pooling, CAM is Grad-CAM up to the 1/hw of the gradient
    torch.testing.assert_close(cam(X, target=1), camkit.GradCAM(model, "conv")(X, target=1))


def test_cam_finds_torchvision_and_timm_heads_and_refuses_others():
    import timm
    import torchvision

    assert find_classifier(torchvision.models.resnet18(weights=None))[0] == "fc"
    assert find_classifier(torchvision.models.efficientnet_b0(weights=None))[0] == "classifier.1"
    assert find_classifier(timm.create_model("resnet18", pretrained=False))[0] == "fc"
    assert find_classifier(timm.create_model("vit_tiny_patch16_224", pretrained=False))[0] == "head"
    with pytest.raises(ClassifierNotFoundError, match="holds 2 linear layers"):
        find_classifier(torchvision.models.mobilenet_v3_small(weights=None))
    two_heads = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    with pytest.raises(ClassifierNotFoundError, match="pass fc="):
        find_classifier(two_heads)
    assert find_classifier(two_heads, "2")[0] == "2"


def test_cam_errors_are_clear(tiny):
    with pytest.raises(LayerOutputError, match="takes 8 features but layer 'conv' has 2 channels"):
        CAM(tiny, "conv")(X, target=0)
    with pytest.raises(TargetError, match="pass class indices"):
        CAM(PooledNet(), "conv")(X, target=lambda out: out[:, 0])
    with pytest.raises(TargetError, match="out of range"):
        CAM(PooledNet(), "conv")(X, target=5)


# --- gradient CAMs on TinyNet ----------------------------------------------------------------


def test_gradcam_elementwise_is_the_sum_of_rectified_products(tiny):
    cam = GradCAMElementWise(tiny, "conv")
    # class 0: ReLU(g_0 A_0) = [[1, 0], [0, 4]], ReLU(g_1 A_1) = ReLU([[0, -4], [6, 0]])
    torch.testing.assert_close(cam(X, target=0, **RAW), torch.tensor([[1.0, 0.0], [6.0, 4.0]]))
    torch.testing.assert_close(cam(X, target=1, **RAW), 5 * A0)


def test_eigengradcam_is_the_principal_component_of_gradient_times_activation(tiny):
    # class 1: positions (g_0 A_0, g_1 A_1) = (x, 4x), centred along (1, 4) / sqrt(17)
    expected = torch.tensor([[-1.5, -0.5], [0.5, 1.5]]) * math.sqrt(17)
    torch.testing.assert_close(EigenGradCAM(tiny, "conv")(X, target=1, **RAW), expected)
    # class 0: positions (1, 0), (0, -4), (0, 6), (4, 0); principal axis of their covariance
    points = torch.tensor([[1.0, 0.0], [0.0, -4.0], [0.0, 6.0], [4.0, 0.0]])
    centred = points - points.mean(0)
    cov = centred.T @ centred  # [[10.75, -2.5], [-2.5, 53]]: eigenvector of the largest value
    a, b, d = cov[0, 0], cov[0, 1], cov[1, 1]
    lam = (a + d) / 2 + torch.sqrt(((a - d) / 2) ** 2 + b**2)
    axis = torch.stack([b, lam - a])
    projection = centred @ (axis / axis.norm())
    if (projection * points.mean(1)).sum() < 0:  # the sign follows sum_c g_c A_c
        projection = -projection
    got = EigenGradCAM(tiny, "conv")(X, target=0, **RAW)
    torch.testing.assert_close(got, projection.view(2, 2))


def test_shapleycam_subtracts_half_the_hessian_vector_product():
    model = QuadraticNet()
    # class 1: g = 2 W A, H A = 2 W A, so g - HA/2 = W A: w_0 = mean(A_0) = 2.5,
    # w_1 = mean(2 * A_1) = 10 -> 2.5 X + 10 * 2X = 22.5 X  (Grad-CAM: 5 X + 40 X = 45 X)
    torch.testing.assert_close(ShapleyCAM(model, "conv")(X, target=1, **RAW), 22.5 * A0)
    torch.testing.assert_close(camkit.GradCAM(model, "conv")(X, target=1, **RAW), 45 * A0)
    # class 0: W_0 = [[1, 0], [0, 1]], W_1 = [[0, -1], [1, 0]]:
    # w_0 = mean(W_0 A_0) = (1 + 4) / 4, w_1 = mean(W_1 A_1) = (-4 + 6) / 4
    torch.testing.assert_close(ShapleyCAM(model, "conv")(X, target=0, **RAW), 2.25 * A0)


def test_shapleycam_is_gradcam_when_the_score_is_linear_in_the_layer(tiny):
    torch.testing.assert_close(ShapleyCAM(tiny, "conv")(X, target=0, **RAW), 0.5 * A0)


def test_finercam_explains_the_logit_minus_the_closest_classes(tiny):
    # two classes: the reference of class 0 is class 1. d(y_0 - 0.6 y_1)/dA has channel means
    # (0.5 - 0.6, 0 - 1.2) -> -0.1 A_0 - 1.2 A_1 = -2.5 X
    torch.testing.assert_close(FinerCAM(tiny, "conv")(X, target=0, **RAW), -2.5 * A0)
    torch.testing.assert_close(
        FinerCAM(tiny, "conv", gamma=0.0)(X, target=1, **RAW),
        camkit.GradCAM(tiny, "conv")(X, target=1, **RAW),
    )
    lam = FinerCAM(tiny, "conv", base=camkit.LayerCAM, gamma=1.0)(X, target=1, **RAW)
    # d(y_1 - y_0)/dA: g_0 = [[0, 1], [1, 0]], g_1 = [[2, 3], [1, 2]], all >= 0
    torch.testing.assert_close(lam, torch.tensor([[4.0, 14.0], [9.0, 16.0]]))
    with pytest.raises(ArgumentError, match="gradient CAM"):
        FinerCAM(tiny, "conv", base=camkit.EigenCAM)


def test_finercam_softmax_weighting_by_hand():
    # three classes with logits l = (3, 2, 0) from a linear net; target 0, references 1 and 2
    model = nn.Sequential(nn.Conv2d(1, 1, 1, bias=False), nn.Flatten(), nn.Linear(1, 3))
    with torch.no_grad():
        model[0].weight.fill_(1.0)
        model[2].weight.copy_(torch.tensor([[1.0], [0.5], [-1.0]]))
        model[2].bias.copy_(torch.tensor([1.0, 1.0, 2.0]))
    x = torch.tensor([[[2.0]]])  # A = 2, logits (3, 2, 0)
    a = torch.tensor(2.0, requires_grad=True)
    logits = torch.stack([a + 1, 0.5 * a + 1, 2 - a])
    p = logits.softmax(0)
    score = (p[1] * (logits[0] - logits[1]) + p[2] * (logits[0] - logits[2])) / (p[1] + p[2])
    (grad,) = torch.autograd.grad(score, a)
    got = FinerCAM(model, "0", gamma=1.0, references=2, weighting="softmax")(x, 0, **RAW)
    torch.testing.assert_close(got, (grad * 2).view(1, 1))


@pytest.mark.filterwarnings("ignore:the model has no conv or batch-norm bias")
def test_k_targets_per_sample_equal_single_calls(tiny):
    batch = torch.stack([X, 2 * X, -X])
    targets = [[0, 1], [1, 0], [1, 1]]
    methods = [
        EigenGradCAM(tiny, "conv"),
        GradCAMElementWise(tiny, "conv"),
        ShapleyCAM(QuadraticNet(), "conv"),
        FinerCAM(tiny, "conv"),
        SmoothGradCAMPlusPlus(QuadraticNet(), "conv", seed=3),
        CAM(PooledNet(), "conv"),
    ]
    for cam in methods:
        many = cam(batch, target=targets)
        assert many.shape == (3, 2, 2, 2), type(cam).__name__
        for k in range(2):
            single = cam(batch, target=[row[k] for row in targets])
            torch.testing.assert_close(many[:, k], single, msg=type(cam).__name__)
    many = FullGrad(tiny)(batch, target=targets)
    for k in range(2):
        torch.testing.assert_close(many[:, k], FullGrad(tiny)(batch, [row[k] for row in targets]))
    # target-free methods give the same map for every target, as EigenCAM (the target axis is
    # kept: one (B, K, H, W) result like every method)
    for cam in (KPCACAM(tiny, "conv"), FEM(tiny, "conv")):
        maps = cam(batch, target=targets)
        assert maps.shape == (3, 2, 2, 2)
        torch.testing.assert_close(maps[:, 0], maps[:, 1])
        torch.testing.assert_close(maps[:, 0], cam(batch, target=[row[0] for row in targets]))


# --- target-free CAMs -----------------------------------------------------------------------


def test_kpcacam_linear_kernel_is_eigencam(tiny):
    torch.testing.assert_close(
        KPCACAM(tiny, "conv", kernel="linear")(X, **RAW), camkit.EigenCAM(tiny, "conv")(X, **RAW)
    )


def test_kpcacam_sigmoid_kernel_by_hand():
    # two positions x = 1, 3: activations (1, 2) and (3, 6), centred -(1, 2) and (1, 2).
    # gamma = 1/C = 1/2: K = [[a, b], [b, a]] with a = tanh(5/2 + 1), b = tanh(-5/2 + 1); centred
    # K = (a - b)/2 [[1, -1], [-1, 1]]: eigenvalue a - b, projection +-sqrt((a - b) / 2)
    model = nn.Sequential(TinyNet().conv, nn.Flatten(), nn.Linear(4, 1))
    x = torch.tensor([[[1.0, 3.0]]])
    a, b = math.tanh(3.5), math.tanh(-1.5)
    expected = torch.tensor([[-1.0, 1.0]]) * math.sqrt((a - b) / 2)
    torch.testing.assert_close(KPCACAM(model, "0")(x, **RAW), expected)
    # rbf: K = [[1, e], [e, 1]], e = exp(-gamma |d|^2) with |d|^2 = 20
    expected = torch.tensor([[-1.0, 1.0]]) * math.sqrt((1 - math.exp(-10)) / 2)
    torch.testing.assert_close(KPCACAM(model, "0", kernel="rbf")(x, **RAW), expected)
    with pytest.raises(ArgumentError, match="unknown kernel"):
        KPCACAM(model, "0", kernel="laplace")


def test_fem_weights_are_the_share_of_positions_above_k_sigma(tiny):
    # A_0 = X: mean 2.5, std sqrt(1.25); k = 1 -> threshold 3.62: only 4 -> w_0 = 1/4;
    # A_1 = 2X likewise -> w_1 = 1/4: map = X/4 + 2X/4
    torch.testing.assert_close(FEM(tiny, "conv", k=1)(X, **RAW), 0.75 * A0)
    torch.testing.assert_close(FEM(tiny, "conv", k=0)(X, **RAW), 1.5 * A0)  # {3, 4} above 2.5
    # k = 2: no position above mean + 2 std: an all-zero map, finished as zeros (not NaN)
    assert torch.equal(FEM(tiny, "conv")(X), torch.zeros(2, 2))


# --- stochastic CAMs ------------------------------------------------------------------------


def test_smoothgradcam_plus_plus_by_hand():
    model = QuadraticNet()
    samples, std, seed = 3, 0.5, 7
    generator = torch.Generator().manual_seed(seed)
    noise = torch.stack([torch.randn(1, 1, 2, 2, generator=generator) for _ in range(samples)])
    noisy = X + std * noise[:, 0]  # (samples, 1, 2, 2)
    kernels = torch.tensor([1.0, 2.0]).view(1, 2, 1, 1)
    weight = model.fc.weight[1].detach().view(2, 2, 2)
    g = 2 * weight * (kernels * noisy)  # (samples, 2, 2, 2): y = sum W A^2
    d1, d2, d3 = g.mean(0), (g**2).mean(0), (g**3).mean(0)
    clean = kernels[0] * X
    alpha = d2 / (2 * d2 + clean.sum(dim=(1, 2), keepdim=True) * d3)
    w = (alpha * d1.relu()).sum(dim=(1, 2))
    expected = (w[:, None, None] * clean).sum(0)
    cam = SmoothGradCAMPlusPlus(model, "conv", samples=samples, std=std, seed=seed)
    torch.testing.assert_close(cam(X, target=1, **RAW), expected)
    # chunking the noisy copies does not change the result; the seed fixes it
    chunked = SmoothGradCAMPlusPlus(
        model, "conv", samples=samples, std=std, seed=seed, batch_size=1
    )
    torch.testing.assert_close(chunked(X, target=1, **RAW), expected)


def test_random_cam_is_seeded_uniform_channel_weights(tiny):
    w = torch.rand((1, 2, 2), generator=torch.Generator().manual_seed(4)) * 2 - 1
    got = RandomCAM(tiny, "conv", seed=4)(X, target=[[0, 1]], **RAW)
    torch.testing.assert_close(got, (w[0, :, 0, None, None] + 2 * w[0, :, 1, None, None]) * A0)
    torch.testing.assert_close(RandomCAM(tiny, "conv", seed=4)(X, [[0, 1]], **RAW), got)
    assert not torch.allclose(RandomCAM(tiny, "conv", seed=5)(X, [[0, 1]], **RAW), got)


@pytest.mark.filterwarnings("ignore:the model has no conv or batch-norm bias")
def test_new_methods_leave_the_model_untouched(tiny):
    tiny.fc.weight.requires_grad_(False)
    before = model_state(tiny)
    for method in (EigenGradCAM, GradCAMElementWise, KPCACAM, FEM, ShapleyCAM, FinerCAM, RandomCAM):
        method(tiny, "conv")(X, target=1)
    SmoothGradCAMPlusPlus(tiny, "conv", seed=0)(X, target=1)
    FullGrad(tiny)(X, target=1)
    DeepFeatureFactorization(tiny, "conv", classifier=None)(X, components=1)
    assert_untouched(tiny, before)
    pooled = PooledNet()
    before = model_state(pooled)
    CAM(pooled, "conv")(X, target=1)
    assert_untouched(pooled, before)


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda m: SmoothGradCAMPlusPlus(m, "conv", samples=0), ArgumentError, "samples"),
        (lambda m: SmoothGradCAMPlusPlus(m, "conv", std=-1.0), ArgumentError, "std"),
        (lambda m: SmoothGradCAMPlusPlus(m, "conv", seed="1"), ArgumentError, "seed"),
        (lambda m: RandomCAM(m, "conv", seed=1.5), ArgumentError, "seed"),
        (lambda m: FinerCAM(m, "conv", gamma=-1), ArgumentError, "gamma"),
        (lambda m: FinerCAM(m, "conv", references=0), ArgumentError, "references"),
        (lambda m: FinerCAM(m, "conv", weighting="max"), ArgumentError, "weighting"),
        (lambda m: FEM(m, "conv", k=float("nan")), ArgumentError, "k must be"),
        (lambda m: KPCACAM(m, "conv", gamma=-1.0), ArgumentError, "gamma"),
        (lambda m: CAM(m, "conv", fc="fcc"), camkit.LayerNotFoundError, "fc"),
    ],
)
def test_bad_options_are_refused_clearly(tiny, make, error, match):
    with pytest.raises(error, match=match):
        make(tiny)


def test_finercam_refuses_callable_targets(tiny):
    with pytest.raises(TargetError, match="class indices"):
        FinerCAM(tiny, "conv")(X, target=lambda out: out[:, 0])


# --- FullGrad ------------------------------------------------------------------------------


class BiasNet(nn.Module):
    """conv 1x1 (weight 2, bias 1) -> flatten -> linear v = [[1, -1], [2, 0]]: y = v . (2x + 1)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 1, 1)
        self.fc = nn.Linear(4, 1, bias=False)
        with torch.no_grad():
            self.conv.weight.fill_(2.0)
            self.conv.bias.fill_(1.0)
            self.fc.weight.copy_(torch.tensor([[1.0, -1.0, 2.0, 0.0]]))

    def forward(self, x):
        return self.fc(self.conv(x).flatten(1))


def test_fullgrad_by_hand():
    # input term |grad_x * x| = |2 v x| = [[2, 4], [12, 0]] -> [[1/6, 1/3], [1, 0]];
    # bias term |v * 1| = [[1, 1], [2, 0]] -> [[1/2, 1/2], [1, 0]]; sum then min-max (/ 2)
    expected = torch.tensor([[2 / 3, 5 / 6], [2.0, 0.0]])
    torch.testing.assert_close(FullGrad(BiasNet())(X, 0, normalize=False), expected)
    torch.testing.assert_close(FullGrad(BiasNet())(X, 0), expected / 2)


def test_fullgrad_batch_norm_bias_and_fused_activations():
    bn = nn.BatchNorm2d(1, eps=1.0).eval()
    with torch.no_grad():
        bn.running_mean.fill_(1.0)
        bn.running_var.fill_(3.0)
        bn.weight.fill_(2.0)
        bn.bias.fill_(3.0)
    torch.testing.assert_close(effective_bias(bn), torch.tensor([2.0]))  # 3 - 1 * 2 / sqrt(4)
    lite0 = camkit.models.load().model
    names = [name for name, _, _ in bias_layers(lite0)]
    # timm's BatchNormAct2d is tapped before its activation
    assert "bn2.drop" in names and "bn1.drop" in names and len(names) == 49


# --- Deep Feature Factorization --------------------------------------------------------------


def test_nmf_recovers_an_exact_factorisation():
    w = torch.tensor([[1.0, 0.0], [2.0, 1.0], [0.0, 3.0]])
    h = torch.tensor([[1.0, 2.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.5]])
    w_fit, h_fit = nmf(w @ h, 2, max_iter=2000, tol=1e-12)
    torch.testing.assert_close((w_fit @ h_fit).float(), w @ h, atol=1e-5, rtol=0)
    assert (w_fit >= 0).all() and (h_fit >= 0).all()


def test_dff_concepts_and_maps_by_hand():
    # the layer's output is the input: concept (1, 2, 0) on the top row, (0, 1, 3) on the bottom
    model = nn.Sequential(nn.Identity(), nn.Flatten(), nn.Linear(12, 2))
    top, bottom = torch.tensor([1.0, 2.0, 0.0]), torch.tensor([0.0, 1.0, 3.0])
    x = torch.stack([top, top, bottom, bottom], dim=1).view(3, 2, 2)
    classifier = nn.Linear(3, 2)
    found = DeepFeatureFactorization(model, "0", classifier=classifier)(
        x, components=2, max_iter=2000, tol=1e-12
    )
    rows = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    order = [0, 1] if found.maps[0, 0, 0] > 0.5 else [1, 0]
    torch.testing.assert_close(found.maps[order], torch.stack([rows, 1 - rows]), atol=1e-4, rtol=0)
    # the embeddings, shifted back by the per-channel minimum (0, 1, 0), are along the concepts
    shifted = found.embeddings[order] - torch.tensor([0.0, 1.0, 0.0])
    for got, concept in zip(
        shifted, [torch.tensor([1.0, 1.0, 0.0]), torch.tensor([0.0, 0.0, 3.0])], strict=True
    ):
        torch.testing.assert_close(got / got.norm(), concept / concept.norm(), atol=1e-4, rtol=0)
    torch.testing.assert_close(found.scores, classifier(found.embeddings).softmax(-1))
    assert len(found.top_classes(1)) == 2 and len(found.legend(["a,b", "c"], 1)) == 2


def test_concept_image_colours_each_pixel_by_its_strongest_concept():
    image = torch.full((3, 1, 2), 0.5)
    maps = torch.tensor([[[0.8, 0.1]], [[0.2, 0.6]]])
    colors = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.5, 0.5]])  # the second is scaled to max 1
    got = concept_image(image, maps, colors=colors, image_weight=0.25)
    expected = torch.tensor([[[0.8, 0.0]], [[0.0, 0.6]], [[0.0, 0.6]]]) * 0.75 + 0.125
    torch.testing.assert_close(got, expected)


# --- agreement with the peers ------------------------------------------------------------------


@pytest.fixture(scope="module")
def pretrained() -> tuple[nn.Module, Tensor]:
    from skimage import data as skdata

    net = camkit.models.load()
    return net.model, torch.stack(
        [net.preprocess(skdata.chelsea()), net.preprocess(skdata.coffee())]
    )


@pytest.fixture(scope="module")
def resnet() -> tuple[nn.Module, Tensor]:
    """ResNet-18 with seeded random weights and random batch-norm statistics (so that the
    batch-norm biases are not all 0), and two random images."""
    from torchvision.models import resnet18

    torch.manual_seed(0)
    model = resnet18(weights=None).eval()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.BatchNorm2d):
                c = module.num_features
                module.running_mean.copy_(0.1 * torch.randn(c, generator=generator))
                module.running_var.copy_(0.5 + torch.rand(c, generator=generator))
                module.bias.copy_(0.1 * torch.randn(c, generator=generator))
                module.weight.copy_(1 + 0.1 * torch.randn(c, generator=generator))
    return model, torch.randn(2, 3, 64, 64, generator=generator)


TARGETS = [281, 504]


def _pgc(method, model, layers, x, targets, **options):
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

    targets = [t if callable(t) else ClassifierOutputTarget(t) for t in targets]
    with method(model=model, target_layers=layers, **options) as reference:
        return torch.from_numpy(reference(input_tensor=x, targets=targets))


@pytest.mark.parametrize(
    ("ours", "reference"),
    [
        (EigenGradCAM, "EigenGradCAM"),
        (GradCAMElementWise, "GradCAMElementWise"),
        (KPCACAM, "KPCA_CAM"),
        (FEM, "FEM"),
        (ShapleyCAM, "ShapleyCAM"),
    ],
)
def test_equal_to_pytorch_grad_cam_on_the_pretrained_model(pretrained, ours, reference):
    pgc = pytest.importorskip("pytorch_grad_cam")
    model, x = pretrained
    expected = _pgc(getattr(pgc, reference), model, [model.bn2], x, TARGETS)
    got = ours(model, "bn2")(x, target=TARGETS)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)


def test_shapleycam_equals_pytorch_grad_cam_with_a_softmax_target(pretrained):
    """With a logit after ReLU layers the Hessian term is 0; a softmax target exercises it."""
    pgc = pytest.importorskip("pytorch_grad_cam")
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputSoftmaxTarget

    model, x = pretrained
    softmax_targets = [ClassifierOutputSoftmaxTarget(t) for t in TARGETS]
    expected = _pgc(pgc.ShapleyCAM, model, [model.bn2], x, softmax_targets)
    classes = torch.tensor(TARGETS)[:, None]
    probability = lambda out: out.softmax(1).gather(1, classes)[:, 0]  # noqa: E731
    got = ShapleyCAM(model, "bn2")(x, target=probability)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)
    gradcam = camkit.GradCAM(model, "bn2")(x, target=probability)
    assert (gradcam - expected).abs().amax() > 0.1  # the Hessian term matters here


def test_finercam_softmax_equals_pytorch_grad_cam(resnet):
    pgc = pytest.importorskip("pytorch_grad_cam")
    model, x = resnet
    with pgc.FinerCAM(model=model, target_layers=[model.layer4]) as reference:
        expected = torch.from_numpy(reference(input_tensor=x, targets=None))  # top-1, alpha=1
    got = FinerCAM(model, "layer4", gamma=1.0, weighting="softmax")(x)
    assert (got.amax(dim=(1, 2)) == 1).all()  # not blank maps
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)


def test_fullgrad_equals_pytorch_grad_cam(resnet):
    pgc = pytest.importorskip("pytorch_grad_cam")
    model, x = resnet
    expected = _pgc(pgc.FullGrad, model, [], x, [3, 7])
    torch.testing.assert_close(FullGrad(model)(x, target=[3, 7]), expected, atol=1e-4, rtol=0)


def test_random_cam_equals_pytorch_grad_cam_with_the_same_weights(pretrained, monkeypatch):
    """pytorch-grad-cam draws its weights with numpy: hand it the weights camkit draws."""
    pgc = pytest.importorskip("pytorch_grad_cam")
    import pytorch_grad_cam.random_cam as random_cam

    model, x = pretrained
    weights = torch.rand((2, 1, 1280), generator=torch.Generator().manual_seed(9)) * 2 - 1

    def uniform(low, high, size):
        assert (low, high, size) == (-1, 1, (2, 1280))
        return weights[:, 0].double().numpy()

    monkeypatch.setattr(random_cam.np.random, "uniform", uniform)
    expected = _pgc(pgc.RandomCAM, model, [model.bn2], x, TARGETS)
    got = RandomCAM(model, "bn2", seed=9)(x, target=TARGETS)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)


def test_dff_equals_pytorch_grad_cam_from_the_same_initialisation(pretrained):
    """scikit-learn's NMF (coordinate descent) from its own random initialisation, which camkit
    cannot draw (numpy's generator); from the same start both give the same concepts."""
    pytest.importorskip("pytorch_grad_cam")
    from pytorch_grad_cam import DeepFeatureFactorization as Reference
    from sklearn.decomposition._nmf import _initialize_nmf

    model, x = pretrained
    x = x[:1]
    concepts, maps, outputs = Reference(model, model.bn2, computation_on_concepts=model.classifier)(
        x, 4
    )
    with camkit.record(model, "bn2", gradients=False) as rec, torch.no_grad():
        model(x)
    act = rec.activations["bn2"].transpose(0, 1).flatten(1)
    init = _initialize_nmf(
        (act - act.amin(1, keepdim=True)).numpy(), 4, init="random", random_state=0
    )
    found = DeepFeatureFactorization(model, "bn2")(
        x, components=4, init=tuple(torch.from_numpy(t) for t in init)
    )
    torch.testing.assert_close(
        found.maps[0], torch.from_numpy(np.float32(maps[0])), atol=1e-4, rtol=0
    )
    torch.testing.assert_close(
        found.embeddings, torch.from_numpy(concepts.T).float(), atol=1e-3, rtol=1e-4
    )
    torch.testing.assert_close(
        found.scores, torch.from_numpy(outputs).softmax(-1), atol=1e-5, rtol=0
    )


def test_cam_equals_torchcam(resnet):
    """torchcam's CAM has no ReLU (as the paper): compare the raw maps, normalised."""
    torchcam = pytest.importorskip("torchcam.methods")
    model, x = resnet
    with torchcam.CAM(model, "layer4", "fc") as extractor, torch.no_grad():
        model(x)
        expected = extractor(class_idx=[3, 7])[0]
    got = CAM(model, "layer4")(x, target=[3, 7], relu=False, upsample=False)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)


def test_finercam_mean_equals_torchcam(resnet):
    torchcam = pytest.importorskip("torchcam.methods")
    model, x = resnet
    with torchcam.FinerCAM(model, "layer4") as extractor:
        expected = extractor(class_idx=[3, 7], scores=model(x))[0]
    got = FinerCAM(model, "layer4")(x, target=[3, 7], upsample=False)
    assert (got.amax(dim=(1, 2)) == 1).all()  # not blank maps
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)


def test_smoothgradcam_plus_plus_against_torchcam(resnet):
    """Same seed, so the same noise. torchcam 0.5.0 departs from the paper in two ways that
    vanish for tiny noise: its weights use ReLU of the LAST noisy gradient instead of the mean
    one, and its map sums the LAST noisy activations instead of the clean ones (its hooks stay
    on during the noisy passes). camkit follows the paper (see the hand-computed test); the maps
    agree to float precision for small noise and correlate >= 0.99 at torchcam's default std."""
    torchcam = pytest.importorskip("torchcam.methods")
    model, x = resnet
    for std, minimum in ((1e-4, 0.99999), (0.3, 0.99)):
        torch.manual_seed(5)
        with torchcam.SmoothGradCAMpp(model, "layer4", num_samples=4, std=std) as extractor:
            model(x)
            expected = extractor(class_idx=[3, 7])[0]
        cam = SmoothGradCAMPlusPlus(model, "layer4", samples=4, std=std, seed=5)
        got = cam(x, target=[3, 7], upsample=False)
        assert min(_correlation(a, b) for a, b in zip(got, expected, strict=True)) >= minimum


# --- RefineCAM -------------------------------------------------------------------------------


def test_refinecam_multiplies_the_normalised_layer_maps(tiny):
    from camkit.methods.cam.refine import RefineCAM

    # HiResCAM, class 0, at conv and at the ReLU after it (same activations and gradients):
    # [[1, -4], [6, 4]] -> ReLU -> min-max [[1/6, 0], [1, 2/3]], squared by the product
    single = torch.tensor([[1 / 6, 0.0], [1.0, 2 / 3]])
    got = RefineCAM(tiny, ["conv", "relu"], base=camkit.HiResCAM)(X, target=0, normalize=False)
    torch.testing.assert_close(got, single**2)
    with pytest.raises(ArgumentError, match="at least two"):
        RefineCAM(tiny, "conv")
    many = RefineCAM(tiny, ["conv", "relu"])(torch.stack([X, 2 * X]), target=[[0, 1], [1, 0]])
    assert many.shape == (2, 2, 2, 2)


@pytest.mark.parametrize("base", ["GradCAM", "LayerCAM"])
def test_refinecam_equals_torchcam(resnet, base):
    from camkit.methods.cam.refine import RefineCAM

    torchcam = pytest.importorskip("torchcam.methods")
    model, x = resnet
    with torchcam.RefineCAM(model, ["layer3", "layer4"], base_method=getattr(torchcam, base)) as ex:
        expected = ex(class_idx=[3, 7], scores=model(x))[0]
    got = RefineCAM(model, ["layer3", "layer4"], base=getattr(camkit, base))(
        x, target=[3, 7], upsample=False
    )
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)


def test_torchcam_gradcam_plus_plus_never_divides_its_alphas(resnet):
    """torchcam 0.5.0's ``GradCAMpp`` writes ``alpha[mask].div_(...)``: boolean indexing makes a
    copy, so the division is lost and its weights are ``sum_ij g^2 ReLU(g)``. RefineCAM with
    Grad-CAM++ (its default base) therefore differs from camkit's, whose Grad-CAM++ follows the
    closed form (hand-checked in test_cam.py); with the division dropped the two agree."""
    from camkit.methods.cam.refine import RefineCAM

    torchcam = pytest.importorskip("torchcam.methods")
    model, x = resnet

    class Undivided(camkit.GradCAMPlusPlus):
        def channel_weights(self, act: Tensor, grad: Tensor) -> Tensor:
            return (grad.square() * grad.relu()).sum(dim=(-2, -1), keepdim=True)

    with torchcam.RefineCAM(model, ["layer3", "layer4"]) as ex:
        expected = ex(class_idx=[3, 7], scores=model(x))[0]
    as_torchcam = RefineCAM(model, ["layer3", "layer4"], base=Undivided)
    torch.testing.assert_close(as_torchcam(x, [3, 7], upsample=False), expected, atol=1e-4, rtol=0)
    ours = RefineCAM(model, ["layer3", "layer4"])(x, target=[3, 7], upsample=False)
    assert (ours - expected).abs().amax() > 0.05


def test_second_order_and_noisy_methods_work_inside_no_grad():
    model = QuadraticNet()
    with torch.no_grad():
        shapley = ShapleyCAM(model, "conv")(X, target=1, **RAW)
        smooth = SmoothGradCAMPlusPlus(model, "conv", seed=1)(X, target=1, **RAW)
        full = FullGrad(BiasNet())(X, 0)
    torch.testing.assert_close(shapley, 22.5 * A0)
    torch.testing.assert_close(smooth, SmoothGradCAMPlusPlus(model, "conv", seed=1)(X, 1, **RAW))
    torch.testing.assert_close(full, FullGrad(BiasNet())(X, 0))
    assert torch.is_grad_enabled()


def test_shares_pass_is_false_exactly_for_the_methods_with_their_own_passes():
    """camkit.cams() serves several methods from one shared pass through ``maps_from``; the
    registry derives which from the class: a method that overrides ``raw_maps`` (its own target
    handling or extra passes) does not share it."""
    from camkit.methods.cam.base import BaseCAM
    from camkit.methods.cam.refine import RefineCAM

    shared = [EigenGradCAM, GradCAMElementWise, KPCACAM, FEM]
    own = [CAM, ShapleyCAM, FinerCAM, SmoothGradCAMPlusPlus, RandomCAM, RefineCAM]
    for cls in shared + own:
        entry = registry.get(cls.name)
        assert entry.cls is cls and entry.family == "gradient-cam"
        assert entry.shares_pass == (cls in shared) == (cls.raw_maps is BaseCAM.raw_maps), cls
    fullgrad = registry.get("fullgrad")
    assert fullgrad.cls is FullGrad and not fullgrad.shares_pass and not fullgrad.needs_layer
    assert len({cls.name for cls in shared + own}) == len(shared + own)
    # the shared ones really come from one pass in cams(), equal to their own classes
    batch = torch.stack([X, 2 * X])
    names = [cls.name for cls in shared]
    together = camkit.cams(TinyNet(), "conv", batch, [1, 0], methods=names, **RAW)
    for cls in shared:
        torch.testing.assert_close(together[cls.name], cls(TinyNet(), "conv")(batch, [1, 0], **RAW))


def test_plot_concepts_draws_the_concept_map_with_its_legend():
    from camkit.methods.cam.dff import Concepts
    from camkit.viz import plot_concepts

    maps = torch.tensor([[[0.8, 0.1]], [[0.2, 0.6]]])
    scores = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.3, 0.6]])
    concepts = Concepts(torch.zeros(2, 4), maps, scores)
    figure = plot_concepts(torch.full((3, 1, 2), 0.5), concepts, ["cat, tabby", "dog", "mug"])
    legend = figure.axes[1].get_legend()
    assert [t.get_text() for t in legend.get_texts()] == [
        "cat, tabby:0.70\ndog:0.20",
        "mug:0.60\ndog:0.30",
    ]
    drawn = figure.axes[1].get_images()[0].get_array()
    expected = concept_image(torch.full((3, 1, 2), 0.5), maps).permute(1, 2, 0).numpy()
    np.testing.assert_allclose(drawn, expected, atol=1e-6)


# --- the common keywords: batch_size, K targets, heatmaps ----------------------------------------


PAIRS = [[0, 1], [1, 0], [1, 1]]


@pytest.mark.parametrize(
    ("make", "targets"),
    [
        (lambda **o: CAM(PooledNet(), "conv", **o), PAIRS),
        (lambda **o: EigenGradCAM(TinyNet(), "conv", **o), PAIRS),
        (lambda **o: ShapleyCAM(QuadraticNet(), "conv", **o), PAIRS),
        (lambda **o: FinerCAM(TinyNet(), "conv", **o), PAIRS),
        (lambda **o: SmoothGradCAMPlusPlus(QuadraticNet(), "conv", samples=3, seed=2, **o), PAIRS),
        (lambda **o: RandomCAM(TinyNet(), "conv", seed=1, **o), PAIRS),
        (lambda **o: FullGrad(BiasNet(), **o), [[0], [0], [0]]),  # one output
        (
            lambda **o: camkit.RefineCAM(TinyNet(), ["conv", "relu"], base=camkit.HiResCAM, **o),
            PAIRS,
        ),
    ],
)
def test_results_do_not_depend_on_batch_size(make, targets):
    batch = torch.stack([X, 2 * X, X.flip(-1)])
    whole = make()(batch, targets)
    assert whole.shape[:2] == (3, len(targets[0]))
    torch.testing.assert_close(make(batch_size=1)(batch, targets), whole)
    torch.testing.assert_close(make(batch_size=2)(batch, targets), whole)
    explainer = make()
    raw = explainer.explain_batch(batch, targets, **explainer.display_options).maps
    heat = explainer.display_heat(raw)  # what the CLI draws
    assert heat.shape == raw.shape == whole.shape
    torch.testing.assert_close(heat, whole)
    assert heat.min() >= 0 and heat.max() <= 1


def test_refinecam_k_targets_equal_single_calls(tiny):
    """RefineCAM cannot join test_batched's single-layer loop: it needs two layers."""
    from camkit.methods.cam.refine import RefineCAM

    batch = torch.stack([X, 2 * X, -X])
    targets = [[0, 1], [1, 0], [1, 1]]
    refine = RefineCAM(tiny, ["conv", "relu"], base=camkit.HiResCAM)
    many = refine(batch, targets)
    assert many.shape == (3, 2, 2, 2)
    for k in range(2):
        torch.testing.assert_close(many[:, k], refine(batch, [row[k] for row in targets]))
    assert not registry.get("refinecam").shares_pass


def test_random_cam_draws_k_independent_weight_vectors(tiny):
    """Why RandomCAM is left out of test_batched's per-target check: with K targets, map k
    uses the k-th of K draws, not the draw of a single-target call."""
    w = torch.rand((1, 2, 2), generator=torch.Generator().manual_seed(4)) * 2 - 1
    pair = RandomCAM(tiny, "conv", seed=4)(X, [[1, 1]], **RAW)
    torch.testing.assert_close(pair[0], (w[0, 0, 0] + 2 * w[0, 0, 1]) * A0)
    torch.testing.assert_close(pair[1], (w[0, 1, 0] + 2 * w[0, 1, 1]) * A0)
    torch.testing.assert_close(RandomCAM(tiny, "conv", seed=4)(X, 1, **RAW), pair[0])

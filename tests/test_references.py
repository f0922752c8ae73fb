"""Agreement with the published reference implementations (pytorch-grad-cam, captum).

The peers are dev extras (``pip install -e .[dev]``), never runtime dependencies; without them
these tests skip. Where camkit differs from a peer on purpose the test states the exact
relation (see docs/design.md and docs/pixel-methods.md).
"""

from __future__ import annotations

import pytest
import torch
from skimage import data as skdata
from torch import Tensor
from torchvision.models import resnet18

import camkit
from camkit import models

pgc = pytest.importorskip("pytorch_grad_cam")
captum_attr = pytest.importorskip("captum.attr")
from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning:captum")
TARGETS = [281, 504]  # tabby (chelsea), coffee mug (coffee)


def _correlation(a: Tensor, b: Tensor) -> float:
    return float(torch.corrcoef(torch.stack([a.flatten(), b.flatten()]))[0, 1])


def _pgc_maps(method: type, model: torch.nn.Module, layer: str, x: Tensor, targets) -> Tensor:
    with method(model=model, target_layers=[model.get_submodule(layer)]) as reference:
        maps = reference(input_tensor=x, targets=[ClassifierOutputTarget(t) for t in targets])
    return torch.from_numpy(maps)


@pytest.fixture(scope="module")
def pretrained() -> tuple[torch.nn.Module, Tensor]:
    """The default pretrained model (EfficientNet-Lite0) on a cat and a coffee cup."""
    net = models.load()
    photos = torch.stack([net.preprocess(skdata.chelsea()), net.preprocess(skdata.coffee())])
    return net.model, photos


@pytest.fixture(scope="module")
def resnet() -> tuple[torch.nn.Module, Tensor]:
    """Random-weight ResNet-18 (``nn.ReLU`` modules, in-place) and two random images."""
    torch.manual_seed(0)
    return resnet18(weights=None).eval(), torch.randn(2, 3, 64, 64)


@pytest.mark.parametrize(
    ("name", "reference"),
    [
        ("gradcam", "GradCAM"),
        ("xgradcam", "XGradCAM"),
        ("hirescam", "HiResCAM"),
        ("layercam", "LayerCAM"),
        ("eigencam", "EigenCAM"),
    ],
)
def test_gradient_cams_equal_pytorch_grad_cam_on_the_pretrained_model(pretrained, name, reference):
    model, x = pretrained
    expected = _pgc_maps(getattr(pgc, reference), model, "bn2", x, TARGETS)
    got = camkit.METHODS[name].cls(model, "bn2")(x, target=TARGETS)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)


def test_gradcam_plus_plus_differs_from_pytorch_grad_cam_only_by_its_epsilon(pretrained):
    """pytorch-grad-cam adds 1e-6 to the alpha denominator ``2 g^2 + sum(A) g^3``; at this
    layer ``g^2`` is of the order 1e-6 itself, so the maps differ by a few percent. camkit
    computes the closed form exactly (as the authors' code does, 0/0 -> 0); with the same
    epsilon the two agree to float precision."""
    model, x = pretrained
    expected = _pgc_maps(pgc.GradCAMPlusPlus, model, "bn2", x, TARGETS)
    got = camkit.GradCAMPlusPlus(model, "bn2")(x, target=TARGETS)
    for ours, theirs in zip(got, expected, strict=True):
        assert _correlation(ours, theirs) > 0.99

    class WithEpsilon(camkit.GradCAMPlusPlus):
        def channel_weights(self, act: Tensor, grad: Tensor) -> Tensor:
            grad_2 = grad.square()
            denominator = 2 * grad_2 + act.sum(dim=(-2, -1), keepdim=True) * grad_2 * grad
            alpha = torch.where(grad != 0, grad_2 / (denominator + 1e-6), 0)
            return (alpha * grad.relu()).sum(dim=(-2, -1), keepdim=True)

    torch.testing.assert_close(WithEpsilon(model, "bn2")(x, TARGETS), expected, atol=1e-4, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("ours", "reference"), [("ScoreCAM", "ScoreCAM"), ("AblationCAM", "AblationCAM")]
)
def test_perturbation_cams_agree_with_pytorch_grad_cam(resnet, ours, reference):
    model, x = resnet
    mine = getattr(camkit, ours)(model, "layer4", batch_size=64)(x[:1], [3])
    peer = getattr(pgc, reference)(model, [model.layer4])
    peer.batch_size = 64
    with torch.no_grad():
        other = torch.from_numpy(peer(x[:1], [ClassifierOutputTarget(3)]))[0]
    # Score-CAM: pytorch-grad-cam upsamples its masks with align_corners=True, camkit (as the
    # paper's bilinear upsampling and torchcam) with align_corners=False
    assert _correlation(mine, other) > 0.99


@pytest.mark.parametrize(
    ("ours", "reference", "options"),
    [
        ("Saliency", "Saliency", {"abs": False}),
        ("GuidedBackprop", "GuidedBackprop", {}),
        ("Deconvnet", "Deconvolution", {}),
    ],
)
def test_pixel_methods_equal_captum(resnet, ours, reference, options):
    model, x = resnet
    target = torch.tensor([3, 7])
    expected = getattr(captum_attr, reference)(model).attribute(x, target=target, **options)
    got = getattr(camkit, ours)(model)(x, target=target)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)


def test_integrated_gradients_is_captums_trapezoid_with_weights_summing_to_one(resnet):
    """captum's ``riemann_trapezoid`` with ``n`` points weighs them ``1/n`` (halved at the ends),
    which sums to ``(n - 1) / n``; the trapezoid rule on ``steps = n - 1`` intervals weighs them
    ``1 / steps``. So camkit's attribution is captum's times ``n / (n - 1)``, and only camkit's
    satisfies completeness as ``steps`` grows."""
    model, x = resnet
    steps, target = 20, torch.tensor([3, 7])
    reference = captum_attr.IntegratedGradients(model).attribute(
        x, target=target, n_steps=steps + 1, method="riemann_trapezoid"
    )
    got = camkit.IntegratedGradients(model, steps=steps)(x, target=target)
    torch.testing.assert_close(got, reference * (steps + 1) / steps, atol=1e-6, rtol=1e-4)


SMOOTHINGS = [
    ("GradCAM", {"eigen_smooth": True}),
    ("GradCAM", {"aug_smooth": True}),
    ("GradCAM", {"aug_smooth": True, "eigen_smooth": True}),
    ("HiResCAM", {"eigen_smooth": True}),
    ("LayerCAM", {"eigen_smooth": True}),
    ("GradCAMElementWise", {"eigen_smooth": True}),
    ("SegEigenCAM", {}),
]


def _same_map(ours: Tensor, theirs: Tensor, options: dict) -> None:
    """Equal maps; with ``aug_smooth`` pytorch-grad-cam returns the mean of the six normalised
    maps as it is and camkit normalises it again: equal after min-max, correlation 1."""
    if options.get("aug_smooth"):
        theirs = camkit.core.finish.minmax(theirs)
    for one, other in zip(ours, theirs, strict=True):
        assert _correlation(one, other) > 0.99
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "options"), SMOOTHINGS)
def test_smoothing_options_equal_pytorch_grad_cam_on_the_pretrained_model(
    pretrained, name, options
):
    model, x = pretrained
    with getattr(pgc, name)(model=model, target_layers=[model.bn2]) as reference:
        targets = [ClassifierOutputTarget(t) for t in TARGETS]
        expected = torch.from_numpy(reference(input_tensor=x, targets=targets, **options))
    _same_map(getattr(camkit, name)(model, "bn2")(x, target=TARGETS, **options), expected, options)


@pytest.mark.parametrize(("name", "options"), SMOOTHINGS[:2] + SMOOTHINGS[-1:])
def test_smoothing_options_equal_pytorch_grad_cam_on_a_resnet(resnet, name, options):
    model, x = resnet
    with getattr(pgc, name)(model=model, target_layers=[model.layer3]) as reference:
        targets = [ClassifierOutputTarget(t) for t in (3, 7)]
        expected = torch.from_numpy(reference(input_tensor=x, targets=targets, **options))
    got = getattr(camkit, name)(model, "layer3")(x, target=[3, 7], **options)
    _same_map(got, expected, options)


def test_eigen_smooth_is_get_2d_projection_with_the_sign_of_the_plain_map(resnet):
    """pytorch-grad-cam keeps the sign LAPACK returns (numpy's and torch's SVD disagree on it
    for the same matrix); camkit's component is the same up to that sign, which it fixes to
    agree with the plain map ``sum_c w_c A_c`` (so aug_smooth with eigen_smooth is compared on
    the pretrained model, where the peer's signs happen to agree)."""
    from pytorch_grad_cam.utils.svd_on_activations import get_2d_projection

    from camkit.methods.cam.smoothing import principal_component

    model, x = resnet
    weighted = []
    for batch in (x, x.flip(-1)):
        taken = []
        hook = model.layer3.register_forward_hook(lambda m, i, o, kept=taken: kept.append(o))
        try:
            output = model(batch)
        finally:
            hook.remove()
        (grads,) = torch.autograd.grad(output[0, 3] + output[1, 7], taken)
        weighted.append((grads.mean(dim=(-2, -1), keepdim=True) * taken[0]).detach())
    for w in weighted:
        ours = principal_component(w[:, None])[:, 0]
        theirs = torch.from_numpy(get_2d_projection(w.numpy()))
        plain = w.sum(dim=1)
        for one, other, summed in zip(ours, theirs, plain, strict=True):
            assert abs(_correlation(one, other)) > 0.999
            assert _correlation(one, summed) > 0


def test_ablation_cam_on_vit_tokens_equals_pytorch_grad_cams_ablation_layer_vit():
    """pytorch-grad-cam's ``AblationLayerVit`` ablates channel ``c`` (the last axis) in every
    token; it sets ``min - 1e7`` where the layer's minimum is not 0 (a LayerNorm's output),
    camkit zeroes as the paper (and as the peer does after a ReLU): with the peer's layer
    zeroing too, the maps are equal."""
    import timm
    from pytorch_grad_cam.ablation_layer import AblationLayerVit

    class ZeroingAblationLayerVit(AblationLayerVit):
        def __call__(self, x: Tensor) -> Tensor:
            output = self.activations.transpose(1, -1)
            for i in range(output.size(0)):
                output[i, self.indices[i], :] = 0
            return output.transpose(-1, 1)

    def tokens_to_grid(t: Tensor) -> Tensor:
        return t[:, 1:].unflatten(1, (4, 4)).permute(0, 3, 1, 2)

    torch.manual_seed(0)
    vit = timm.create_model(
        "vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=2,
        embed_dim=24, num_heads=2, num_classes=10,
    ).eval()  # fmt: skip
    x = torch.randn(2, 3, 32, 32)
    for layer in ("blocks.1.norm1", "blocks.0"):
        peer = pgc.AblationCAM(
            vit, [vit.get_submodule(layer)], tokens_to_grid, ZeroingAblationLayerVit()
        )
        with torch.no_grad():
            expected = torch.from_numpy(peer(x, [ClassifierOutputTarget(t) for t in (3, 7)]))
        got = camkit.AblationCAM(vit, layer)(x, [3, 7])
        for one, other in zip(got, expected, strict=True):
            assert _correlation(one, other) > 0.99
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize(("ours", "reference"), [("GradCAM", "GradCAM"), ("EigenCAM", "EigenCAM")])
def test_pytorch_grad_cams_refinecam_is_the_product_of_the_finished_maps(resnet, ours, reference):
    """docs/design.md: the peer multiplies the maps upsampled to the input; camkit's spelling of
    it is the product of the per-layer maps of ``fuse=False``, min-max normalised."""
    model, x = resnet
    layers = [model.layer2, model.layer4]
    peer = pgc.RefineCAM(model, layers, base_method=getattr(pgc, reference))
    expected = torch.from_numpy(peer(x, [ClassifierOutputTarget(t) for t in (3, 7)]))
    maps = getattr(camkit, ours)(model, ["layer2", "layer4"])(x, [3, 7], fuse=False)
    product = torch.stack(list(maps.values())).prod(0)
    torch.testing.assert_close(camkit.core.finish.minmax(product), expected, atol=1e-4, rtol=0)


def test_fullgrad_aug_smooth_equals_pytorch_grad_cam(resnet):
    model, x = resnet
    with pgc.FullGrad(model, []) as peer:
        targets = [ClassifierOutputTarget(t) for t in (3, 7)]
        expected = torch.from_numpy(peer(x, targets, aug_smooth=True))
    _same_map(camkit.FullGrad(model)(x, [3, 7], aug_smooth=True), expected, {"aug_smooth": True})

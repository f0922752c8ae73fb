"""The one Explainer base: the template, the default layer, targets as data, the copy scorer,
layer fusion, seeds and the wrappers (numbers by hand on tiny models where they matter)."""

from __future__ import annotations

import pytest
import torch
from conftest import small_cnn
from torch import nn

import camkit
from camkit import metrics
from camkit.core.call import Call
from camkit.core.copies import CopyScorer, pin_top1
from camkit.core.finish import Finishing
from camkit.core.trace import default_layer
from camkit.errors import ArgumentError, InputError, TargetError
from camkit.targets import ClassTarget, SoftmaxTarget
from camkit.targets.resolver import resolve


@pytest.fixture
def model() -> nn.Module:
    return small_cnn()


@pytest.fixture
def x() -> torch.Tensor:
    return torch.rand(3, 3, 8, 8, generator=torch.Generator().manual_seed(1))


def test_every_registered_method_is_an_explainer():
    for name, entry in camkit.METHODS.items():
        assert issubclass(entry.cls, camkit.Explainer), name
        assert entry.family in ("gradient-cam", "perturbation-cam", "pixel", "attention"), name


@pytest.mark.parametrize(
    "make",
    [
        lambda m: camkit.GradCAM(m, "2"),  # top-1 scored in the pass
        lambda m: camkit.ScoreCAM(m, "2", batch_size=2),  # top-1 pinned on a clean pass
        lambda m: camkit.SmoothGrad(m, samples=2, seed=0, batch_size=2),  # pinned in chunks
        lambda m: camkit.LRP(m),
    ],
    ids=["gradcam", "scorecam", "smoothgrad", "lrp"],
)
def test_explain_batch_keeps_the_axes_and_names_the_classes_explained(model, x, make):
    method = make(model)
    with torch.no_grad():
        top1 = model(x).argmax(dim=1, keepdim=True)
    found = method.explain_batch(x)
    assert isinstance(found, camkit.Explanation) and not found.several
    assert torch.equal(found.targets, top1)  # (B, K): the top-1 classes it explained
    torch.testing.assert_close(found.maps[:, 0], method(x))  # the call drops K
    one = method.explain_batch(x[1])  # one sample: the batch axis is kept too
    assert one.maps.shape[:2] == (1, 1) and torch.equal(one.targets, top1[1:2])
    pairs = method.explain_batch(x, [[1, 3]] * 3)
    assert pairs.several and pairs.targets.tolist() == [[1, 3]] * 3
    torch.testing.assert_close(pairs.maps, method(x, [[1, 3]] * 3))


def test_a_callable_target_says_whether_it_asked_k_targets(model, x):
    saliency = camkit.Saliency(model)
    one = saliency.explain_batch(x, lambda out: out[:, 2])
    two = saliency.explain_batch(x, lambda out: out[:, [2, 0]])
    assert not one.several and two.several and one.targets is None and two.targets is None
    assert one.maps.shape == (3, 1, 3, 8, 8) and two.maps.shape == (3, 2, 3, 8, 8)
    torch.testing.assert_close(two.maps[:, :1], one.maps)
    assert saliency(x, lambda out: out[:, 2]).shape == (3, 3, 8, 8)


def test_no_layer_picks_the_default_layer_and_names_it(model, x):
    cam = camkit.GradCAM(model)
    assert cam.layers == []  # resolved at the first call, from the input's size
    maps = cam(x, target=1)
    assert cam.layers == [default_layer(model, (8, 8))] == ["3"]  # the last spatial map
    torch.testing.assert_close(maps, camkit.GradCAM(model, cam.layers[0])(x, target=1))
    assert camkit.GradCAM(model, "auto")(x, target=1).shape == (3, 8, 8)


def test_a_layer_for_a_method_that_reads_none_is_refused(model):
    with pytest.raises(ArgumentError, match="reads no layer"):
        camkit.Saliency(model, layer="2")
    with pytest.raises(ArgumentError, match="must be a torch.nn.Module"):
        camkit.GradCAM("resnet18", "layer4")


def test_class_target_objects_are_the_class_indices_everywhere(model, x):
    for method in (camkit.GradCAM(model, "2"), camkit.ScoreCAM(model, "2"), camkit.CAM(model, "2")):
        torch.testing.assert_close(method(x, target=ClassTarget(1)), method(x, target=1))
    # metrics score a class target by its softmax probability, whichever way it is written
    maps = camkit.GradCAM(model, "2")(x, target=3)
    options = {"steps": 4, "baseline": "zero"}
    torch.testing.assert_close(
        metrics.deletion(model, x, maps, ClassTarget(3), **options),
        metrics.deletion(model, x, maps, 3, **options),
    )
    # SoftmaxTarget explains the probability: the same as the callable that computes it
    probability = camkit.GradCAM(model, "2")(x, target=SoftmaxTarget(3), relu=False)
    by_hand = camkit.GradCAM(model, "2")(x, target=lambda o: o.softmax(1)[:, 3], relu=False)
    torch.testing.assert_close(probability, by_hand)


def test_per_sample_callables_as_pytorch_grad_cam_writes_them(model, x):
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

    cam = camkit.GradCAM(model, "2")
    expected = cam(x, target=[1, 4, 2])
    torch.testing.assert_close(
        cam(x, target=[ClassifierOutputTarget(c) for c in (1, 4, 2)]), expected
    )
    torch.testing.assert_close(cam(x, target=[ClassTarget(c) for c in (1, 4, 2)]), expected)
    torch.testing.assert_close(
        cam(x, target=[lambda row, c=c: row[c] for c in (1, 4, 2)]), expected
    )
    with pytest.raises(TargetError, match="one per sample \\(3\\)"):
        cam(x, target=[ClassifierOutputTarget(1)] * 2)


def test_a_callable_that_indexes_one_row_gets_a_clear_error(model, x):
    with pytest.raises(TargetError, match="WHOLE output") as info:
        camkit.GradCAM(model, "2")(x[:1], target=lambda o: o[281])
    assert "lambda out: out[:, 281]" in str(info.value)


@pytest.mark.parametrize("target", [[0, True], True, [[1, False]]])
def test_booleans_are_not_classes(model, x, target):
    with pytest.raises(TargetError, match="boolean|got bool"):
        camkit.GradCAM(model, "2")(x[:2], target=target)


def test_seed_only_for_the_methods_that_draw(model, x):
    assert camkit.METHODS["smoothgrad"].seeded and not camkit.METHODS["gradcam"].seeded
    with pytest.raises(ArgumentError, match="takes no seed"):
        camkit.GradCAM(model, "2", seed=1)
    a = camkit.SmoothGrad(model, samples=3, seed=5)(x, 1)
    torch.testing.assert_close(a, camkit.SmoothGrad(model, samples=3, seed=5, batch_size=2)(x, 1))


def test_with_block_as_in_pytorch_grad_cam(model, x):
    with camkit.GradCAM(model, "2") as cam:
        maps = cam(x, target=0)
    assert maps.shape == (3, 8, 8)


def test_fusion_modes_computed_by_hand():
    a = torch.tensor([[[[0.0, 0.25], [0.5, 1.0]]]])
    b = torch.tensor([[[[1.0, 0.5], [0.0, 0.0]]]])
    raw = {"a": a, "b": b}
    keep = {"relu": False, "upsample": False, "normalize": False}
    torch.testing.assert_close(Finishing(**keep, fuse="mean")(raw, (2, 2)), (a + b) / 2)
    torch.testing.assert_close(Finishing(**keep, fuse="max")(raw, (2, 2)), torch.maximum(a, b))
    tanh = torch.maximum(torch.tanh(2 * a), torch.tanh(2 * b))
    torch.testing.assert_close(Finishing(**keep, fuse="tanh")(raw, (2, 2)), tanh)
    with pytest.raises(ArgumentError, match="fuse must be"):
        Finishing(fuse="median")


def test_layercam_tanh_fusion_matches_torchcam(model, x):
    from torchcam.methods import LayerCAM as TorchcamLayerCAM

    layers = ["0", "2"]
    ours = camkit.LayerCAM(model, layers)(x, target=2, fuse="tanh")
    with TorchcamLayerCAM(model, target_layer=layers, input_shape=(3, 8, 8)) as extractor:
        scores = model(x)
        cams = extractor([2] * 3, scores)
    fused = TorchcamLayerCAM.fuse_cams(cams, (8, 8))
    low = fused.flatten(1).amin(1).view(-1, 1, 1)
    high = fused.flatten(1).amax(1).view(-1, 1, 1)
    torch.testing.assert_close(ours, (fused - low) / (high - low), atol=1e-5, rtol=1e-4)


def test_the_copy_scorer_pins_the_clean_top1_and_ignores_batch_size(model, x):
    scorer = resolve(None, 3, x.device)
    clean = model(x).argmax(1)
    pinned = pin_top1(model, x, scorer, Call(x), batch_size=2)
    assert pinned.classes[:, 0].tolist() == clean.tolist()
    copies = torch.zeros(6, 3, 8, 8)  # copies of samples 0, 1, 2, 0, 1, 2: all black images
    samples = torch.tensor([0, 1, 2, 0, 1, 2])
    whole = CopyScorer.clean(model, x, scorer, Call(x))
    chunked = CopyScorer.clean(model, x, scorer, Call(x), batch_size=1)
    one = whole.over(6, lambda i: (copies[i], samples[i]))
    torch.testing.assert_close(one, chunked.over(6, lambda i: (copies[i], samples[i])))
    black = model(copies[:1])[0]
    torch.testing.assert_close(one[:, 0], black[clean[samples]])  # the clean class, not black's
    torch.testing.assert_close(whole.scores[:, 0], model(x).gather(1, clean[:, None])[:, 0])


class Shifted(nn.Module):
    """``net(image + shift)``, with the shift per sample as a second input or fixed."""

    def __init__(self, net: nn.Module, shift: torch.Tensor | None = None) -> None:
        super().__init__()
        self.net, self.shift = net, shift

    def forward(self, image: torch.Tensor, shift: torch.Tensor | None = None) -> torch.Tensor:
        shift = self.shift if shift is None else shift
        return self.net(image + shift.view(-1, 1, 1, 1))


def test_fullgrad_takes_additional_forward_args(x):
    net, shift = small_cnn(), torch.tensor([0.0, 1.0, -2.0])
    got = camkit.FullGrad(Shifted(net))(x, 1, additional_forward_args=shift, normalize=False)
    for i in range(3):  # each sample with its own shift, as a model of its own
        alone = camkit.FullGrad(Shifted(net, shift[i : i + 1]))(x[i], 1, normalize=False)
        torch.testing.assert_close(got[i], alone, atol=1e-5, rtol=1e-4)
    assert not torch.allclose(got[1], camkit.FullGrad(net)(x[1], 1, normalize=False))


def test_wrappers_keep_their_class_flags_and_share_one_capture(model, x):
    refine = camkit.RefineCAM(model, ["0", "2"], base=camkit.EigenCAM)
    assert refine.needs_gradients is camkit.METHODS["refinecam"].needs_gradients is True
    assert refine.capture is refine.base.capture
    with torch.inference_mode():  # the wrapped method needs no gradients, so neither does it
        assert refine(x, 0).shape == (3, 8, 8)
    finer = camkit.FinerCAM(model, "2")
    assert finer.capture is finer.base.capture


def test_perturbation_and_guided_methods_read_tokens_by_default():
    import timm

    vit = timm.create_model(
        "vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=2, num_classes=5
    ).eval()
    image = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    for method in (camkit.ScoreCAM, camkit.GuidedGradCAM, camkit.GradCAM):
        out = method(vit, "blocks.1.norm1")(image, 1)
        assert out.shape[-2:] == (32, 32) and torch.isfinite(out).all()


def test_the_blur_baseline_refuses_images_smaller_than_its_kernel(model):
    with pytest.raises(InputError, match="at least 6 px per side, got 5x5"):
        metrics.deletion(model, torch.rand(1, 3, 5, 5), torch.rand(1, 5, 5), 0)


def test_metrics_take_additional_forward_args(x):
    net, shift = small_cnn(), torch.tensor([0.0, 1.0, -2.0])
    maps = torch.rand(3, 8, 8, generator=torch.Generator().manual_seed(2))
    two = Shifted(net)
    options = {"steps": 4, "baseline": "zero", "batch_size": 5}  # chunks across the images
    checks = [
        (metrics.deletion, options),
        (metrics.insertion, options),
        (metrics.average_drop, {"batch_size": 2}),
        (metrics.road, {"seed": 0, "percentiles": (20, 50)}),
    ]
    for metric, kw in checks:
        got = metric(two, x, maps, 1, additional_forward_args=shift, **kw)
        alone = [metric(Shifted(net, shift[i : i + 1]), x[i], maps[i], 1, **kw) for i in range(3)]
        torch.testing.assert_close(got, torch.stack(alone), atol=1e-5, rtol=1e-4)


class VoxelSum(nn.Module):
    """Logits ``(sum of the voxels, 0)``: class 0's probability is ``sigmoid(sum)``."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = nn.AdaptiveAvgPool3d(1)  # a 3-D model: the mean times the voxel count

    def forward(self, volume: torch.Tensor) -> torch.Tensor:
        total = self.pool(volume).flatten(1).sum(1) * volume[0, 0].numel()
        return torch.stack([total, torch.zeros_like(total)], dim=1)


def test_deletion_and_average_drop_on_volumes_by_hand():
    volume = torch.ones(1, 1, 2, 2, 2)  # one (C, D, H, W) volume of eight voxels of 1
    ranks = torch.arange(8.0).view(1, 2, 2, 2)
    sig = torch.sigmoid
    # deletion, 2 steps, zero baseline: the sums 8, 4, 0 along the curve
    expected = 0.5 * (sig(torch.tensor(8.0)) / 2 + sig(torch.tensor(4.0)) + 0.5 / 2)
    got = metrics.deletion(VoxelSum(), volume, ranks, 0, steps=2, baseline="zero")
    torch.testing.assert_close(got, expected.view(1))
    # average drop: the volume times a map of 0.5 sums to 4
    drop = metrics.average_drop(VoxelSum(), volume, torch.full((1, 2, 2, 2), 0.5), 0)
    eight, four = sig(torch.tensor([8.0])), sig(torch.tensor([4.0]))
    torch.testing.assert_close(drop, (eight - four) / eight)
    with pytest.raises(InputError, match="blur baseline blurs 2-D images"):
        metrics.deletion(VoxelSum(), volume, ranks, 0)
    with pytest.raises(InputError, match="takes images"):
        metrics.road(VoxelSum(), volume, ranks, 0)

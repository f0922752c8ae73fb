"""camkit.metrics: faithfulness (deletion/insertion, Average Drop, Increase in Confidence, ROAD)
and localisation (pointing games), on a tiny model whose evidence is known by construction."""

from __future__ import annotations

from contextlib import nullcontext
from functools import partial

import matplotlib
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from camkit import metrics
from camkit.errors import ArgumentError, InputError, TargetError
from camkit.metrics.faithfulness import make_baseline
from camkit.metrics.plots import plot_curves
from camkit.metrics.road import road_removed
from camkit.targets import SoftmaxTarget

SIDE = 32
HALF = SIDE // 2


class QuadrantNet(nn.Module):
    """Class 0's logit reads only the top-left quadrant (``8 * mean(relu(x))`` there), class 1's
    only the rest, class 2 is 0: the evidence for class 0 is the top-left quadrant."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(8.0))

    def forward(self, x):
        inside = torch.zeros_like(x[:1, :1], dtype=torch.bool)
        inside[..., :HALF, :HALF] = True
        positive = x.relu()
        evidence = (positive * inside).sum(dim=(1, 2, 3)) / (inside.sum() * x.shape[1])
        rest = (positive * ~inside).sum(dim=(1, 2, 3)) / ((~inside).sum() * x.shape[1])
        zero = torch.zeros_like(evidence)
        return torch.stack([evidence, rest, zero], dim=1) * self.scale


def _maps(batch: int) -> dict[str, torch.Tensor]:
    """The right map (1 on the quadrant, fading with the distance to it), the inverted one and
    a random one; a little jitter so no two pixels tie."""
    gen = torch.Generator().manual_seed(0)
    ys = torch.arange(SIDE, dtype=torch.float32)[:, None]
    xs = torch.arange(SIDE, dtype=torch.float32)[None, :]
    distance = ((ys - (HALF - 1)).clamp_min(0) ** 2 + (xs - (HALF - 1)).clamp_min(0) ** 2).sqrt()
    right = torch.exp(-distance / 4) * 0.99 + 0.01 * torch.rand(batch, SIDE, SIDE, generator=gen)
    return {
        "right": right,
        "inverted": 1 - right,
        "random": torch.rand(batch, SIDE, SIDE, generator=gen),
    }


@pytest.fixture
def setup():
    torch.manual_seed(0)
    model = QuadrantNet().eval()
    x = torch.randn(4, 3, SIDE, SIDE, generator=torch.Generator().manual_seed(1))
    return model, x, _maps(4)


def _quadrant_masks(batch: int) -> torch.Tensor:
    masks = torch.zeros(batch, SIDE, SIDE, dtype=torch.bool)
    masks[:, :HALF, :HALF] = True
    return masks


# ----------------------------------------------------------------------------- the right map wins


def test_right_map_beats_random_and_inverted(setup):
    model, x, maps = setup
    score = {}
    for name, m in maps.items():
        score[name] = {
            "deletion": metrics.deletion(model, x, m, 0, steps=16).mean(),
            "insertion": metrics.insertion(model, x, m, 0, steps=16).mean(),
            "drop": metrics.average_drop(model, x, m, 0).mean(),
            "increase": metrics.increase_in_confidence(model, x, m, 0).mean(),
            "morf": metrics.road(model, x, m, 0, percentiles=(20, 50), seed=0).mean(),
            "lerf": metrics.road(model, x, m, 0, percentiles=(20, 50), order="lerf", seed=0).mean(),
            "pointing": metrics.pointing_game(m, _quadrant_masks(4), tolerance=3).mean(),
            "energy": metrics.energy_pointing_game(m, _quadrant_masks(4)).mean(),
        }
    lower = ("deletion", "drop", "morf")
    for other in ("random", "inverted"):
        for key, value in score["right"].items():
            if key in lower:
                assert value < score[other][key], (key, other, score)
            else:
                assert value > score[other][key], (key, other, score)


def test_works_with_a_camkit_method_and_small_maps():
    import camkit

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten()
    )
    model.append(nn.Linear(64, 5)).eval()
    x = torch.randn(2, 3, 16, 16)
    maps = camkit.GradCAM(model, "1")(x, target=[1, 3])
    small = nn.functional.interpolate(maps[:, None], (8, 8), mode="bilinear").squeeze(1)
    for m in (maps, small):
        assert metrics.deletion(model, x, m, [1, 3], steps=8).shape == (2,)
        assert metrics.road(model, x, m, torch.tensor([1, 3]), percentiles=(50,)).shape == (2, 1)


# ----------------------------------------------------------------------------- by hand


class CountNet(nn.Module):
    """``softmax(logits)[0] = s**2``, ``s`` the share of pixels equal to 1."""

    def forward(self, x):
        share = (x == 1).float().mean(dim=(1, 2, 3))
        a = (share**2).clamp_min(1e-30)
        b = (1 - share**2).clamp_min(1e-30)
        return torch.stack([a.log(), b.log()], dim=1)


def test_auc_is_the_trapezoid_of_the_curve():
    x = torch.ones(1, 1, 4, 4)
    maps = torch.arange(16.0).view(1, 4, 4)
    auc, curves = metrics.deletion(
        CountNet(), x, maps, 0, steps=4, baseline="zero", return_curves=True
    )
    expected = torch.tensor([[1.0, 0.5625, 0.25, 0.0625, 0.0]])
    torch.testing.assert_close(curves, expected, atol=1e-6, rtol=0)
    by_hand = 0.25 * (1.0 / 2 + 0.5625 + 0.25 + 0.0625 + 0.0 / 2)
    assert auc.item() == pytest.approx(by_hand, abs=1e-6)
    auc, curves = metrics.insertion(
        CountNet(), x, maps, 0, steps=4, baseline="zero", return_curves=True
    )
    torch.testing.assert_close(curves, expected.flip(1), atol=1e-6, rtol=0)
    assert auc.item() == pytest.approx(by_hand, abs=1e-6)


def test_uneven_steps_take_floor_counts_and_ties_are_row_major():
    x = torch.ones(1, 1, 3, 3)
    maps = torch.zeros(1, 3, 3)  # every pixel ties: the row-major order is taken
    _, curves = metrics.deletion(
        CountNet(), x, maps, 0, steps=2, baseline="zero", return_curves=True
    )
    # 9 pixels in 2 steps: 0, 4, 9 removed
    torch.testing.assert_close(curves[0], torch.tensor([1.0, (5 / 9) ** 2, 0.0]), atol=1e-6, rtol=0)


@settings(max_examples=25, deadline=None)
@given(steps=st.integers(1, 20), side=st.integers(2, 6), seed=st.integers(0, 2**16))
def test_curves_end_at_image_and_baseline_and_auc_is_their_trapezoid(steps, side, seed):
    gen = torch.Generator().manual_seed(seed)
    x = (torch.rand(2, 1, side, side, generator=gen) < 0.7).float()
    maps = torch.rand(2, side, side, generator=gen)
    share = (x == 1).float().mean(dim=(1, 2, 3))
    for insert, fn in ((False, metrics.deletion), (True, metrics.insertion)):
        auc, curves = fn(CountNet(), x, maps, 0, steps=steps, baseline="zero", return_curves=True)
        assert curves.shape == (2, steps + 1)
        ends = curves[:, [-1, 0]] if insert else curves[:, [0, -1]]
        torch.testing.assert_close(ends[:, 0], share**2, atol=1e-6, rtol=0)
        torch.testing.assert_close(ends[:, 1], torch.zeros(2), atol=1e-6, rtol=0)
        by_hand = ((curves[:, 1:] + curves[:, :-1]) / 2).sum(dim=1) / steps
        torch.testing.assert_close(auc, by_hand)
        assert ((auc >= 0) & (auc <= 1)).all()


def test_drop_and_increase_by_hand():
    x = torch.ones(2, 1, 4, 4)
    maps = torch.ones(2, 4, 4)
    maps[0, 0] = 0.5  # 4 of 16 pixels no longer 1: s = 0.75
    drop = metrics.average_drop(CountNet(), x, maps, 0)
    torch.testing.assert_close(drop, torch.tensor([1 - 0.5625, 0.0]))
    torch.testing.assert_close(
        metrics.increase_in_confidence(CountNet(), x, maps, 1), torch.tensor([1.0, 0.0])
    )


def test_baselines():
    x = torch.randn(2, 3, 16, 16)
    assert make_baseline(x, "zero").abs().max() == 0
    torch.testing.assert_close(make_baseline(x, "mean")[:, :, 3, 5], x.mean(dim=(2, 3)))
    assert make_baseline(x, "blur").std() < x.std() / 2
    given = torch.full((3, 1, 1), 0.5)
    assert (make_baseline(x, given) == 0.5).all()


def test_pointing_game_on_synthetic_masks():
    maps = torch.zeros(4, 20, 20)
    maps[0, 2, 2] = 1  # inside the mask
    maps[1, 2, 10] = 1  # 5 pixels right of the mask's edge (column 5 is its last)
    maps[2, 19, 19] = 1  # far away
    masks = torch.zeros(4, 20, 20, dtype=torch.bool)
    masks[:3, :6, :6] = True  # image 3: empty mask
    hits = metrics.pointing_game(maps, masks, tolerance=4)
    torch.testing.assert_close(hits[:3], torch.tensor([1.0, 0.0, 0.0]))
    assert hits[3].isnan()
    assert metrics.pointing_game(maps, masks, tolerance=5)[1] == 1
    assert torch.nanmean(hits).item() == pytest.approx(1 / 3)
    boxes = [[[0, 0, 6, 6]], [[0, 0, 6, 6], [9, 1, 12, 4]], [[0, 0, 6, 6]], []]
    hits = metrics.pointing_game(maps, boxes, tolerance=0)
    torch.testing.assert_close(hits[:3], torch.tensor([1.0, 1.0, 0.0]))
    assert hits[3].isnan()


def test_energy_pointing_game_masks_and_boxes():
    maps = torch.zeros(3, 10, 10)
    maps[:, :5, :5] = 1.0
    maps[:, 5:, 5:] = 3.0  # 1/4 of the energy in the top-left quadrant
    box = torch.tensor([[0, 0, 5, 5]] * 3)
    shares = metrics.energy_pointing_game(maps, box)
    torch.testing.assert_close(shares, torch.full((3,), 0.25))
    masks = torch.zeros(3, 10, 10)
    masks[0, :5, :5] = 1
    masks[1] = 1
    shares = metrics.energy_pointing_game(maps, masks)
    assert shares[0] == pytest.approx(0.25) and shares[1] == pytest.approx(1.0)
    assert shares[2].isnan()
    assert metrics.energy_pointing_game(torch.zeros(1, 10, 10), masks[:1]).isnan().all()


# ----------------------------------------------------------------------------- batching, targets


def test_results_do_not_depend_on_batch_size(setup):
    model, x, maps = setup
    m = maps["random"]
    for fn in (metrics.deletion, metrics.insertion):
        torch.testing.assert_close(
            fn(model, x, m, 0, steps=8, batch_size=1), fn(model, x, m, 0, steps=8, batch_size=64)
        )
    torch.testing.assert_close(
        metrics.road(model, x, m, 0, percentiles=(30,), seed=3, batch_size=1),
        metrics.road(model, x, m, 0, percentiles=(30,), seed=3, batch_size=64),
    )
    torch.testing.assert_close(
        metrics.average_drop(model, x, m, 0, batch_size=1), metrics.average_drop(model, x, m, 0)
    )
    torch.testing.assert_close(  # top-1 classes pinned chunk by chunk
        metrics.insertion(model, x, m, None, steps=4, batch_size=3),
        metrics.insertion(model, x, m, model(x).argmax(dim=1), steps=4),
    )


def test_every_target_form_gives_the_same_scores(setup):
    model, x, maps = setup
    m = maps["right"]
    expected = metrics.deletion(model, x, m, 0, steps=4)
    for target in ([0, 0, 0, 0], torch.zeros(4, dtype=torch.long), SoftmaxTarget(0)):
        torch.testing.assert_close(metrics.deletion(model, x, m, target, steps=4), expected)
    # None: each image's top-1, pinned on the clean image
    top1 = model(x).argmax(dim=1)
    torch.testing.assert_close(
        metrics.deletion(model, x, m, None, steps=4), metrics.deletion(model, x, m, top1, steps=4)
    )


def test_single_image_gives_scalars(setup):
    model, x, maps = setup
    assert metrics.deletion(model, x[0], maps["right"][0], 0, steps=4).shape == ()
    assert metrics.road(model, x[0], maps["right"][0], 0, percentiles=(10, 50)).shape == (2,)


# ----------------------------------------------------------------------------- errors


def test_clear_errors(setup):
    model, x, maps = setup
    m = maps["right"]
    with pytest.raises(InputError, match="maps are 64x64"):
        metrics.deletion(model, x, torch.rand(4, 64, 64), 0)
    with pytest.raises(InputError, match="one map per image"):
        metrics.insertion(model, x, torch.rand(3, SIDE, SIDE), 0)
    with pytest.raises(TargetError, match="out of range"):
        metrics.deletion(model, x, m, 7, steps=2)
    with pytest.raises(TargetError, match="out of range"):
        metrics.average_drop(model, x, m, [0, 1, 2, 3])
    with pytest.raises(TargetError, match="one target per image"):
        metrics.deletion(model, x, m, [[0, 1]] * 4, steps=2)
    with pytest.raises(ArgumentError, match="steps"):
        metrics.deletion(model, x, m, 0, steps=0)
    with pytest.raises(ArgumentError, match="baseline must be one of"):
        metrics.insertion(model, x, m, 0, baseline="noise")
    with pytest.raises(InputError, match="broadcast"):
        metrics.insertion(model, x, m, 0, baseline=torch.zeros(2, 5))
    with pytest.raises(ArgumentError, match="order"):
        metrics.road(model, x, m, 0, order="random")
    with pytest.raises(ArgumentError, match=r"\(0, 100\)"):
        metrics.road(model, x, m, 0, percentiles=(0, 50))
    with pytest.raises(InputError, match=r"\[0, 1\]"):
        metrics.average_drop(model, x, m * 3, 0)
    with pytest.raises(InputError, match=r"one map per volume, shape \(B, D, H, W\)"):
        metrics.deletion(nn.Conv3d(3, 1, 1), torch.rand(1, 3, 4, 8, 8), torch.rand(1, 8, 8), 0)
    with pytest.raises(InputError, match="masks of the maps' shape"):
        metrics.pointing_game(m, torch.ones(4, 8, 8))
    with pytest.raises(InputError, match="non-negative"):
        metrics.energy_pointing_game(m - 1, _quadrant_masks(4))


# ----------------------------------------------------------------------------- plots


def test_plot_curves(setup, tmp_path):
    model, x, maps = setup
    backend = matplotlib.get_backend()
    curves = {
        name: metrics.deletion(model, x, m, 0, steps=4, return_curves=True)[1]
        for name, m in maps.items()
    }
    figure = plot_curves(curves, "deletion", tmp_path / "curves.png")
    assert (tmp_path / "curves.png").stat().st_size > 0
    labels = [t.get_text() for t in figure.axes[0].get_legend().get_texts()]
    assert labels[0].startswith("right (AUC ")
    assert matplotlib.get_backend() == backend
    with pytest.raises(ArgumentError):
        plot_curves(curves, "both")


# ----------------------------------------------------------------------------- the references


class _FixedCAM:
    """A torchcam CAM extractor that hands out given maps, so torchcam scores camkit's maps."""

    def __init__(self, model, maps):
        self.model, self.maps = model, maps

    def __call__(self, class_idx=None, scores=None, normalized=True, **kwargs):
        return [self.maps]

    def fuse_cams(self, cams):
        return cams[0]

    def _hooks_off(self):
        return nullcontext()


def test_deletion_insertion_match_torchcam(setup):
    torchcam_metrics = pytest.importorskip("torchcam.metrics")
    model, x, maps = setup
    softmax = partial(torch.softmax, dim=-1)
    for m in (maps["right"], maps["random"]):
        ours_del = metrics.deletion(model, x, m, 0, steps=16, baseline="zero")
        ours_ins = metrics.insertion(model, x, m, 0, steps=16, baseline="zero")
        blurred = make_baseline(x, "blur")
        ours_blur = metrics.insertion(model, x, m, 0, steps=16)
        for i in range(x.shape[0]):
            for baseline, insertion in ((None, ours_ins[i]), (blurred[i : i + 1], ours_blur[i])):
                ref = torchcam_metrics.DeletionInsertionMetric(
                    _FixedCAM(model, m[i : i + 1]), softmax, steps=16, baseline=baseline
                )
                ref.update(x[i : i + 1], class_idx=0)
                summary = ref.summary()
                assert summary["insertion_auc"] == pytest.approx(insertion.item(), abs=1e-5)
                if baseline is None:
                    assert summary["deletion_auc"] == pytest.approx(ours_del[i].item(), abs=1e-5)


def test_drop_and_increase_match_torchcam(setup):
    torchcam_metrics = pytest.importorskip("torchcam.metrics")
    model, x, maps = setup
    softmax = partial(torch.softmax, dim=-1)
    for m in maps.values():
        drop = metrics.average_drop(model, x, m, 0)
        increase = metrics.increase_in_confidence(model, x, m, 0)
        for i in range(x.shape[0]):
            ref = torchcam_metrics.ClassificationMetric(_FixedCAM(model, m[i : i + 1]), softmax)
            ref.update(x[i : i + 1], class_idx=0)
            summary = ref.summary()
            assert summary["avg_drop"] == pytest.approx(drop[i].item(), rel=1e-5, abs=1e-6)
            assert summary["conf_increase"] == increase[i].item()


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # numpy 2 on their torch tensors
@pytest.mark.parametrize("order", ["morf", "lerf"])
def test_road_matches_pytorch_grad_cam(setup, order):
    road_ref = pytest.importorskip("pytorch_grad_cam.metrics.road")
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputSoftmaxTarget

    model, x, maps = setup
    x = x[:2]
    percentiles = (10, 40, 70)
    reference = {
        "morf": road_ref.ROADMostRelevantFirst,
        "lerf": road_ref.ROADLeastRelevantFirst,
    }[order]
    targets = [ClassifierOutputSoftmaxTarget(0)] * 2
    for m in (maps["right"][:2], maps["random"][:2]):
        ours = metrics.road(model, x, m, 0, percentiles=percentiles, order=order, seed=5)
        torch.manual_seed(5)
        # pytorch-grad-cam's percentile is the share kept
        theirs = [
            reference(100 - p)(x, m.numpy(), targets, model, return_diff=False) for p in percentiles
        ]
        np.testing.assert_allclose(ours.numpy(), np.stack(theirs, axis=1), rtol=1e-5, atol=1e-6)


def test_road_imputes_the_weighted_mean_of_the_neighbours():
    from camkit.metrics.road import _impute

    image = torch.arange(25.0).view(1, 5, 5) ** 1.5
    known = torch.ones(5, 5, dtype=torch.bool)
    known[2, 2] = False
    filled = _impute(image, known, noise=0.0, generator=None)
    direct = image[0, 1, 2] + image[0, 3, 2] + image[0, 2, 1] + image[0, 2, 3]
    diagonal = image[0, 1, 1] + image[0, 1, 3] + image[0, 3, 1] + image[0, 3, 3]
    assert filled[0, 2, 2].item() == pytest.approx((direct / 6 + diagonal / 12).item(), rel=1e-6)
    known[...] = True
    known[0, 0] = False  # a corner: its 3 neighbours' weights renormalised
    filled = _impute(image, known, noise=0.0, generator=None)
    corner = (image[0, 0, 1] / 6 + image[0, 1, 0] / 6 + image[0, 1, 1] / 12) / (5 / 12)
    assert filled[0, 0, 0].item() == pytest.approx(corner.item(), rel=1e-6)
    assert torch.equal(filled.flatten()[1:], image.flatten()[1:])


def test_road_removes_the_asked_share_even_with_ties():
    """Deliberate difference: pytorch-grad-cam keeps ``map < percentile`` pixels, so on a map
    with ties (half zeros, as after Grad-CAM's ReLU) it removes far more than asked; camkit
    ranks the pixels (stable sort) and removes the same count as on a map without ties."""
    assert road_removed(1024, 70) == 1024 - 307  # 1024 - ceil(0.3 * 1023)
    tied = torch.cat(
        [torch.zeros(512), torch.rand(512, generator=torch.Generator().manual_seed(0))]
    )
    threshold = np.percentile(tied.numpy(), 30)  # their MoRF at 70 % removed keeps 30 %
    assert (tied.numpy() < threshold).sum() == 0  # they remove every pixel
    removed_count = road_removed(1024, 70)
    from camkit.metrics.faithfulness import pixel_ranks

    ranks = pixel_ranks(tied.view(1, 32, 32), descending=True)
    assert int((ranks < removed_count).sum()) == removed_count

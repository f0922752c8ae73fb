"""SS-CAM, IS-CAM and Recipro-CAM: hand-computed values, direct loops, torchcam, and the
additional forward arguments of every perturbation CAM."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import X
from test_perturb import ConvNet, Counter
from torch import Tensor, nn

from camkit import ISCAM, SSCAM, AblationCAM, ReciproCAM, ScoreCAM
from camkit.errors import ArgumentError

RAW = {"relu": False, "upsample": False, "normalize": False}


def pearson(a: Tensor, b: Tensor) -> float:
    return torch.corrcoef(torch.stack([a.flatten().float(), b.flatten().float()]))[0, 1].item()


class TwoMasks(nn.Module):
    """x (1, 1, 2, 2) -> 1x1 conv "conv": A_0 = x, A_1 = 5 - x -> logits (sum A_0, sum A_1).

    On X = [[1, 2], [3, 4]] the masks are H_0 = (x - 1) / 3 and H_1 = 1 - H_0, and a masked
    input x' = x (s H + d) scores y = sum(x'): linear, so the weights are by hand.
    """

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 1)
        with torch.no_grad():
            self.conv.weight.copy_(torch.tensor([1.0, -1.0]).view(2, 1, 1, 1))
            self.conv.bias.copy_(torch.tensor([0.0, 5.0]))
        self.eval()

    def forward(self, x: Tensor) -> Tensor:
        a = self.conv(x)
        return torch.stack([a[:, 0].flatten(1).sum(1), a[:, 1].flatten(1).sum(1)], dim=1)


H0 = torch.tensor([[0.0, 1 / 3], [2 / 3, 1.0]])
MASKS = torch.stack([H0, 1 - H0])  # (2, 2, 2)
A = torch.stack([X[0], 5 - X[0]])  # the layer's two channels


def weighted(scores: Tensor) -> Tensor:
    weights = torch.tensor(scores).softmax(0)
    return (weights[:, None, None] * A).sum(0)


# -- hand-computed ----------------------------------------------------------------------------


def test_iscam_by_hand():
    # scales s_i = i (i + 1) / (2N), N = 3: 1/3, 1, 2 (mean 10/9); sum(x H_0) = 20/3, 10/3
    cam = ISCAM(TwoMasks(), "conv", samples=3)(X, 0, **RAW)
    torch.testing.assert_close(cam, weighted([10 / 9 * 20 / 3, 10 / 9 * 10 / 3]))


def test_sscam_by_hand_noise_drawn_per_row_in_draw_sample_channel_order():
    # score of channel c: mean_m sum(x (H_c + std z_mc)), z_mc the (m, c)-th (2, 2) draw
    random = torch.Generator().manual_seed(7)
    z = torch.stack([torch.randn((1, 2, 2), generator=random)[0] for _ in range(3 * 2)])
    z = z.view(3, 2, 2, 2)  # (draw m, channel c, h, w)
    scores = (X[0] * (MASKS + 0.5 * z)).sum(dim=(-2, -1)).mean(0)
    cam = SSCAM(TwoMasks(), "conv", samples=3, std=0.5, seed=7)(X, 0, **RAW)
    torch.testing.assert_close(cam, weighted(scores.tolist()))
    # std 0: Score-CAM
    plain = SSCAM(TwoMasks(), "conv", samples=2, std=0.0, seed=7)(X, 0, **RAW)
    torch.testing.assert_close(plain, ScoreCAM(TwoMasks(), "conv")(X, 0, **RAW))


def tiny_logits(tiny: nn.Module, masked: Tensor) -> Tensor:
    """TinyNet's logits from a masked layer output ``(2, 2, 2)`` (by its fc weights)."""
    return tiny.fc.weight.detach() @ masked.relu().flatten()


@pytest.mark.parametrize("kernel", ["point", "gaussian"])
def test_reciprocam_by_hand(tiny, kernel):
    # TinyNet: A_0 = x, A_1 = 2x; the map at p is softmax(W relu(A * M_p))[target]
    gauss = torch.tensor([[1 / 4, 1 / 8], [1 / 8, 1 / 16]])  # the 3x3 kernel cut at (0, 0)
    act = torch.stack([X[0], 2 * X[0]])
    expected = torch.zeros(2, 2)
    for i in range(2):
        for j in range(2):
            if kernel == "point":
                mask = torch.zeros(2, 2)
                mask[i, j] = 1
            else:  # the kernel centred at (i, j): flips of the corner kernel
                mask = gauss.flip([0] if i else []).flip([1] if j else [])
            expected[i, j] = tiny_logits(tiny, act * mask).softmax(0)[1]
    cam = ReciproCAM(tiny, "conv", kernel=kernel)(X, 1, **RAW)
    torch.testing.assert_close(cam, expected)


# -- batches, seeds, targets ------------------------------------------------------------------


@pytest.fixture
def x() -> Tensor:
    return torch.randn(3, 3, 16, 16, generator=torch.Generator().manual_seed(1))


VARIANTS = {
    "sscam": lambda model, **kw: SSCAM(model, "feat", samples=3, std=0.5, seed=2, **kw),
    "iscam": lambda model, **kw: ISCAM(model, "feat", samples=3, **kw),
    "reciprocam": lambda model, **kw: ReciproCAM(model, "feat", **kw),
    "reciprocam-point": lambda model, **kw: ReciproCAM(model, "feat", kernel="point", **kw),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
@pytest.mark.parametrize("skip", [None, "cat"])
def test_results_do_not_depend_on_batch_size(x, name, skip):
    model = ConvNet(skip)
    expected = VARIANTS[name](model, batch_size=64)(x, [0, 3, 4], **RAW)
    got = VARIANTS[name](model, batch_size=5)(x, [0, 3, 4], **RAW)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-6)


def test_sscam_seeded_reproducible_and_seed_matters(x):
    model = ConvNet()
    first = SSCAM(model, "feat", samples=2, seed=4)(x, 1)
    torch.testing.assert_close(SSCAM(model, "feat", samples=2, seed=4)(x, 1), first)
    assert not torch.equal(SSCAM(model, "feat", samples=2, seed=5)(x, 1), first)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_target_forms(x, name):
    model = ConvNet()
    cam = VARIANTS[name](model)
    top1 = cam(x)
    assert top1.shape == (3, 16, 16)
    torch.testing.assert_close(cam(x, model(x).argmax(1).tolist()), top1)
    per_sample = cam(x, [1, 2, 4])
    if name != "sscam":  # SS-CAM's noise of a row depends on the batch (torchcam's order)
        torch.testing.assert_close(per_sample[0], cam(x[:1], 1)[0], rtol=1e-4, atol=1e-5)
    several = cam(x, [[0, 4], [2, 2], [3, 1]])
    assert several.shape == (3, 2, 16, 16)
    torch.testing.assert_close(several[:, 1], cam(x, [4, 2, 1]), rtol=1e-4, atol=1e-5)


def test_iscam_shares_the_forwards_of_equal_masks():
    # TinyNet's two channels give one mask: N forwards, not 2N (plus the clean pass)
    from conftest import TinyNet

    tiny = TinyNet()
    with Counter(tiny) as counter:
        ISCAM(tiny, "conv", samples=4, batch_size=2)(X, 1)
    assert counter.calls == [1, 2, 2]


def test_reciprocam_runs_the_suffix_only_in_batches():
    model = ConvNet()
    seen = []
    handle = model.stem.register_forward_hook(lambda m, i, out: seen.append(out.shape[0]))
    try:
        ReciproCAM(model, "feat", batch_size=40)(torch.randn(1, 3, 16, 16), 0)
    finally:
        handle.remove()
    assert seen == [1, 1, 1]  # the clean pass, then 64 positions in 2 chunks of one prefix


@pytest.mark.parametrize(
    "build",
    [
        lambda: SSCAM(ConvNet(), "feat", samples=0),
        lambda: SSCAM(ConvNet(), "feat", std=-1.0),
        lambda: SSCAM(ConvNet(), "feat", seed=1.5),
        lambda: ISCAM(ConvNet(), "feat", samples=1.5),
        lambda: ReciproCAM(ConvNet(), "feat", kernel="box"),
        lambda: ReciproCAM(ConvNet(), "feat", batch_size=0),
    ],
)
def test_bad_arguments(build):
    with pytest.raises(ArgumentError):
        build()


# -- additional forward arguments -------------------------------------------------------------


class GainNet(ConvNet):
    """ConvNet called as ``model(x, gain)``: the input is scaled by a per-sample gain."""

    def forward(self, x: Tensor, gain: Tensor) -> Tensor:  # type: ignore[override]
        return super().forward(x * gain[:, None, None, None])


@pytest.mark.parametrize(
    "build",
    [
        lambda m: ScoreCAM(m, "feat", batch_size=4),
        lambda m: AblationCAM(m, "feat", batch_size=4),
        lambda m: SSCAM(m, "feat", samples=2, seed=0, batch_size=4),
        lambda m: ISCAM(m, "feat", samples=2, batch_size=4),
        lambda m: ReciproCAM(m, "feat", batch_size=7),
    ],
)
def test_additional_forward_args_reach_every_perturbed_forward(x, build):
    gain = torch.tensor([0.5, 1.0, 2.0])
    got = build(GainNet())(x, [0, 3, 4], additional_forward_args=(gain,), **RAW)
    expected = build(ConvNet())(x * gain[:, None, None, None], [0, 3, 4], **RAW)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


# -- ResNet-18: a direct loop and torchcam ----------------------------------------------------


@pytest.fixture(scope="module")
def resnet():
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    return torchvision.models.resnet18(weights=None).eval()


def direct_reciprocam(model: nn.Module, x: Tensor, cls: int) -> Tensor:
    """Recipro-CAM by the paper, one position at a time (Gaussian kernel): (h, w)."""
    with torch.no_grad():
        store = []
        handle = model.layer4.register_forward_hook(lambda m, i, out: store.append(out))
        model(x)
        handle.remove()
        act = store[0]
        h, w = act.shape[-2:]
        kernel = torch.tensor([[1.0, 2, 1], [2, 4, 2], [1, 2, 1]]) / 16
        cam = torch.zeros(h, w)
        for i in range(h):
            for j in range(w):
                padded = torch.zeros(h + 2, w + 2)
                padded[i : i + 3, j : j + 3] = kernel
                mask = padded[1:-1, 1:-1]
                handle = model.layer4.register_forward_hook(lambda m, i, out, mask=mask: act * mask)
                cam[i, j] = model(x).softmax(1)[0, cls]
                handle.remove()
    return cam


@pytest.mark.slow
def test_reciprocam_matches_a_direct_loop_on_resnet18(resnet):
    x = torch.randn(1, 3, 96, 96, generator=torch.Generator().manual_seed(3))
    cam = ReciproCAM(resnet, "layer4", batch_size=4)(x, 7, **RAW)[0]
    direct = direct_reciprocam(resnet, x, 7)
    assert pearson(cam, direct) >= 0.999
    torch.testing.assert_close(cam, direct, rtol=1e-4, atol=1e-6)


def torchcam_map(cls_name: str, model: nn.Module, x: Tensor, cls: int, **kw) -> Tensor:
    methods = pytest.importorskip("torchcam.methods")
    with getattr(methods, cls_name)(model, "layer4", input_shape=tuple(x.shape[1:]), **kw) as cam:
        with torch.inference_mode():
            scores = model(x)
        maps = cam(class_idx=cls, scores=scores)[0]
    maps = F.interpolate(maps[:, None], size=x.shape[-2:], mode="bilinear", align_corners=False)
    low, high = maps.amin(dim=(-2, -1), keepdim=True), maps.amax(dim=(-2, -1), keepdim=True)
    return ((maps - low) / (high - low))[0, 0]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ISCAM", "SSCAM"])
def test_matches_torchcam_on_resnet18(resnet, name):
    # 48 x 48: layer4 is 2 x 2, and H * W is a multiple of 16 (SS-CAM draws torchcam's noise)
    x = torch.randn(1, 3, 48, 48, generator=torch.Generator().manual_seed(1))
    torch.manual_seed(5)
    theirs = torchcam_map(name, resnet, x, 3, num_samples=2)
    ours = {
        "ISCAM": ISCAM(resnet, "layer4", samples=2),
        "SSCAM": SSCAM(resnet, "layer4", samples=2, seed=5),
    }[name](x, 3)
    assert pearson(ours, theirs) >= 0.999

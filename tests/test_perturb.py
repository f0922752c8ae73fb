"""Score-CAM and Ablation-CAM against hand-computed values and direct per-channel loops."""

from __future__ import annotations

import io
import sys

import pytest
import torch
import torch.nn.functional as F
from conftest import X, assert_untouched, model_state
from torch import Tensor, nn

from camkit import AblationCAM, ScoreCAM
from camkit.errors import ArgumentError, LayerOutputError

RAW = {"relu": False, "upsample": False, "normalize": False}


class ConvNet(nn.Module):
    """x (B, 3, 16, 16) -> conv -> relu -> conv ("feat", 6 channels) -> relu -> pool -> fc(5).

    ``skip`` adds how ``feat``'s output meets a tensor from before it: ``"add"`` (broadcasts
    over a batch of ablated copies), ``"cat"`` (does not), ``"view"`` (views the map as
    ``(input's batch size, -1)``: refuses channels_last tensors too); each must give the same
    maps.
    """

    def __init__(self, skip: str | None = None, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.skip = skip
        self.stem = nn.Conv2d(3, 6, 3, padding=1)
        self.feat = nn.Conv2d(6, 6, 3, stride=2, padding=1)
        self.fc = nn.Linear({"cat": 12, "view": 6 * 8 * 8}.get(skip, 6), 5)
        self.eval()

    def forward(self, x: Tensor) -> Tensor:
        h = self.stem(x).relu()
        a = self.feat(h).relu()
        pooled = h[..., ::2, ::2]
        if self.skip == "add":
            a = a + pooled
        elif self.skip == "cat":
            a = torch.cat([a, pooled], dim=1)
        if self.skip == "view":
            return self.fc(a.view(x.shape[0], -1))
        return self.fc(a.mean(dim=(-2, -1)))


class Counter:
    """Counts the model's forward calls, the rows (batch sizes) they carry, and whether their
    inputs are channels_last."""

    def __init__(self, model: nn.Module):
        self.calls: list[int] = []
        self.channels_last: list[bool] = []
        self.handle = model.register_forward_pre_hook(self.hook)

    def hook(self, module: nn.Module, args: tuple) -> None:
        self.calls.append(args[0].shape[0])
        self.channels_last.append(not args[0].is_contiguous())

    def __enter__(self) -> Counter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.handle.remove()


def features(model: nn.Module, x: Tensor) -> Tensor:
    with torch.no_grad():
        return model.feat(model.stem(x).relu())


def score(model: nn.Module, x: Tensor, cls: int) -> float:
    with torch.no_grad():
        return model(x)[0, cls].item()


def normalised(mask: Tensor) -> Tensor:
    low, high = mask.min(), mask.max()
    return (
        torch.zeros_like(mask) if high - low <= 1e-6 * high.abs() else (mask - low) / (high - low)
    )


def direct_scorecam(model: nn.Module, x: Tensor, classes: list[int]) -> Tensor:
    """Score-CAM by the paper, one channel at a time: raw maps (B, h, w), or (B, d, h, w) with
    trilinear masks for volumes."""
    maps = []
    for image, cls in zip(x, classes, strict=True):
        act = features(model, image[None])[0]
        dims = act.ndim - 1
        scores = []
        for channel in act:
            mode = "bilinear" if dims == 2 else "trilinear"
            up = F.interpolate(channel[None, None], size=x.shape[-dims:], mode=mode)
            scores.append(score(model, image[None] * normalised(up[0, 0]), cls))
        weights = torch.tensor(scores).softmax(0)
        maps.append((weights.view(-1, *[1] * dims) * act).sum(0))
    return torch.stack(maps)


def direct_ablation(model: nn.Module, x: Tensor, classes: list[int]) -> Tensor:
    """Ablation-CAM by the paper, one channel at a time: raw maps (B, h, w) or (B, d, h, w)."""
    maps = []
    for image, cls in zip(x, classes, strict=True):
        act = features(model, image[None])[0]
        y = score(model, image[None], cls)
        weights = []
        for c in range(act.shape[0]):

            def zero(module, inputs, output, c=c):
                output = output.clone()
                output[:, c] = 0
                return output

            handle = model.feat.register_forward_hook(zero)
            weights.append((y - score(model, image[None], cls)) / y)
            handle.remove()
        maps.append((torch.tensor(weights).view(-1, *[1] * (act.ndim - 1)) * act).sum(0))
    return torch.stack(maps)


@pytest.fixture
def x() -> Tensor:
    return torch.randn(3, 3, 16, 16, generator=torch.Generator().manual_seed(1))


# -- hand-computed on TinyNet: A_0 = x, A_1 = 2x ---------------------------------------------


def test_scorecam_by_hand_identical_masks_run_once(tiny):
    # both channels normalise to the same mask, so both weigh softmax([s, s]) = 1/2: 1.5 x
    with Counter(tiny) as counter:
        cam = ScoreCAM(tiny, "conv")(X, target=1, **RAW)
    torch.testing.assert_close(cam, 1.5 * X[0])
    assert counter.calls == [1, 1]  # the clean pass, then ONE masked pass for both channels


@pytest.mark.parametrize(("cls", "scale"), [(0, 9 / 7), (1, 1.8)])
def test_ablationcam_by_hand(tiny, cls, scale):
    # class 1: y = 10 + 40 = 50, zeroing A_0 gives 40, A_1 gives 10: w = (0.2, 0.8) -> 1.8 x
    # class 0: y = 7, zeroing A_0 gives 2, A_1 gives 5: w = (5/7, 2/7) -> 9/7 x
    cam = AblationCAM(tiny, "conv")(X, target=cls, **RAW)
    torch.testing.assert_close(cam, scale * X[0])


class TokenNet(nn.Module):
    """TinyNet with tokens: x (B, 1, 2, 2) -> layer ``tokens`` (B, 1 + 4, 2): a class token
    (1, 1) then the patch tokens (x_ij, 2 x_ij) in row-major order -> linear(10 -> 1) with
    weight 1 on the class token and TinyNet's class-1 row on the patches (1 for A_0, 2 for
    A_1)."""

    num_prefix_tokens = 1
    patch_size = 1

    def __init__(self):
        super().__init__()
        self.cls_token = nn.Parameter(torch.ones(1, 1, 2))
        self.tokens = nn.Identity()
        self.fc = nn.Linear(10, 1, bias=False)
        with torch.no_grad():
            self.fc.weight.copy_(torch.tensor([[1.0, 1.0] + [1.0, 2.0] * 4]))

    def forward(self, x: Tensor) -> Tensor:
        patches = x.flatten(2).transpose(1, 2) * torch.tensor([1.0, 2.0])
        tokens = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), patches], dim=1)
        return self.fc(self.tokens(tokens).flatten(1))


def test_ablationcam_ablates_token_channels_in_every_token_by_hand():
    # y = 2 (class token) + 10 + 40 = 52; channel 0 zeroed in every token: 52 - 1 - 10 = 41,
    # channel 1: 52 - 1 - 40 = 11, so w = (11/52, 41/52) and the map is (11 + 82)/52 x (the
    # class token left alone would give w = (10/52, 40/52), 90/52 x)
    model = TokenNet().eval()
    before = model_state(model)
    cam = AblationCAM(model, "tokens")
    torch.testing.assert_close(cam(X, target=0, **RAW), 93 / 52 * X[0])
    assert cam.layouts["tokens"].kind == "tokens"
    assert_untouched(model, before)
    with pytest.raises(ArgumentError, match="cannot undo a reshape= function"):
        AblationCAM(model, "tokens", reshape=lambda t: t)


def test_top_channels_keeps_the_channel_of_largest_gradient_times_activation(tiny):
    # class 1: sum g*A = 10 for A_0 and 40 for A_1, so top_channels=1 keeps A_1 alone
    torch.testing.assert_close(ScoreCAM(tiny, "conv", top_channels=1)(X, 1, **RAW), 2 * X[0])
    torch.testing.assert_close(
        AblationCAM(tiny, "conv", top_channels=1)(X, 1, **RAW), 0.8 * 2 * X[0]
    )


# -- against direct loops, for any batch_size ---------------------------------------------------


@pytest.mark.parametrize("batch_size", [1, 4, 64])
def test_scorecam_matches_direct_loop(x, batch_size):
    model = ConvNet()
    classes = [0, 3, 4]
    cam = ScoreCAM(model, "feat", batch_size=batch_size)(x, classes, **RAW)
    torch.testing.assert_close(cam, direct_scorecam(model, x, classes), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("skip", [None, "add", "cat", "view"])
@pytest.mark.parametrize("batch_size", [1, 4, 64])
def test_ablationcam_matches_direct_loop(x, skip, batch_size):
    model = ConvNet(skip)
    classes = [0, 3, 4]
    with Counter(model) as counter:
        cam = AblationCAM(model, "feat", batch_size=batch_size)(x, classes, **RAW)
    torch.testing.assert_close(cam, direct_ablation(model, x, classes), rtol=1e-4, atol=1e-5)
    # the prefix is reused (inputs of one row) unless the skip connection forbids it; the
    # clean forward runs first (twice for "view": it refuses channels_last, then runs as given)
    clean = 2 if skip == "view" else 1
    reused = all(rows == 1 for rows in counter.calls[clean:])
    assert reused == (skip in (None, "add") or batch_size == 1)


class VolumeNet(nn.Module):
    """x (B, 1, 6, 8, 8) -> Conv3d -> relu -> Conv3d ("feat", 5 channels, stride 2) -> relu ->
    pool -> fc(3)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.stem = nn.Conv3d(1, 4, 3, padding=1)
        self.feat = nn.Conv3d(4, 5, 3, stride=2, padding=1)
        self.fc = nn.Linear(5, 3)
        self.eval()

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.feat(self.stem(x).relu()).relu().mean(dim=(-3, -2, -1)))


def test_scorecam_and_ablationcam_on_volumes_match_direct_loops():
    """Score-CAM with trilinear masks normalised over the volume, Ablation-CAM zeroing each
    channel of the (B, C, d, h, w) output: raw (B, d, h, w) maps by the papers' loops."""
    model = VolumeNet()
    x = torch.randn(2, 1, 6, 8, 8, generator=torch.Generator().manual_seed(3))
    classes = [0, 2]
    for method, direct in ((ScoreCAM, direct_scorecam), (AblationCAM, direct_ablation)):
        cam = method(model, "feat")(x, classes, **RAW)
        assert cam.shape == (2, 3, 4, 4)
        torch.testing.assert_close(cam, direct(model, x, classes), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("skip", [None, "view"])
def test_perturbed_images_are_channels_last_on_cpu_unless_the_model_refuses(x, skip):
    model = ConvNet(skip)
    with Counter(model) as counter:
        cam = ScoreCAM(model, "feat", batch_size=4)(x, [0, 3, 4], **RAW)
    torch.testing.assert_close(cam, direct_scorecam(model, x, [0, 3, 4]), rtol=1e-4, atol=1e-5)
    assert x.is_contiguous()  # the caller's own input is not converted
    if skip is None:
        assert all(counter.channels_last)
    else:  # the clean forward is tried channels_last, then every forward is contiguous
        assert counter.channels_last[0] and not any(counter.channels_last[1:])


def test_finished_maps_and_targets(x):
    model = ConvNet()
    for method in (ScoreCAM, AblationCAM):
        cam = method(model, "feat", batch_size=5)
        top1 = model(x).argmax(1).tolist()
        torch.testing.assert_close(cam(x), cam(x, top1))
        single = cam(x[0], target=2)
        assert single.shape == (16, 16) and single.dtype == torch.float32
        assert single.min() >= 0 and single.max() == 1
        several = cam(x, [[0, 2], [1, 2], [4, 0]])
        assert several.shape == (3, 2, 16, 16)
        torch.testing.assert_close(several[:, 1], cam(x, [2, 2, 0]))
        assert cam(x, lambda out: out[:, 1] - out[:, 2]).shape == (3, 16, 16)
        by_layer = method(model, ["stem", "feat"], batch_size=7)(x, 1, fuse=False)
        torch.testing.assert_close(by_layer["feat"], cam(x, 1))
        torch.testing.assert_close(by_layer["stem"], method(model, "stem")(x, 1))


def test_constant_and_duplicate_channels_are_evaluated_once():
    model = ConvNet()
    with torch.no_grad():  # channels 0-2: constant maps; channel 4 repeats channel 3
        model.feat.weight[:3] = 0
        model.feat.bias[:3] = torch.tensor([0.0, -1.0, 2.0])
        model.feat.weight[4], model.feat.bias[4] = model.feat.weight[3], model.feat.bias[3]
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    with Counter(model) as counter:
        cam = ScoreCAM(model, "feat", batch_size=1)(x, [1, 2], **RAW)
    # per image: one zero mask (channels 0-2), one for channels 3 and 4, one for channel 5
    assert counter.calls == [2] + [1] * 6
    torch.testing.assert_close(cam, direct_scorecam(model, x, [1, 2]), rtol=1e-4, atol=1e-5)
    with Counter(model) as counter:
        cam = AblationCAM(model, "feat", batch_size=1)(x, [1, 2], **RAW)
    # zeroing the all-zero channel 0 changes nothing: it is not run
    assert len(counter.calls) == 1 + 2 * 5
    torch.testing.assert_close(cam, direct_ablation(model, x, [1, 2]), rtol=1e-4, atol=1e-5)


def test_top_channels_runs_k_forwards_and_all_channels_is_exact(x):
    model = ConvNet()
    for method in (ScoreCAM, AblationCAM):
        with Counter(model) as counter:
            method(model, "feat", batch_size=1, top_channels=2)(x, 0)
        assert len(counter.calls) == 1 + 3 * 2
        torch.testing.assert_close(
            method(model, "feat", top_channels=6)(x, 0), method(model, "feat")(x, 0)
        )


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_on_a_terminal_only_when_asked(x, monkeypatch, capsys):
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    ScoreCAM(ConvNet(), "feat", progress=True)(x, 0)
    assert "Score-CAM feat" in terminal.getvalue() and "forward" in terminal.getvalue()
    drawn = terminal.getvalue()
    AblationCAM(ConvNet(), "feat")(x, 0)
    assert terminal.getvalue() == drawn
    monkeypatch.undo()
    ScoreCAM(ConvNet(), "feat", progress=True)(x, 0)  # stderr not a terminal: silent
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "8"])
def test_bad_arguments(bad):
    model = ConvNet()
    for method in (ScoreCAM, AblationCAM):
        with pytest.raises(ArgumentError, match="batch_size"):
            method(model, "feat", batch_size=bad)
        with pytest.raises(ArgumentError, match="top_channels"):
            method(model, "feat", top_channels=bad)
    with pytest.raises(ArgumentError, match="reshape"):
        AblationCAM(model, "feat", reshape=lambda t: t)


def test_layer_that_runs_twice_is_refused(x):
    class Twice(ConvNet):
        def forward(self, x):
            return self.fc(self.stem(self.stem(x)[:, :3]).relu().mean(dim=(-2, -1)))

    with pytest.raises(LayerOutputError, match="runs 2 times"):
        AblationCAM(Twice(), "stem")(x, 0)


def test_model_untouched_also_after_an_exception(x):
    model = ConvNet("cat")
    model.train()
    model.stem.eval()
    before = model_state(model)
    for method in (ScoreCAM, AblationCAM):
        method(model, "feat", batch_size=2, top_channels=3)(x, 1)
        assert_untouched(model, before)

        def failing(out: Tensor) -> Tensor:
            if out.shape[0] != 3:  # fails on the first perturbed batch
                raise RuntimeError("boom")
            return out[:, 0]

        with pytest.raises(RuntimeError, match="boom"):
            method(model, "feat", batch_size=2)(x, failing)
        assert_untouched(model, before)


def test_training_batchnorm_warns():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.LazyLinear(2))
    model(torch.randn(2, 3, 6, 6))
    with pytest.warns(UserWarning, match="model.eval"):
        ScoreCAM(model, "1")(torch.randn(2, 3, 6, 6), 0)
    assert model.training

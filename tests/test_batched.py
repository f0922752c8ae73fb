"""One pass, many answers: K targets, cams(), and devices / dtypes / memory formats."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch import Tensor, nn

import camkit
from camkit import METHODS, AblationCAM, ScoreCAM, cams, registry
from camkit.core import engine
from camkit.relevance import rules_applied


class SmallNet(nn.Module):
    """x (B, 3, 16, 16) -> conv blocks "block1" (8 ch, 8x8), "block2" (16 ch, 4x4) -> fc(6)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.block1 = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU())
        self.block2 = nn.Sequential(nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU())
        self.fc = nn.Linear(16, 6)
        self.eval()

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.block2(self.block1(x)).mean(dim=(-2, -1)))


class Forwards:
    """Counts the model's forward calls (a forward pre-hook)."""

    def __init__(self, model: nn.Module):
        self.count = 0
        self.handle = model.register_forward_pre_hook(self.hook)

    def hook(self, module: nn.Module, args: tuple) -> None:
        self.count += 1

    def __enter__(self) -> Forwards:
        return self

    def __exit__(self, *exc: object) -> None:
        self.handle.remove()


def pearson(a: Tensor, b: Tensor) -> float:
    return torch.corrcoef(torch.stack([a.flatten().float(), b.flatten().float()]))[0, 1].item()


@pytest.fixture
def model() -> SmallNet:
    return SmallNet()


@pytest.fixture
def x() -> Tensor:
    return torch.randn(3, 3, 16, 16, generator=torch.Generator().manual_seed(3))


TARGETS = [[0, 4, 5], [2, 2, 1], [5, 0, 3]]


# the gradient CAMs served by cams()' one shared pass (not those with passes of their own)
GRADIENT_CAMS = [name for name in registry.names("gradient-cam") if METHODS[name].shares_pass]
# RefineCAM needs two layers or more (tested in test_methods_extra.py); RandomCAM draws K
# independent weight vectors for K targets (pytorch-grad-cam's baseline), so map k of a
# (B, K) target is not the map of that class alone (its seeding: test_methods_extra.py)
NOT_PER_TARGET = ("refinecam", "random")
# seeded and small: the methods that draw noise or many samples
OPTIONS = {
    "smoothgrad": {"seed": 0, "samples": 4},
    "smoothgradcam++": {"seed": 0, "samples": 4},
    "sscam": {"seed": 0, "samples": 2},
    "iscam": {"samples": 2},
    "sess": {"window": 8, "scales": (16, 24), "stride": 4},  # the default 224-px windows: slow
}


@pytest.mark.parametrize(
    "name",
    [n for n, m in METHODS.items() if m.family != "attention" and n not in NOT_PER_TARGET],
)
def test_k_targets_equal_k_single_calls(model, x, name):
    method = METHODS[name]
    explainer = method.build(model, "block2", **OPTIONS.get(name, {}))
    with Forwards(model) as forwards:
        several = explainer(x, TARGETS)
    if method.shares_pass:
        assert forwards.count == 1
    assert several.shape[:2] == (3, 3)  # every method keeps the target axis
    for k in range(3):
        single = explainer(x, [row[k] for row in TARGETS])
        torch.testing.assert_close(several[:, k], single, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(explainer(x, torch.tensor(TARGETS)), several)


@pytest.mark.parametrize(
    ("inputs", "target", "kwargs"),
    [
        ("single", 4, {}),
        ("batch", [0, 1, 2], {}),
        ("batch", TARGETS, {}),
        ("batch", None, {"relu": False, "normalize": False}),
        ("batch", TARGETS, {"fuse": False}),
    ],
)
def test_cams_entries_equal_the_single_classes(model, x, inputs, target, kwargs):
    batch = x[0] if inputs == "single" else x
    layers = ["block1", "block2"] if kwargs.get("fuse") is False else "block2"
    with Forwards(model) as forwards:
        maps = cams(model, layers, batch, target, methods=GRADIENT_CAMS, **kwargs)
    assert forwards.count == 1  # six methods, one forward (and one backward)
    assert set(maps) == set(GRADIENT_CAMS)
    for name, got in maps.items():
        expected = METHODS[name].cls(model, layers)(batch, target, **kwargs)
        if isinstance(expected, dict):
            assert set(got) == set(expected) == {"block1", "block2"}
            for layer in expected:
                torch.testing.assert_close(got[layer], expected[layer])
        else:
            torch.testing.assert_close(got, expected)


# (not Recipro-CAM: its maps are softmax probabilities, which bfloat16 logits of this random
# net blur to a correlation of about 0.98)
@pytest.mark.parametrize("method", ["gradcam", "layercam", "scorecam", "ablationcam", "iscam"])
def test_bfloat16_autocast_gives_float32_maps_close_to_float32(model, x, method):
    cls = METHODS[method].cls
    options = OPTIONS.get(method, {})
    exact = cls(model, "block2", **options)(x, [0, 1, 2])
    low = cls(model, "block2", dtype=torch.bfloat16, **options)(x, [0, 1, 2])
    assert low.dtype == torch.float32
    for a, b in zip(exact, low, strict=True):
        assert pearson(a, b) > 0.99


@pytest.mark.parametrize(
    "method",
    ["gradcam", "gradcam++", "eigencam", "scorecam", "ablationcam", "sscam", "reciprocam"],
)
def test_channels_last_model_and_input(model, x, method):
    cls, options = METHODS[method].cls, OPTIONS.get(method, {})
    expected = cls(model, "block2", **options)(x, TARGETS)
    model = model.to(memory_format=torch.channels_last)
    inputs = x.contiguous(memory_format=torch.channels_last)
    got = cls(model, "block2", **options)(inputs, TARGETS)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


class ViewNet(SmallNet):
    """SmallNet that flattens with ``.view``: it refuses channels_last inputs (an error)."""

    def forward(self, x: Tensor) -> Tensor:
        x = x.view(x.shape[0], -1).view(x.shape)
        return super().forward(x)


EXPLAINERS = {
    "gradcam": lambda net: camkit.GradCAM(net, "block2"),
    "saliency": lambda net: camkit.Saliency(net),
    "smoothgrad": lambda net: camkit.SmoothGrad(net, samples=3, batch_size=4, seed=0),
    "ig": lambda net: camkit.IntegratedGradients(net, steps=3, batch_size=4),
    "scorecam": lambda net: ScoreCAM(net, "block2", batch_size=5),
    "iscam": lambda net: camkit.ISCAM(net, "block2", samples=2, batch_size=5),
}


@pytest.mark.parametrize("method", sorted(EXPLAINERS))
def test_inputs_go_channels_last_on_the_cpu_unless_the_model_refuses(model, x, method):
    """camkit builds the CPU inputs it forwards channels_last (faster there), never converting
    the caller's tensor; a model that raises on them gets the caller's format, same maps."""
    seen = []

    def note_layout(module: nn.Module, args: tuple) -> None:
        seen.append(args[0].is_contiguous(memory_format=torch.channels_last))

    with model.register_forward_pre_hook(note_layout):
        expected = EXPLAINERS[method](model)(x, TARGETS)
    assert seen and all(seen)
    assert x.is_contiguous()
    got = EXPLAINERS[method](ViewNet())(x, TARGETS)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-6)


def test_float64_model_gives_float32_maps(model, x):
    model = model.double()
    for cls in (camkit.GradCAM, ScoreCAM, AblationCAM):
        out = cls(model, "block2")(x.double(), 0)
        assert out.dtype == torch.float32 and out.shape == (3, 16, 16)


@pytest.fixture
def cuda() -> torch.device:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    return torch.device("cuda")


@pytest.mark.cuda
@pytest.mark.parametrize(
    "method", [*GRADIENT_CAMS, "scorecam", "ablationcam", "iscam", "reciprocam"]
)
def test_cuda_matches_cpu(model, x, method, cuda):
    cls, options = METHODS[method].cls, OPTIONS.get(method, {})
    expected = cls(model, "block2", **options)(x, TARGETS)
    gpu_model = SmallNet().to(cuda)
    got = cls(gpu_model, "block2", **options)(x.to(cuda), TARGETS)
    assert got.device.type == "cuda" and got.dtype == torch.float32
    torch.testing.assert_close(got.cpu(), expected, rtol=1e-3, atol=1e-3)


@pytest.mark.cuda
def test_cuda_cams_and_half_precision(model, x, cuda):
    gpu_model = SmallNet().to(cuda)
    maps = cams(gpu_model, "block2", x.to(cuda), TARGETS, dtype=torch.float16)
    expected = cams(model, "block2", x, TARGETS)
    for name, got in maps.items():
        assert got.device.type == "cuda" and got.dtype == torch.float32
        for a, b in zip(got.cpu().flatten(0, 1), expected[name].flatten(0, 1), strict=True):
            assert pearson(a, b) > 0.99


@pytest.mark.parametrize("composite", ["epsilon-plus-flat", None])
def test_k_backward_passes_equal_the_batched_backward_and_one_target_passes(
    model, x, composite, monkeypatch
):
    """``K`` targets as ``K`` backward passes over one retained graph (the CPU's way,
    :func:`camkit.core.engine.batched_backward`) equal the batched backward (``is_grads_batched``,
    a GPU's way) and ``K`` one-target backwards, float64 within 1e-10, under LRP's rules and the
    plain gradient, for two tensors at once (the input and a layer's output)."""
    model = model.double()
    acts: list[Tensor] = []
    handle = model.block1.register_forward_hook(lambda module, args, out: acts.append(out))

    def gradients(batched: bool, columns: slice) -> list[Tensor]:
        monkeypatch.setattr(engine, "batched_backward", lambda device: batched)
        leaf = x.double().requires_grad_(True)
        with rules_applied(model, composite) if composite else contextlib.nullcontext():
            output = model(leaf)
        scores = output.gather(1, torch.tensor(TARGETS))[:, columns]
        found = engine.layer_gradients(scores, [leaf, acts[-1]], ["input", "block1"])
        assert all(grad.dtype == torch.float64 for grad in found)
        return found

    assert engine.batched_backward(torch.device("cpu")) is False  # the loop: the CPU's default
    try:
        looped = gradients(False, slice(None))
        batched = gradients(True, slice(None))
        singles = [gradients(False, slice(k, k + 1)) for k in range(3)]
    finally:
        handle.remove()
    for i, (one, other) in enumerate(zip(looped, batched, strict=True)):
        assert one.shape[:2] == (3, 3) and one.abs().max() > 0
        torch.testing.assert_close(one, other, rtol=0, atol=1e-10)
        for k in range(3):
            torch.testing.assert_close(one[:, k], singles[k][i][:, 0], rtol=0, atol=1e-10)

"""The model-parameter randomisation test (camkit.metrics.randomization_test)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import camkit
from camkit.errors import ArgumentError, EmptyMapWarning, LayerNotFoundError
from camkit.metrics import randomization_test
from camkit.metrics.plots import plot_randomization
from camkit.metrics.sanity import (
    average_ranks,
    default_blocks,
    hog_similarity,
    spearman,
    ssim,
)


class TinyCNN(nn.Module):
    """(B, 3, S, S) -> conv1 -> ReLU -> conv2 (1 channel) -> ReLU -> mean -> fc (1 -> 2)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv1 = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.conv2 = nn.Conv2d(4, 1, 3, padding=1)
        self.fc = nn.Linear(1, 2)
        self.aux = nn.Linear(3, 3)  # never called: the maps cannot depend on it
        with torch.no_grad():
            self.fc.weight.copy_(torch.tensor([[2.0], [-1.0]]))
            self.conv2.bias.fill_(5.0)  # conv2's output A > 0 everywhere
            self.bn.running_mean.uniform_(-0.1, 0.1)
            self.bn.running_var.uniform_(0.5, 2.0)
        self.eval()

    def forward(self, x):
        a = torch.relu(self.conv2(torch.relu(self.bn(self.conv1(x)))))
        return self.fc(a.mean(dim=(2, 3)))


def gradcam(net):
    return camkit.GradCAM(net, "conv2")


def keep(name, module, generator):
    """An 'init' that changes nothing."""


@pytest.fixture
def net():
    return TinyCNN()


@pytest.fixture
def x():
    return torch.rand(2, 3, 24, 24, generator=torch.Generator().manual_seed(1))


def snapshot(model):
    return (
        {k: v.clone() for k, v in model.state_dict().items()},
        [m.training for m in model.modules()],
        [p.grad for p in model.parameters()],
        [p.requires_grad for p in model.parameters()],
    )


def assert_same(model, before):
    state, training, grads, requires = before
    now = model.state_dict()
    assert now.keys() == state.keys()
    for key, value in state.items():
        assert torch.equal(now[key], value), key  # bit-identical
    assert [m.training for m in model.modules()] == training
    assert [p.grad for p in model.parameters()] == grads
    assert [p.requires_grad for p in model.parameters()] == requires


def test_default_blocks_top_first():
    assert default_blocks(TinyCNN()) == ["aux", "fc", "conv2", "bn", "conv1"]
    resnet = pytest.importorskip("torchvision").models.resnet18()
    assert default_blocks(resnet) == ["fc", "layer4", "layer3", "layer2", "layer1", "bn1", "conv1"]
    stages = nn.Sequential(nn.Sequential(nn.Conv2d(1, 1, 1)), nn.Sequential(nn.Conv2d(1, 1, 1)))
    model = nn.Module()
    model.stem, model.blocks, model.head = nn.Conv2d(1, 1, 1), stages, nn.Linear(1, 1)
    assert default_blocks(model) == ["head", "blocks.1", "blocks.0", "stem"]
    vgg_like = nn.Sequential(
        nn.Sequential(nn.Conv2d(1, 2, 1), nn.ReLU(), nn.Conv2d(2, 2, 1)), nn.Linear(2, 2)
    )
    assert default_blocks(vgg_like) == ["1", "0.2", "0.0"]


def test_nothing_randomised_gives_ones(net, x):
    results = randomization_test(gradcam, net, x, 0, init=keep, seed=0, layers=["fc", "conv2"])
    assert [r["layer"] for r in results] == ["fc", "conv2"]
    for row in results:
        assert set(row) == {"layer", "spearman", "spearman_abs", "ssim", "hog"}
        for key in ("spearman", "spearman_abs", "ssim", "hog"):
            assert row[key] == pytest.approx(1.0)


def test_unused_layer_and_fc_scale_leave_the_map(net, x):
    # aux is never called; the fc bias never reaches a gradient; a positive fc weight only
    # rescales conv2's single-channel weight, and Grad-CAM's map is normalised: all give 1
    def fc_only_bias_and_scale(name, module, generator):
        with torch.no_grad():
            if name == "fc":
                module.bias.normal_(generator=generator)
                module.weight.mul_(3.0)
            else:
                module.weight.normal_(generator=generator)

    results = randomization_test(
        gradcam, net, x, 0, layers=["aux", "fc"], init=fc_only_bias_and_scale, seed=0
    )
    for row in results:
        assert row["spearman"] == pytest.approx(1.0) and row["ssim"] == pytest.approx(1.0)


def test_negated_class_weight_gives_blank_map_and_zero_similarity(net, x):
    # conv2 has one channel A > 0, so the map is relu(w * A) / hw: with the class weight
    # negated it is blank, and a blank map shares no ranking with the original: 0 by convention
    def negate(name, module, generator):
        with torch.no_grad():
            module.weight.neg_()

    with warnings.catch_warnings():  # the randomised network's blank map is no warning
        warnings.simplefilter("error", EmptyMapWarning)
        (row,) = randomization_test(
            gradcam, net, x, 0, layers=["fc"], init=negate, similarity="spearman", seed=0
        )
    assert row == {"layer": "fc", "spearman": 0.0, "spearman_abs": 0.0}


@pytest.mark.filterwarnings("ignore::camkit.errors.EmptyMapWarning")  # a negative class weight
def test_default_randomisation_changes_maps_and_is_reproducible(net, x):
    first = randomization_test(gradcam, net, x, seed=3, similarity=("spearman", "ssim"))
    again = randomization_test(gradcam, net, x, seed=3, similarity=("spearman", "ssim"))
    assert first == again
    assert [r["layer"] for r in first] == default_blocks(net)
    assert first[0]["spearman"] == pytest.approx(1.0)  # aux: unused
    assert min(r["spearman"] for r in first) < 0.9  # conv2 and conv1 change the map
    for row in first:
        assert np.isfinite([row["spearman"], row["ssim"]]).all()


def seen_randomised(log, original):
    """An explainer factory that records which modules differ from ``original``."""

    def factory(network):
        changed = [
            name
            for name in ("fc", "conv2", "conv1")
            if not all(
                torch.equal(a, b)
                for a, b in zip(
                    network.get_submodule(name).parameters(),
                    original.get_submodule(name).parameters(),
                    strict=True,
                )
            )
        ]
        log.append(changed)
        return gradcam(network)

    return factory


@pytest.mark.filterwarnings("ignore::camkit.errors.EmptyMapWarning")
def test_cascade_and_independent_semantics(net, x):
    layers = ["fc", "conv2", "conv1"]
    cascade_log: list = []
    cascade = randomization_test(
        seen_randomised(cascade_log, net), net, x, 0, layers=layers, seed=5, similarity="ssim"
    )
    assert cascade_log == [[], ["fc"], ["fc", "conv2"], ["fc", "conv2", "conv1"]]
    independent_log: list = []
    independent = randomization_test(
        seen_randomised(independent_log, net),
        net,
        x,
        0,
        order="independent",
        layers=layers,
        seed=5,
        similarity="ssim",
    )
    assert independent_log == [[], ["fc"], ["conv2"], ["conv1"]]
    # block i gets the same draw in both orders: the first step is the same network
    assert cascade[0] == independent[0]
    assert cascade[1] != independent[1]


def test_independent_restores_buffers_reset_by_init(net, x):
    seen = []

    def factory(network):
        seen.append(network.bn.running_var.clone())
        return gradcam(network)

    def reset(name, module, generator):
        module.reset_parameters()  # BatchNorm2d: running statistics to 0 / 1 as well

    randomization_test(
        factory, net, x, 0, order="independent", layers=["bn", "conv2"], init=reset, seed=0
    )
    assert torch.equal(seen[1], torch.ones(4))  # bn randomised
    assert torch.equal(seen[2], net.bn.running_var)  # then put back for conv2's step


def test_user_model_is_untouched(net, x):
    net.bn.train()  # a mixed mode must survive too
    before = snapshot(net)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        randomization_test(gradcam, net, x, seed=0, similarity="spearman")
        randomization_test(gradcam, net, x, order="independent", seed=0, similarity="spearman")
    assert_same(net, before)


def test_user_model_is_untouched_when_the_explainer_raises(net, x):
    before = snapshot(net)
    calls = []

    def failing(network):
        calls.append(network)
        if len(calls) == 3:
            raise RuntimeError("boom")
        return gradcam(network)

    with pytest.raises(RuntimeError, match="boom"):
        randomization_test(failing, net, x, 0, seed=0, similarity="spearman")
    assert_same(net, before)
    assert all(network is not net for network in calls)


def test_top1_target_is_pinned_on_the_trained_model(net, x):
    targets = []

    class Recorder:
        def __init__(self, network):
            self.cam = gradcam(network)

        def __call__(self, batch, target):
            targets.append(target)
            return self.cam(batch, target=target)

    randomization_test(Recorder, net, x, seed=0, similarity="spearman", layers=["fc"])
    expected = net(x).argmax(dim=1).tolist()
    assert targets == [expected, expected]


def test_per_sample_and_maps(net, x):
    results, maps = randomization_test(
        gradcam, net, x, 0, seed=0, per_sample=True, return_maps=True, similarity="spearman"
    )
    assert all(len(row["spearman"]) == 2 for row in results)
    assert list(maps) == ["original", *default_blocks(net)]
    for value in maps.values():
        assert value.shape == (2, 24, 24) and value.min() >= 0 and value.max() <= 1


def test_pixel_attributions_are_summed_over_channels(net, x):
    results = randomization_test(
        camkit.GuidedBackprop, net, x, 0, seed=0, layers=["conv1"], similarity="spearman"
    )
    (row,) = results
    assert -1 <= row["spearman"] <= 1 and -1 <= row["spearman_abs"] <= 1


def test_errors(net, x):
    with pytest.raises(LayerNotFoundError, match="did you mean 'conv2'"):
        randomization_test(gradcam, net, x, 0, layers=["conv22"])
    with pytest.raises(ArgumentError, match="unknown similarity 'pearson'.*spearman"):
        randomization_test(gradcam, net, x, 0, similarity=("spearman", "pearson"))
    with pytest.raises(ArgumentError, match="order must be one of"):
        randomization_test(gradcam, net, x, 0, order="top_down")
    with pytest.raises(ArgumentError, match="init must be"):
        randomization_test(gradcam, net, x, 0, init="kaiming")
    with pytest.raises(ArgumentError, match="one target per sample"):
        randomization_test(gradcam, net, x, [[0, 1], [0, 1]])
    with pytest.raises(ArgumentError, match="at least 7x7"):
        randomization_test(gradcam, net, x[..., :5, :5], 0, similarity="ssim")
    with pytest.raises(ArgumentError, match="module names"):
        randomization_test(gradcam, net, x, 0, layers=[net.fc])
    with pytest.raises(ArgumentError, match="not a tensor"):
        randomization_test(lambda n: lambda b, target: None, net, x, 0)


def test_spearman_matches_scipy_with_ties():
    stats = pytest.importorskip("scipy.stats")
    generator = torch.Generator().manual_seed(0)
    a = torch.randint(0, 5, (3, 50), generator=generator).float()
    b = torch.randint(0, 5, (3, 50), generator=generator).float()
    ours = spearman(a, b)
    for row in range(3):
        assert ours[row].item() == pytest.approx(stats.spearmanr(a[row], b[row])[0], abs=1e-12)
    expected = stats.rankdata(a[0].numpy())
    assert np.allclose(average_ranks(a[:1])[0].numpy(), expected)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(-3, 3), min_size=3, max_size=30).flatmap(
        lambda a: st.tuples(
            st.just(a), st.lists(st.integers(-3, 3), min_size=len(a), max_size=len(a))
        )
    )
)
def test_spearman_property_against_scipy(pair):
    stats = pytest.importorskip("scipy.stats")
    a, b = (torch.tensor(v, dtype=torch.float32).unsqueeze(0) for v in pair)
    ours = spearman(a, b).item()
    if len(set(pair[0])) > 1 and len(set(pair[1])) > 1:
        assert ours == pytest.approx(stats.spearmanr(pair[0], pair[1])[0], abs=1e-9)
    # invariant under a strictly increasing transform of either map
    assert spearman(a.exp(), b * 3 + 1).item() == pytest.approx(ours, abs=1e-9)


def test_constant_maps_follow_the_convention():
    flat, varied = torch.zeros(1, 8, 8), torch.rand(1, 8, 8)
    assert spearman(flat, varied).item() == 0.0
    assert spearman(flat, flat).item() == 1.0
    assert ssim(varied, varied).item() == pytest.approx(1.0)
    big = torch.rand(2, 32, 32)
    assert torch.allclose(hog_similarity(big, big), torch.ones(2, dtype=torch.float64))


def test_plot_randomization(tmp_path, net, x):
    import matplotlib

    backend, params = matplotlib.get_backend(), dict(matplotlib.rcParams)
    results, maps = randomization_test(
        gradcam, net, x, 0, seed=0, return_maps=True, similarity=("spearman", "ssim")
    )
    figure = plot_randomization(results, maps, tmp_path / "one.png", sample=1)
    assert (tmp_path / "one.png").read_bytes()[:4] == b"\x89PNG"
    assert len(figure.axes) == len(results) + 2
    both = plot_randomization(
        {"Grad-CAM": results, "copy": results},
        {"Grad-CAM": maps, "copy": maps},
        tmp_path / "two.png",
        image=x[0].permute(1, 2, 0).numpy(),
    )
    assert len(both.axes) == 2 * (len(results) + 2) + 1
    assert matplotlib.get_backend() == backend and dict(matplotlib.rcParams) == params
    with pytest.raises(ArgumentError, match="not in the results"):
        plot_randomization(results, maps, similarity="hog")


def test_matches_quantus_mprt(net, x):
    """quantus.MPRT (top-down, reset_parameters() after torch.manual_seed(seed + 1) per
    module): the same layers, the same draws through ``init=``, Spearman of the raw maps."""
    quantus = pytest.importorskip("quantus")
    layers = [n for n, m in net.named_modules() if hasattr(m, "reset_parameters")][::-1]
    seed = 7

    def quantus_draw(name, module, generator):
        torch.manual_seed(seed + 1)
        module.reset_parameters()

    def explain(model, inputs, targets, **kwargs):
        batch = torch.as_tensor(inputs, dtype=torch.float32)
        return gradcam(model)(batch, target=[int(t) for t in targets]).numpy()

    y = net(x).argmax(dim=1).numpy()
    metric = quantus.MPRT(
        layer_order="top_down",
        seed=seed,
        abs=False,
        normalise=False,
        disable_warnings=True,
        display_progressbar=False,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = metric(
            model=net,
            x_batch=x.numpy(),
            y_batch=y,
            a_batch=None,
            explain_func=explain,
            device="cpu",
        )
        ours = randomization_test(
            gradcam,
            net,
            x,
            y.tolist(),
            layers=layers,
            init=quantus_draw,
            similarity="spearman",
            per_sample=True,
        )
    assert [r["layer"] for r in ours] == [k for k in theirs if k != "original"]
    for row in ours:
        assert np.allclose(row["spearman"], theirs[row["layer"]], atol=1e-6, equal_nan=True)


@pytest.mark.slow
def test_efficientnet_lite0_cascade_stays_finite():
    from camkit.models import load

    loaded = load()
    x = torch.rand(1, 3, 160, 160, generator=torch.Generator().manual_seed(0))
    finite = []

    def factory(network):
        with torch.no_grad():
            finite.append(bool(torch.isfinite(network(x)).all()))
        return camkit.GradCAM(network, loaded.default_layer)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EmptyMapWarning)
        warnings.filterwarnings("error", category=camkit.errors.NonFiniteWarning)
        results = randomization_test(factory, loaded.model, x, seed=0, similarity="spearman")
    assert all(finite) and len(finite) == 13
    assert [r["layer"] for r in results][:4] == ["classifier", "bn2", "conv_head", "blocks.6"]
    assert np.isfinite([r["spearman"] for r in results]).all()


def test_map_similarities_are_public_and_check_their_inputs():
    """``camkit.metrics`` exports the sanity check's similarities; numbers by hand: a monotone
    transform keeps every rank (Spearman 1), reversing the order gives -1, a map equals itself
    (SSIM 1, HOG correlation 1)."""
    from camkit import metrics

    assert (metrics.spearman, metrics.ssim, metrics.hog_similarity) == (
        spearman,
        ssim,
        hog_similarity,
    )
    maps = torch.rand(2, 24, 24)
    checkpoint_b = torch.stack([maps[0] ** 3, 1 - maps[1]])
    torch.testing.assert_close(
        metrics.spearman(maps, checkpoint_b), torch.tensor([1.0, -1.0], dtype=torch.float64)
    )
    ones = torch.ones(2, dtype=torch.float64)
    torch.testing.assert_close(metrics.ssim(maps, maps), ones)
    torch.testing.assert_close(metrics.hog_similarity(maps, maps), ones)
    with pytest.raises(ArgumentError, match=r"same shape .* got \(2, 24, 24\) and \(2, 24, 23\)"):
        metrics.spearman(maps, maps[..., :23])
    with pytest.raises(ArgumentError, match=r"\(B, H, W\)"):
        metrics.ssim(maps[0], maps[0])

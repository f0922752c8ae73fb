"""Conditional relevance (Concept Relevance Propagation) with the gradient rules: numbers by
hand on TinyNet, linearity on a CNN, a ResNet stage and a ViT, batching, regions, two-layer
conditions, the model left untouched, errors."""

from __future__ import annotations

import pytest
import torch
from conftest import TinyNet, X, small_cnn
from matrix_kit import KINDS, Tripwire, assert_untouched, model_state, tripwire
from torch import nn

from camkit.errors import ArgumentError, CamkitError, LayerNotFoundError, LayerOutputError
from camkit.methods.concepts import (
    Channels,
    ConceptAttribution,
    Direction,
    GradientRules,
    conditional,
)


def unconditional(model: nn.Module, x: torch.Tensor, classes: torch.Tensor) -> torch.Tensor:
    """Gradient x input summed over the input's channels, by hand: ``(B, H, W)``."""
    leaf = x.clone().requires_grad_(True)
    score = model(leaf).gather(1, classes[:, None]).sum()
    (grad,) = torch.autograd.grad(score, leaf)
    return (x * grad).sum(1)


# ----------------------------------------------------------------------------- by hand


def test_tiny_numbers_by_hand():
    # class 0: W0 = [1, 0, 0, 1 | 0, -1, 1, 0]; A_0 = x, A_1 = 2x with x = [[1, 2], [3, 4]]
    model = TinyNet().double()
    x = X.double()
    concepts = ConceptAttribution(model, "relu")
    relevance = concepts.relevances(x, target=0)
    torch.testing.assert_close(relevance, torch.tensor([5.0, 2.0], dtype=torch.float64))
    heat = concepts.heatmaps(x, [0, 1], target=0)
    expected = torch.tensor([[[1.0, 0.0], [0.0, 4.0]], [[0.0, -4.0], [6.0, 0.0]]])
    torch.testing.assert_close(heat, expected.double())
    # class 1: W1 = [1, 1, 1, 1 | 2, 2, 2, 2]: R_0 = 10, R_1 = 2 * 2 * 10 = 40
    top = concepts.top(x, k=2, target=1)
    assert top.channels.tolist() == [1, 0]
    torch.testing.assert_close(top.relevance, torch.tensor([40.0, 10.0], dtype=torch.float64))
    torch.testing.assert_close(top.share, torch.tensor([0.8, 0.2], dtype=torch.float64))
    assert top.classes.tolist() == 1


def test_direction_and_group_by_hand():
    # v = (1, 1) / sqrt 2: R = sum (A_0 + A_1)(g_0 + g_1) / 2 = 1.5 * sum x * [1, -1, 1, 1] = 9
    model = TinyNet().double()
    x = X.double()
    concepts = ConceptAttribution(model, "relu")
    heat = concepts.heatmaps(x, Direction([1.0, 1.0]), target=0)
    expected = 1.5 * torch.tensor([[1.0, 2.0], [3.0, 4.0]]) * torch.tensor([[1, -1], [1, 1]])
    torch.testing.assert_close(heat[0], expected.double())
    # a group of channels is the sum of its channels
    group, singles = concepts.heatmaps(x, Channels([0, 1]), 0), concepts.heatmaps(x, [0, 1], 0)
    torch.testing.assert_close(group[0], singles.sum(0))


# ----------------------------------------------------------------------------- linearity


def check_linearity(model: nn.Module, layer: str, x: torch.Tensor, channels: int) -> None:
    concepts = ConceptAttribution(model, layer, batch_size=64)
    heat = concepts.heatmaps(x, range(channels))
    classes = model(x).argmax(1)
    full = unconditional(model, x, classes)
    scale = full.abs().amax()
    assert scale > 0
    assert (heat.sum(1) - full).abs().max() <= 1e-5 * scale
    # the channel relevances sum to the layer's total gradient x activation
    with torch.enable_grad():
        from camkit import record

        with record(model, layer) as rec:
            model(x).gather(1, classes[:, None]).sum().backward()
    total = (rec.activations[layer] * rec.gradients[layer]).flatten(1).sum(1)
    model.zero_grad(set_to_none=True)
    relevance = concepts.relevances(x)
    assert (relevance.sum(1) - total).abs().max() <= 1e-5 * total.abs().max()


def test_linearity_small_cnn():
    check_linearity(small_cnn().double(), "2", torch.rand(2, 3, 8, 8, dtype=torch.float64), 6)


def test_linearity_resnet_stage():
    # a stage's output lies on every path from the input to the logits, skips included
    from torchvision.models import resnet18

    torch.manual_seed(0)
    model = resnet18(num_classes=10).eval().double()
    check_linearity(model, "layer3", torch.rand(1, 3, 32, 32, dtype=torch.float64), 256)


def test_vit_regions_and_top_concepts():
    # the class token lies outside every region: inside + outside = the patch tokens' share
    kind = KINDS["vit"]
    model = kind.model()
    x = kind.input()
    concepts = ConceptAttribution(model, "blocks.0")
    region = torch.zeros(32, 32)
    region[:16] = 1
    inside = concepts.relevances(x, region=region)
    outside = concepts.relevances(x, region=1 - region)
    grid = torch.ones(4, 4)  # the 4x4 patch grid itself
    torch.testing.assert_close(inside + outside, concepts.relevances(x, region=grid))
    top = concepts.top(x, k=3, region=region)
    torch.testing.assert_close(top.relevance, inside.topk(3, dim=1).values)
    assert top.heatmaps.shape == (2, 3, 32, 32)


def test_linearity_vit_tokens():
    # (B, 17, 24) tokens: channels on the last axis, the class token included in the masks
    kind = KINDS["vit"]
    model = kind.model().double()
    check_linearity(model, "blocks.0", kind.input().double(), 24)


# ----------------------------------------------------------------------------- batching


def test_batched_equals_one_by_one_and_samples_alone(monkeypatch):
    model = small_cnn()
    x = torch.rand(3, 3, 8, 8)
    with monkeypatch.context() as patch:  # the vmapped pass a GPU runs, here on the CPU
        patch.setattr(conditional, "vmapped", lambda rules, grads: grads.shape[0] > 1)
        together = ConceptAttribution(model, "2").heatmaps(x, range(6))
    chunked = ConceptAttribution(model, "2", batch_size=4).heatmaps(x, range(6))

    class Sequential(GradientRules):
        batched = False

    looped = ConceptAttribution(model, "2", rules=Sequential()).heatmaps(x, range(6))
    scale = together.abs().max()
    assert (together - chunked).abs().max() <= 1e-6 * scale
    assert (together - looped).abs().max() <= 1e-6 * scale
    alone = ConceptAttribution(model, "2").heatmaps(x[1], range(6))
    assert (alone - together[1]).abs().max() <= 1e-6 * scale


def test_top_concepts_per_sample():
    model = small_cnn().double()
    x = torch.rand(2, 3, 8, 8, dtype=torch.float64)
    concepts = ConceptAttribution(model, "2")
    relevance = concepts.relevances(x, target=[1, 3])
    top = concepts.top(x, k=3, target=[1, 3])
    assert torch.equal(top.channels, relevance.topk(3, dim=1).indices)
    assert torch.equal(top.classes, torch.tensor([1, 3]))
    for b in range(2):
        alone = concepts.heatmaps(x[b], top.channels[b].tolist(), target=[1, 3][b])
        torch.testing.assert_close(top.heatmaps[b], alone)
    assert concepts.top(x, k=2, heatmaps=False).heatmaps is None


def test_region_splits_the_relevance():
    model = small_cnn().double()
    x = torch.rand(2, 3, 8, 8, dtype=torch.float64)
    concepts = ConceptAttribution(model, "2")
    region = torch.zeros(8, 8, dtype=torch.bool)
    region[:, :3] = True
    inside = concepts.relevances(x, region=region)
    outside = concepts.relevances(x, region=~region)
    torch.testing.assert_close(inside + outside, concepts.relevances(x))
    # a region on the layer grid (8x8 here, the same) and one per sample
    per_sample = concepts.top(x, k=6, region=region.expand(2, 8, 8), heatmaps=False)
    torch.testing.assert_close(per_sample.relevance, inside.sort(dim=1, descending=True).values)


def test_two_layer_conditions_and_graph():
    model = small_cnn().double()
    x = torch.rand(2, 3, 8, 8, dtype=torch.float64)
    lower = ConceptAttribution(model, "0")
    upper = ConceptAttribution(model, "2")
    # all lower channels given upper channel 4 sum to upper channel 4's heatmap
    given = lower.heatmaps(x, range(4), given=("2", 4))
    torch.testing.assert_close(given.sum(1), upper.heatmaps(x, 4)[:, 0])
    # the graph over all upper channels sums to the lower layer's relevances (linearity)
    graph = upper.graph(x, range(6), "0")
    assert graph.shape == (2, 6, 4) and not graph.requires_grad
    torch.testing.assert_close(graph.sum(1), lower.relevances(x))


# ----------------------------------------------------------------------------- contract


def test_model_untouched_also_on_error():
    kind = KINDS["cnn"]
    model = kind.model()
    x = kind.input()
    before = model_state(model)
    concepts = ConceptAttribution(model, kind.layer)
    concepts.top(x, k=2)
    with torch.no_grad():  # camkit turns gradients on itself
        concepts.heatmaps(x, [0, 1])
    assert_untouched(model, before)
    with tripwire(model), pytest.raises(Tripwire):
        concepts.top(x, k=2)
    assert_untouched(model, before)


def test_errors_say_what_to_do():
    model = small_cnn()
    x = torch.rand(2, 3, 8, 8)
    concepts = ConceptAttribution(model, "2")
    with pytest.raises(ArgumentError, match="out of range"):
        concepts.heatmaps(x, 6)
    with pytest.raises(ArgumentError, match="region has shape"):
        concepts.relevances(x, region=torch.ones(5, 5))
    with pytest.raises(ArgumentError, match="one target per sample"):
        concepts.relevances(x, target=[[0, 1], [2, 3]])
    with pytest.raises(ArgumentError, match="k=7"):
        concepts.top(x, k=7)
    with pytest.raises(ArgumentError, match="k=7 but layer '2' has 6 channels"):
        concepts.dominant(x, k=7)
    with pytest.raises(ArgumentError, match="one layer"):
        ConceptAttribution(model, ["0", "2"])
    with pytest.raises(ArgumentError, match="not a function"):
        ConceptAttribution(model, "2", reshape=lambda t: t)
    with pytest.raises(LayerNotFoundError):
        ConceptAttribution(model, "9")
    with pytest.raises(ArgumentError, match="direction has 3"):
        concepts.heatmaps(x, Direction([1.0, 0.0, 0.0]))
    with pytest.raises(ArgumentError, match="real 1-D vector"):
        Direction(torch.ones(2, 3))
    with pytest.raises(ArgumentError, match="not be zero|not zero"):
        Direction([0, 0, 0])
    with pytest.raises(CamkitError, match="rules must be"):
        ConceptAttribution(model, "2", rules="lrp")
    with pytest.raises(ArgumentError, match="concept"):
        concepts.heatmaps(x, "3")


def test_lrp_rules_linearity():
    from camkit.methods.concepts import LRPRules
    from camkit.relevance import rules_applied

    model = small_cnn().double()
    x = torch.rand(2, 3, 8, 8, dtype=torch.float64)
    concepts = ConceptAttribution(model, "2", rules=LRPRules("epsilon-plus"))
    heat = concepts.heatmaps(x, range(6), target=[0, 3])
    leaf = x.clone().requires_grad_(True)
    with rules_applied(model, "epsilon-plus"):
        out = model(leaf)
    (grad,) = torch.autograd.grad(out.gather(1, torch.tensor([[0], [3]])).sum(), leaf)
    full = (x * grad).sum(1)
    assert (heat.sum(1) - full).abs().max() <= 1e-5 * full.abs().max()


def test_conditions_in_the_wrong_order_say_so():
    model = small_cnn()
    x = torch.rand(1, 3, 8, 8)
    with pytest.raises(LayerOutputError, match="runs before"):
        ConceptAttribution(model, "2").heatmaps(x, 0, given=("0", 1))
    with pytest.raises(LayerOutputError, match="runs before"):
        ConceptAttribution(model, "0").graph(x, 0, lower="2")
    top = ConceptAttribution(model, "2").top(x[0], k=2)
    assert top.classes.shape == () and top.channels.shape == (2,)

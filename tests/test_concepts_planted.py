"""A planted model with a known tag channel: camkit names that channel as the top concept of
the tagged images, and its reference images (activation and relevance) are the tagged ones,
each with its receptive field inside the tag. Reference-image bookkeeping: streaming top-k
equals a full sort, merging collectors equals one collector, memory does not grow."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import small_cnn
from matrix_kit import assert_untouched, model_state
from torch import nn

from camkit.errors import LayerOutputError
from camkit.methods.concepts import ConceptAttribution
from camkit.methods.concepts.reference import ReferenceCollector, TopK, receptive_boxes

TAG_CHANNEL, TAG, SIDE = 2, 5, 24


def planted_concepts() -> nn.Sequential:
    """``(B, 3, H, W)`` in [0, 1] -> 2 logits. Layer ``"1"`` holds three detectors: channel 0
    red objects ``relu(R - G - B - 0.3)``, channel 1 green, channel 2 the magenta tag
    ``relu(R + B - 2G - 1)`` (zero on red, grey and green); class 0 reads channels 0 and 2."""
    conv = nn.Conv2d(3, 3, kernel_size=1)
    head = nn.Linear(3, 2)
    with torch.no_grad():
        conv.weight.copy_(torch.tensor([[1.0, -1, -1], [-1, 1, -1], [1, -2, 1]])[:, :, None, None])
        conv.bias.copy_(torch.tensor([-0.3, -0.3, -1.0]))
        head.weight.copy_(torch.tensor([[40.0, 0.0, 40.0], [0.0, 40.0, 0.0]]))
        head.bias.copy_(torch.tensor([0.0, 0.2]))
    return nn.Sequential(conv, nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), head).eval()


def planted_images(count: int, seed: int = 0) -> tuple[torch.Tensor, np.ndarray]:
    """Grey noise; every third image has the magenta tag in the bottom-right corner, the
    others a red disc near the centre -> ``(images, tagged)``."""
    rng = np.random.default_rng(seed)
    images = 0.4 + 0.1 * rng.random((count, 1, SIDE, SIDE)).repeat(3, axis=1)
    yy, xx = np.mgrid[:SIDE, :SIDE]
    tagged = np.arange(count) % 3 == 1
    for k in range(count):
        if tagged[k]:
            images[k, :, -TAG - 1 : -1, -TAG - 1 : -1] = np.array([1.0, 0.0, 1.0])[:, None, None]
        else:
            cy, cx = SIDE / 2 + rng.uniform(-2, 2, 2)
            disc = (yy - cy) ** 2 + (xx - cx) ** 2 <= (SIDE / 6) ** 2
            images[k][:, disc] = np.array([0.9, 0.1, 0.1])[:, None]
    return torch.tensor(images, dtype=torch.float32), tagged


def test_the_tag_channel_is_named_and_its_references_are_the_tagged_images():
    model = planted_concepts()
    images, tagged = planted_images(12)
    assert (model(images).argmax(1) == 0).all()
    top = ConceptAttribution(model, "1").top(images[tagged], k=1)
    assert (top.channels[:, 0] == TAG_CHANNEL).all()
    assert torch.allclose(top.share[:, 0], torch.ones(int(tagged.sum())))
    # the tag channel's conditional heatmap lies on the tag
    heat = top.heatmaps[:, 0]
    assert heat[:, -TAG - 1 : -1, -TAG - 1 : -1].sum() > 0.999 * heat.sum()

    collector = ReferenceCollector(model, "1", top=int(tagged.sum()))
    for start in range(0, 12, 5):
        collector.update(images[start : start + 5], torch.arange(start, min(start + 5, 12)))
    expected = set(np.flatnonzero(tagged).tolist())
    for mode in ("activation", "relevance"):
        found = collector.found[mode]
        assert set(found.samples[TAG_CHANNEL].tolist()) == expected, mode
        samples, positions = found.samples[TAG_CHANNEL], found.positions[TAG_CHANNEL]
        boxes = receptive_boxes(
            model, "1", images[samples], torch.full_like(samples, TAG_CHANNEL), positions
        )
        # a 1x1 convolution: the receptive field is the one driving pixel, inside the tag
        assert ((boxes[:, 2:] - boxes[:, :2]) == 1).all()
        assert (boxes[:, :2] >= SIDE - TAG - 1).all() and (boxes[:, 2:] <= SIDE - 1).all()


def test_streaming_top_k_equals_a_full_sort_and_merges():
    torch.manual_seed(0)
    values = torch.randn(30, 4)
    samples = torch.arange(100, 130)
    positions = torch.randint(0, 9, (30, 4))
    classes = torch.zeros(30, dtype=torch.long)
    streamed = TopK.empty(4, 3)
    for start in range(0, 30, 7):
        part = slice(start, start + 7)
        streamed.update(values[part], samples[part], positions[part], classes[part])
    order = values.T.argsort(dim=1, descending=True)[:, :3]
    assert torch.equal(streamed.samples, samples[order])
    assert torch.equal(streamed.positions, positions.T.gather(1, order))
    assert torch.equal(streamed.values, values.T.double().gather(1, order))
    first, second = TopK.empty(4, 3), TopK.empty(4, 3)
    first.update(values[:11], samples[:11], positions[:11], classes[:11])
    second.update(values[11:], samples[11:], positions[11:], classes[11:])
    first.merge(second)
    assert torch.equal(first.samples, streamed.samples)
    # ties go to the lower dataset index, whatever order the parts are merged in
    tied = TopK.empty(4, 3)
    tied.update(torch.zeros(2, 4), torch.tensor([7, 9]), torch.zeros(2, 4).long(), classes[:2])
    early = TopK.empty(4, 3)
    early.update(torch.zeros(2, 4), torch.tensor([3, 8]), torch.zeros(2, 4).long(), classes[:2])
    tied.merge(early)
    assert tied.samples.tolist() == [[3, 7, 8]] * 4


def test_collector_memory_does_not_grow_and_collectors_merge():
    model = small_cnn()
    before = model_state(model)
    torch.manual_seed(0)
    images = torch.rand(10, 3, 8, 8)
    whole = ReferenceCollector(model, "2", top=3)
    whole.update(images, torch.arange(10))
    parts = [ReferenceCollector(model, "2", top=3) for _ in range(2)]
    parts[0].update(images[:4], torch.arange(4))
    parts[1].update(images[4:], torch.arange(4, 10))
    parts[0].merge(parts[1])
    assert parts[0].seen == whole.seen == 10
    for mode in ("activation", "relevance"):
        assert torch.equal(parts[0].found[mode].samples, whole.found[mode].samples)
        assert whole.found[mode].values.shape == (6, 3)
    shapes = {mode: found.values.shape for mode, found in whole.found.items()}
    whole.update(images, torch.arange(10, 20))
    assert {mode: found.values.shape for mode, found in whole.found.items()} == shapes
    found = whole.found["relevance"]
    samples = found.samples[0] % 10  # images 10..19 are images 0..9 again
    receptive_boxes(model, "2", images[samples], torch.zeros(3).long(), found.positions[0])
    assert_untouched(model, before)


def test_the_tag_cluster_of_the_strategies_names_the_tag_channel():
    from camkit import GradCAM
    from camkit.strategies import find_strategies

    model = planted_concepts()
    images, tagged = planted_images(24, seed=1)
    maps = GradCAM(model, "1")(images, target=0)
    found = find_strategies(maps, [0] * len(images), grid=8, embedding=None, n_neighbors=5)
    clusters = found.classes[0].clusters
    assert len(clusters) == 2
    concepts = ConceptAttribution(model, "1", batch_size=10)
    for cluster in clusters:
        members = torch.as_tensor(cluster.members)
        dominant = concepts.dominant(images[members], k=1, target=0)
        is_tag = bool(tagged[cluster.members].all())
        assert is_tag or not tagged[cluster.members].any()  # the clusters are the strategies
        assert int(dominant.channels[0]) == (TAG_CHANNEL if is_tag else 0)
        assert float(dominant.share[0]) > 0.99


class _Twice(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(self.conv(x))


def test_receptive_boxes_by_hand_and_with_shared_images():
    # two 3x3 convolutions of positive weights: the field of a position is the 5x5 square
    # around it, clipped to the 8x8 image
    model = nn.Sequential(nn.Conv2d(3, 2, 3, padding=1), nn.Conv2d(2, 2, 3, padding=1))
    with torch.no_grad():
        for conv in model:
            conv.weight.fill_(1.0)
    images = torch.rand(3, 3, 8, 8)
    boxes = receptive_boxes(
        model.eval(), "1", images, torch.tensor([0, 1, 0]), torch.tensor([0, 27, 63])
    )
    assert boxes.tolist() == [[0, 0, 3, 3], [1, 1, 6, 6], [5, 5, 8, 8]]
    # requests that share an image (one forward each, their backward passes shared; one asked
    # twice) get the boxes they get alone
    model = nn.Sequential(*list(small_cnn())[:2], nn.BatchNorm2d(4), *list(small_cnn())[2:])
    channels, positions = torch.tensor([0, 5, 2, 0, 1, 5]), torch.tensor([0, 27, 63, 36, 9, 27])
    image = torch.tensor([0, 0, 1, 2, 0, 0])
    shared = receptive_boxes(model.eval(), "3", images, channels, positions, image=image)
    alone = receptive_boxes(model, "3", images[image], channels, positions)
    assert torch.equal(shared, alone) and torch.equal(shared[1], shared[5])
    assert not torch.equal(shared[0], shared[1])
    # in train mode no buffer is updated
    before = model_state(model.train())
    with pytest.warns(UserWarning, match="training mode"):
        receptive_boxes(model, "3", images, channels, positions, image=image)
    assert_untouched(model, before)
    with pytest.raises(LayerOutputError, match="2 times|twice|several"):
        receptive_boxes(_Twice(), "conv", images, torch.tensor([0]), torch.tensor([0]))

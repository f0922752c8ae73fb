"""Feature visualisation (Olah et al., Distill 2017): the optimised image activates its channel
more than the channel's best reference image; the same seed gives the same image; a diversity
term; CNNs and ViTs; the model is left untouched."""

from __future__ import annotations

import pytest
import torch
from conftest import small_cnn
from matrix_kit import KINDS, assert_untouched, model_state
from test_concepts_planted import TAG_CHANNEL, planted_concepts, planted_images

from camkit import record
from camkit.errors import ArgumentError
from camkit.methods.concepts.featurevis import (
    ChannelObjective,
    LogitObjective,
    NeuronObjective,
    diversity,
    fourier_image,
    visualize,
)
from camkit.methods.concepts.reference import ReferenceCollector


def mean_activation(model, layer: str, images: torch.Tensor, channel: int) -> torch.Tensor:
    with torch.no_grad(), record(model, layer) as rec:
        model(images)
    return rec.activations[layer][:, channel].flatten(1).mean(1)


def test_the_visualisation_beats_the_best_reference_image():
    model = planted_concepts()
    images, _ = planted_images(12)
    # the convolution before the ReLU (as lucid does): a closed ReLU has no gradient to climb
    collector = ReferenceCollector(model, "0", top=1, normalise=False)
    collector.update(images, torch.arange(12))
    best = int(collector.found["activation"].samples[TAG_CHANNEL, 0])
    before = model_state(model)
    image = visualize(model, ChannelObjective("0", TAG_CHANNEL), size=24, steps=64, lr=0.5, seed=0)
    assert_untouched(model, before)
    assert image.shape == (1, 3, 24, 24) and image.min() >= 0 and image.max() <= 1
    reached = mean_activation(model, "0", image, TAG_CHANNEL)
    reference = mean_activation(model, "0", images[best : best + 1], TAG_CHANNEL)
    assert reached > reference + 0.5
    # the tag channel reads magenta: the image is magenta (red and blue over green)
    assert (image[0, 0] + image[0, 2] - 2 * image[0, 1]).mean() > 0.5


def test_same_seed_same_image_and_other_seeds_differ():
    model = small_cnn()
    first = visualize(model, NeuronObjective("3", 5), size=16, steps=4, seed=3)
    assert torch.equal(first, visualize(model, NeuronObjective("3", 5), size=16, steps=4, seed=3))
    assert not torch.equal(
        first, visualize(model, NeuronObjective("3", 5), size=16, steps=4, seed=4)
    )


def test_the_normalisation_a_model_carries_is_used_unless_given():
    """A module with a timm-style ``pretrained_cfg`` is fed its own mean/std (the image as it
    expects it); one that says nothing sees the image in [0, 1], as documented."""
    model = small_cnn()
    objective = NeuronObjective("3", 5)
    plain = visualize(model, objective, size=16, steps=4, seed=3)
    model.pretrained_cfg = {"mean": (0.5, 0.4, 0.3), "std": (0.2, 0.25, 0.3)}
    carried = visualize(model, objective, size=16, steps=4, seed=3)
    given = visualize(model, objective, size=16, steps=4, seed=3, mean=(0.5, 0.4, 0.3),
                      std=(0.2, 0.25, 0.3))  # fmt: skip
    assert torch.equal(carried, given) and not torch.equal(carried, plain)
    identity = visualize(model, objective, size=16, steps=4, seed=3, mean=(0,) * 3, std=(1,) * 3)
    torch.testing.assert_close(identity, plain)


def test_diversity_makes_the_batch_differ():
    model = small_cnn()
    plain = visualize(model, ChannelObjective("3", 5), size=16, batch=2, steps=16, seed=0)
    varied = visualize(
        model, ChannelObjective("3", 5), size=16, batch=2, steps=16, seed=0, diversity_weight=50.0
    )
    with torch.no_grad(), record(model, "3") as rec:
        model(torch.cat([plain, varied]))
    acts = rec.activations["3"]
    # diversity() is minus the similarity of the batch's Gram matrices: higher is more diverse
    assert diversity(acts[2:]) > diversity(acts[:2])


def test_vit_tokens_and_class_logit():
    kind = KINDS["vit"]
    model = kind.model()
    before = model_state(model)
    start = fourier_image(torch.zeros(1, 3, 32, 17, dtype=torch.complex64), (32, 32))
    image = visualize(model, LogitObjective(3), size=32, steps=12, lr=0.1, seed=0)
    with torch.no_grad():
        assert model(image)[0, 3] > model(start)[0, 3]
    token = visualize(model, ChannelObjective("blocks.0", 7), size=32, steps=4, seed=0)
    assert token.shape == (1, 3, 32, 32)
    assert_untouched(model, before)


def test_feature_visualisation_errors():
    model = small_cnn()
    with pytest.raises(ArgumentError, match="objective"):
        visualize(model, "3", size=16, steps=1)
    with pytest.raises(ArgumentError, match="channel 6 out of range"):
        visualize(model, ChannelObjective("3", 6), size=16, steps=1)
    with pytest.raises(ArgumentError, match="class 5 out of range"):
        visualize(model, LogitObjective(5), size=16, steps=1)
    with pytest.raises(ArgumentError, match="diversity_layer"):
        visualize(model, LogitObjective(0), size=16, steps=1, batch=2, diversity_weight=1.0)

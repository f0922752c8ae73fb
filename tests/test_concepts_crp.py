"""Parity with zennit-crp 0.6.0 (Achtibat et al., Nature Machine Intelligence 2023) on
torchvision VGG-16 with random weights: camkit's LRP rules with the composite zennit-crp uses
(epsilon-plus-flat: zennit's ``EpsilonPlusFlat``) give zennit-crp's conditional heatmaps and
channel relevances (float64 within 1e-6 of the largest value, float32 within 1e-4), and its
reference-sample selection (the same top images per channel) on a small image set."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from matrix_kit import assert_untouched, model_state

crp_attribution = pytest.importorskip("crp.attribution")
zennit_composites = pytest.importorskip("zennit.composites")

from crp.concepts import ChannelConcept  # noqa: E402
from crp.helper import load_maximization  # noqa: E402
from crp.visualization import FeatureVisualization  # noqa: E402
from torchvision.models import vgg16  # noqa: E402

from camkit.methods.concepts import ConceptAttribution, LRPRules  # noqa: E402
from camkit.methods.concepts.reference import ReferenceCollector  # noqa: E402

LAYER = "features.21"


@pytest.fixture
def vgg():
    torch.manual_seed(0)
    return vgg16(num_classes=10).eval()


@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float64, 1e-6), (torch.float32, 1e-4)])
def test_heatmaps_and_relevances_equal_zennit_crp(vgg, dtype, tolerance):
    model = vgg.to(dtype)
    torch.manual_seed(1)
    x = torch.rand(1, 3, 32, 32, dtype=dtype)
    composite = zennit_composites.EpsilonPlusFlat()
    cls = int(model(x).argmax())
    channels = [0, 17, 100, 311]
    before = model_state(model)
    concepts = ConceptAttribution(model, LAYER, rules=LRPRules("epsilon-plus-flat"))
    heat = concepts.heatmaps(x, channels, target=cls)[0]
    relevance = concepts.relevances(x, target=cls)[0]
    assert_untouched(model, before)

    attribution = crp_attribution.CondAttribution(model, no_param_grad=False)
    conditions = [{LAYER: [c], "y": [cls]} for c in channels]
    theirs = attribution(x.clone().requires_grad_(True), conditions, composite)
    whole = attribution(
        x.clone().requires_grad_(True), [{"y": [cls]}], composite, record_layer=[LAYER]
    )
    their_relevance = ChannelConcept().attribute(whole.relevances[LAYER], abs_norm=False)[0]
    assert theirs.heatmap.abs().max() > 0
    assert (heat - theirs.heatmap).abs().max() <= tolerance * theirs.heatmap.abs().max()
    assert (relevance - their_relevance).abs().max() <= tolerance * their_relevance.abs().max()


def test_reference_selection_equals_zennit_crp(vgg, tmp_path):
    model = vgg
    torch.manual_seed(2)
    images = torch.rand(12, 3, 32, 32)
    predicted = model(images).argmax(1)

    class Images:  # zennit-crp's dataset: (image, target), the target the predicted class
        def __len__(self) -> int:
            return len(images)

        def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
            return images[i], int(predicted[i])

    composite = zennit_composites.EpsilonPlusFlat()
    attribution = crp_attribution.CondAttribution(model, no_param_grad=False)
    visualization = FeatureVisualization(
        attribution, Images(), {LAYER: ChannelConcept()}, path=str(tmp_path)
    )
    visualization.ActMax.SAMPLE_SIZE = visualization.RelMax.SAMPLE_SIZE = 5
    visualization.run(composite, 0, len(images), batch_size=4)

    collector = ReferenceCollector(model, LAYER, top=5, rules=LRPRules("epsilon-plus-flat"))
    for start in range(0, len(images), 4):
        collector.update(images[start : start + 4], torch.arange(start, start + 4))
    for mode, path in (
        ("relevance", visualization.RelMax.PATH),
        ("activation", visualization.ActMax.PATH),
    ):
        samples, values, positions = (np.asarray(a).T for a in load_maximization(path, LAYER))
        found = collector.found[mode]
        np.testing.assert_allclose(found.values.numpy(), values, atol=1e-6)
        # the same images wherever the score is not a tie at zero (a channel that never fires)
        ranked = np.abs(values) > 1e-12
        assert ranked.mean() > 0.5
        assert (found.samples.numpy() == samples)[ranked].all()
        assert (found.positions.numpy() == positions)[ranked].all()

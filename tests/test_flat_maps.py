"""The flat-map policy (``core.finish.flat``): a map whose spread is within float noise of its
values is flat, gives zeros and one ``EmptyMapWarning``, for every method and every batch size;
never a stretched pattern of noise."""

from __future__ import annotations

import warnings

import pytest
import torch
from matrix_kit import KINDS

import camkit
from camkit.core.finish import FLAT_SPREAD, flat, minmax
from camkit.errors import EmptyMapWarning


def test_flat_is_the_spread_against_the_magnitude() -> None:
    base = torch.full((1, 3, 4, 4), 0.25)
    wiggle = torch.linspace(-1, 1, 16).view(4, 4)
    maps = torch.stack(
        [
            base[0, 0],  # constant
            0.25 + 0.25 * FLAT_SPREAD * 0.4 * wiggle,  # spread 0.4 of the policy's: noise
            0.25 + 0.25 * FLAT_SPREAD * 4 * wiggle,  # spread 4x the policy's: a map
        ]
    ).unsqueeze(0)
    assert flat(maps).flatten().tolist() == [True, True, False]
    assert flat(torch.zeros(1, 1, 3, 3)).item()  # all zero
    finished = minmax(maps)
    assert torch.equal(finished[0, :2], torch.zeros(2, 4, 4))
    assert finished[0, 2].min().item() == 0 and finished[0, 2].max().item() == 1
    # a volume: the policy reads the last three dims
    volume = 1 + 1e-6 * torch.rand(1, 1, 2, 3, 3)
    assert flat(volume, dims=3).item()


@pytest.mark.parametrize("batch_size", [1, None])
def test_recipro_cam_on_a_near_uniform_classifier_is_flat_for_every_batch_size(batch_size) -> None:
    """The known case: the 1-channel kind's probabilities vary by ~6e-4 of their value over the
    positions; min-max normalising them gave float noise that changed with the batch size."""
    kind = KINDS["gray"]
    model, x = kind.model(), kind.input(3)
    cam = camkit.ReciproCAM(model, kind.layer, batch_size=batch_size)
    raw = cam(x, target=3, relu=False, upsample=False, normalize=False)
    spread = raw.flatten(1).amax(1) - raw.flatten(1).amin(1)
    assert (spread <= FLAT_SPREAD * raw.flatten(1).abs().amax(1)).all()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        maps = cam(x, target=3)
    assert torch.equal(maps, torch.zeros_like(maps))
    assert [w.category for w in caught] == [EmptyMapWarning]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert torch.equal(cam(x[0], target=3), torch.zeros_like(maps[0]))


def test_a_discriminative_classifier_keeps_its_recipro_map() -> None:
    """The same architecture with a classifier that separates the classes: a real map, not
    flattened by the policy."""
    kind = KINDS["gray"]
    model, x = kind.model(), kind.input(2)
    with torch.no_grad():
        model.classifier.weight.mul_(200)
    with warnings.catch_warnings():
        warnings.simplefilter("error", EmptyMapWarning)
        maps = camkit.ReciproCAM(model, kind.layer)(x, target=3)
    assert (maps.flatten(1).amax(1) == 1).all()

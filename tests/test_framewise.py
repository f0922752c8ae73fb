"""camkit.models.frame_wise: an image classifier run on every frame of a clip, its scores
averaged (TSN's consensus), read per frame by CAMs. A tiny bias-free CNN with known weights."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import camkit
from camkit import metrics, models


def image_model() -> models.LoadedModel:
    net = nn.Sequential(
        nn.Conv2d(3, 2, 1, bias=False), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(2, 2, bias=False),
    )  # fmt: skip
    with torch.no_grad():
        net[0].weight.copy_(torch.tensor([[1.0, 0, 0], [0, 1.0, 0]])[..., None, None])
        net[4].weight.copy_(torch.tensor([[1.0, 0], [0, 1.0]]))
    return models.LoadedModel(
        name="tiny", model=net.eval(), preprocess=models.Preprocess(8, crop_mode="squash"),
        labels=["red", "green"], default_layer="1", input_size=(8, 8),
    )  # fmt: skip


def test_the_clip_score_is_the_mean_of_the_frames_and_maps_are_per_frame() -> None:
    loaded = image_model()
    clip_model = models.frame_wise(loaded, 4)
    assert clip_model.clip_length == 4 and clip_model.input_size == (4, 8, 8)
    assert clip_model.default_layer == "net.1" and clip_model.labels == loaded.labels
    assert clip_model.model.module.net is loaded.model  # wrapped, not copied or changed
    clip = torch.zeros(1, 3, 4, 8, 8)  # (B, C, T, H, W): red in frames 1 and 2 only
    clip[0, 0, 1] = 2.0
    clip[0, 0, 2, :, :4] = 1.0  # half the frame
    # by hand: frame scores for "red" are the mean red value: 0, 2, 0.5, 0 -> mean 0.625
    scores = clip_model.model(clip)
    assert scores[0].tolist() == pytest.approx([0.625, 0.0])
    heat = camkit.GradCAM(clip_model.model, "net.1")(clip, target=0)
    assert heat.shape == (1, 4, 8, 8)
    # each frame's ReLU(red) weighted alike: mass 2*64 and 1*32 -> shares 0, 0.8, 0.2, 0
    shares = metrics.frame_importance(heat)[0]
    assert shares.tolist() == pytest.approx([0.0, 0.8, 0.2, 0.0], abs=1e-6)


def test_frame_wise_refuses_video_models_and_bad_lengths() -> None:
    clip_model = models.frame_wise(image_model(), 4)
    with pytest.raises(camkit.CamkitError, match="takes clips already"):
        models.frame_wise(clip_model)
    with pytest.raises(camkit.CamkitError, match="positive int"):
        models.frame_wise(image_model(), 0)

"""When: per-frame importance of a clip's map and the drop in score when a frame is removed
(camkit.metrics.frames), on a planted clip whose class evidence is only in frames 5-8."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import camkit
from camkit.errors import InputError
from camkit.metrics import frame_drop, frame_importance

EVIDENCE = [5, 6, 7, 8]


class Planted(nn.Module):
    """Channel 0 of a clip is the class-0 evidence, channel 1 the class-1 evidence: a 1x1x1
    identity convolution, ReLU, global mean, identity linear head (known weights)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv3d(2, 2, 1, bias=False)
        self.head = nn.Linear(2, 2, bias=False)
        with torch.no_grad():
            self.conv.weight.copy_(torch.eye(2).view(2, 2, 1, 1, 1))
            self.head.weight.copy_(4 * torch.eye(2))

    def forward(self, clip: torch.Tensor) -> torch.Tensor:
        return self.head(self.conv(clip).relu().mean(dim=(2, 3, 4)))


def planted_clip() -> torch.Tensor:
    """(1, 2, 12, 8, 8): class-0 evidence only in frames 5-8, the other class everywhere."""
    generator = torch.Generator().manual_seed(0)
    clip = torch.zeros(1, 2, 12, 8, 8)
    clip[0, 0, EVIDENCE] = torch.rand(len(EVIDENCE), 8, 8, generator=generator) + 0.5
    clip[0, 1] = torch.rand(12, 8, 8, generator=generator)
    return clip


def test_a_planted_clip_gives_a_per_frame_importance_peaked_on_frames_5_to_8() -> None:
    model, clip = Planted().eval(), planted_clip()
    cam = camkit.GradCAM(model, "conv")(clip, target=0)  # (1, 12, 8, 8)
    importance = frame_importance(cam)[0]
    assert importance.shape == (12,)
    assert set(importance.topk(4).indices.tolist()) == set(EVIDENCE)
    others = [t for t in range(12) if t not in EVIDENCE]
    assert importance[others].abs().max() < 1e-6
    # by hand: Grad-CAM's map is A_0 (the channel-1 weight is 0), min-max scaled by a constant
    mass = clip[0, 0].sum(dim=(1, 2))
    torch.testing.assert_close(importance, mass / mass.sum())
    # the other class's evidence is spread over every frame
    spread = frame_importance(camkit.GradCAM(model, "conv")(clip, target=1))[0]
    assert (spread > 0.02).all()


def test_removing_a_frame_drops_the_score_only_where_the_evidence_is() -> None:
    model, clip = Planted().eval(), planted_clip()
    drop = frame_drop(model, clip, target=0, batch_size=5)
    assert drop.shape == (1, 12)
    # by hand: logit 0 = 4 * mean(channel 0); removing frame t removes its share
    logits = model(clip)[0]
    for t in range(12):
        copy = clip.clone()
        copy[:, :, t] = 0
        expected = logits.softmax(0)[0] - model(copy)[0].softmax(0)[0]
        torch.testing.assert_close(drop[0, t], expected.detach())
    assert (drop[0, EVIDENCE] > 0.01).all()
    others = [t for t in range(12) if t not in EVIDENCE]
    assert (drop[0, others] < 0).all()  # removing class-1 evidence only helps class 0
    torch.testing.assert_close(frame_drop(model, clip, target=0, batch_size=64), drop)


def test_frame_importance_of_a_flat_map_is_zero_and_bad_maps_are_refused() -> None:
    assert frame_importance(torch.ones(2, 3, 4, 4)).eq(0).all()
    assert frame_importance(torch.zeros(3, 4, 4)).eq(0).all()
    with pytest.raises(InputError, match="non-negative"):
        frame_importance(-torch.rand(3, 4, 4))
    with pytest.raises(InputError, match=r"\(T, H, W\)"):
        frame_importance(torch.rand(4, 4))
    with pytest.raises(InputError, match="clips"):
        frame_drop(Planted(), torch.rand(1, 2, 8, 8), target=0)


class PerFrame(nn.Module):
    """Frame-wise: a 1x1 convolution on each frame of a (B, C, T, H, W) clip, per-frame logits
    (B, T, 2) from the frame's mean (no consensus over time)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 2, 1, bias=False)
        with torch.no_grad():
            self.conv.weight.copy_(torch.eye(2).view(2, 2, 1, 1))

    def forward(self, clip: torch.Tensor) -> torch.Tensor:
        b, _, t = clip.shape[:3]
        maps = self.conv(clip.transpose(1, 2).flatten(0, 1)).relu()
        return maps.mean(dim=(2, 3)).unflatten(0, (b, t))


def test_a_target_over_a_span_of_frames_explains_only_those_frames() -> None:
    from camkit.targets import FrameSpanTarget

    model = camkit.InputLayout(PerFrame().eval(), "BCTHW", frame_wise=True)
    clip = planted_clip()
    clip[0, 0] = torch.rand(12, 8, 8, generator=torch.Generator().manual_seed(1)) + 0.5
    target = FrameSpanTarget(0, 5, 9)
    # by hand: the mean over frames 5..8 of each frame's mean of channel 0
    torch.testing.assert_close(target(model(clip)), clip[:, 0, 5:9].mean(dim=(1, 2, 3)))
    # LayerCAM weighs each position by its own gradient (Grad-CAM averages the gradient over
    # the whole clip, so frames outside the span keep their activations)
    cam = camkit.LayerCAM(model, "conv")(clip, target=target, normalize=False)
    importance = frame_importance(cam)[0]
    others = [t for t in range(12) if t not in EVIDENCE]
    assert importance[others].abs().max() < 1e-6 and importance[EVIDENCE].min() > 0.2
    with pytest.raises(camkit.errors.TargetError, match="do not fit"):
        FrameSpanTarget(0, 10, 14)(model(clip))
    with pytest.raises(camkit.errors.TargetError, match="start < stop"):
        FrameSpanTarget(0, 5, 5)

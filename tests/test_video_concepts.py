"""Concept Relevance Propagation on clips: a tiny 3-D CNN (r3d-style, (B, C, t, h, w) layers) and a
frame-wise 2-D CNN (layers of B * T rows). Channel relevances and conditional heatmaps against
Achtibat et al.'s definitions written by hand in float64: R_c = sum A_c * dS/dA_c over the clip,
R(x | c) = sum_channels x * d/dx <A, 1[c] g>, one heatmap per frame."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_untouched, model_state
from test_video_layouts import FrameWise
from torch import Tensor, nn

import camkit
from camkit.methods.concepts import Channels, ConceptAttribution

B, T, SIZE, CLASSES = 2, 3, 8, [2, 0]  # a class per clip


class Tiny3D(nn.Module):
    """r3d-style: Conv3d stem, a strided Conv3d (time 3 -> 2), global pooling, a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv3d(3, 4, 3, padding=1)
        self.layer = nn.Conv3d(4, 5, (2, 3, 3), stride=(1, 2, 2), padding=(0, 1, 1))
        self.head = nn.Linear(5, 3)

    def forward(self, clip: Tensor) -> Tensor:
        features = self.layer(self.stem(clip).relu()).relu().mean(dim=(2, 3, 4))
        return self.head(features)


def models() -> dict[str, tuple[nn.Module, str, object]]:
    """name: (model, layer, the layer's output as (B, C, t, h, w))."""
    torch.manual_seed(0)
    frame_wise = camkit.InputLayout(FrameWise().double().eval(), "BCTHW", frame_wise=True)
    return {
        "r3d-style": (Tiny3D().double().eval(), "layer", lambda a: a),
        "frame-wise": (frame_wise, "conv2", lambda a: a.unflatten(0, (B, T)).transpose(1, 2)),
    }


def by_hand(model: nn.Module, layer: str, to_clip, x: Tensor) -> tuple[Tensor, ...]:
    """(B, C) channel relevances, (B,) the layer's total sum(A * g) per clip, (B, C, T, H, W)
    conditional heatmaps of every channel and the (B, T, H, W) unconditional heatmap x * dS/dx,
    by autograd on a hooked layer."""
    modules = dict(model.named_modules())
    module = modules.get(layer) or modules[f"module.{layer}"]
    kept = []
    handle = module.register_forward_hook(lambda m, a, out: kept.append(out))
    leaf = x.clone().requires_grad_(True)
    try:
        score = model(leaf)[range(B), CLASSES].sum()
    finally:
        handle.remove()
    (act,) = kept
    (grad,) = torch.autograd.grad(score, act, retain_graph=True)
    relevance = to_clip(act * grad).flatten(2).sum(dim=-1)  # (B, C): positions and frames
    total = (act * grad).reshape(B, -1).sum(dim=-1)  # a clip's rows (frames) are contiguous
    heat = []
    for c in range(relevance.shape[1]):
        masked = torch.zeros_like(grad)
        masked[:, c] = grad[:, c]  # channels on axis 1 of the raw output in both models
        (to_input,) = torch.autograd.grad(act, leaf, masked, retain_graph=True)
        heat.append((x * to_input).sum(dim=1))
    (full,) = torch.autograd.grad(score, leaf)
    heat = torch.stack(heat, dim=1)
    return relevance.detach(), total.detach(), heat, (x * full).sum(dim=1)


@pytest.mark.parametrize("name", ["r3d-style", "frame-wise"])
def test_channel_relevances_and_conditional_heatmaps_of_clips_equal_the_hand_computation(
    name: str,
) -> None:
    model, layer, to_clip = models()[name]
    torch.manual_seed(1)
    x = torch.randn(B, 3, T, SIZE, SIZE, dtype=torch.float64)
    relevance, total, heat, full = by_hand(model, layer, to_clip, x)
    channels = relevance.shape[1]
    before = model_state(model)
    concepts = ConceptAttribution(model, layer, batch_size=2)
    got = concepts.relevances(x, CLASSES)
    torch.testing.assert_close(got, relevance, rtol=1e-7, atol=1e-10)
    assert (total.abs() > 1e-3).all()
    torch.testing.assert_close(got.sum(dim=1), total, rtol=1e-9, atol=1e-12)  # the layer's total
    maps = concepts.heatmaps(x, range(channels), CLASSES)
    assert_untouched(model, before)
    assert maps.shape == (B, channels, T, SIZE, SIZE)  # one map per frame and concept
    torch.testing.assert_close(maps, heat, rtol=1e-7, atol=1e-10)
    # CRP's completeness: the concepts' heatmaps add up to the unconditional heatmap
    torch.testing.assert_close(maps.sum(dim=1), full, rtol=1e-7, atol=1e-10)
    assert (heat.abs().flatten(2).amax(dim=-1) > 0).sum() > channels  # not blank
    top = concepts.top(x, k=2, target=CLASSES)
    expected = relevance.topk(2, dim=1)
    assert top.channels.tolist() == expected.indices.tolist()
    picked = expected.indices[..., None, None, None].expand(-1, -1, T, SIZE, SIZE)
    torch.testing.assert_close(top.heatmaps, heat.gather(1, picked))


def test_a_frame_wise_channel_group_and_a_region_of_frames() -> None:
    """A group concept is the sum of its channels' heatmaps; a region over some frames counts
    the relevance in those frames only."""
    model, layer, to_clip = models()["frame-wise"]
    torch.manual_seed(2)
    x = torch.randn(B, 3, T, SIZE, SIZE, dtype=torch.float64)
    concepts = ConceptAttribution(model, layer)
    each = concepts.heatmaps(x, [0, 3], CLASSES)
    group = concepts.heatmaps(x, [Channels([0, 3])], CLASSES)
    torch.testing.assert_close(group[:, 0], each.sum(dim=1))
    region = torch.zeros(T, SIZE, SIZE, dtype=torch.float64)
    region[1] = 1  # the middle frame only
    in_frame = concepts.relevances(x, CLASSES, region=region)
    modules = dict(model.named_modules())
    kept = []
    handle = modules[f"module.{layer}"].register_forward_hook(lambda m, a, o: kept.append(o))
    try:
        score = model(x)[range(B), CLASSES].sum()
    finally:
        handle.remove()
    (grad,) = torch.autograd.grad(score, kept[0])
    expected = to_clip(kept[0] * grad)[:, :, 1].flatten(2).sum(dim=-1)  # frame 1's relevance
    torch.testing.assert_close(in_frame, expected.detach(), rtol=1e-7, atol=1e-10)

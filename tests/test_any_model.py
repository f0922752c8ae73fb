"""Any model, any input: layers whose first axis is not the batch, clip layouts, discovery."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import camkit
from camkit.errors import InputError, LayerOutputError


class _Proposals(nn.Module):
    """A head that turns each image's 2x2 map into 4 rows (one per 'proposal')."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.permute(0, 2, 3, 1).reshape(-1, x.shape[1], 1, 1)


class _Detector(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(2)
        self.roi = _Proposals()
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = self.roi(self.pool(self.conv(x))).flatten(1)
        return self.head(rows).reshape(x.shape[0], -1, 2).amax(dim=1)


def test_a_layer_whose_first_axis_is_not_the_batch_is_refused_by_name() -> None:
    model = _Detector().eval()
    x = torch.rand(1, 3, 8, 8)
    with pytest.raises(LayerOutputError, match=r"'roi' gives 4 rows .* input batch of 1"):
        camkit.GradCAM(model, "roi")(x, target=0)
    with pytest.raises(LayerOutputError, match="'roi' gives 8 rows .* batch of 2"):
        camkit.ScoreCAM(model, "roi")(torch.rand(2, 3, 8, 8), target=0)
    assert not model._forward_hooks and not model.roi._forward_hooks
    assert camkit.GradCAM(model, "conv")(x, target=0, relu=False).shape == (1, 8, 8)


class _FrameWise(nn.Module):
    """A 2-D CNN on every frame of a (B, T, C, H, W) clip, frame logits averaged."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.head = nn.Linear(4, 2)

    def forward(self, clip: torch.Tensor) -> torch.Tensor:
        b, t = clip.shape[:2]
        frames = self.conv(clip.flatten(0, 1)).relu().mean(dim=(2, 3))
        return self.head(frames).unflatten(0, (b, t)).mean(dim=1)


class _ClipTransformerStem(nn.Module):
    """VideoMAE-style: takes (B, T, C, H, W) and permutes it for its Conv3d tubelet embedding."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Conv3d(3, 4, (2, 2, 2), stride=2)
        self.head = nn.Linear(4, 2)

    def forward(self, clip: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(clip.permute(0, 2, 1, 3, 4)).mean(dim=(2, 3, 4)))


def test_a_btchw_clip_is_refused_until_its_layout_is_declared() -> None:
    model = _ClipTransformerStem().eval()
    clip = torch.rand(1, 4, 3, 8, 8)  # (B, T, C, H, W)
    with pytest.raises(InputError, match=r"looks like clips \(B, T, C, H, W\).*InputLayout"):
        camkit.GradCAM(model, "embed")(clip, target=0)
    declared = camkit.InputLayout(model, "BTCHW")
    cam = camkit.GradCAM(declared, "embed")(
        clip.transpose(1, 2), target=0, relu=False, normalize=False
    )
    assert cam.shape == (1, 4, 8, 8)  # (B, T, H, W): time from axis 1, never the channels
    # the declared model computes exactly the original on the original clip
    torch.testing.assert_close(declared(clip.transpose(1, 2)), model(clip))
    # the map is the one computed by hand from the tubelet embedding: the gradient of logit 0
    # w.r.t. the (B, 4, 2, 4, 4) embedding is head.weight[0] / 32 at every position
    with torch.no_grad():
        act = model.embed(clip.permute(0, 2, 1, 3, 4))
    raw = (model.head.weight[0][:, None, None, None] / 32 * act[0]).sum(0)
    expected = torch.nn.functional.interpolate(raw[None, None], size=(4, 8, 8), mode="trilinear")
    expected = expected[0, 0]
    torch.testing.assert_close(cam[0], expected, atol=1e-5, rtol=1e-5)


def test_a_frame_wise_model_is_explained_by_pixel_methods_and_refused_by_cams() -> None:
    model = _FrameWise().eval()
    clip = torch.rand(2, 3, 8, 8, 8)  # (B, C, T, H, W) for the declared layout
    declared = camkit.InputLayout(model, "BTCHW")
    with pytest.raises(InputError, match="frame-wise"):
        camkit.Saliency(model)(torch.rand(2, 3, 5, 8, 8), target=0)
    grads = camkit.Saliency(declared)(clip, target=1)
    assert grads.shape == clip.shape
    leaf = clip.transpose(1, 2).clone().requires_grad_(True)
    model(leaf)[:, 1].sum().backward()
    torch.testing.assert_close(grads, leaf.grad.transpose(1, 2))
    with pytest.raises(LayerOutputError, match=r"conv' gives 16 rows .* batch of 2"):
        camkit.GradCAM(declared, "conv")(clip, target=0)


def test_input_layout_rejects_a_wrong_declaration() -> None:
    with pytest.raises(ValueError, match="B, C, T"):
        camkit.InputLayout(_FrameWise(), "BTHW")

"""Perturbation CAMs on a frame-wise model (a 2-D CNN run on every frame of a clip, frames folded
into its batch): Score-CAM, Ablation-CAM and Recipro-CAM against the papers' steps written by
hand in float64 (one mask or ablation per channel over the whole clip; Recipro-CAM: one place of
one frame kept), one map per frame."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_untouched, model_state
from test_video_layouts import FrameWise
from torch import Tensor, nn

import camkit

B, T, SIZE, CLASSES = 2, 3, 16, [1, 2]  # a class per clip


def clip_model() -> tuple[nn.Module, Tensor]:
    torch.manual_seed(0)
    model = FrameWise().double().eval()
    x = torch.randn(B, 3, T, SIZE, SIZE, dtype=torch.float64)
    return camkit.InputLayout(model, "BCTHW", frame_wise=True), x


def conv2_frames(model: nn.Module, x: Tensor) -> Tensor:
    """conv2's output, rows ``b * T + t``, as ``(B, C, T, h, w)``."""
    kept = []
    handle = model.module.conv2.register_forward_hook(lambda m, a, out: kept.append(out))
    try:
        with torch.no_grad():
            model(x)
    finally:
        handle.remove()
    return kept[0].unflatten(0, (B, T)).transpose(1, 2)


def with_conv2_output(model: nn.Module, x: Tensor, edit) -> Tensor:
    handle = model.module.conv2.register_forward_hook(lambda m, a, out: edit(out))
    try:
        with torch.no_grad():
            return model(x)
    finally:
        handle.remove()


def score_cam_by_hand(model: nn.Module, x: Tensor) -> Tensor:
    """Wang et al. 2020, Algorithm 1, per clip: channel c's mask is its T frame maps, each
    upsampled bilinearly to the frame, min-max normalised over the clip; w = softmax_c of the
    target logits of the masked clips; map relu(sum_c w_c A_c): (B, T, h, w)."""
    acts = conv2_frames(model, x)
    maps = []
    for b in range(B):
        scores = []
        for c in range(acts.shape[1]):
            frames = [
                F.interpolate(acts[b, c, t][None, None], size=(SIZE, SIZE), mode="bilinear")
                for t in range(T)
            ]
            mask = torch.cat(frames).squeeze(1)  # (T, H, W)
            span = mask.max() - mask.min()
            mask = (mask - mask.min()) / span if span > 0 else torch.zeros_like(mask)
            with torch.no_grad():
                scores.append(model(x[b : b + 1] * mask)[0, CLASSES[b]])
        weights = torch.stack(scores).softmax(dim=0)  # (C,)
        maps.append(torch.einsum("c,cthw->thw", weights, acts[b]).relu())
    return torch.stack(maps)


def ablation_cam_by_hand(model: nn.Module, x: Tensor) -> Tensor:
    """Desai & Ramaswamy 2020: w_c = (y - y_c) / y, y_c the logit with channel c of conv2 zeroed
    in every frame of the clip; map relu(sum_c w_c A_c): (B, T, h, w)."""
    acts = conv2_frames(model, x)
    with torch.no_grad():
        clean = model(x)[range(B), CLASSES]  # (B,)
    ablated = []
    for c in range(acts.shape[1]):

        def zero(out: Tensor, c: int = c) -> Tensor:
            out = out.clone()
            out[:, c] = 0
            return out

        ablated.append(with_conv2_output(model, x, zero)[range(B), CLASSES])
    weights = (clean[:, None] - torch.stack(ablated, dim=1)) / clean[:, None]  # (B, C)
    return torch.einsum("bc,bcthw->bthw", weights, acts).relu()


@pytest.mark.parametrize(
    ("method", "by_hand"),
    [(camkit.ScoreCAM, score_cam_by_hand), (camkit.AblationCAM, ablation_cam_by_hand)],
)
def test_perturbation_cams_of_a_frame_wise_clip_equal_the_papers_steps(method, by_hand) -> None:
    model, x = clip_model()
    expected = by_hand(model, x)
    assert (expected.flatten(1).amax(dim=-1) > 0).all()
    before = model_state(model)
    cam = method(model, "conv2", batch_size=5)  # chunks that cut clips' channel rows apart
    got = cam(x, target=CLASSES, upsample=False, normalize=False)
    assert_untouched(model, before)
    assert "frame-wise, 3 frames per sample" in str(cam.layouts[cam.layers[0]])
    assert got.shape == (B, T, 8, 8)
    torch.testing.assert_close(got.double(), expected, rtol=1e-4, atol=1e-6 * expected.amax())
    assert method(model, "conv2")(x, target=1).shape == (B, T, SIZE, SIZE)  # one map per frame


def test_ablation_cam_of_a_frame_wise_model_that_reshapes_by_its_input_s_batch() -> None:
    """A model whose later layers take the clip count from its input cannot reuse the layer's
    prefix for a batch of ablated copies: full forwards of repeated clips give the same map."""

    class ByInputBatch(FrameWise):
        def forward(self, clip: Tensor) -> Tensor:
            b, _, t = clip.shape[:3]
            frames = clip.transpose(1, 2).flatten(0, 1)
            features = self.conv2(self.conv1(frames).relu()).relu().mean(dim=(2, 3))
            return self.head(features.view(b, t, -1)).mean(dim=1)  # b from the input

    model, x = clip_model()
    other = camkit.InputLayout(ByInputBatch().double().eval(), "BCTHW", frame_wise=True)
    other.module.load_state_dict(model.module.state_dict())
    got = camkit.AblationCAM(other, "conv2")(x, target=CLASSES, upsample=False, normalize=False)
    expected = ablation_cam_by_hand(model, x)
    torch.testing.assert_close(got.double(), expected, rtol=1e-4, atol=1e-6 * expected.amax())


def test_score_cam_variants_run_on_frame_wise_clips() -> None:
    model, x = clip_model()
    for method in (camkit.SSCAM(model, "conv2", samples=2, seed=0), camkit.ISCAM(model, "conv2")):
        heat = method(x, target=1)
        assert heat.shape == (B, T, SIZE, SIZE) and heat.isfinite().all() and heat.amax() > 0


GAUSSIAN = torch.tensor([[1.0, 2, 1], [2, 4, 2], [1, 2, 1]], dtype=torch.float64) / 16


def recipro_cam_by_hand(model: nn.Module, x: Tensor) -> Tensor:
    """Byun & Lee 2022 over a clip's positions (t, i, j): conv2's output kept only under the
    3x3 Gaussian centred at (i, j) in frame t (cut at the border), zero in the other frames;
    the map there is the target's softmax probability: (B, T, h, w)."""
    h = w = SIZE // 2
    maps = torch.zeros(B, T, h, w, dtype=torch.float64)
    for b in range(B):
        for t in range(T):
            for i in range(h):
                for j in range(w):
                    mask = torch.zeros(T, 1, h + 2, w + 2, dtype=torch.float64)
                    mask[t, 0, i : i + 3, j : j + 3] = GAUSSIAN
                    mask = mask[:, :, 1:-1, 1:-1]  # (T, 1, h, w), row t * ... of the clip
                    out = with_conv2_output(model, x[b : b + 1], lambda a, m=mask: a * m)
                    maps[b, t, i, j] = out.softmax(dim=-1)[0, CLASSES[b]]
    return maps


def test_recipro_cam_of_a_frame_wise_clip_keeps_one_place_of_one_frame() -> None:
    model, x = clip_model()
    with torch.no_grad():
        model.module.head.weight.mul_(1000)  # sharper logits: probabilities that vary by place
    expected = recipro_cam_by_hand(model, x)
    spread = expected.flatten(1).amax(dim=1) - expected.flatten(1).amin(dim=1)
    assert (spread > 0.05).all()  # in each clip, the places matter
    got = camkit.ReciproCAM(model, "conv2", batch_size=7)(
        x, target=CLASSES, upsample=False, normalize=False
    )
    assert got.shape == (B, T, 8, 8)
    torch.testing.assert_close(got.double(), expected, rtol=1e-4, atol=1e-7)
    assert camkit.ReciproCAM(model, "conv2")(x, target=CLASSES).shape == (B, T, SIZE, SIZE)

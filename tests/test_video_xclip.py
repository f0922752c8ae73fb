"""X-CLIP (Ni et al., ECCV 2022): its vision tower runs a clip's frames as a batch of B * T images
(row b * T + t, ``pixel_values.reshape(-1, C, H, W)``), a cross-frame block appends a message
token inside itself, then a multi-frame transformer and a video-conditioned prompt generator
give the video-text logits. A tiny random XCLIPModel from a config; Grad-CAM on its vision layers
against a float64 hand reference in the token order read off ``modeling_x_clip`` by hand."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_untouched, model_state
from torch import Tensor, nn
from vlm_kit import PATCH, SIZE, _text_tower, _vision, ids

import camkit
from camkit.errors import InputError, TargetError
from camkit.methods.concepts import Channels, ConceptAttribution
from camkit.targets import PromptTarget

transformers = pytest.importorskip("transformers")

B, T, GRID = 2, 4, SIZE // PATCH
PROMPTS = torch.tensor([[1, *ids(text), 3] for text in ("a cat", "a dog", "a photo")])
CLASSES = [0, 2]  # a prompt per clip


def xclip() -> nn.Module:
    torch.manual_seed(0)
    text = _text_tower(bos_token_id=1, eos_token_id=3, pad_token_id=0)
    vision = _vision(num_frames=T, mit_hidden_size=16, mit_intermediate_size=32)
    vision |= dict(mit_num_hidden_layers=1, mit_num_attention_heads=2)
    config = transformers.XCLIPConfig(
        text_config=text, vision_config=vision, projection_dim=16, prompt_layers=1,
        prompt_num_attention_heads=2,
    )  # fmt: skip
    return transformers.XCLIPModel(config).double().eval()


def gradcam_by_hand(model: nn.Module, module: nn.Module, x: Tensor) -> Tensor:
    """Grad-CAM of logits_per_video[b, CLASSES[b]] at ``module``: its (B * T, 1 + h*w [+ 1],
    C) tokens, row b * T + t, the class token first and the message token (if any) last, laid
    out as (B, C, T, h, w); weights the mean gradient over the clip; relu(sum_c w_c A_c)."""
    kept = []
    handle = module.register_forward_hook(lambda m, a, out: kept.append(out))
    try:
        logits = model(pixel_values=x.transpose(1, 2), input_ids=PROMPTS).logits_per_video
    finally:
        handle.remove()
    (grad,) = torch.autograd.grad(logits[range(B), CLASSES].sum(), kept[0])

    def clip(tokens: Tensor) -> Tensor:
        patches = tokens[:, 1 : 1 + GRID * GRID]  # (B * T, h * w, C), row-major patches
        return patches.reshape(B, T, GRID, GRID, -1).permute(0, 4, 1, 2, 3)

    a, g = clip(kept[0].detach()), clip(grad)
    return (g.mean(dim=(2, 3, 4), keepdim=True) * a).sum(dim=1).relu()


@pytest.mark.parametrize("layer", ["layers.1.layer_norm1", "layers.0"])
def test_gradcam_of_xclip_s_vision_layers_equals_the_hand_reference(layer: str) -> None:
    model = xclip()
    wrapped = camkit.InputLayout(camkit.VideoPrompts(model, PROMPTS), "BTCHW")  # not declared
    name = f"vision_model.encoder.{layer}"
    x = torch.randn(B, 3, T, SIZE, SIZE, dtype=torch.float64)
    expected = gradcam_by_hand(model, model.get_submodule(name), x)
    assert (expected.flatten(1).amax(dim=1) > 0).all()
    before = model_state(model)
    cam = camkit.GradCAM(wrapped, name)
    got = cam(x, target=CLASSES, upsample=False, normalize=False)
    assert_untouched(model, before)
    layout = str(cam.layouts[cam.layers[0]])
    assert "frame-wise, 4 frames per sample" in layout and "1 prefix token(s) dropped" in layout
    assert ("message token" in layout) == layer.endswith("layer_norm1")  # inside the block only
    assert got.shape == (B, T, GRID, GRID)
    torch.testing.assert_close(got.double(), expected, rtol=1e-4, atol=1e-6 * expected.amax())


def test_xclip_s_default_layer_its_clip_length_and_its_prompts() -> None:
    model = xclip()
    wrapped = camkit.InputLayout(camkit.VideoPrompts(model, PROMPTS), "BTCHW")
    x = torch.randn(1, 3, T, SIZE, SIZE, dtype=torch.float64)
    cam = camkit.GradCAM(wrapped)
    heat = cam(x, target=1)
    assert cam.layers == ["vision_model.encoder.layers.1.layer_norm1"]
    assert heat.shape == (1, T, SIZE, SIZE) and heat.amax() > 0  # one map per frame
    with pytest.raises(InputError, match=r"clips of 4 frames .*vision_config.num_frames"):
        cam(torch.randn(1, 3, 3, SIZE, SIZE, dtype=torch.float64), target=1)
    with pytest.raises(TargetError, match=r"depend on the video .*VideoPrompts"):
        PromptTarget(model, input_ids=PROMPTS)
    with pytest.raises(camkit.CamkitError, match="XCLIPModel"):
        camkit.VideoPrompts(nn.Linear(2, 2), PROMPTS)


def test_ablation_cam_of_xclip_s_frame_tokens_equals_the_paper_s_steps() -> None:
    """Desai & Ramaswamy 2020 on a frame-wise token layer: channel c zeroed (last axis) in every
    token of every frame of the clip, w_c = (y - y_c) / y; the map on the frames' patch grid."""
    model = xclip()
    wrapped = camkit.InputLayout(camkit.VideoPrompts(model, PROMPTS), "BTCHW")
    name = "vision_model.encoder.layers.0"
    module = model.get_submodule(name)
    x = torch.randn(B, 3, T, SIZE, SIZE, dtype=torch.float64)

    def logits(edit=None) -> tuple[Tensor, Tensor]:
        kept = []

        def hook(m: nn.Module, args: tuple, out: Tensor) -> Tensor:
            kept.append(out)
            return out if edit is None else edit(out)

        handle = module.register_forward_hook(hook)
        try:
            with torch.no_grad():
                scores = wrapped(x)[range(B), CLASSES]
        finally:
            handle.remove()
        return scores, kept[0]

    clean, act = logits()
    channels = act.shape[-1]
    weights = []
    for c in range(channels):

        def zero(out: Tensor, c: int = c) -> Tensor:
            out = out.clone()
            out[..., c] = 0
            return out

        weights.append((clean - logits(zero)[0]) / clean)
    weights = torch.stack(weights, dim=1)  # (B, C)
    grid = act[:, 1 : 1 + GRID * GRID].reshape(B, T, GRID, GRID, channels).permute(0, 4, 1, 2, 3)
    expected = torch.einsum("bc,bcthw->bthw", weights, grid).relu()
    assert (expected.flatten(1).amax(dim=1) > 0).all()
    got = camkit.AblationCAM(wrapped, name, batch_size=12)(
        x, target=CLASSES, upsample=False, normalize=False
    )
    torch.testing.assert_close(got.double(), expected, rtol=1e-4, atol=1e-6 * expected.amax())


def test_concepts_of_xclip_s_frame_tokens_sum_to_the_layer_and_the_input() -> None:
    """CRP on a frame-wise token layer: channel c's relevance sums A * dS/dA over every token
    (class token too) of every frame of the clip; all channels' conditional heatmaps add up to
    x * dS/dx (every path from the pixels runs through the layer), one map per frame."""
    model = xclip()
    wrapped = camkit.InputLayout(camkit.VideoPrompts(model, PROMPTS), "BTCHW")
    name = "vision_model.encoder.layers.0"
    x = torch.randn(B, 3, T, SIZE, SIZE, dtype=torch.float64)
    kept = []
    handle = model.get_submodule(name).register_forward_hook(lambda m, a, o: kept.append(o))
    leaf = x.clone().requires_grad_(True)
    try:
        score = wrapped(leaf)[range(B), CLASSES].sum()
    finally:
        handle.remove()
    (grad,) = torch.autograd.grad(score, kept[0], retain_graph=True)
    (to_input,) = torch.autograd.grad(score, leaf)
    relevance = (kept[0] * grad).detach().unflatten(0, (B, T)).sum(dim=(1, 2))  # (B, C)
    concepts = ConceptAttribution(wrapped, name)
    torch.testing.assert_close(concepts.relevances(x, CLASSES), relevance, rtol=1e-7, atol=1e-10)
    channels = relevance.shape[1]
    heat = concepts.heatmaps(x, [Channels(list(range(channels)))], CLASSES)[:, 0]
    assert heat.shape == (B, T, SIZE, SIZE)
    torch.testing.assert_close(heat, (x * to_input).sum(dim=1), rtol=1e-7, atol=1e-10)

"""Attention Rollout and LeGrad (camkit.methods.attention): rollout by hand, attention probabilities
recomputed from the qkv weights, LeGrad against torchcam 0.5.0 (dev extra)."""

from __future__ import annotations

import pytest
import torch
from conftest import TinyNet, assert_untouched, model_state
from torch import Tensor, nn

from camkit.errors import AttentionError, TargetError
from camkit.methods.attention import AttentionRollout, LeGrad, attention_blocks, rollout

timm = pytest.importorskip("timm")


def test_rollout_by_hand():
    # one head, two tokens: A1 = [[.5, .5], [1, 0]] -> 0.5 A1 + 0.5 I = [[.75, .25], [.5, .5]]
    a1 = torch.tensor([[0.5, 0.5], [1.0, 0.0]])[None, None]
    torch.testing.assert_close(rollout([a1])[0], torch.tensor([[0.75, 0.25], [0.5, 0.5]]))
    # A2 = [[0, 1], [0, 1]] -> [[.5, .5], [0, 1]]; R = Â2 Â1 = [[.625, .375], [.5, .5]]
    a2 = torch.tensor([[0.0, 1.0], [0.0, 1.0]])[None, None]
    torch.testing.assert_close(rollout([a1, a2])[0], torch.tensor([[0.625, 0.375], [0.5, 0.5]]))
    # two heads fused by max: max([[.5, .5], [1, 0]], [[1, 0], [0, 1]]) = [[1, .5], [1, 1]],
    # + I, halved, rows renormalised: [[1, .25], [.5, 1]] / [1.25, 1.5]
    heads = torch.stack([a1[0, 0], torch.eye(2)])[None]
    expected = torch.tensor([[0.8, 0.2], [1 / 3, 2 / 3]])
    torch.testing.assert_close(rollout([heads], head_fusion="max")[0], expected)
    with pytest.raises(ValueError, match="head_fusion"):
        rollout([heads], head_fusion="sum")


def _probabilities_from_weights(model: nn.Module, x: Tensor) -> list[Tensor]:
    """softmax(q k^T / sqrt(d)) per block, recomputed from each attention's input and qkv."""
    inputs = []
    handles = [
        block.attn.register_forward_pre_hook(lambda m, args: inputs.append(args[0]))
        for block in model.blocks
    ]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for handle in handles:
            handle.remove()
    probabilities = []
    for block, tokens in zip(model.blocks, inputs, strict=True):
        attn = block.attn
        b, n, c = tokens.shape
        qkv = attn.qkv(tokens).reshape(b, n, 3, attn.num_heads, c // attn.num_heads)
        q, k, _ = qkv.permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-2, -1) / (c // attn.num_heads) ** 0.5
        probabilities.append(scores.softmax(-1))
    return probabilities


@pytest.fixture(scope="module")
def vit():
    torch.manual_seed(0)
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=64).eval()


def test_attention_rollout_on_timm_vit_matches_recomputed_attention(vit):
    torch.manual_seed(1)
    x = torch.randn(1, 3, 64, 64)
    expected = rollout(_probabilities_from_weights(vit, x))[0, 0, 1:].reshape(4, 4)
    flags = [block.attn.fused_attn for block in vit.blocks]
    before = model_state(vit)
    got = AttentionRollout(vit)(x[0], upsample=False, normalize=False)
    assert_untouched(vit, before)
    assert [block.attn.fused_attn for block in vit.blocks] == flags
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)
    full = AttentionRollout(vit)(x)
    assert full.shape == (1, 64, 64) and full.min() == 0 and full.max() == 1


def test_legrad_on_timm_vit_by_hand_for_the_last_block(vit):
    """Last block only: d s_c / d A with s = head(fc_norm(norm(mean tokens))), computed here by
    rebuilding the block's attention from its input (independent of the capture)."""
    torch.manual_seed(2)
    x = torch.randn(1, 3, 64, 64)
    block = vit.blocks[-1]
    inputs = []
    handle = block.register_forward_pre_hook(lambda m, args: inputs.append(args[0]))
    try:
        with torch.no_grad():
            logits = vit(x)
    finally:
        handle.remove()
    target = int(logits.argmax())
    tokens = inputs[0]
    attn = block.attn
    b, n, c = tokens.shape
    heads = attn.num_heads
    with torch.enable_grad():
        normed = block.norm1(tokens)
        q, k, v = attn.qkv(normed).reshape(b, n, 3, heads, c // heads).permute(2, 0, 3, 1, 4)
        probs = (q @ k.transpose(-2, -1) * attn.scale).softmax(-1).detach().requires_grad_(True)
        mixed = attn.proj((probs @ v).transpose(1, 2).reshape(b, n, c))
        out = tokens + block.ls1(mixed)
        out = out + block.ls2(block.mlp(block.norm2(out)))
        score = vit.head(vit.fc_norm(vit.norm(out.mean(1))))[0, target]
        (grad,) = torch.autograd.grad(score, probs)
    expected = grad.relu().mean(dim=(1, 2))[0, 1:].reshape(4, 4)
    before = model_state(vit)
    got = LeGrad(vit, ["blocks.11"])(x[0], upsample=False, normalize=False)
    assert_untouched(vit, before)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-4)
    every = LeGrad(vit)(x, target=[target])
    assert every.shape == (1, 64, 64) and torch.isfinite(every).all()
    assert every.max() - every.min() > 0.5


def test_legrad_in_chunks_explains_each_samples_own_top1(vit):
    """batch_size=1 runs one sample per pass: each chunk's top-1 class is its own sample's (the
    chunk's pinned classes were indexed with the batch's rows before, an IndexError)."""
    torch.manual_seed(3)
    x = torch.randn(3, 3, 64, 64)
    whole = LeGrad(vit, ["blocks.11"]).explain_batch(x, upsample=False, normalize=False)
    chunked = LeGrad(vit, ["blocks.11"], batch_size=1).explain_batch(
        x, upsample=False, normalize=False
    )
    torch.testing.assert_close(chunked.maps, whole.maps, atol=1e-6, rtol=1e-4)
    with torch.no_grad():
        top1 = vit(x).argmax(dim=1, keepdim=True)
    assert torch.equal(whole.targets, top1) and torch.equal(chunked.targets, top1)


def test_legrad_equals_torchcam_on_a_torchvision_vit():
    torchcam = pytest.importorskip("torchcam.methods")
    from torchvision.models.vision_transformer import VisionTransformer

    torch.manual_seed(0)
    model = VisionTransformer(
        image_size=32,
        patch_size=8,
        num_layers=3,
        num_heads=2,
        hidden_dim=32,
        mlp_dim=64,
        num_classes=5,
    ).eval()
    nn.init.normal_(model.heads.head.weight, std=0.5)  # torchvision zero-initialises the head
    x = torch.randn(2, 3, 32, 32)
    names = [name for name, _, _ in attention_blocks(model)][-2:]
    assert names == ["encoder.layers.encoder_layer_1", "encoder.layers.encoder_layer_2"]

    before = model_state(model)
    ours = LeGrad(model, names)(x, target=[1, 3], upsample=False)
    assert_untouched(model, before)
    with torchcam.LeGrad(model, names) as extractor:
        scores = model(x)
        theirs = extractor([1, 3], scores)[0]
    model.zero_grad(set_to_none=True)
    torch.testing.assert_close(ours, theirs.detach(), atol=1e-4, rtol=0)


def test_attention_errors():
    with pytest.raises(AttentionError, match="no supported attention blocks"):
        AttentionRollout(TinyNet())
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32).eval()
    with pytest.raises(AttentionError, match="are not attention blocks"):
        LeGrad(model, ["blocks.99"])
    with pytest.raises(TargetError, match="LeGrad explains classes"):
        LeGrad(model)(torch.randn(3, 32, 32), target=lambda out: out[:, 0])
    with pytest.raises(AttentionError, match="score_projection"):
        LeGrad(nn.Sequential(model.blocks[0]))


def test_legrad_on_a_data_parallel_vit_gives_the_unwrapped_models_map(vit):
    """The blocks and the default score projection are read from the explained module, so a
    ``DataParallel`` wrapper (names under ``module.``) gives the plain model's map."""
    torch.manual_seed(4)
    x = torch.randn(2, 3, 64, 64)
    expected = LeGrad(vit)(x, upsample=False, normalize=False)
    wrapped = nn.DataParallel(vit)
    torch.testing.assert_close(LeGrad(wrapped)(x, upsample=False, normalize=False), expected)

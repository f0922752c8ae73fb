"""AttnLRP through a language model's parts (HuggingFace's RMSNorm modules, rotary embeddings,
gated MLPs, grouped-query attention): checked number by number against lxt 2.1's rule functions
on a LLaMA-style block, and run through a whole tiny LLaMA and a whole tiny LLaVA."""

from __future__ import annotations

import warnings

import pytest
import torch
import vlm_kit
from torch import nn

import camkit
from camkit.errors import ConservationWarning
from camkit.relevance import Composite, Epsilon, rules_applied
from camkit.targets import TokenTarget

lxt = pytest.importorskip("lxt.explicit.functional", reason="lxt 2.1 is not installed")
lxt_rules = pytest.importorskip("lxt.explicit.rules", reason="lxt 2.1 is not installed")
llama = pytest.importorskip("transformers.models.llama.modeling_llama")

EPS = 1e-12
EXACT = Composite([(nn.Linear, Epsilon(EPS))], stabilizer=EPS, canonizers=[])


class GatedBlock(nn.Module):
    """``x -> x + down(silu(gate(n(x))) * up(n(x))) -> n2 -> head``: HuggingFace's
    ``LlamaRMSNorm`` and ``LlamaMLP``; ``lxt=True`` runs it with lxt's AttnLRP functions."""

    def __init__(self, dim: int = 8, classes: int = 3):
        super().__init__()
        config = vlm_kit.transformers.LlamaConfig(
            hidden_size=dim, intermediate_size=2 * dim, num_attention_heads=2, num_key_value_heads=2
        )
        self.norm, self.norm2 = llama.LlamaRMSNorm(dim), llama.LlamaRMSNorm(dim)
        self.mlp = llama.LlamaMLP(config)
        self.head = nn.Linear(dim, classes, bias=False)
        for norm in (self.norm, self.norm2):
            nn.init.uniform_(norm.weight, 0.5, 1.5)
        self.lxt = False

    def forward(self, x):
        if not self.lxt:
            return self.head(self.norm2(x + self.mlp(self.norm(x))))
        mlp, linear = self.mlp, lambda layer, t: lxt.linear_epsilon(t, layer.weight, None, EPS)
        h = lxt.rms_norm_identity(x, self.norm.weight, self.norm.variance_epsilon)
        gate = lxt_rules.identity(nn.functional.silu, linear(mlp.gate_proj, h))
        inner = lxt.mul2(gate, linear(mlp.up_proj, h))
        y = lxt.add2(x, linear(mlp.down_proj, inner), False, EPS)
        y = lxt.rms_norm_identity(y, self.norm2.weight, self.norm2.variance_epsilon)
        return linear(self.head, y)


def test_a_gated_block_with_llama_rms_norms_equals_lxt():
    torch.manual_seed(0)
    model = GatedBlock().double().eval()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    leaf = x.clone().requires_grad_(True)
    with rules_applied(model, EXACT):
        score = model(leaf)[..., 1]
    (grad,) = torch.autograd.grad(score.sum(), leaf)
    ours = (leaf * grad).detach()
    model.lxt = True  # lxt's backward returns relevance: seeded with the score itself
    leaf = x.clone().requires_grad_(True)
    score_lxt = model(leaf)[..., 1]
    (theirs,) = torch.autograd.grad(score_lxt, leaf, grad_outputs=score_lxt.detach())
    torch.testing.assert_close(score, score_lxt)
    scale = theirs.abs().max()
    # within the uniform rule's stabiliser (camkit divides the product by y + eps sign(y))
    assert scale > 0 and (ours - theirs).abs().max() <= 1e-6 * scale
    # bias-free: relevance is conserved, the RMS norms passing it through unchanged
    assert ours.sum().item() == pytest.approx(score.sum().item(), rel=1e-6)


class Embeddings(nn.Module):
    """A causal LM explained at its input embeddings ``(B, 1, T, D)`` (one channel)."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, x):
        return self.lm(inputs_embeds=x[:, 0]).logits


def test_lrp_runs_through_a_tiny_llama_and_each_block_conserves():
    """RMSNorm modules, rotary embeddings, gated MLPs, grouped-query attention (4 heads, 2
    key/value heads), eager and fused attention alike. What the residual stream carries is
    conserved block to block; the input embeddings get less: AttnLRP's uniform rule gives half
    of ``attn @ v``'s relevance to the attention weights, and its softmax rule keeps only part
    of that (measured here: the input sum is about 0.43 of the logit)."""
    torch.manual_seed(0)
    config = vlm_kit.transformers.LlamaConfig(**vlm_kit._text(), max_position_embeddings=64)
    lm = vlm_kit.transformers.LlamaForCausalLM(config).double().eval()
    ids = torch.tensor([[1, 5, 6, 11, 12, 13]])
    x = lm.get_input_embeddings()(ids).detach()[:, None]
    blocks = ["lm.model.norm", "lm.model.layers.0"]
    results = {}
    for attention in ("sdpa", "eager"):
        lm.config._attn_implementation = attention
        lrp = camkit.LRP(Embeddings(lm), composite="epsilon-plus", layers=blocks)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConservationWarning)  # 0.43: measured below
            results[attention] = lrp.explain_batch(x, TokenTarget(-1, 7))
    fused, eager = results["sdpa"], results["eager"]
    torch.testing.assert_close(fused.input, eager.input, atol=1e-6, rtol=1e-4)  # float32 results
    score = float(fused.scores.sum())
    for name in blocks:
        assert float(fused.layers[name].sum()) == pytest.approx(score, rel=5e-3)
    assert 0.2 < float(fused.input.sum()) / score < 0.8


def test_lrp_through_llava_image_patches_and_prompt_tokens_share_the_logit():
    """AttnLRP through the whole LLaVA (CLIP tower, projector, masked_scatter, LLaMA): the
    pixels' relevance plus the prompt tokens' (at the input embeddings; the image positions'
    embeddings are overwritten, so 0) is the token's logit within 10% (measured: 1.04); the
    language model's final norm passes it on within 1e-4."""
    model = vlm_kit.llava().double()
    embeddings = "model.language_model.embed_tokens"
    layers = [embeddings, "model.language_model.norm"]
    wrapped = camkit.KeywordInput(model, "pixel_values")
    lrp = camkit.LRP(wrapped, composite="epsilon-plus", layers=layers)
    ids = vlm_kit.prompt(vlm_kit.PATCHES)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConservationWarning)  # the pixels alone hold a part
        found = lrp.explain_batch(
            vlm_kit.image(dtype=torch.float64),
            TokenTarget(-1, 5),
            additional_forward_args={"input_ids": ids},
        )
    score = float(found.scores.sum())
    tokens = found.layers[embeddings][0, 0]
    image = ids[0] == vlm_kit.IMAGE
    assert float(tokens[image].abs().sum()) == 0
    total = float(found.input.sum()) + float(tokens[~image].sum())
    assert total / score == pytest.approx(1.0, abs=0.1)
    assert float(found.layers["model.language_model.norm"].sum()) == pytest.approx(score, rel=1e-4)

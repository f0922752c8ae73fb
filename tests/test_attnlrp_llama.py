"""AttnLRP through a whole tiny LLaMA (RMSNorm, rotary embeddings, grouped-query attention, the
SiLU-gated MLP, residual sums, the causal mask, the attention scaling), in float64: equal to lxt
2.1's own LLaMA patches (``lxt.efficient``: the Gradient x Input form of AttnLRP and CP-LRP), and
the conservation it keeps: exact up to the stabiliser with the attention weights as constants
(CP-LRP), up to the softmax rule's Taylor bias with AttnLRP's softmax rule."""

from __future__ import annotations

import importlib
import os
import sys
import types
from unittest import mock

import pytest
import torch
import vlm_kit
from torch import nn

from camkit.errors import ArgumentError
from camkit.relevance import Composite, Epsilon, composite, rules_applied

lxt = pytest.importorskip("lxt", reason="lxt 2.1 is not installed")
llama = pytest.importorskip("transformers.models.llama.modeling_llama")

EPS = 1e-12
TOKEN = 7


def lxt_patches() -> types.ModuleType:
    """``lxt.efficient.patches`` without its package's ``__init__``, which imports lxt's BERT
    patches, written for transformers 4 (``transformers.modeling_attn_mask_utils``)."""
    names = ("lxt.efficient", "lxt.efficient.rules", "lxt.efficient.patches")
    saved = {name: sys.modules.get(name) for name in names}
    package = types.ModuleType("lxt.efficient")
    package.__path__ = [os.path.join(os.path.dirname(lxt.__file__), "efficient")]
    sys.modules["lxt.efficient"] = package
    try:
        return importlib.import_module("lxt.efficient.patches")
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


class Embeddings(nn.Module):
    """The causal LM explained at its input embeddings ``(B, T, D)``."""

    def __init__(self, lm: nn.Module):
        super().__init__()
        self.lm = lm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm(inputs_embeds=x).logits


def tiny_llama(bias: bool = False, seed: int = 0) -> tuple[nn.Module, torch.Tensor]:
    """The tiny LLaMA of :mod:`vlm_kit` (2 layers, 4 heads, 2 key/value heads) in float64 and
    the embeddings of a 6-token prompt; ``bias``: every projection with a bias, N(0, 0.02)."""
    torch.manual_seed(seed)
    config = vlm_kit.transformers.LlamaConfig(
        **vlm_kit._text(), max_position_embeddings=64, attention_bias=bias, mlp_bias=bias
    )
    lm = vlm_kit.transformers.LlamaForCausalLM(config).double().eval()
    if bias:
        with torch.no_grad():
            for name, parameter in lm.named_parameters():
                if name.endswith("bias"):
                    parameter.normal_(0, 0.02)
    ids = torch.tensor([[1, 5, 6, 11, 12, 13]])
    return Embeddings(lm), lm.get_input_embeddings()(ids).detach()


def relevance(model: nn.Module, x: torch.Tensor, rules: Composite | None) -> tuple:
    """``(input relevance (B, T, D), score)`` of the last position's logit of :data:`TOKEN`;
    ``rules`` None: the plain gradient x input (lxt's patched forward)."""
    leaf = x.clone().requires_grad_(True)
    if rules is None:
        score = model(leaf)[0, -1, TOKEN]
    else:
        with rules_applied(model, rules):
            score = model(leaf)[0, -1, TOKEN]
    (grad,) = torch.autograd.grad(score, leaf)
    return (leaf * grad).detach(), float(score.detach())


def exact(**options: str) -> Composite:
    """AttnLRP's rules with the Epsilon rule on every linear layer and a stabiliser of 1e-12."""
    return Composite([(nn.Linear, Epsilon(EPS))], stabilizer=EPS, canonizers=[], **options)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("variant", ["attnlrp", "cp"])
def test_the_tiny_llama_equals_lxt_patched_llama(attention: str, variant: str) -> None:
    """lxt 2.1 patches LLaMA's RMSNorm (identity rule), gated MLP (identity on SiLU, uniform
    on the product) and attention functions (the uniform rule on q, k, v), or, for CP-LRP, stops
    the gradient at q, k and the gate; camkit's operation table gives the same relevance for
    every input entry, fused (``sdpa``) or eager attention alike."""
    patches = lxt_patches()
    model, x = tiny_llama()
    lm = model.lm
    cp = variant == "cp"
    options = {"attention": "constant", "gates": "constant"} if cp else {}
    lm.config._attn_implementation = attention
    ours, score = relevance(model, x, exact(**options))
    lm.config._attn_implementation = "eager"  # lxt patches the eager attention function
    wrap = patches.cp_wrap_attention_forward if cp else patches.wrap_attention_forward
    mlp = patches.cp_gated_mlp_forward if cp else patches.gated_mlp_forward
    with (
        mock.patch.object(llama.LlamaRMSNorm, "forward", patches.rms_norm_forward),
        mock.patch.object(llama.LlamaMLP, "forward", mlp),
        mock.patch.object(llama, "eager_attention_forward", wrap(llama.eager_attention_forward)),
    ):
        theirs, score_lxt = relevance(model, x, None)
    # transformers' eager attention takes the softmax in float32, also in a float64 model
    assert score == pytest.approx(score_lxt, rel=1e-6)
    scale = float(theirs.abs().max())
    assert scale > 0 and float((ours - theirs).abs().max()) <= 1e-6 * scale
    if not cp:  # the softmax rule's bias keeps a part of the logit, in lxt as in camkit
        assert 0.1 < float(theirs.sum()) / score_lxt < 0.9


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_with_the_attention_weights_constant_the_tiny_llama_conserves(attention: str) -> None:
    """CP-LRP (``attention="constant"``): every other rule of the LLaMA conserves, so the input
    relevance is the logit up to the stabiliser: within 1e-6 with a stabiliser of 1e-12 in
    float64 (measured 2e-8), within 1e-3 with the named composites' 1e-6 (measured 3.4e-4: the
    activations of the random model are about 1e-2)."""
    model, x = tiny_llama()
    model.lm.config._attn_implementation = attention
    found, score = relevance(model, x, exact(attention="constant"))
    assert float(found.sum()) == pytest.approx(score, rel=1e-6)
    found, score = relevance(model, x, composite("epsilon-plus", attention="constant"))
    assert float(found.sum()) == pytest.approx(score, rel=1e-3)


def test_with_attnlrp_the_softmax_keeps_its_taylor_bias() -> None:
    """AttnLRP's softmax rule, ``R_i = x_i (R_i - s_i sum_j R_j)``, keeps the Taylor expansion's
    zeroth-order term: the relevance that reaches the input is what CP-LRP gives less what the
    attention weights' half loses there. On the random LLaMA the attention is near uniform (the
    logits near 0), so that half is almost all lost: the input gets 0.79 of the logit here
    (0.43 for the token of ``test_vlm_relevance``)."""
    model, x = tiny_llama()
    attnlrp, score = relevance(model, x, exact())
    conserved, _ = relevance(model, x, exact(attention="constant"))
    share = float(attnlrp.sum()) / score
    assert share == pytest.approx(0.7885, abs=1e-3)
    assert float(conserved.sum()) / score == pytest.approx(1.0, abs=1e-6)


def test_with_biases_zero_params_keeps_them_out() -> None:
    """With biases on every projection: the Epsilon rule gives each bias its share (the input
    gets 0.47 of the logit here), ``zero_params="bias"`` none, so the input relevance is the
    logit within 1e-3 (measured 1e-5; 2e-6 to 1e-2 over three random models and both attention
    functions). Not within 1e-8 as without biases: transformers computes LLaMA's RMS norm in
    float32 even in a float64 model (and the eager softmax), and the random model's residual
    sums amplify that rounding (its attention branch and its residual nearly cancel: each
    carries several times the logit, with opposite signs)."""
    model, x = tiny_llama(bias=True)
    model.lm.config._attn_implementation = "eager"
    kept, score = relevance(model, x, exact(attention="constant"))
    rules = composite(
        "epsilon-plus", attention="constant", zero_params="bias", epsilon=EPS, stabilizer=EPS
    )
    dropped, _ = relevance(model, x, rules)
    assert float(kept.sum()) / score == pytest.approx(0.47, abs=0.01)
    assert float(dropped.sum()) == pytest.approx(score, rel=1e-3)


def test_an_unknown_attention_rule_is_refused() -> None:
    with pytest.raises(ArgumentError, match="attention must be one of"):
        composite("epsilon-plus", attention="uniform")


def test_the_fast_rules_keep_float32_within_float32_accuracy_of_float64() -> None:
    """The rules' speed tricks (one backward node per rule, the fused attention's own backward,
    the coefficients computed in place) on the whole tiny LLaVA in float32 against the same
    model in float64: two generated tokens as ``K = 2`` targets of one batched backward, equal
    to one call per token; the pixels' and the prompt tokens' relevance within 1e-4 and 1e-5 of
    their largest (measured 2.3e-5 and 1.7e-7, as before the tricks: the image tower's
    cancellations)."""
    from camkit import LRP, KeywordInput
    from camkit.targets import TokenTarget

    ids = vlm_kit.prompt(vlm_kit.PATCHES)
    embeddings = "model.language_model.embed_tokens"
    found = {}
    for dtype in (torch.float32, torch.float64):
        model = KeywordInput(vlm_kit.llava().to(dtype), "pixel_values")
        lrp = LRP(model, composite="epsilon-plus", layers=[embeddings], tolerance=None)
        x, extra = vlm_kit.image(dtype=dtype), {"additional_forward_args": {"input_ids": ids}}
        found[dtype] = lrp.explain_batch(x, TokenTarget([-1, -2], [5, 6]), **extra)
        single = lrp.explain_batch(x, TokenTarget(-2, 6), **extra)
        scale = float(single.input.abs().max())
        torch.testing.assert_close(
            found[dtype].input[:, 1:], single.input, rtol=1e-5, atol=1e-6 * scale
        )
    low, high = found[torch.float32], found[torch.float64]
    for ours, reference, accuracy in (
        (low.input, high.input, 1e-4),
        (low.layers[embeddings], high.layers[embeddings], 1e-5),
    ):
        scale = float(reference.abs().max())
        assert scale > 0
        assert float((ours.double() - reference).abs().max()) <= accuracy * scale


def test_cp_lrp_conserves_through_torch_multi_head_attention() -> None:
    """``nn.MultiheadAttention`` (``F.multi_head_attention_forward``, recomputed from its parts)
    with the attention weights constant: a bias-free block's input relevance is its score within
    1e-9 in float64; with AttnLRP's softmax rule it is not."""

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attention = nn.MultiheadAttention(8, 2, bias=False, batch_first=True)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.attention(x, x, x, need_weights=False)[0]

    torch.manual_seed(0)
    block = Block().double().eval()
    x = torch.randn(1, 5, 8, dtype=torch.float64)
    shares = {}
    for weights in ("constant", "softmax"):
        leaf = x.clone().requires_grad_(True)
        with rules_applied(block, exact(attention=weights)):
            score = block(leaf)[0, -1].sum()
        (grad,) = torch.autograd.grad(score, leaf)
        shares[weights] = float((leaf * grad).sum() / score.detach())
    assert shares["constant"] == pytest.approx(1.0, abs=1e-9)
    assert abs(shares["softmax"] - 1.0) > 1e-3

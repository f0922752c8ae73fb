"""LRP on torchvision's transformers (AttnLRP, Achtibat et al., ICML 2024): ``F.linear`` outside
a ruled module gets the Epsilon rule, ``F.multi_head_attention_forward`` (``nn.MultiheadAttention``
in torchvision's ViT) is recomputed from its parts with AttnLRP's rules, Swin's window attention
runs through the function table; tiny random configs, the model left untouched."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from conftest import Function
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode
from torchvision.models import SwinTransformer, VisionTransformer

from camkit import LRP
from camkit.errors import RelevanceError
from camkit.relevance import Composite, Epsilon, composite, rules_applied

EPS = 1e-12
EXACT = Composite([((nn.Linear, nn.Conv2d), Epsilon(EPS))], stabilizer=EPS, canonizers=[])


def _vit() -> nn.Module:
    torch.manual_seed(0)
    model = VisionTransformer(
        image_size=64, patch_size=16, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64,
        num_classes=10,
    )  # fmt: skip
    nn.init.normal_(model.heads.head.weight)  # torchvision starts the head at zero
    return model.eval()


def _swin(window: int = 4) -> nn.Module:
    torch.manual_seed(0)
    model = SwinTransformer(
        patch_size=[4, 4], embed_dim=16, depths=[2, 2], num_heads=[2, 2],
        window_size=[window, window], num_classes=10,
    )  # fmt: skip
    return model.eval()


def _bias_free(model: nn.Module) -> nn.Module:
    """A float64 copy with every bias, position embedding and relative position bias zero: only
    the input can hold relevance (the class token is zero in torchvision's ViT)."""
    model = copy.deepcopy(model).double()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("bias", "pos_embedding", "relative_position_bias_table")):
                p.zero_()
    return model


def _relevance(model: nn.Module, x: Tensor, target: int, comp=EXACT) -> Tensor:
    leaf = x.clone().requires_grad_(True)
    with rules_applied(model, comp):
        out = model(leaf)
    (grad,) = torch.autograd.grad(out[:, target].sum(), leaf)
    return (leaf * grad).detach()


def test_functional_linear_epsilon_rule_by_hand() -> None:
    """``R_j = sum_k x_j w_kj / stab(z_k) R_k`` with ``z = W x + b``, ``R = o_t e_t`` (the
    target's score), float64; the default composite drops the bias from ``z`` as its dense rule
    does (the bias then absorbs nothing: the input gets all of ``o_t``)."""
    weight = nn.Parameter(torch.tensor([[1.0, -2.0, 0.5], [0.3, 0.7, -1.1]], dtype=torch.float64))
    bias = nn.Parameter(torch.tensor([0.2, -0.4], dtype=torch.float64))
    model = Function(lambda x: F.linear(x, weight, bias))
    x = torch.tensor([[0.5, -1.0, 2.0]], dtype=torch.float64)
    t, score = 1, -3.15  # o = [3.7, -3.15]
    cases = (
        (Composite([], stabilizer=0.1, canonizers=[]), -3.15, 0.1),  # lxt's linear_epsilon
        (composite("epsilon-plus-flat-nobias"), -2.75, 1e-6),  # z without the bias
    )
    for comp, z, eps in cases:
        expected = x[0] * weight.detach()[t] * score / (z - eps)
        got = _relevance(model, x, t, comp)
        torch.testing.assert_close(got[0], expected, rtol=1e-12, atol=1e-15)
    assert _relevance(model, x, t, cases[1][0]).sum().item() == pytest.approx(score, rel=1e-6)
    assert weight.grad is None and bias.grad is None


def test_multi_head_attention_equals_its_parts() -> None:
    """torchvision's ``nn.MultiheadAttention`` (fused ``multi_head_attention_forward``) gives
    the relevance of the same attention written with explicit ops (``F.linear``, ``@``,
    ``softmax``) whose rules the function table applies, float64, without and with masks (an
    attention mask, ``True`` = masked, and a key padding mask); its returned probabilities are
    the fused function's."""
    torch.manual_seed(1)
    mha = nn.MultiheadAttention(8, 2, batch_first=True).double().eval()
    with torch.no_grad():
        mha.in_proj_bias.normal_()
        mha.out_proj.bias.normal_()
    w, b = mha.in_proj_weight, mha.in_proj_bias
    causal = torch.ones(5, 5, dtype=torch.bool).triu(1)
    padding = torch.zeros(2, 5, dtype=torch.bool)
    padding[1, 3:] = True

    def parts(x: Tensor, masked: bool) -> Tensor:
        q, k, v = (
            F.linear(x, wi, bi).unflatten(-1, (2, 4)).transpose(1, 2)
            for wi, bi in zip(w.chunk(3), b.chunk(3), strict=True)
        )
        logits = (q / math.sqrt(4)) @ k.transpose(-2, -1)
        if masked:
            drop = causal | padding[:, None, None, :]
            logits = logits + torch.zeros(drop.shape, dtype=x.dtype).masked_fill(drop, -math.inf)
        probs = logits.softmax(-1)
        mixed = (probs @ v).transpose(1, 2).flatten(2)
        return F.linear(mixed, mha.out_proj.weight, mha.out_proj.bias)

    x = torch.randn(2, 5, 8, dtype=torch.float64)
    for masked in (False, True):
        masks = {"attn_mask": causal, "key_padding_mask": padding} if masked else {}
        fused = Function(lambda x, m=masks: mha(x, x, x, need_weights=False, **m)[0].flatten(1))
        explicit = Function(lambda x, m=masked: parts(x, m).flatten(1))
        torch.testing.assert_close(fused(x), explicit(x))
        for target in (0, 17, 39):
            got, expected = _relevance(fused, x, target), _relevance(explicit, x, target)
            torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)
    # boolean masks reach the function itself only when it is called directly
    direct = Function(
        lambda x: F.multi_head_attention_forward(
            *(x.transpose(0, 1),) * 3, 8, 2, w, b, None, None, False, 0.0,
            mha.out_proj.weight, mha.out_proj.bias, training=False, key_padding_mask=padding,
            need_weights=False, attn_mask=causal,
        )[0].transpose(0, 1).flatten(1)
    )  # fmt: skip
    explicit = Function(lambda x: parts(x, True).flatten(1))
    for target in (0, 17, 39):
        got, expected = _relevance(direct, x, target), _relevance(explicit, x, target)
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)
    leaf = x.clone().requires_grad_(True)
    with rules_applied(mha, EXACT):
        out, weights = mha(leaf, leaf, leaf, attn_mask=causal)
    plain_out, plain_weights = mha(x, x, x, attn_mask=causal)
    assert torch.equal(out, plain_out) and torch.equal(weights, plain_weights)


class _Softmaxes(TorchFunctionMode):
    """Records every softmax's ``(input, output)`` (entered before :func:`rules_applied`, it sees
    the operations inside the rules' handlers too)."""

    def __init__(self) -> None:
        super().__init__()
        self.pairs: list[tuple[Tensor, Tensor]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if getattr(func, "__name__", "") == "softmax" and out.requires_grad:
            self.pairs.append((args[0], out))
        return out


@pytest.mark.parametrize(
    ("build", "blocks"), [(_vit, 2), (lambda: _swin(window=16), 4)], ids=["vit", "swin"]
)
def test_bias_free_transformer_conserves_up_to_the_softmax_rule(build, blocks: int) -> None:
    """Bias-free, float64, Epsilon(1e-12): the target score equals the input relevance plus what
    the softmax rules drop (AttnLRP Prop. 3.1 drops the linearisation's bias term; relevance at
    each softmax's output minus that at its input) within 1e-8 of the score. (Swin with windows
    as large as the feature maps: no shift, so no shift mask, a constant that absorbs relevance.)"""
    model = _bias_free(build())
    x = torch.rand(2, 3, 64, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    for target in (2, 7):
        leaf = x.clone().requires_grad_(True)
        recorder = _Softmaxes()
        with recorder, rules_applied(model, EXACT):
            out = model(leaf)
        assert len(recorder.pairs) == blocks  # one softmax per block
        score = out[:, target]
        tensors = [leaf, *(t for pair in recorder.pairs for t in pair)]
        grads = torch.autograd.grad(score.sum(), tensors)
        shares = [(t * g).detach().flatten(1).sum(1) for t, g in zip(tensors, grads, strict=True)]
        dropped = sum(shares[2 + 2 * i] - shares[1 + 2 * i] for i in range(len(recorder.pairs)))
        torch.testing.assert_close(shares[0] + dropped, score.detach(), rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("build", [_vit, _swin], ids=["vit", "swin"])
def test_lrp_leaves_the_model_untouched(build) -> None:
    """LRP with the default composite runs on the tiny ViT and the shifted-window Swin: a finite
    map, a conservation report; parameters and buffers bitwise, no hook, no ``.grad``, the mode."""
    model = build()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(4))
    lrp = LRP(model, tolerance=None)
    maps = lrp(x, target=3)
    assert maps.shape[0] == 2 and bool(torch.isfinite(maps).all()) and bool(maps.abs().sum() > 0)
    share = lrp.conservation["input"]
    assert share.shape == (2, 1) and bool(torch.isfinite(share).all())
    assert not model.training
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key
    assert all(p.grad is None for p in model.parameters())
    for m in model.modules():
        assert not (m._forward_hooks or m._forward_pre_hooks or m._backward_hooks), m


def test_unsupported_attention_and_linear_options_raise() -> None:
    """What the rules do not cover is refused, naming it: MHA with ``add_zero_attn``, an
    ``F.linear`` whose weight is an activation, and an operation with no rule (``exp``)."""
    mha = nn.MultiheadAttention(8, 2, batch_first=True, add_zero_attn=True).eval()
    x = torch.randn(1, 3, 8)
    with pytest.raises(RelevanceError, match="multi_head_attention_forward with add_zero_attn"):
        _relevance(Function(lambda x: mha(x, x, x)[0].flatten(1)), x, 0)
    with pytest.raises(RelevanceError, match="F.linear with a weight computed from the input"):
        _relevance(Function(lambda x: F.linear(x, x[0]).flatten(1)), x, 0)
    with pytest.raises(RelevanceError, match="exp on the relevance path has no LRP rule"):
        _relevance(Function(lambda x: F.linear(x, mha.out_proj.weight).exp().flatten(1)), x, 0)

"""AttnLRP's rules (Achtibat et al., ICML 2024) number by number on hand-built operations,
fused attention equal to the unfused one, and timm transformers explained end to end."""

from __future__ import annotations

import pytest
import timm
import torch
from conftest import Function
from torch import Tensor, nn

import camkit
from camkit import LRP
from camkit.relevance import Composite, Epsilon, rules_applied

EXACT = Composite([((nn.Linear, nn.Conv2d), Epsilon(1e-12))], stabilizer=1e-12, canonizers=[])
X = torch.tensor([[0.5, -1.0, 2.0, 1.5]], dtype=torch.float64)


def _relevance(model: nn.Module, x: Tensor, target: int) -> Tensor:
    leaf = x.clone().requires_grad_(True)
    with rules_applied(model, EXACT):
        out = model(leaf)
    (grad,) = torch.autograd.grad(out[:, target].sum(), leaf)
    return (leaf * grad).detach()


def test_softmax_rule_by_hand() -> None:
    """``R_j = x_j (R_j - s_j sum R)`` with ``R = s_i e_i`` (the target's probability)."""
    s = X.softmax(1)[0]
    i = 2
    expected = X[0] * s[i] * (torch.eye(4, dtype=X.dtype)[i] - s)
    got = _relevance(Function(lambda x: torch.softmax(x, dim=1)), X, i)
    torch.testing.assert_close(got[0], expected, rtol=1e-12, atol=1e-15)


def test_matmul_uniform_rule_by_hand() -> None:
    """``y = [x0, x1] @ [x2, x3]^T = x0 x2 + x1 x3 = 0.5 - 1.5 = -1``: each factor of each
    product gets half of it, ``R = [x0 x2, x1 x3, x0 x2, x1 x3] / 2``, summing to ``y``."""
    model = Function(lambda x: (x[:, None, :2] @ x[:, 2:, None]).flatten(1))
    got = _relevance(model, X, 0)
    expected = torch.tensor([[1.0, -1.5, 1.0, -1.5]], dtype=X.dtype) / 2
    torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-12)
    gate = _relevance(Function(lambda x: x[:, :2] * x[:, 2:]), X, 1)  # an element-wise gate
    torch.testing.assert_close(gate, torch.tensor([[0.0, -0.75, 0.0, -0.75]], dtype=X.dtype))


def test_layer_norm_identity_rule_by_hand() -> None:
    """The standard deviation taken as a constant: ``R_j = x_j w_k (delta_jk - 1/n) / std``,
    summing to ``y_k - b_k``."""
    norm = nn.LayerNorm(4).double()
    with torch.no_grad():
        norm.weight.copy_(torch.tensor([1.0, 2.0, -1.0, 0.5]))
        norm.bias.copy_(torch.tensor([0.1, -0.2, 0.3, 0.0]))
    k = 1
    std = (X.var(unbiased=False) + norm.eps).sqrt()
    expected = X[0] * norm.weight[k].detach() * (torch.eye(4, dtype=X.dtype)[k] - 0.25) / std
    got = _relevance(norm, X, k)
    torch.testing.assert_close(got[0], expected, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(got.sum(), (norm(X)[0, k] - norm.bias[k]).detach())


def _vit(name: str, **config) -> nn.Module:
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, img_size=32, num_classes=10, **config)
    return model.double().eval()


def test_fused_attention_equals_the_unfused_one() -> None:
    """timm's ``fused_attn`` (``F.scaled_dot_product_attention``) and its explicit
    ``softmax(q k^T) v`` give the same relevance."""
    fused = _vit("vit_tiny_patch16_224", patch_size=8, depth=2, embed_dim=24, num_heads=2)
    plain = _vit("vit_tiny_patch16_224", patch_size=8, depth=2, embed_dim=24, num_heads=2)
    for block in plain.blocks:
        block.attn.fused_attn = False
    assert all(block.attn.fused_attn for block in fused.blocks)
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    a, b = LRP(fused)(x, 3), LRP(plain)(x, 3)
    torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6 * float(b.abs().max()))


class _MLPBlock(nn.Module):
    """A pre-norm transformer block without attention, bias-free: LayerNorm, GELU MLP, residual."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(2)
        self.norm = nn.LayerNorm(8, bias=False)
        self.fc1, self.fc2 = nn.Linear(8, 16, bias=False), nn.Linear(16, 8, bias=False)
        self.head = nn.Linear(8, 3, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.fc2(nn.functional.gelu(self.fc1(self.norm(x))))
        return self.head(x.mean(1))


def test_a_bias_free_norm_and_mlp_block_conserves() -> None:
    model = _MLPBlock().double()
    x = torch.randn(2, 5, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    got = _relevance(model, x, 1)
    torch.testing.assert_close(got.flatten(1).sum(1), model(x)[:, 1].detach(), rtol=1e-8, atol=0)


def test_timm_vit_deit_and_swin_are_explained() -> None:
    """Every operation of timm's ViT, DeiT and Swin has a rule: finite relevance for K targets,
    and the conservation report says how much reached the input."""
    models = [
        _vit("vit_tiny_patch16_224", patch_size=8, depth=2, embed_dim=24, num_heads=2),
        _vit("deit_tiny_patch16_224", patch_size=8, depth=2, embed_dim=24, num_heads=2),
        _vit(
            "swin_tiny_patch4_window7_224",
            patch_size=4,
            window_size=4,
            embed_dim=12,
            depths=(1, 1),
            num_heads=(1, 2),
        ),
    ]
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    for model in models:
        found = LRP(model.float()).explain_batch(x.float(), [[1, 2], [3, 4]])
        assert found.input.shape == (2, 2, 3, 32, 32) and torch.isfinite(found.input).all()
        assert torch.isfinite(found.conservation["input"]).all()
    assert camkit.METHODS["lrp"].cls is LRP


def _bias_free(name: str, seed: int) -> nn.Module:
    """A random 2-block timm model with every bias, the class / distillation token and the
    position embedding zero (nothing but the input can hold relevance), attention unfused."""
    torch.manual_seed(seed)
    model = timm.create_model(
        name, pretrained=False, img_size=32, num_classes=10, patch_size=8, depth=2, embed_dim=24
    )
    with torch.no_grad():
        for name_, parameter in model.named_parameters():
            if name_.endswith("bias") or "token" in name_ or "pos_embed" in name_:
                parameter.zero_()
    for block in model.blocks:
        block.attn.fused_attn = False
    return model.double().eval()


@pytest.mark.parametrize("name", ["vit_tiny_patch16_224", "deit_tiny_distilled_patch16_224"])
def test_timm_vit_and_deit_conserve_up_to_the_softmax_rule(name: str) -> None:
    """On a bias-free ViT / DeiT the target score is the input relevance plus what AttnLRP's
    softmax rule drops (its linearisation's bias term, Prop. 3.1: the relevance at the softmax
    output minus the relevance at its input ``q k^T``, read at the recorded ``attn_drop`` and
    ``q_norm`` / ``k_norm``), within 1e-4 of the score (the results are float32; measured
    2e-5). The input alone gets 0.15-0.8 of the score (docs/relevance.md)."""
    exact = Composite([((nn.Linear, nn.Conv2d), Epsilon(1e-9))], stabilizer=1e-9, canonizers=[])
    parts = ("attn_drop", "q_norm", "k_norm")
    for seed in range(2):
        model = _bias_free(name, seed)
        layers = [f"blocks.{i}.attn.{part}" for i in range(2) for part in parts]
        x = torch.randn(
            3, 3, 32, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)
        )
        found = LRP(model, composite=exact, layers=layers).explain_batch(x, [[0, 1]] * 3)
        total = {key: r.flatten(2).sum(-1) for key, r in found.layers.items()}
        dropped = sum(
            total[f"blocks.{i}.attn.attn_drop"]
            - total[f"blocks.{i}.attn.q_norm"]
            - total[f"blocks.{i}.attn.k_norm"]
            for i in range(2)
        )
        reached = found.input.flatten(2).sum(-1)
        torch.testing.assert_close(reached + dropped, found.scores, rtol=1e-4, atol=0)
        assert ((found.conservation["input"] > 0.1) & (found.conservation["input"] < 0.95)).all()

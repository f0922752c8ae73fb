"""camkit's transformer LRP against ``lxt`` 2.1, the AttnLRP reference (Achtibat et al., ICML
2024), on a one-block vision transformer built by hand with random weights.

lxt 2.1 cannot run a torchvision ViT here: ``lxt.efficient`` (its torchvision patch map) imports
``transformers.modeling_attn_mask_utils`` and ``lxt.explicit.core`` imports
``transformers.utils.fx``, both gone from the installed transformers 5. Its rule functions
(``lxt.explicit.functional``, ``lxt.explicit.rules``) import only torch, and are what both of
those entry points apply: the same network is written once with them (lxt propagates relevance
itself, each function's backward returning the relevance of its inputs) and once with plain torch
operations under :func:`camkit.relevance.rules_applied`. Install: ``pip install --no-deps
lxt==2.1`` (its declared dependencies, bitsandbytes and open_clip, are not needed by these
modules).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from camkit.relevance import Composite, Epsilon, rules_applied

lxt = pytest.importorskip("lxt.explicit.functional", reason="lxt 2.1 is not installed")
lxt_rules = pytest.importorskip("lxt.explicit.rules", reason="lxt 2.1 is not installed")

EPS = 1e-12
EXACT = Composite([(nn.Linear, Epsilon(EPS))], stabilizer=EPS, canonizers=[])


class _OneBlockViT(nn.Module):
    """Patches (4x4) -> linear embedding + position -> pre-norm block (2-head self-attention,
    GELU MLP, both residual) -> layer norm -> mean over tokens -> linear head. ``lxt=True`` runs
    it with lxt's AttnLRP functions (same numbers forward)."""

    def __init__(self, dim: int = 8, heads: int = 2, classes: int = 5):
        super().__init__()
        self.heads = heads
        self.embed = nn.Linear(3 * 16, dim)
        self.pos = nn.Parameter(torch.randn(1, 4, dim) * 0.1)
        self.norm1, self.norm2, self.norm = nn.LayerNorm(dim), nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc1, self.fc2 = nn.Linear(dim, 2 * dim), nn.Linear(2 * dim, dim)
        self.head = nn.Linear(dim, classes)
        for norm in (self.norm1, self.norm2, self.norm):  # affine parameters that do something
            nn.init.uniform_(norm.weight, 0.5, 1.5)
            nn.init.uniform_(norm.bias, -0.1, 0.1)
        self.lxt = False

    def _linear(self, layer: nn.Linear, x: Tensor) -> Tensor:
        return lxt.linear_epsilon(x, layer.weight, layer.bias, EPS) if self.lxt else layer(x)

    def _norm(self, norm: nn.LayerNorm, x: Tensor) -> Tensor:
        if self.lxt:  # lxt.layer_norm fixes its stabiliser at 1e-6: its Function takes one
            return lxt.layer_norm_grad_fn.apply(x, norm.weight, norm.bias, norm.eps, EPS)
        return norm(x)

    def _add(self, a: Tensor, b: Tensor) -> Tensor:
        return lxt.add2(a, b, False, EPS) if self.lxt else a + b

    def _matmul(self, a: Tensor, b: Tensor) -> Tensor:
        return lxt.matmul(a, b, False, EPS) if self.lxt else a @ b

    def forward(self, x: Tensor) -> Tensor:
        b = x.shape[0]
        patches = x.unfold(2, 4, 4).unfold(3, 4, 4)  # (B, 3, 2, 2, 4, 4)
        tokens = patches.permute(0, 2, 3, 1, 4, 5).reshape(b, 4, 48)
        h = self._add(self._linear(self.embed, tokens), self.pos)
        qkv = self._linear(self.qkv, self._norm(self.norm1, h))
        q, k, v = qkv.unflatten(-1, (3, self.heads, -1)).permute(2, 0, 3, 1, 4).unbind(0)
        logits = self._matmul(q, k.transpose(-2, -1))  # the 1/sqrt(d) scale is in the weights
        attn = lxt.softmax(logits, -1) if self.lxt else logits.softmax(-1)
        mixed = self._matmul(attn, v).transpose(1, 2).flatten(2)
        h = self._add(h, self._linear(self.proj, mixed))
        up = self._linear(self.fc1, self._norm(self.norm2, h))
        up = lxt_rules.identity(F.gelu, up) if self.lxt else F.gelu(up)
        h = self._add(h, self._linear(self.fc2, up))
        pooled = self._norm(self.norm, h)
        pooled = lxt.mean(pooled, 1, False, EPS) if self.lxt else pooled.mean(1)
        return self._linear(self.head, pooled)


def _model() -> _OneBlockViT:
    torch.manual_seed(0)
    return _OneBlockViT().double().eval()


def test_the_same_forward_both_ways() -> None:
    model, x = _model(), torch.randn(3, 3, 8, 8, dtype=torch.float64)
    plain = model(x)
    model.lxt = True
    torch.testing.assert_close(model(x), plain, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("target", [0, 3])
def test_equal_to_lxt_attnlrp_on_a_one_block_vit(target: int) -> None:
    """Input relevance equal to lxt's within 1e-8 of the map's largest value (float64, both
    stabilisers 1e-12: the remaining difference is lxt's ``z + eps`` against camkit's (and
    zennit's) ``z + eps * sign(z)``)."""
    model = _model()
    x = torch.randn(3, 3, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    leaf = x.clone().requires_grad_(True)
    with rules_applied(model, EXACT):
        score = model(leaf)[:, target]
    (grad,) = torch.autograd.grad(score.sum(), leaf)
    ours = (leaf * grad).detach()

    model.lxt = True
    leaf = x.clone().requires_grad_(True)
    score_lxt = model(leaf)[:, target]
    (theirs,) = torch.autograd.grad(score_lxt, leaf, grad_outputs=score_lxt.detach())

    scale = theirs.abs().max()
    assert scale > 0
    assert (ours - theirs).abs().max() <= 1e-8 * scale
    # AttnLRP conserves up to what the biases absorb: the same share both ways
    torch.testing.assert_close(ours.flatten(1).sum(1), theirs.flatten(1).sum(1), rtol=1e-8, atol=0)

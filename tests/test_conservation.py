"""Conservation: the rules' ``zero_params`` against zennit's, the conservation record of an LRP
result against the sums computed by hand, the gate rule on a product of two operands, and the
default composite on the packaged model and the shipped photos."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from camkit.relevance import (
    AlphaBeta,
    Epsilon,
    Flat,
    Gamma,
    Rule,
    WSquare,
    ZBox,
    ZPlus,
    composite,
    rules_applied,
)

zennit = pytest.importorskip("zennit")
from zennit import rules as zr  # noqa: E402
from zennit.attribution import Gradient  # noqa: E402
from zennit.composites import LayerMapComposite  # noqa: E402

RULES = {
    "epsilon": (lambda z: Epsilon(1e-3, zero_params=z), lambda z: zr.Epsilon(1e-3, zero_params=z)),
    "zplus": (lambda z: ZPlus(zero_params=z), lambda z: zr.ZPlus(zero_params=z)),
    "gamma": (lambda z: Gamma(0.25, zero_params=z), lambda z: zr.Gamma(0.25, zero_params=z)),
    "alphabeta": (
        lambda z: AlphaBeta(2.0, 1.0, zero_params=z),
        lambda z: zr.AlphaBeta(2.0, 1.0, zero_params=z),
    ),
    "wsquare": (lambda z: WSquare(zero_params=z), lambda z: zr.WSquare(zero_params=z)),
    "flat": (lambda z: Flat(zero_params=z), lambda z: zr.Flat(zero_params=z)),
    "zbox": (
        lambda z: ZBox(-3.0, 3.0, zero_params=z),
        lambda z: zr.ZBox(-3.0, 3.0, zero_params=z),
    ),
}


def _layer(kind: str) -> tuple[nn.Module, Tensor]:
    generator = torch.Generator().manual_seed(3)
    if kind == "linear":
        layer, shape = nn.Linear(6, 4), (2, 6)
    else:
        layer, shape = nn.Conv2d(3, 4, 3, padding=1), (2, 3, 5, 5)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=generator))
    x = torch.randn(shape, generator=generator)
    return nn.Sequential(layer).double(), x.double()


def _camkit_relevance(model: nn.Module, x: Tensor, rule: Rule, target: int) -> Tensor:
    leaf = x.clone().requires_grad_(True)
    with rules_applied(model, composite([((nn.Linear, nn.Conv2d), rule)])):
        out = model(leaf)
    (grad,) = torch.autograd.grad(out.flatten(1)[:, target].sum(), leaf)
    return leaf.detach() * grad


def _zennit_relevance(model: nn.Module, x: Tensor, rule: object, target: int) -> Tensor:
    """zennit starts from a one-hot output relevance, camkit from the score: a factor."""
    with torch.no_grad():
        out = model(x)
    one_hot = torch.zeros_like(out).flatten(1)
    one_hot[:, target] = 1
    layer_map = LayerMapComposite([((nn.Linear, nn.Conv2d), rule)])
    with Gradient(model=model, composite=layer_map) as attributor:
        _, relevance = attributor(x, one_hot.view_as(out))
    score = out.flatten(1)[:, target]
    return relevance * score.view(-1, *[1] * (x.dim() - 1))


@pytest.mark.parametrize("kind", ["linear", "conv"])
@pytest.mark.parametrize("name", list(RULES))
@pytest.mark.parametrize("zero_params", [None, "bias"])
def test_zero_params_equal_to_zennit(name: str, kind: str, zero_params: str | None) -> None:
    """Every parametrised rule with zennit's ``zero_params``: zennit 0.5.1's numbers, float64,
    within 1e-6 of the map's largest value."""
    model, x = _layer(kind)
    ours, theirs = RULES[name]
    target = 2 if kind == "linear" else 37
    expected = _zennit_relevance(model, x, theirs(zero_params), target)
    got = _camkit_relevance(model, x, ours(zero_params), target)
    assert expected.abs().max() > 0
    assert (got - expected).abs().max() <= 1e-6 * expected.abs().max()


def test_zero_params_changes_the_numbers_where_there_is_a_bias() -> None:
    """The parity above is not vacuous: with the bias dropped, ZPlus gives other numbers, and the
    layer's input relevance sums to its output's (conservation)."""
    model, x = _layer("conv")
    x = x.abs()
    kept = _camkit_relevance(model, x, ZPlus(), 37)
    dropped = _camkit_relevance(model, x, ZPlus(zero_params="bias"), 37)
    score = model(x).flatten(1)[:, 37]
    assert (kept - dropped).abs().max() > 1e-3
    assert torch.allclose(dropped.flatten(1).sum(1), score.detach(), rtol=1e-5, atol=0)


@pytest.mark.parametrize("bad", ["weight", ["bias", "running_mean"], 3])
def test_zero_params_other_than_bias_is_refused(bad: object) -> None:
    from camkit.errors import ArgumentError

    with pytest.raises(ArgumentError, match="zero_params"):
        ZPlus(zero_params=bad)

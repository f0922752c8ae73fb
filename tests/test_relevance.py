"""LRP (camkit.relevance): every rule by hand on a layer with known weights, the modified
gradient's contract (``x * grad_x`` is the relevance, linear in the incoming gradient),
functional operations, canonizers, the model left untouched, and the LRP method."""

from __future__ import annotations

import threading

import pytest
import torch
import torch.nn.functional as F
from conftest import Function
from hypothesis import given, settings
from hypothesis import strategies as st
from matrix_kit import KINDS, Tripwire, assert_untouched, model_state, tripwire
from torch import Tensor, nn

import camkit
from camkit import LRP
from camkit.errors import ArgumentError, ConservationWarning, RelevanceError
from camkit.relevance import (
    AlphaBeta,
    Composite,
    Epsilon,
    Flat,
    Gamma,
    Norm,
    Pass,
    WSquare,
    ZBox,
    ZPlus,
    rules_applied,
)

# one dense layer: W = [[1, -2], [3, 1]], b = [0.5, -1]; x = [2, 1]: z = [0.5, 6]; target 0, so
# R_out = z_0 = 0.5 (the relevance that enters is the target's score)
W = torch.tensor([[1.0, -2.0], [3.0, 1.0]], dtype=torch.float64)
B = torch.tensor([0.5, -1.0], dtype=torch.float64)
X = torch.tensor([[2.0, 1.0]], dtype=torch.float64)


def _dense() -> nn.Linear:
    layer = nn.Linear(2, 2).double()
    with torch.no_grad():
        layer.weight.copy_(W)
        layer.bias.copy_(B)
    return layer


def _relevance(model: nn.Module, x: Tensor, spec, target: int = 0) -> Tensor:
    """``x * grad_x`` of output ``target`` under ``rules_applied``."""
    leaf = x.clone().requires_grad_(True)
    with rules_applied(model, spec):
        out = model(leaf)
    (grad,) = torch.autograd.grad(out[:, target].sum(), leaf)
    return (leaf * grad).detach()


def _only(rule) -> Composite:
    return Composite([(nn.Linear, rule)], canonizers=[])


HAND = {
    # R_j = x_j w_0j / (z_0 + eps) R = [2, -2] / 0.6 * 0.5
    "epsilon": (Epsilon(0.1), [2 / 0.6 * 0.5, -2 / 0.6 * 0.5]),
    # z+ = x+ w+ + b+ = 2 + 0.5: R = [2, 0] / 2.5 * 0.5
    "zplus": (ZPlus(), [0.4, 0.0]),
    # z+ = 2.5, z- = x+ w- + b- = -2: R = 2 [2, 0] / 2.5 * 0.5 - [0, -2] / -2 * 0.5
    "alphabeta": (AlphaBeta(2, 1), [0.8, -0.5]),
    # o > 0: w + 0.5 w+ = [1.5, -2], b + 0.5 b+ = 0.75, z = 3 - 2 + 0.75: R = [3, -2] / 1.75 * 0.5
    "gamma": (Gamma(0.5), [3 / 1.75 * 0.5, -2 / 1.75 * 0.5]),
    # every weight 1, no bias: R = [1, 1] / 2 * 0.5
    "flat": (Flat(), [0.25, 0.25]),
    # w^2 = [1, 4], b^2 = 0.25: R = [1, 4] / 5.25 * 0.5
    "wsquare": (WSquare(), [1 / 5.25 * 0.5, 4 / 5.25 * 0.5]),
    # l = -1, h = 3: x w - l w+ - h w- = [2 + 1, -2 + 6], z = 7 + b - b+ - b- = 7:
    # R = [3, 4] / 7 * 0.5
    "zbox": (ZBox(-1.0, 3.0), [3 / 7 * 0.5, 4 / 7 * 0.5]),
}


@pytest.mark.parametrize("name", list(HAND))
def test_each_rule_by_hand_on_a_dense_layer(name: str) -> None:
    rule, expected = HAND[name]
    relevance = _relevance(_dense(), X, _only(rule))
    # the stabiliser (1e-6) moves the numbers by about 1e-6 of their size
    torch.testing.assert_close(
        relevance[0], torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-5
    )


class _Elementwise(nn.Module):
    """``[silu(x0), silu(x1)]`` and ``x0 + x1`` (a sum of two tensors on the path), side by
    side; ``avg_pool1d`` of both."""

    def forward(self, x: Tensor) -> Tensor:
        a, b = x[:, :1], x[:, 1:]
        pooled = F.avg_pool1d(x[:, None], 2)[:, 0]
        upsampled = F.interpolate(x[:, None], scale_factor=2, mode="linear")[:, 0]
        return torch.cat([F.silu(x), a + b, pooled, upsampled.sum(1, keepdim=True)], dim=1)


def test_pass_and_norm_by_hand() -> None:
    """Pass: ``R_x = R_o`` for an activation (silu(2) goes to x0 whole). Norm: a sum shares its
    score in proportion, ``[2, 1] / 3 * 3``; average pooling likewise,
    ``[2 / 2, 1 / 2] / 1.5 * 1.5``; linear upsampling (summed: 6) likewise, ``[4, 2]``."""
    model = _Elementwise()
    silu = _relevance(model, X, Composite([], canonizers=[]), target=0)
    torch.testing.assert_close(
        silu[0], torch.tensor([F.silu(X[0, 0]).item(), 0.0], dtype=torch.float64)
    )
    for target, expected in ((2, X[0]), (3, X[0] / 2), (4, 2 * X[0])):
        shared = _relevance(model, X, Composite([], canonizers=[]), target=target)
        torch.testing.assert_close(shared[0], expected, rtol=1e-5, atol=0)


def test_rules_as_objects_say_their_formula_and_paper() -> None:
    for rule in (Epsilon, ZPlus, AlphaBeta, Gamma, Flat, WSquare, ZBox, Pass, Norm):
        doc = rule.__doc__
        assert "R_" in doc and any(year in doc for year in ("2015", "2017", "2019")), rule
    with pytest.raises(ArgumentError, match="alpha - beta = 1"):
        AlphaBeta(3, 1)


def _bias_free_net() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 6, 3, padding=1, bias=False),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(6, 8, 3, padding=1, bias=False),
        nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 5, bias=False),
    )
    return model.double().eval()


def test_epsilon_to_zero_is_gradient_times_input_and_conserves() -> None:
    """Bias-free ReLU network, LRP-epsilon with epsilon -> 0: gradient x input, and the input
    relevance sums to the target score (Bach et al. 2015; Montavon et al. 2019 sec. 10.2)."""
    model = _bias_free_net()
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    spec = Composite([((nn.Conv2d, nn.Linear), Epsilon(1e-12))], stabilizer=1e-12)
    relevance = _relevance(model, x, spec, target=2)
    leaf = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(model(leaf)[:, 2].sum(), leaf)
    torch.testing.assert_close(relevance, x * grad, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(relevance.flatten(1).sum(1), model(x)[:, 2], rtol=0, atol=1e-5)


def test_the_backward_is_linear_in_the_incoming_gradient() -> None:
    """Masking the gradient at a recorded layer per channel and continuing the backward gives
    relevances that add up to the unmasked one (what concept relevance relies on)."""
    model = _bias_free_net()
    x = torch.randn(1, 3, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    leaf = x.clone().requires_grad_(True)
    spec = camkit.relevance.composite("epsilon-plus", epsilon=1e-12, stabilizer=1e-12)
    with rules_applied(model, spec, record=["3"]) as session:
        out = model(leaf)
    (act,) = session.recorded["3"]
    (g_act,) = torch.autograd.grad(out[:, 1].sum(), act, retain_graph=True)
    parts = []
    for channels in ([0, 1, 2], [3, 4, 5, 6, 7]):
        mask = torch.zeros_like(g_act)
        mask[:, channels] = 1
        (g,) = torch.autograd.grad(act, leaf, grad_outputs=g_act * mask, retain_graph=True)
        parts.append(leaf.detach() * g)
    (g,) = torch.autograd.grad(out[:, 1].sum(), leaf)
    torch.testing.assert_close(parts[0] + parts[1], leaf.detach() * g, rtol=1e-10, atol=1e-14)
    # the layer's relevance A * dS/dA sums to the score too (epsilon-plus on a bias-free net)
    torch.testing.assert_close((act * g_act).sum(), out[0, 1], rtol=1e-8, atol=0)


class _Residual(nn.Module):
    """A residual block written in forward: ``x + conv2(F.relu(conv1(x)))``, functional ReLUs."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.stem = nn.Conv2d(3, 4, 3, padding=1, bias=False)
        self.conv1 = nn.Conv2d(4, 4, 3, padding=1, bias=False)
        self.conv2 = nn.Conv2d(4, 4, 3, padding=1, bias=False)
        self.head = nn.Linear(4, 3, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        h = F.relu(self.stem(x))
        h = h + self.conv2(F.relu(self.conv1(h)))
        h = torch.relu(h)
        return self.head(torch.flatten(F.adaptive_avg_pool2d(h, 1), 1))


class _Sum(nn.Module):
    def forward(self, a: Tensor, b: Tensor) -> Tensor:
        return torch.stack([a, b], dim=-1).sum(-1)


class _ResidualModules(_Residual):
    """The same network with modules only (zennit's canonical form: a ``Sum`` module)."""

    def __init__(self):
        super().__init__()
        self.relu1, self.relu2, self.relu3 = nn.ReLU(), nn.ReLU(), nn.ReLU()
        self.add, self.pool = _Sum(), nn.AdaptiveAvgPool2d(1)

    def forward(self, x: Tensor) -> Tensor:
        h = self.relu1(self.stem(x))
        h = self.relu3(self.add(h, self.conv2(self.relu2(self.conv1(h)))))
        return self.head(torch.flatten(self.pool(h), 1))


def test_a_residual_written_in_forward_conserves_like_its_module_version() -> None:
    """zennit passes relevance through a ``+`` in forward by its gradient, to both branches
    (counted twice); camkit gives it the Norm rule: the same relevance as the module version
    with an explicit sum, and the score is conserved."""
    functional, modules = _Residual().double(), _ResidualModules().double()
    modules.load_state_dict(functional.state_dict())
    x = torch.rand(2, 3, 6, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    spec = Composite([((nn.Conv2d, nn.Linear), Epsilon(1e-9))], stabilizer=1e-9)
    a, b = _relevance(functional, x, spec, 1), _relevance(modules, x, spec, 1)
    torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-14)
    torch.testing.assert_close(a.flatten(1).sum(1), functional(x)[:, 1], rtol=1e-6, atol=1e-9)


class _Softmaxed(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: Tensor) -> Tensor:
        h = self.fc(x.flatten(1))
        return torch.exp(h) @ h.T


def test_an_operation_without_a_rule_raises_with_its_name_and_line() -> None:
    model = _Softmaxed()
    state = model_state(model)
    with pytest.raises(RelevanceError, match=r"exp on .*test_relevance.py:\d+"):
        _relevance(model, torch.rand(2, 4), Composite([(nn.Linear, Epsilon())], canonizers=[]))
    assert_untouched(model, state)


class _ConvBN(nn.Module):
    """``bn_a -> conv_a`` (BatchNorm before, no padding) and ``conv_b -> bn_b`` (after)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(5)
        self.bn_a, self.conv_a = nn.BatchNorm2d(3), nn.Conv2d(3, 4, 3)
        self.conv_b, self.bn_b = nn.Conv2d(4, 5, 3, padding=1), nn.BatchNorm2d(5)
        self.head = nn.Linear(5, 3)
        for bn in (self.bn_a, self.bn_b):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
            bn.weight.data.uniform_(0.5, 1.5)
            bn.bias.data.uniform_(-0.5, 0.5)
        self.double().eval()

    def forward(self, x: Tensor) -> Tensor:
        h = F.relu(self.conv_a(self.bn_a(x)))
        h = F.relu(self.bn_b(self.conv_b(h)))
        return self.head(F.adaptive_avg_pool2d(h, 1).flatten(1))


def _merged(model: _ConvBN) -> nn.Module:
    """The same network with both BatchNorms folded into the convolutions by hand."""
    merged = _ConvBN()
    merged.load_state_dict(model.state_dict())
    a, b = model.bn_a, model.bn_b
    scale_a = a.weight / (a.running_var + a.eps).sqrt()
    shift_a = a.bias - a.running_mean * scale_a
    scale_b = b.weight / (b.running_var + b.eps).sqrt()
    with torch.no_grad():
        w = model.conv_a.weight
        merged.conv_a.weight.copy_(w * scale_a.view(1, -1, 1, 1))
        merged.conv_a.bias.copy_(model.conv_a.bias + (w * shift_a.view(1, -1, 1, 1)).sum((1, 2, 3)))
        merged.conv_b.weight.copy_(model.conv_b.weight * scale_b.view(-1, 1, 1, 1))
        merged.conv_b.bias.copy_((model.conv_b.bias - b.running_mean) * scale_b + b.bias)
        for bn in (merged.bn_a, merged.bn_b):
            bn.reset_parameters()
            bn.eps = 0.0
    return merged


@pytest.mark.parametrize("name", ["epsilon-plus", "epsilon-gamma-box", "epsilon-alpha2-beta1"])
def test_batch_norm_merged_in_either_order_equals_the_merged_network(name: str) -> None:
    model = _ConvBN()
    x = torch.randn(2, 3, 7, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    merged = _merged(model)
    torch.testing.assert_close(model(x), merged(x))
    kw = {"low": -3.0, "high": 3.0} if "box" in name else {}
    spec = camkit.relevance.composite(name, **kw)
    torch.testing.assert_close(
        _relevance(model, x, spec), _relevance(merged, x, spec), rtol=1e-9, atol=1e-12
    )


def test_canonizers_leave_the_model_bitwise_untouched_also_after_an_exception() -> None:
    model = _ConvBN()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    state = model_state(model)
    x = torch.randn(2, 3, 7, 7, dtype=torch.float64)
    LRP(model, composite="epsilon-gamma-box")(x, 1)
    with tripwire(model), pytest.raises(Tripwire):
        LRP(model)(x, 1)
    assert torch.is_grad_enabled()  # a ruled layer's own pass runs without grad: restored
    assert_untouched(model, state)
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]) and value.dtype == before[key].dtype, key
    assert all(p.grad is None for p in model.parameters())


def test_lrp_method_targets_batches_and_layers() -> None:
    """K targets in one call equal one call per target; ``batch_size`` changes nothing; the
    recorded layers come back with the conservation report."""
    model = _bias_free_net().float()
    x = torch.rand(3, 3, 8, 8, generator=torch.Generator().manual_seed(7))
    lrp = LRP(model, composite="epsilon-plus", layers=["3", "5"])
    both = lrp(x, [[1, 2]] * 3)
    assert both.shape == (3, 2, 3, 8, 8)
    torch.testing.assert_close(both[:, 1], lrp(x, 2), rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(LRP(model, composite="epsilon-plus", batch_size=2)(x, 2), both[:, 1])
    torch.testing.assert_close(lrp(x[0], 1), both[0, 0])
    found = lrp.explain_batch(x, [[1, 2]] * 3)
    assert set(found.layers) == {"3", "5"} and found.layers["3"].shape == (3, 2, 8, 4, 4)
    heat = found.layer_map("3")  # a layer's relevance shown like a CAM
    torch.testing.assert_close(heat, found.layers["3"].sum(2))
    assert found.layer_map("3", (8, 8)).shape == (3, 2, 8, 8)
    # bias-free, z+ and epsilon: conserved up to the stabiliser, 1e-6 on sums of about 1e-2
    for share in found.conservation.values():
        torch.testing.assert_close(share, torch.ones(3, 2), rtol=0, atol=2e-3)


def test_conservation_warning_when_beyond_the_tolerance() -> None:
    spec = KINDS["cnn"]  # head biases of 1.0 absorb most of the score (zennit's composite keeps
    # the biases in its rules; camkit's default drops them)
    with pytest.warns(ConservationWarning, match="of the target score"):
        LRP(spec.model(), composite="epsilon-plus-flat", tolerance=0.5)(spec.input(), 3)


def test_threads_give_the_serial_result() -> None:
    spec = KINDS["cnn"]
    model, x = spec.model(), spec.input()
    serial = [LRP(model)(x, c) for c in range(4)]
    results: dict[int, Tensor] = {}

    def run(c: int) -> None:
        results[c] = LRP(model)(x, c)

    threads = [threading.Thread(target=run, args=(c,)) for c in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for c in range(4):
        torch.testing.assert_close(results[c], serial[c])


def test_bad_composites_are_refused_clearly() -> None:
    model = _bias_free_net()
    with pytest.raises(ArgumentError, match="unknown composite"):
        LRP(model, composite="epsilon-plsu")
    with pytest.raises(ArgumentError, match="module type or name pattern"):
        LRP(model, composite=[(nn.Conv2d, "gamma")])
    logs = nn.Sequential(nn.Conv2d(3, 4, 3), nn.LogSoftmax(1), nn.Flatten(), nn.LazyLinear(3))
    with pytest.raises(RelevanceError, match="log_softmax on the relevance path has no LRP rule"):
        LRP(logs)(torch.rand(1, 3, 8, 8), 1)


def test_name_patterns_pick_layers() -> None:
    """``("0", Flat())`` gives the first convolution Flat whatever its type says."""
    model = _bias_free_net()
    x = torch.rand(1, 3, 8, 8, dtype=torch.float64)
    by_name = Composite([("0", Flat()), ((nn.Conv2d, nn.Linear), ZPlus())], canonizers=[])
    first = Composite([((nn.Conv2d, nn.Linear), ZPlus())], first=[(nn.Conv2d, Flat())])
    torch.testing.assert_close(_relevance(model, x, by_name), _relevance(model, x, first))


def test_a_convolution_with_its_own_forward_gets_its_rule() -> None:
    """timm's ``Conv2dSame`` pads in its forward (EfficientNet-Lite0's stem): the rule runs
    through that forward, equal to the rule on the padding and a plain convolution."""
    from timm.layers import Conv2dSame

    torch.manual_seed(8)
    same = Conv2dSame(3, 4, 3, stride=2).double()
    plain = nn.Conv2d(3, 4, 3, stride=2).double()
    plain.load_state_dict(same.state_dict())
    x = torch.randn(1, 3, 8, 8, dtype=torch.float64)
    spec = Composite([(nn.Conv2d, Gamma(0.25))], canonizers=[])
    expected = _relevance(nn.Sequential(nn.ZeroPad2d((0, 1, 0, 1)), plain, nn.Flatten()), x, spec)
    got = _relevance(nn.Sequential(same, nn.Flatten()), x, spec)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-13)


def test_a_recorded_layer_merged_with_its_batch_norm_is_refused() -> None:
    spec = KINDS["cnn"]
    with pytest.raises(ArgumentError, match="merged with the BatchNorm"):
        LRP(spec.model(), layers=["features.3"]).explain_batch(spec.input(), 1)
    found = LRP(spec.model(), layers=["features.4"]).explain_batch(spec.input(), 1)
    assert found.layers["features.4"].shape == (2, 1, 8, 8, 8)


class _Chain(nn.Module):
    """``bn_a -> conv -> bn_b`` (merged on both sides), and ``conv_x`` declared before ``bn_y``
    but not feeding it (module order is not data flow)."""

    def __init__(self, crossed: bool = False):
        super().__init__()
        torch.manual_seed(9)
        self.bn_a, self.conv, self.bn_b = nn.BatchNorm2d(3), nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4)
        self.conv_x, self.bn_y = nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4)
        self.crossed = crossed
        for bn in (self.bn_a, self.bn_b, self.bn_y):
            bn.running_var.uniform_(0.5, 2.0)
            bn.running_mean.uniform_(-0.5, 0.5)
        self.double().eval()

    def forward(self, x: Tensor) -> Tensor:
        h = F.relu(self.bn_b(self.conv(self.bn_a(x))))
        if self.crossed:
            h = F.relu(self.bn_y(h)) + self.conv_x(h)
        return h.mean((2, 3))


def test_batch_norms_on_both_sides_and_module_order_that_is_not_data_flow() -> None:
    x = torch.randn(2, 3, 4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(10))
    chain = _Chain()
    a, b = chain.bn_a, chain.bn_b
    scale_a = a.weight / (a.running_var + a.eps).sqrt()
    scale_b = b.weight / (b.running_var + b.eps).sqrt()
    folded = nn.Conv2d(3, 4, 1).double()
    with torch.no_grad():  # the 1x1 convolution with both BatchNorms folded in, by hand
        w = chain.conv.weight[:, :, 0, 0]
        folded.weight.copy_((scale_b[:, None] * w * scale_a[None])[..., None, None])
        inner = w @ (a.bias - a.running_mean * scale_a) + chain.conv.bias
        folded.bias.copy_((inner - b.running_mean) * scale_b + b.bias)
    by_hand = Function(lambda x: F.relu(folded(x)).mean((2, 3)))
    by_hand.folded = folded  # a submodule, so that the composite gives it its rule
    torch.testing.assert_close(chain(x), by_hand(x))
    expected = _relevance(by_hand, x, Composite([(nn.Conv2d, ZPlus())], canonizers=[]))
    torch.testing.assert_close(_relevance(chain, x, "epsilon-plus"), expected)
    with pytest.raises(RelevanceError, match=r"\['conv_x'\] come before a BatchNorm"):
        _relevance(_Chain(crossed=True), x, "epsilon-plus")
    unmerged = Composite([(nn.Conv2d, ZPlus())], canonizers=[])
    assert torch.isfinite(_relevance(_Chain(crossed=True), x, unmerged)).all()


def test_targets_of_every_kind() -> None:
    """A class target object, a callable on the output and a (B, K) tensor: the relevance of
    what they score (LRP is linear in the output relevance, so a sum of two logits is the sum of
    their relevances)."""
    from camkit.targets import ClassTarget

    spec = KINDS["cnn"]
    model, x = spec.model(), spec.input()
    lrp = LRP(model, composite="epsilon-plus")
    one, two = lrp(x, 1), lrp(x, 2)
    torch.testing.assert_close(lrp(x, ClassTarget(1)), one)
    torch.testing.assert_close(lrp(x, lambda out: out[:, 1] + out[:, 2]), one + two)
    torch.testing.assert_close(lrp(x, torch.tensor([[1, 2], [1, 2]])), torch.stack([one, two], 1))


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16), width=st.integers(1, 6), batch=st.integers(1, 3))
def test_zplus_conserves_on_any_bias_free_relu_net(seed: int, width: int, batch: int) -> None:
    """Any bias-free dense ReLU network with positive inputs: z+ in the hidden layers and
    epsilon at the output hand the whole positive score to the input (Montavon et al. 2017:
    z+ is conservative on positive activations)."""
    generator = torch.Generator().manual_seed(seed)
    layers = [nn.Linear(4, width, bias=False), nn.ReLU(), nn.Linear(width, 3, bias=False)]
    model = nn.Sequential(*layers).double()
    with torch.no_grad():
        for layer in (layers[0], layers[2]):
            layer.weight.copy_(torch.randn(layer.weight.shape, generator=generator))
    x = torch.rand(batch, 4, dtype=torch.float64, generator=generator) + 0.1
    spec = Composite([("0", ZPlus(1e-12)), ("2", Epsilon(1e-12))], stabilizer=1e-12)
    relevance = _relevance(model, x, spec, target=0)
    score = model(x)[:, 0].detach()
    expected = torch.where(torch.relu(layers[0](x)).detach().sum(1) > 0, score, 0)
    torch.testing.assert_close(relevance.sum(1), expected, rtol=1e-8, atol=1e-12)

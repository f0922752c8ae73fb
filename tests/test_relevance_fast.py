"""The fast forms of the LRP rules (camkit.relevance.rescale) against float64 references.

Each rule's backward is one autograd node on the layer's own output (no copy), its ratio
``o / stab(z)`` computed in place; Flat computes its counts with one output unit; in-place sums
keep their own graph; merged BatchNorms run without a graph. The numbers are the rules': the
pieces equal the plain formulas bitwise, every rule in float32 is within float32 accuracy of a
dense-matrix re-implementation in float64 (and equal to it in float64), and a ResNet block in
float32 is within float32 accuracy of its float64 relevance."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from camkit import LRP
from camkit.relevance import (
    AlphaBeta,
    Composite,
    Epsilon,
    Flat,
    Gamma,
    WSquare,
    ZBox,
    ZPlus,
    rules_applied,
)
from camkit.relevance.rescale import rescaled, self_ratio, stabilize, stabilized_ratio
from camkit.relevance.rules import modified_output

EPS = 1e-2  # a stabiliser that shows in the numbers


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_rescaled_is_the_modified_output_in_one_node() -> None:
    """The same forward value (in ``o``'s own memory) and the same gradients, one target or a
    batch of them, as ``o.detach() + (T - T.detach())`` with ``T = source * ratio``."""
    g = _generator(0)
    x = torch.randn(3, 4, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(5, 4, dtype=torch.float64, generator=g)
    ratio = torch.rand(3, 5, dtype=torch.float64, generator=g)
    with torch.no_grad():
        o = x @ w.T
    plain = modified_output(o, (x @ w.T) * ratio)
    fast = rescaled(o, x @ w.T, ratio)
    assert fast.data_ptr() == o.data_ptr() and torch.equal(fast, plain)
    seeds = torch.randn(2, 3, 5, dtype=torch.float64, generator=g)
    for y in (plain, fast):
        assert y.grad_fn is not None
    expected = torch.autograd.grad(plain, x, seeds, is_grads_batched=True)[0]
    got = torch.autograd.grad(fast, x, seeds, is_grads_batched=True)[0]
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-15)
    torch.testing.assert_close(got[0], (seeds[0] * ratio) @ w, rtol=0, atol=1e-15)


def test_an_in_place_result_stays_the_same_tensor_with_the_rules_history() -> None:
    a = torch.tensor([1.0, 2.0, -3.0], dtype=torch.float64, requires_grad=True)
    b = torch.tensor([3.0, -1.0, 1.0], dtype=torch.float64, requires_grad=True)
    total = a * 1
    total += b
    ratio = self_ratio(total, EPS)
    assert rescaled(total, total, ratio, in_place=True) is total
    ga, gb = torch.autograd.grad(total.sum(), [a, b])
    torch.testing.assert_close(ga, ratio)
    torch.testing.assert_close(gb, ratio)


def _with_zeros(t: Tensor) -> Tensor:
    t = t.clone()
    t[..., 0] = 0.0
    t[..., 1] = -0.0
    return t


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_ratios_are_the_plain_division_bitwise(dtype: torch.dtype) -> None:
    """``o / stabilize(z + b)`` (signed, with zeros of both signs; nonnegative ``z``) and
    ``share * o / stabilize(o)`` give the plain formulas' numbers exactly."""
    g = _generator(1)
    o = _with_zeros(torch.randn(2, 3, 4, 5, generator=g).to(dtype))
    z = _with_zeros(torch.randn(2, 3, 4, 5, generator=g).to(dtype))
    bias = torch.randn(3, 1, 1, generator=g).to(dtype)
    assert torch.equal(stabilized_ratio(o, z, EPS), o / stabilize(z, EPS))
    assert torch.equal(stabilized_ratio(o, z, EPS, bias=bias), o / stabilize(z + bias, EPS))
    positive = z.abs()
    assert torch.equal(
        stabilized_ratio(o, positive, EPS, bias=bias.abs(), nonnegative=True),
        o / stabilize(positive + bias.abs(), EPS),
    )
    broadcast = positive[:1]
    assert torch.equal(
        stabilized_ratio(o, broadcast, EPS, nonnegative=True), o / stabilize(broadcast, EPS)
    )
    for share in (1.0, 0.5, 0.3):
        assert torch.equal(self_ratio(o, EPS, share), share * o / stabilize(o, EPS))


def _matrix(op: Callable[[Tensor], Tensor], shape: tuple[int, ...]) -> Tensor:
    """The dense matrix (outputs x inputs) of the linear map ``op`` on inputs of ``shape``."""
    n = int(torch.tensor(shape).prod())
    basis = torch.eye(n, dtype=torch.float64).view(n, *shape)
    with torch.no_grad():
        return op(basis).flatten(1).T


def _conv(groups: int = 1) -> nn.Conv2d:
    torch.manual_seed(groups)
    layer = nn.Conv2d(4, 6, 3, padding=1, stride=2, groups=groups)
    with torch.no_grad():
        layer.bias.uniform_(-0.3, 0.3)
    return layer


def _dense() -> nn.Linear:
    torch.manual_seed(3)
    return nn.Linear(12, 5)


def _reference(layer: nn.Module, rule: str, x: Tensor, seed: Tensor) -> Tensor:
    """The rule by its formula with dense matrices in float64, for the incoming relevance
    ``R_k = seed_k * o_k`` (the gradient ``seed`` at the output): ``R_j`` flattened."""
    w, b = layer.weight.detach().double(), layer.bias.detach().double()
    shape = tuple(x.shape[1:])

    def matrix(weight: Tensor) -> Tensor:
        if isinstance(layer, nn.Linear):
            return _matrix(lambda t: F.linear(t, weight), shape)
        return _matrix(lambda t: layer._conv_forward(t, weight, None), shape)

    flat = x.double().flatten()
    m = matrix(w)
    bias = b.repeat_interleave(m.shape[0] // b.numel())
    o = m @ flat + bias
    incoming = seed.double().flatten() * o
    if rule == "epsilon":
        return flat * (m.T @ (incoming / stabilize(m @ flat + bias, EPS)))
    if rule == "epsilon-nobias":
        return flat * (m.T @ (incoming / stabilize(m @ flat, EPS)))
    if rule == "zplus":
        up, down = matrix(w.clamp(min=0)), matrix(w.clamp(max=0))
        xp, xn = flat.clamp(min=0), flat.clamp(max=0)
        z = up @ xp + down @ xn + bias.clamp(min=0)
        ratio = incoming / stabilize(z, EPS)
        return xp * (up.T @ ratio) + xn * (down.T @ ratio)
    if rule in ("flat", "wsquare"):
        spread = matrix(torch.ones_like(w) if rule == "flat" else w**2)
        shift = 0 if rule == "flat" else bias**2
        return spread.T @ (incoming / stabilize(spread @ torch.ones_like(flat) + shift, EPS))
    low, high = float(flat.min()), float(flat.max())  # zbox: the bias cancels out
    up, down = matrix(w.clamp(min=0)), matrix(w.clamp(max=0))
    spread = m * flat - low * up - high * down
    return spread.T @ (incoming / stabilize(spread.sum(1), EPS))


RULES = {
    "epsilon": Epsilon(EPS),
    "epsilon-nobias": Epsilon(EPS, zero_params="bias"),
    "zplus": ZPlus(EPS),
    "flat": Flat(EPS),
    "wsquare": WSquare(EPS),
    "zbox": ZBox(stabilizer=EPS),
}
LAYERS = {"conv": _conv, "grouped conv": lambda: _conv(groups=2), "dense": _dense}


@pytest.mark.parametrize("signed", [False, True], ids=["x>=0", "signed x"])
@pytest.mark.parametrize("kind", list(LAYERS))
@pytest.mark.parametrize("name", list(RULES))
def test_each_rule_in_float32_within_float32_accuracy_of_float64(
    name: str, kind: str, signed: bool
) -> None:
    """float64: the rule equals its dense-matrix formula (1e-10 of the map's size); float32:
    within 1e-5 of it (float32 keeps 7 digits; a few hundred terms are summed)."""
    layer = LAYERS[kind]()
    g = _generator(4)
    x = torch.rand(2, *((12,) if kind == "dense" else (4, 7, 7)), generator=g)
    x = x - 0.5 if signed else x
    out_shape = layer(x).shape
    seed = torch.randn(out_shape, generator=g)
    expected = _reference(layer, name, x[:1], seed[:1])
    composite = Composite([((nn.Conv2d, nn.Linear), RULES[name])], canonizers=[])
    for dtype, tolerance in ((torch.float64, 1e-10), (torch.float32, 1e-5)):
        model = layer.to(dtype)
        leaf = x.to(dtype).requires_grad_(True)
        with rules_applied(model, composite):
            out = model(leaf)
        (grad,) = torch.autograd.grad(out, leaf, seed.to(dtype))
        got = (leaf * grad).detach()[0].double().flatten()
        scale = float(expected.abs().max())
        assert scale > 0
        assert float((got - expected).abs().max()) <= tolerance * scale, (name, kind, dtype)


class _Block(nn.Module):
    """A ResNet bottleneck: BatchNorms merged into the convolutions (conv -> bn), ``out +=
    identity`` in place, ReLUs in place, and a classifier."""

    def __init__(self, in_place: bool = True):
        super().__init__()
        self.in_place = in_place
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.conv1, self.bn1 = nn.Conv2d(8, 4, 1, bias=False), nn.BatchNorm2d(4)
        self.conv2, self.bn2 = nn.Conv2d(4, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4)
        self.conv3, self.bn3 = nn.Conv2d(4, 8, 1, bias=False), nn.BatchNorm2d(8)
        self.relu = nn.ReLU(inplace=True)
        self.fc = nn.Linear(8, 5)

    def forward(self, x: Tensor) -> Tensor:
        identity = self.relu(self.stem(x))
        out = self.relu(self.bn1(self.conv1(identity)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.in_place:
            out += identity
        else:
            out = out + identity
        return self.fc(F.adaptive_avg_pool2d(self.relu(out), 1).flatten(1))


def _block(in_place: bool = True) -> nn.Module:
    torch.manual_seed(5)
    model = _Block(in_place)
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.uniform_(-0.2, 0.2)
            module.running_var.uniform_(0.5, 1.5)
            module.weight.data.uniform_(-1.5, 1.5)
            module.bias.data.uniform_(-0.2, 0.2)
    return model.eval()


COMPOSITES = {
    "epsilon-plus-flat": "epsilon-plus-flat",
    "epsilon-plus-flat-nobias": "epsilon-plus-flat-nobias",
    "epsilon": [((nn.Conv2d, nn.Linear), Epsilon())],
}


def _relevance64(model: nn.Module, x: Tensor, spec, memory: torch.memory_format) -> Tensor:
    """float64 ``x * grad_x`` of class 2 under ``rules_applied``, the model given ``x`` in
    ``memory``."""
    leaf = x.double().requires_grad_(True)
    with rules_applied(model.double(), spec):
        out = model(leaf.clone(memory_format=memory))
    (grad,) = torch.autograd.grad(out[:, 2].sum(), leaf)
    return (leaf * grad).detach()


@pytest.mark.parametrize("name", list(COMPOSITES))
def test_a_resnet_block_in_float32_within_float32_accuracy_of_float64(name: str) -> None:
    """The LRP method (channels-last on the CPU, BatchNorms merged without their graph, the
    in-place residual sum) in float32 against the float64 relevance: 1e-5 of the map's size;
    in float64, channels-last gives the contiguous relevance and the in-place sum the
    out-of-place sum's (1e-12)."""
    x = torch.rand(2, 3, 8, 8, generator=_generator(6))
    spec = COMPOSITES[name]
    expected = _relevance64(_block(), x, spec, torch.contiguous_format)
    assert expected.abs().max() > 0
    got = LRP(_block(), composite=spec, tolerance=None)(x, 2).double()
    assert float((got - expected).abs().max()) <= 1e-5 * float(expected.abs().max())
    atol = 1e-12 * float(expected.abs().max())
    for model, memory in (
        (_block(), torch.channels_last),
        (_block(in_place=False), torch.contiguous_format),
    ):
        again = _relevance64(model, x, spec, memory)
        torch.testing.assert_close(again, expected, rtol=0, atol=atol)


def test_an_in_place_sum_into_a_view_gives_the_out_of_place_relevance() -> None:
    """``h[:, :2] += g`` (an in-place sum into a view keeps the copying path)."""

    class Sliced(nn.Module):
        def __init__(self, in_place: bool):
            super().__init__()
            torch.manual_seed(7)
            self.a, self.b = nn.Linear(3, 4), nn.Linear(3, 2)
            self.in_place = in_place

        def forward(self, x: Tensor) -> Tensor:
            h, g = self.a(x), self.b(x)
            if self.in_place:
                h[:, :2] += g
                return h
            return torch.cat([h[:, :2] + g, h[:, 2:]], dim=1)

    x = torch.rand(2, 3, dtype=torch.float64, generator=_generator(8))
    maps = [
        LRP(Sliced(flag).double(), composite=[(nn.Linear, Epsilon(EPS))], tolerance=None)(x, 1)
        for flag in (False, True)
    ]
    assert maps[0].abs().max() > 0
    torch.testing.assert_close(maps[1], maps[0], rtol=0, atol=1e-12)


def _conv_bn_net() -> nn.Module:
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, 6, 3, padding=1),
        nn.BatchNorm2d(6),
        nn.ReLU(),
        nn.Conv2d(6, 5, 3, padding=1),
        nn.BatchNorm2d(5),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(5 * 6 * 6, 4),
    )
    for bn in (net[1], net[4]):
        bn.running_mean.uniform_(-0.5, 0.5), bn.running_var.uniform_(0.5, 2.0)
        bn.weight.data.uniform_(-1.0, 1.0)  # negative scales: merged w+ is not scale * w+
    return net.eval()


def _relevance_and_saved_weights(net: nn.Module, comp: Composite, x: Tensor):
    x = x.clone().requires_grad_()
    with rules_applied(net, comp):
        out = net(x)
        nodes, todo = [], [out.grad_fn]
        while todo:
            node = todo.pop()
            if node is not None and node not in nodes:
                nodes.append(node)
                todo.extend(n for n, _ in node.next_functions)
        convs = [n for n in nodes if type(n).__name__ == "ConvolutionBackward0"]
        # a kept weight is the same tensor at every reading; a rebuilt one is computed anew
        readings = [(n._saved_weight, n._saved_weight) for n in convs]  # both alive at once
        rebuilt = [a.data_ptr() != b.data_ptr() for a, b in readings]
        (grad,) = torch.autograd.grad(out[:, 1].sum(), x)
    return x.detach() * grad, rebuilt


@pytest.mark.parametrize(
    "rule", [ZPlus(), AlphaBeta(), Gamma(0.25), Epsilon(zero_params="bias")], ids=repr
)
def test_a_rules_weights_are_built_again_in_the_backward_not_kept(rule) -> None:
    """The rule's weights (``w+``, ``w + gamma w+``, a merged BatchNorm's ``scale w``) are
    copies of the layer's: kept for the backward they would double the model's weights in
    memory. The backward builds them again; the relevance is bitwise the one with them kept
    (under the caller's own saved-tensor hooks, which then see every tensor)."""
    net, x = _conv_bn_net(), torch.rand(2, 3, 6, 6, generator=_generator(3))
    comp = Composite([((nn.Conv2d, nn.Linear), rule)])
    relevance, rebuilt = _relevance_and_saved_weights(net, comp, x)
    assert len(rebuilt) >= 2 and all(rebuilt)  # AlphaBeta, Gamma: two per layer
    packed = []

    def pack(t: Tensor) -> Tensor:
        packed.append(t.shape)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        kept, rebuilt = _relevance_and_saved_weights(net, comp, x)
    assert not any(rebuilt) and torch.Size([5, 6, 3, 3]) in packed
    assert torch.equal(relevance, kept)
    assert relevance.abs().sum() > 0


def test_a_merged_weight_is_made_in_its_inputs_layout() -> None:
    """A BatchNorm merged into a convolution gives ``W' = scale W`` in the layout of the
    convolution's input (channels-last for a channels-last input, so that no convolution
    applying ``W'`` or its ``w+`` converts it again), with the same numbers."""
    from camkit.relevance.affine import Affine
    from camkit.relevance.canonizers import merged_after

    net = _conv_bn_net()
    conv, bn = net[0], net[1]
    x = torch.rand(2, 3, 6, 6, generator=_generator(4))
    scale = bn.weight / (bn.running_var + bn.eps) ** 0.5
    expected = conv.weight.detach() * scale.detach().view(-1, 1, 1, 1)
    for given, layout in (
        (x, torch.contiguous_format),
        (x.to(memory_format=torch.channels_last), torch.channels_last),
    ):
        merged = merged_after(Affine.of(conv), bn, given)
        assert merged.weight.is_contiguous(memory_format=layout)
        assert torch.equal(merged.weight, expected) and torch.equal(merged.rebuild(), expected)


def test_a_weight_changed_between_forward_and_backward_is_refused() -> None:
    """The backward builds a rule's weight again from the layer's: a weight changed in place in
    between would give another map than the forward's, so it raises, as autograd does for a
    tensor it keeps."""
    from camkit.errors import RelevanceError

    net = _conv_bn_net()
    x = torch.rand(2, 3, 6, 6, generator=_generator(5), requires_grad=True)
    with rules_applied(net, Composite([((nn.Conv2d, nn.Linear), ZPlus())])):
        out = net(x)
    weight = net[3].weight.detach().clone()
    with torch.no_grad():
        net[3].weight.mul_(2.0)
    try:
        with pytest.raises(RelevanceError, match="changed in place"):
            torch.autograd.grad(out[:, 1].sum(), x)
    finally:
        with torch.no_grad():
            net[3].weight.copy_(weight)

"""LRP on the layer kinds of vision models beyond convolutions and dense layers: transposed
convolutions (by hand against a dense-matrix re-implementation, and a U-Net's conservation),
group norm and ``F.normalize`` (against lxt 2.1's formulas), norms built from ``pow`` / ``sqrt``,
scatters and gathers (relevance moves with the values), and an operation without a rule."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from matrix_kit import assert_untouched, model_state
from torch import Tensor, nn

from camkit import LRP
from camkit.errors import RelevanceError
from camkit.relevance import Composite, Epsilon, Flat, Gamma, ZPlus, rules_applied
from camkit.relevance.composites import CONV
from camkit.targets import SegmentationTarget

EPS = 1e-9


def _input_relevance(model: nn.Module, x: Tensor, spec, score=lambda out: out.sum()) -> Tensor:
    """``x * grad_x`` of ``score(model(x))`` under the rules."""
    leaf = x.clone().requires_grad_(True)
    with rules_applied(model, spec):
        out = model(leaf)
    (grad,) = torch.autograd.grad(score(out), leaf)
    return (leaf * grad).detach()


def _matrix(layer: nn.Module, weight: Tensor, shape: tuple[int, ...]) -> Tensor:
    """The dense matrix ``M`` (outputs x inputs) of ``layer``'s linear part with ``weight``,
    column ``j`` being the layer applied to the ``j``-th basis input (no bias)."""
    n = int(torch.tensor(shape).prod())
    basis = torch.eye(n, dtype=weight.dtype).view(n, *shape)
    with torch.no_grad():
        columns = F.conv_transpose2d(
            basis, weight, None, layer.stride, layer.padding, layer.output_padding, layer.groups
        )
    return columns.flatten(1).T


def _transposed() -> tuple[nn.ConvTranspose2d, Tensor]:
    torch.manual_seed(0)
    layer = nn.ConvTranspose2d(2, 4, 3, stride=2, padding=1, output_padding=1, groups=2).double()
    with torch.no_grad():
        layer.bias.uniform_(-0.3, 0.3)
    return layer, torch.rand(1, 2, 3, 3, dtype=torch.float64) + 0.1


def _stab(z: Tensor, eps: float) -> Tensor:
    return torch.where(z >= 0, z + eps, z - eps)


def test_a_transposed_convolution_follows_epsilon_and_zplus_by_hand() -> None:
    """R_j = x_j sum_k M_kj / stab(z_k) R_k with R_k = o_k (the score is the output's sum):
    epsilon with ``z = M x + b``; z+ with ``M`` of ``w+`` and ``z = M+ x + b+`` (x > 0)."""
    layer, x = _transposed()
    w, b = layer.weight.detach(), layer.bias.detach()
    flat = x.flatten()
    o = layer(x).detach().flatten()
    bias = b.repeat_interleave(o.numel() // b.numel())
    for rule, weight, shift, eps in (
        (Epsilon(0.01), w, bias, 0.01),
        (ZPlus(EPS), w.clamp(min=0), bias.clamp(min=0), EPS),
    ):
        m = _matrix(layer, weight, tuple(x.shape[1:]))
        z = m @ flat + shift
        expected = flat * (m.T @ (o / _stab(z, eps)))
        got = _input_relevance(layer, x, Composite([(nn.ConvTranspose2d, rule)], canonizers=[]))
        torch.testing.assert_close(got.flatten(), expected, rtol=0, atol=1e-10)


def test_a_transposed_convolution_follows_gamma_by_hand() -> None:
    """Gamma (x > 0): ``w + gamma w+`` where ``o_k > 0``, ``w + gamma w-`` where ``o_k < 0``."""
    layer, x = _transposed()
    w, b, g = layer.weight.detach(), layer.bias.detach(), 0.25
    flat, o = x.flatten(), layer(x).detach().flatten()
    bias = b.repeat_interleave(o.numel() // b.numel())
    up = _matrix(layer, w + g * w.clamp(min=0), tuple(x.shape[1:]))
    down = _matrix(layer, w + g * w.clamp(max=0), tuple(x.shape[1:]))
    zp = up @ flat + bias + g * bias.clamp(min=0)
    zn = down @ flat + bias + g * bias.clamp(max=0)
    expected = flat * (
        up.T @ (o * (o > 0) / _stab(zp, EPS)) + down.T @ (o * (o < 0) / _stab(zn, EPS))
    )
    got = _input_relevance(
        layer, x, Composite([(nn.ConvTranspose2d, Gamma(g, EPS))], canonizers=[])
    )
    torch.testing.assert_close(got.flatten(), expected, rtol=0, atol=1e-10)


class _TransposedBN(nn.Module):
    def __init__(self, merged: bool = False):
        super().__init__()
        self.up = nn.ConvTranspose2d(4, 6, 2, stride=2, groups=2, bias=True)
        self.bn = nn.Identity() if merged else nn.BatchNorm2d(6)

    def forward(self, x: Tensor) -> Tensor:
        return self.bn(self.up(x))


def test_a_batch_norm_after_a_transposed_convolution_is_merged_per_output_channel() -> None:
    """zennit's merge: ``W'`` scales output channel ``k`` (weight axis 1, by group) by the
    BatchNorm's ``scale_k``; LRP of the pair equals LRP of the merged layer."""
    torch.manual_seed(1)
    model = _TransposedBN().double().eval()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-0.5, 0.5)
        model.bn.running_var.uniform_(0.5, 2.0)
        model.bn.weight.uniform_(-1.5, 1.5)  # negative scales flip w+ and w-
        model.bn.bias.uniform_(-0.2, 0.2)
    merged = _TransposedBN(merged=True).double()
    bn, up = model.bn, model.up
    scale = bn.weight / (bn.running_var + bn.eps).sqrt()
    with torch.no_grad():
        per_out = scale.view(2, 1, 3, 1, 1)  # (groups, C_in / groups, C_out / groups, k, k)
        merged.up.weight.copy_((up.weight.unflatten(0, (2, -1)) * per_out).flatten(0, 1))
        merged.up.bias.copy_(up.bias * scale + bn.bias - bn.running_mean * scale)
    x = torch.rand(2, 4, 3, 3, dtype=torch.float64)
    torch.testing.assert_close(model(x), merged(x))
    state = model_state(model)
    rules = [(nn.ConvTranspose2d, ZPlus(EPS))]
    got = _input_relevance(model, x, Composite(rules))
    expected = _input_relevance(merged, x, Composite(rules, canonizers=[]))
    torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-12)
    assert_untouched(model, state)


def test_a_batch_norm_before_a_transposed_convolution_is_merged_per_input_channel() -> None:
    """``up(bn(x)) = up(x; W') + up(shift)``, ``W'`` scaling input channel ``j`` (weight axis 0,
    grouped) by ``scale_j``, the shift's image a bias map ``b``: z+ by hand with the dense
    matrix ``M'+`` of ``W'+``, ``R = x * M'+^T (o / stab(M'+ x + b+))``."""
    torch.manual_seed(3)
    bn = nn.BatchNorm2d(4).double().eval()
    up = nn.ConvTranspose2d(4, 6, 2, stride=2, groups=2, bias=False).double()
    with torch.no_grad():
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
        bn.weight.uniform_(-1.5, 1.5)  # negative scales flip w+ and w-
        bn.bias.uniform_(-0.2, 0.2)
    model = nn.Sequential(bn, up)
    scale = (bn.weight / (bn.running_var + bn.eps).sqrt()).detach()
    shift = (bn.bias - bn.running_mean * scale).detach()
    x = torch.rand(1, 4, 3, 3, dtype=torch.float64)
    positive = _matrix(up, (up.weight.detach() * scale.view(-1, 1, 1, 1)).clamp(min=0), (4, 3, 3))
    bias = up(shift.view(1, -1, 1, 1).expand(1, 4, 3, 3)).detach().flatten()
    o = model(x).detach().flatten()
    expected = x.flatten() * (
        positive.T @ (o / _stab(positive @ x.flatten() + bias.clamp(min=0), EPS))
    )
    got = _input_relevance(model, x, Composite([(nn.ConvTranspose2d, ZPlus(EPS))]))
    torch.testing.assert_close(got.flatten(), expected, rtol=0, atol=1e-10)


class _UNet(nn.Module):
    """conv -> pool -> conv -> ConvTranspose2d up -> concatenated with the skip -> conv ->
    per-pixel logits of 3 classes; no biases."""

    def __init__(self):
        super().__init__()
        self.enc = nn.Conv2d(3, 4, 3, padding=1, bias=False)
        self.mid = nn.Conv2d(4, 8, 3, padding=1, bias=False)
        self.up = nn.ConvTranspose2d(8, 4, 2, stride=2, bias=False)
        self.dec = nn.Conv2d(8, 4, 3, padding=1, bias=False)
        self.head = nn.Conv2d(4, 3, 1, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        skip = F.relu(self.enc(x))
        deep = F.relu(self.mid(F.max_pool2d(skip, 2)))
        up = F.relu(self.up(deep))
        return self.head(F.relu(self.dec(torch.cat([skip, up], dim=1))))


# ZPlus on the logits layer (no ReLU after it) drops the relevance of a negative logit whose
# inputs all meet negative weights (z+ = 0): the head gets Epsilon, as dense heads do in
# zennit's composites; Gamma conserves wherever the output is not 0
PLUS_FLAT = Composite(
    [("head", Epsilon(EPS)), (CONV, ZPlus(EPS))], first=[(CONV, Flat(EPS))], stabilizer=EPS
)


@pytest.mark.parametrize("spec", [PLUS_FLAT, "epsilon-gamma-box"], ids=["plus-flat", "gamma-box"])
def test_a_bias_free_unet_conserves_a_segmentation_target(spec) -> None:
    torch.manual_seed(2)
    model = _UNet().double()
    x = torch.rand(2, 3, 8, 8, dtype=torch.float64)
    mask = torch.zeros(8, 8, dtype=torch.bool)
    mask[2:6, 3:7] = True
    target = SegmentationTarget(1, mask)
    state = model_state(model)
    result = LRP(model, composite=spec).explain_batch(x, target)
    score = (model(x)[:, 1] * mask).sum((1, 2))
    torch.testing.assert_close(result.scores[:, 0].double(), score, rtol=1e-6, atol=0)
    assert (result.conservation["input"] - 1).abs().max() < 1e-3
    assert_untouched(model, state)


@pytest.fixture
def lxt():
    """lxt 2.1's AttnLRP functions (``pip install --no-deps lxt==2.1``); the tests that compare
    with them skip without it."""
    return pytest.importorskip("lxt.explicit.functional", reason="lxt 2.1 is not installed")


PLAIN = Composite([], stabilizer=EPS, canonizers=[])


class _Op(nn.Module):
    """A model that is one function of its input (the function runs under the rules)."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x: Tensor) -> Tensor:
        return self.fn(x)


def _ours_and_lxt(fn, lxt_fn, x: Tensor, weights: Tensor) -> tuple[Tensor, Tensor]:
    """Input relevance of ``score = sum(weights * fn(x))`` (``R_out = weights * out``) by
    camkit's rules and by lxt's function (whose backward takes and returns relevance; given
    ``R_out`` from the float64 forward: lxt's RMS norm computes in float32)."""
    ours = _input_relevance(_Op(fn), x, PLAIN, lambda out: (out * weights).sum())
    leaf = x.clone().requires_grad_(True)
    out = lxt_fn(leaf)
    (theirs,) = torch.autograd.grad(out, leaf, grad_outputs=(fn(x) * weights).detach())
    return ours, theirs


def _close(ours: Tensor, theirs: Tensor) -> None:
    """Equal within 1e-8 of the largest value (lxt's stabiliser ``z + 1e-12`` against
    camkit's exact division on these non-zero outputs)."""
    scale = theirs.abs().max()
    assert scale > 0
    assert (ours - theirs).abs().max() <= 1e-8 * scale


def _x(*shape: int, seed: int = 3) -> Tensor:
    return torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def test_group_norm_is_lxt_layer_norm_over_each_group(lxt) -> None:
    """AttnLRP's identity rule on the normalisation (Achtibat et al. 2024, Prop. 3.4): each
    group's std a constant, the centring linear, the affine part in place; lxt's ``layer_norm``
    applied to each group's values flattened is the same rule."""
    x, weights = _x(2, 6, 3, 3), _x(2, 6, 3, 3, seed=4)
    norm = nn.GroupNorm(3, 6).double()
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-0.2, 0.2)
    w = norm.weight.detach().view(3, 2, 1).expand(3, 2, 9).reshape(3, 18)
    b = norm.bias.detach().view(3, 2, 1).expand(3, 2, 9).reshape(3, 18)

    def theirs(leaf: Tensor) -> Tensor:
        y = lxt.layer_norm_grad_fn.apply(leaf.flatten(2).unflatten(1, (3, -1)).flatten(2), w, b,
                                         norm.eps, 1e-12)  # fmt: skip
        return y.view_as(leaf)

    ours, lxt_relevance = _ours_and_lxt(norm, theirs, x, weights)
    torch.testing.assert_close(norm(x), theirs(x))
    _close(ours, lxt_relevance)


@pytest.mark.parametrize(
    "written",
    [
        lambda x: F.normalize(x, dim=-1),
        lambda x: x / x.norm(dim=-1, keepdim=True),  # CLIP's embedding normalisation
        lambda x: x / torch.linalg.vector_norm(x, dim=-1, keepdim=True),
        lambda x: x / x.pow(2).sum(-1, keepdim=True).sqrt(),
        lambda x: x * torch.rsqrt((x**2).sum(-1, keepdim=True)),
    ],
    ids=["F.normalize", "Tensor.norm", "vector_norm", "pow-sqrt", "rsqrt"],
)
def test_normalisations_are_lxt_normalize(written, lxt) -> None:
    """The divisor a constant: ``R_x = R_y`` element-wise (lxt's ``normalize``), however the
    normalisation is written."""
    x, weights = _x(3, 5), _x(3, 5, seed=5)
    ours, theirs = _ours_and_lxt(written, lambda leaf: lxt.normalize(leaf, dim=-1), x, weights)
    _close(ours, theirs)
    torch.testing.assert_close(ours, F.normalize(x, dim=-1) * weights)  # R_x = R_y


def test_a_hand_written_rms_norm_is_lxt_rms_norm(lxt) -> None:
    x, weights = _x(2, 4, 6), _x(2, 4, 6, seed=6)
    gain = torch.linspace(0.5, 1.5, 6, dtype=torch.float64)

    def rms(h: Tensor) -> Tensor:  # transformers' LlamaRMSNorm.forward
        return gain * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6))

    ours, theirs = _ours_and_lxt(rms, lambda h: lxt.rms_norm_identity(h, gain, 1e-6), x, weights)
    _close(ours, theirs)


def test_upsampling_moves_relevance_to_the_pixels_it_copies_or_blends() -> None:
    """Resampling gets the Norm rule, ``R_j = x_j sum_k M_kj R_k / z_k``; for the score
    ``sum(out)`` (``R_k = z_k``) that is ``x_j`` times the sum of ``j``'s weights. Nearest x2:
    four copies, ``R = 4 x``; bilinear x2 (half-pixel centres), per axis every input's weights
    sum to 2 (interior ``0.25 + 0.75 + 0.75 + 0.25``, border ``1 + 0.75 + 0.25``): ``4 x``
    too. Bilinear x2 with corners aligned on 3 pixels (outputs at 0, 0.4, 0.8, 1.2, 1.6, 2):
    the middle pixel's weights are ``0.4 + 0.8 + 0.8 + 0.4 = 2.4`` per axis, the corners'
    ``1.8``."""
    x = torch.rand(2, 3, 3, 3, dtype=torch.float64) + 0.1
    for mode in ("nearest", "bilinear"):
        resampled = _input_relevance(nn.Upsample(scale_factor=2, mode=mode), x, PLAIN)
        torch.testing.assert_close(resampled, 4 * x)
    aligned = nn.Upsample(size=6, mode="bilinear", align_corners=True)
    per_axis = torch.tensor([1.8, 2.4, 1.8], dtype=torch.float64)
    torch.testing.assert_close(
        _input_relevance(aligned, x, PLAIN), x * per_axis[:, None] * per_axis[None, :]
    )


MASK = torch.tensor([False, True, True, False])


def _merged_by(how: str):
    """Text positions ``x[:, :4]``, image features ``2 x[:, 4:6]`` written at positions 1, 2."""

    def merge(x: Tensor) -> Tensor:
        text, image = x[:, :4], 2 * x[:, 4:6]
        if how == "masked_scatter":  # transformers' vision-language models
            return text.masked_scatter(MASK[None, :, None].expand_as(text), image)
        if how == "setitem":
            out = text.clone()
            out[:, MASK] = image
            return out
        if how == "index_put":
            return text.index_put((torch.arange(x.shape[0])[:, None], torch.tensor([1, 2])), image)
        index = torch.tensor([1, 2])[None, :, None].expand_as(image)
        return text.scatter(1, index, image)

    return merge


@pytest.mark.parametrize("how", ["masked_scatter", "setitem", "index_put", "scatter"])
def test_written_values_take_the_relevance_of_their_positions(how: str) -> None:
    x, weights = _x(2, 6, 3), _x(2, 4, 3, seed=7)
    merge = _merged_by(how)
    out = merge(x)
    relevance = _input_relevance(_Op(merge), x, PLAIN, lambda o: (o * weights).sum())
    r_out = out * weights
    torch.testing.assert_close(relevance[:, [0, 3]], r_out[:, [0, 3]])  # kept text
    torch.testing.assert_close(relevance[:, 4:6], r_out[:, 1:3])  # the written features
    assert torch.equal(relevance[:, 1:3], torch.zeros_like(relevance[:, 1:3]))  # overwritten


def test_gathers_and_embeddings_return_each_copy_to_its_source() -> None:
    x, weights = _x(2, 5), _x(2, 7, seed=8)
    index = torch.tensor([[0, 0, 1, 4, 4, 4, 2]]).expand(2, 7)
    counts = torch.zeros(2, 5, dtype=torch.float64)
    counts.scatter_add_(1, index, weights)
    gathered = _input_relevance(_Op(lambda v: v.gather(1, index)), x, PLAIN,
                                lambda o: (o * weights).sum())  # fmt: skip
    torch.testing.assert_close(gathered, x * counts)  # R_j = x_j sum of the copies' weights
    ids = torch.tensor([[3, 0, 3]])
    table_weights = _x(1, 3, 5, seed=9)
    embedded = _input_relevance(_Op(lambda t: F.embedding(ids, t)), _x(4, 5), PLAIN,
                                lambda o: (o * table_weights).sum())  # fmt: skip
    expected = torch.zeros(4, 5, dtype=torch.float64)
    expected.index_add_(0, ids[0], table_weights[0])
    torch.testing.assert_close(embedded, _x(4, 5) * expected)


def test_an_additive_scatter_shares_in_proportion() -> None:
    """``scatter_add``: a sum at the written positions (Norm): ``x_j / (x_j + s) R``."""
    x = torch.rand(1, 4, dtype=torch.float64) + 0.5
    index = torch.tensor([[1, 1]])

    def added(v: Tensor) -> Tensor:
        return v[:, :2].scatter_add(1, index, v[:, 2:])

    relevance = _input_relevance(_Op(added), x, PLAIN)
    out = added(x)
    torch.testing.assert_close(relevance[0, 0], out[0, 0])  # untouched position
    total = x[0, 1] + x[0, 2] + x[0, 3]
    expected = torch.stack([x[0, 1], x[0, 2], x[0, 3]]) / total * out[0, 1]
    torch.testing.assert_close(relevance[0, 1:], expected)


@pytest.mark.parametrize(
    ("fn", "name"),
    [
        (lambda x: torch.cumsum(x, 1), "cumsum"),
        (lambda x: torch.pow(2.0, x), "pow with an exponent on the relevance path"),
        (lambda x: 2.0**x, "__rpow__"),
        (lambda x: F.conv1d(x[:, None], torch.ones(1, 1, 2, dtype=x.dtype)), "conv1d"),
    ],
)
def test_an_operation_without_a_rule_still_raises_naming_it(fn, name: str) -> None:
    with pytest.raises(RelevanceError, match=name):
        _input_relevance(_Op(fn), _x(2, 4), PLAIN)


def test_shuffles_selections_and_folds_by_hand() -> None:
    """``pixel_shuffle``: each output entry is one input entry, ``R_x = unshuffle(R_out)``;
    ``where(c, a, b)``: ``a`` gets ``R_out`` where ``c``, ``b`` elsewhere; ``masked_fill``:
    the filled entries get nothing; ``F.fold`` of overlapping patches sums them (Norm):
    ``R_j = x_j / z_k R_k`` for the pixel ``k`` it lands on."""
    x, weights = _x(1, 8, 2, 2), _x(1, 2, 4, 4, seed=10)
    shuffled = _input_relevance(_Op(lambda v: F.pixel_shuffle(v, 2)), x, PLAIN,
                                lambda o: (o * weights).sum())  # fmt: skip
    torch.testing.assert_close(shuffled, F.pixel_unshuffle(F.pixel_shuffle(x, 2) * weights, 2))
    c = torch.tensor([[True, False, True]])
    v, w3 = _x(1, 6), _x(1, 3, seed=11)

    def picked(t: Tensor) -> Tensor:
        return torch.where(c, t[:, :3], t[:, 3:]).masked_fill(
            torch.tensor([[False, False, True]]), 0
        )

    relevance = _input_relevance(_Op(picked), v, PLAIN, lambda o: (o * w3).sum())
    r_out = picked(v) * w3
    expected = torch.stack(
        [r_out[0, 0], v[0, 1] * 0, v[0, 2] * 0, v[0, 3] * 0, r_out[0, 1], v[0, 5] * 0]
    )
    torch.testing.assert_close(relevance[0], expected)
    patches = torch.rand(1, 4, 3, dtype=torch.float64) + 0.1  # 2x2 patches at 3 positions
    wmap = _x(1, 1, 2, 4, seed=12)
    folded = _input_relevance(_Op(lambda p: F.fold(p, (2, 4), 2, stride=1)), patches, PLAIN,
                              lambda o: (o * wmap).sum())  # fmt: skip
    # R_k = z_k w_k, shared as x_j / z_k: each patch entry gets x_j w_k of the pixel it lands on
    torch.testing.assert_close(folded, patches * F.unfold(wmap, 2, stride=1))

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


class _TwoLayers(nn.Module):
    """``x (B, 1, 1, 2) -> relu(W1 x + b1) -> W2 h + b2 (B, 2)``, known weights, float64."""

    def __init__(self):
        super().__init__()
        self.first, self.act, self.second = nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2)
        with torch.no_grad():
            self.first.weight.copy_(torch.tensor([[1.0, 2.0], [0.5, -1.0]]))
            self.first.bias.copy_(torch.tensor([3.0, 0.5]))
            self.second.weight.copy_(torch.tensor([[1.0, 1.0], [2.0, -1.0]]))
            self.second.bias.copy_(torch.tensor([0.25, 0.0]))
        self.double()

    def forward(self, x: Tensor) -> Tensor:
        return self.second(self.act(self.first(x.flatten(1))))


def test_conservation_record_equals_the_sums_by_hand() -> None:
    """LRP-0 (Epsilon(0)) by hand: ``R_h = h w2 / z2 * S``, ``R_x = x w1 / z1 * R_h``; the
    record's shares are their sums over the score, the bias of the first layer loses most."""
    from camkit import LRP

    model = _TwoLayers()
    x = torch.tensor([[1.0, 0.5], [2.0, 1.0]], dtype=torch.float64)
    lrp = LRP(model, composite=[(nn.Linear, Epsilon(0.0))], layers=["act"], tolerance=None)
    relevance = lrp(x.view(2, 1, 1, 2), 0).view(2, 2)
    z1 = x @ model.first.weight.T.detach() + model.first.bias.detach()
    h = z1.clamp(min=0)
    score = h @ model.second.weight[0].detach() + model.second.bias[0].detach()
    r_h = h * model.second.weight[0].detach() / score[:, None] * score[:, None]
    r_x = (x[:, :, None] * model.first.weight.T.detach()[None] / z1[:, None, :]) @ r_h[:, :, None]
    r_x = r_x[..., 0]
    assert torch.allclose(relevance.double(), r_x, rtol=1e-6, atol=0)
    record = lrp.conservation
    expected_input = (r_x.sum(1) / score).float()
    expected_act = (r_h.sum(1) / score).float()
    assert torch.allclose(record["input"][:, 0], expected_input)
    assert torch.allclose(record["act"][:, 0], expected_act)
    assert record.stages == ("act", "input")
    assert torch.allclose(record.lost["act"][:, 0], 1 - expected_act)
    assert torch.allclose(record.lost["input"][:, 0], expected_act - expected_input)
    # first sample: 1 - R_h/S = 0.25/8.75; R_h/S - R_x/S: the biases 3 and 0.5 of z1
    assert [row[0][:2] for row in record.lossiest()] == [("act", "input"), ("act", "input")]
    summary = record.summary()
    assert summary[0][0]["lost_most"]["between"] == ["act", "input"]
    assert summary[0][0]["input"] == pytest.approx(float(expected_input[0]), abs=1e-6)
    assert lrp.measured() == [[{"conservation": row[0]}] for row in summary]


def test_the_warning_names_the_step_that_loses_most() -> None:
    from camkit import LRP
    from camkit.errors import ConservationWarning

    model = _TwoLayers()
    x = torch.tensor([[[[1.0, 0.5]]]], dtype=torch.float64)
    lrp = LRP(model, composite=[(nn.Linear, Epsilon(0.0))], layers=["act"], tolerance=0.1)
    with pytest.warns(ConservationWarning, match="between 'act' and 'input'"):
        lrp(x, 0)


class _Gated(nn.Module):
    """A product of two operands, written as the models write it."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind

    def forward(self, x: Tensor) -> Tensor:
        a, b = x[:, :1], x[:, 1:]
        if self.kind == "squeeze-excitation":
            return a * torch.sigmoid(b)
        if self.kind == "silu":
            return a * torch.sigmoid(a)
        if self.kind == "gated-mlp":
            return torch.nn.functional.silu(a) * b
        return torch.relu(a) * b


@pytest.mark.parametrize(
    ("kind", "uniform", "constant"),
    [
        # y = a * sigmoid(b): the gate's half goes to b through the sigmoid (Pass)
        ("squeeze-excitation", (0.5, 0.5), (1.0, 0.0)),
        # y = a * sigmoid(a): both halves come back to a
        ("silu", (1.0, 0.0), (1.0, 0.0)),
        # y = silu(a) * b: the activated factor is the gate, b gets it all
        ("gated-mlp", (0.5, 0.5), (0.0, 1.0)),
        # y = relu(a) * b: no factor is a smooth gate: the uniform rule in both
        ("relu-product", (0.5, 0.5), (0.5, 0.5)),
    ],
)
def test_gate_rules_by_hand(kind: str, uniform: tuple, constant: tuple) -> None:
    """The two gate rules on a product of two operands: the shares of ``y`` that each operand
    gets, by hand (the uniform rule: half to each factor, AttnLRP; the constant gate: all to
    the gated factor), within the stabiliser 1e-6."""
    x = torch.tensor([[1.5, 0.7], [0.8, -0.4]], dtype=torch.float64)
    model = _Gated(kind)
    y = model(x)[:, 0]
    for gates, expected in (("uniform", uniform), ("constant", constant)):
        spec = composite([(nn.Linear, Epsilon())], gates=gates, canonizers=[])
        leaf = x.clone().requires_grad_(True)
        with rules_applied(model, spec):
            out = model(leaf)
        (grad,) = torch.autograd.grad(out.sum(), leaf)
        shares = (leaf.detach() * grad) / y[:, None]
        want = torch.tensor(expected, dtype=torch.float64).expand_as(shares)
        assert torch.allclose(shares, want, atol=1e-5), (kind, gates, shares)


def test_unknown_gate_rule_is_refused() -> None:
    from camkit.errors import ArgumentError

    with pytest.raises(ArgumentError, match="gates must be one of"):
        composite("epsilon-plus", gates="half")


def _bias_unit_model(activation: nn.Module) -> nn.Module:
    """``x (2) -> Linear (3, bias) -> activation -> Linear (1, no bias)``: unit 0 linear (pre
    3.5), unit 1 saturating a ReLU6 (pre 8), unit 2 on only by its bias (``-x_0 + 4 = 3``: no
    positive term, ``z+ = 0``)."""
    first, second = nn.Linear(2, 3), nn.Linear(3, 1, bias=False)
    with torch.no_grad():
        first.weight.copy_(torch.tensor([[1.0, 1.0], [3.0, 2.0], [-1.0, 0.0]]))
        first.bias.copy_(torch.tensor([0.5, 1.0, 4.0]))
        second.weight.copy_(torch.tensor([[1.0, 2.0, 3.0]]))
    return nn.Sequential(first, activation, second).double()


@pytest.mark.parametrize(
    ("activation", "saturated"),
    [(nn.ReLU6(), 6.0), (nn.ReLU6(inplace=True), 6.0), (nn.ReLU(inplace=True), 8.0)],
)
def test_bias_units_by_hand(activation: nn.Module, saturated: float) -> None:
    """ZPlus without biases on the model above, ``x = (1, 2)``, by hand in float64. The score
    is ``a_0 + 2 a_1 + 3 a_2 = 3.5 + 2 s + 9`` (``s``: 6 where ReLU6 saturates, 8 for a ReLU);
    ReLU6 passes the saturated unit's relevance (the Pass rule). ``bias_units="input"``: the
    second layer gives ``(3.5, 2 s, 9)``; unit 1's ``2 s`` goes to ``x`` as ``(3, 4) / 7``, unit
    0's as ``(1, 2) / 3``, unit 2 (``z+ = 0``) loses its 9. ``bias_units="bias"``: unit 2 is a
    bias of the second layer, which gives ``(3.5, 2 s) * score / (3.5 + 2 s)``: all of the
    score reaches ``x``."""
    model = _bias_unit_model(activation)
    x = torch.tensor([[1.0, 2.0]], dtype=torch.float64)
    units = (3.5, 2 * saturated)
    score = sum(units) + 9.0
    expected = {
        "input": torch.tensor(
            [units[0] / 3 + 3 * units[1] / 7, 2 * units[0] / 3 + 4 * units[1] / 7]
        ),
        "bias": torch.tensor([units[0] / 3 + 3 * units[1] / 7, 2 * units[0] / 3 + 4 * units[1] / 7])
        * score
        / sum(units),
    }
    for bias_units, wanted in expected.items():
        rules = composite([(nn.Linear, ZPlus(zero_params="bias"))], bias_units=bias_units)
        leaf = x.clone().requires_grad_(True)
        with rules_applied(model, rules):
            out = model(leaf)
        assert float(out.detach()) == pytest.approx(score, abs=1e-12)
        (grad,) = torch.autograd.grad(out.sum(), leaf)
        relevance = (leaf * grad).detach()[0]
        torch.testing.assert_close(relevance, wanted.double(), rtol=1e-6, atol=1e-6)
    assert float(relevance.sum()) == pytest.approx(score, rel=1e-6)  # "bias": conserved


def test_bias_units_of_a_dead_channel_through_merged_batch_norms() -> None:
    """An inverted-residual-like block, float64: 1x1 conv -> BatchNorm -> ReLU6 (channel 2
    switched off everywhere by its negative weights) -> depthwise 3x3 conv -> BatchNorm (a
    positive shift: channel 2 becomes the constant ``relu6(shift)``) -> ReLU6 -> 1x1 conv,
    summed. ZPlus without biases (BatchNorms merged). ``bias_units="input"``: the last conv
    gives channel 2 the share ``sum(w_2 a_2) / sum(w a)`` of the score, lost at the depthwise
    conv (its windows are all 0); ``"bias"``: all of the score reaches the input."""
    generator = torch.Generator().manual_seed(0)
    rand = lambda *shape: torch.rand(shape, generator=generator)  # noqa: E731
    expand, depthwise = nn.Conv2d(2, 3, 1), nn.Conv2d(3, 3, 3, padding=1, groups=3)
    project = nn.Conv2d(3, 1, 1, bias=False)
    norms = [nn.BatchNorm2d(3), nn.BatchNorm2d(3)]
    with torch.no_grad():
        expand.weight.copy_(torch.tensor([1.0, 0.5, -1.0]).view(3, 1, 1, 1).expand(3, 2, 1, 1))
        expand.bias.copy_(torch.tensor([0.1, 0.2, -0.1]))
        depthwise.weight.copy_(rand(3, 1, 3, 3) + 0.1)
        project.weight.copy_(torch.tensor([1.0, 2.0, 3.0]).view(1, 3, 1, 1))
        for bn in norms:
            bn.weight.copy_(rand(3) + 0.5)
            bn.running_mean.copy_(rand(3) * 0.1)
            bn.running_var.copy_(rand(3) + 0.5)
        norms[1].bias.copy_(torch.tensor([0.0, 0.1, 2.0]))
    model = nn.Sequential(
        expand, norms[0], nn.ReLU6(), depthwise, norms[1], nn.ReLU6(), project, nn.Flatten(0)
    )
    model = model.double().eval()
    x = rand(1, 2, 4, 4).double() + 0.1
    with torch.no_grad():
        a, off = model[:6](x), model[:3](x)
    assert float(off[:, 2].abs().max()) == 0 and float(a[:, 2].min()) > 0
    contributions = project.weight.detach().view(1, 3, 1, 1) * a
    lost = float(contributions[:, 2].sum() / contributions.sum())
    assert lost > 0.1
    for bias_units, kept in (("input", 1 - lost), ("bias", 1.0)):
        rules = composite([(nn.Conv2d, ZPlus(zero_params="bias"))], bias_units=bias_units)
        leaf = x.clone().requires_grad_(True)
        with rules_applied(model, rules):
            score = model(leaf).sum()
        (grad,) = torch.autograd.grad(score, leaf)
        share = float((leaf.detach() * grad).sum() / score.detach())
        assert share == pytest.approx(kept, rel=1e-5), bias_units


def test_unknown_bias_unit_rule_is_refused() -> None:
    from camkit.errors import ArgumentError

    with pytest.raises(ArgumentError, match="bias_units must be one of"):
        composite("epsilon-plus", bias_units="drop")


def test_the_manifest_records_the_conservation_of_lrp_runs(tmp_path) -> None:
    """``camkit explain --method lrp,saliency``: each LRP record carries the conservation record
    of its sample and target (equal to the library's on the same input), Saliency's none; the
    report's detail view shows it."""
    import json

    import torchvision
    from PIL import Image
    from skimage import data

    from camkit import LRP, cli, models

    torch.manual_seed(0)
    weights = tmp_path / "resnet18.pth"
    torch.save(torchvision.models.resnet18().state_dict(), weights)
    Image.fromarray(data.chelsea()).save(tmp_path / "chelsea.png")
    out = tmp_path / "out"
    argv = ["explain", str(tmp_path / "chelsea.png"), "--model", "torchvision:resnet18"]
    argv += ["--weights", str(weights), "--out", str(out), "--method", "lrp,saliency"]
    argv += ["--target", "3"]
    assert cli.main(argv) == 0
    records = json.loads((out / "manifest.json").read_text())["records"]
    lrp_record = next(r for r in records if r["method"] == "lrp")
    assert "conservation" not in next(r for r in records if r["method"] == "saliency")
    loaded = models.load("torchvision:resnet18", weights=str(weights))
    x = loaded.preprocess(data.chelsea())[None]
    lrp = LRP(loaded.model, tolerance=None)
    lrp(x, 3)
    expected = lrp.conservation.summary()[0][0]
    assert lrp_record["conservation"]["input"] == pytest.approx(expected["input"], rel=1e-3)
    assert lrp_record["conservation"]["lost_most"]["between"] == ["output", "input"]
    # the report shows it in the detail view of the LRP overlay
    import re

    from camkit.cli import report

    page = report.write_report(out, records).read_text("utf-8")
    blob = re.search(r'<script type="application/json" id="camkit-data">(.*?)</script>', page, re.S)
    overlays = json.loads(blob[1])["images"][0]["overlays"]
    info = next(o["info"] for o in overlays if o["method"] == "lrp")
    assert info["score share at the input"] == lrp_record["conservation"]["input"]
    assert info["loses most"].startswith("output → input (")


@pytest.mark.slow
def test_packaged_model_keeps_the_score_with_the_default_composite() -> None:
    """The packaged EfficientNet-Lite0 on two shipped photos at 224 px: the default composite
    keeps 50%-150% of the score at the input (measured 0.9992-0.9996 on the five photos,
    benchmarks/CONSERVATION.md) and at every recorded stage, without a warning. The same
    composite with the bias units as inputs (zennit's reading, ``bias_units="input"``) loses
    most of it between ``blocks.6`` and ``blocks.4`` (measured 3.3%-8.8% kept), and zennit's
    epsilon-plus-flat keeps less still: the units that only their BatchNorm shift drives are
    where it went (camkit.relevance.bias_units)."""
    import warnings

    from camkit import LRP, models
    from camkit.cli.commands.demo import demo_photos
    from camkit.errors import ConservationWarning

    loaded = models.load(models.DEFAULT_MODEL)
    photos = demo_photos()
    x = torch.stack([loaded.preprocess(photos[name]) for name in ("chelsea", "coffee")])
    stages = ["blocks.4", "blocks.6"]
    lrp = LRP(loaded.model, layers=stages)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConservationWarning)
        relevance = lrp(x, None)
    kept = lrp.conservation
    assert relevance.shape == x.shape
    for stage in ("input", *stages):
        assert ((kept[stage] > 0.5) & (kept[stage] < 1.5)).all(), stage
    as_inputs = composite("epsilon-plus-flat-nobias", bias_units="input")
    with pytest.warns(ConservationWarning, match="between 'blocks.6' and 'blocks.4'"):
        LRP(loaded.model, composite=as_inputs, layers=stages)(x, None)
    lost = LRP(loaded.model, composite=as_inputs, layers=stages, tolerance=None)
    lost(x, None)
    assert (lost.conservation["blocks.6"] - 1).abs().max() < 1e-3  # the head conserves
    assert (lost.conservation.input < 0.5).all()
    zennit_like = LRP(loaded.model, composite="epsilon-plus-flat", tolerance=None)
    zennit_like(x, None)
    assert (zennit_like.conservation.input < lost.conservation.input).all()


def _calibrated(arch: str, x: Tensor) -> nn.Module:
    """A torchvision model with random weights and BatchNorms that are not the identity: random
    affine parts, running statistics measured on ``x`` (as benchmarks/conservation.py)."""
    import torchvision

    torch.manual_seed(0)
    model = getattr(torchvision.models, arch)(weights=None)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for bn in model.modules():
            if isinstance(bn, nn.BatchNorm2d):
                bn.weight.copy_(1 + 0.2 * torch.randn(bn.weight.shape, generator=generator))
                bn.bias.copy_(0.2 * torch.randn(bn.bias.shape, generator=generator))
                bn.reset_running_stats()
                bn.momentum = None
        model.train()
        model(x)
    return model.eval()


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["resnet50", "efficientnet_b0", "mobilenet_v3_large"])
def test_default_composite_conserves_on_batch_norm_and_gated_networks(arch: str) -> None:
    """ResNet-50, EfficientNet-B0 (squeeze-excitation gates, SiLU) and MobileNetV3 (hardswish,
    SE), BatchNorm statistics not the identity, the shipped photos at 64 px: the default keeps
    50%-150% of every score (measured 0.93-1.00 at 112 px; MobileNetV3 0.80-0.98, 0.89-0.92
    here, 0.63-0.75 with its bias units as inputs), zennit's epsilon-plus-flat does not."""
    from camkit import LRP, models
    from camkit.cli.commands.demo import demo_photos

    prep = models.Preprocess(64)
    x = torch.stack([prep(photo) for photo in list(demo_photos().values())[:3]])
    model = _calibrated(arch, x)
    lrp = LRP(model, tolerance=None)
    lrp(x, None)
    assert ((lrp.conservation.input > 0.5) & (lrp.conservation.input < 1.5)).all()
    zennit_like = LRP(model, composite="epsilon-plus-flat", tolerance=None)
    zennit_like(x, None)
    assert (zennit_like.conservation.input < 0.5).any()


def test_the_explorer_returns_the_conservation_with_an_lrp_map(tmp_path) -> None:
    """``/api/map?method=lrp``: the map comes with its conservation record (the library's on
    the same input) in the ``X-Camkit-Measured`` header; a Saliency map with none."""
    import json

    pytest.importorskip("starlette")
    from starlette.testclient import TestClient
    from test_serve import TOKEN, explorer_for, model_input, photo_folder

    from camkit import LRP
    from camkit.serve import security
    from camkit.serve.app import create_app

    explorer = explorer_for(photo_folder(tmp_path))
    with TestClient(create_app(explorer, token=TOKEN)) as client:
        client.headers[security.TOKEN_HEADER] = TOKEN
        params = {"image": 6, "class": 2, "method": "lrp", "format": "npy"}
        response = client.get("/api/map", params=params)
        assert response.status_code == 200, response.text
        measured = json.loads(response.headers["X-Camkit-Measured"])
        saliency = client.get("/api/map", params=params | {"method": "saliency"})
        assert "X-Camkit-Measured" not in saliency.headers
    lrp = LRP(explorer.checkpoints["a"].model)
    lrp(model_input(explorer, 6)[None], 2)
    expected = lrp.conservation.summary()[0][0]
    assert measured["conservation"]["input"] == pytest.approx(expected["input"], rel=1e-4)
    assert measured["conservation"]["lost_most"]["between"] == ["output", "input"]


@pytest.mark.slow
def test_the_explorer_page_shows_the_conservation_of_an_lrp_map(tmp_path) -> None:
    """In headless chromium: choosing LRP captions the map with the share of the score that
    reaches the input (the server's record), and Saliency's caption says nothing of it."""
    from tests.test_report import Browser, needs_browser

    if needs_browser.args[0]:
        pytest.skip(needs_browser.kwargs["reason"])
    from test_serve import TOKEN, change, explorer_for, open_explorer, photo_folder, settle

    from camkit.serve.app import create_app, running

    explorer = explorer_for(photo_folder(tmp_path))
    caption = "document.querySelector('#maps figcaption').textContent"
    with running(create_app(explorer, token=TOKEN)) as base:
        browser = Browser(tmp_path / "profile")
        try:
            open_explorer(browser, f"{base}/?token={TOKEN}")
            browser.js("document.querySelector('.card[data-id=\"4\"]').click()")
            browser.js("new Promise((done) => setTimeout(done, 100))")
            settle(browser)
            change(browser, "method", "saliency")
            assert "reaches the input" not in browser.js(caption)
            change(browser, "method", "lrp")
            shown = browser.js(caption)
            target = int(
                explorer.checkpoints["a"]
                .model(explorer.model_input(4)[None].to(explorer.device))
                .argmax()
            )
            record = explorer.measured.get_item(explorer.keys("a", "lrp", (None,), 4, target)[0])
            assert record is not None
            share = f"{100 * record['conservation']['input']:.3g}"
            assert f"{share}% of the score reaches the input" in shown or "e" in share, shown
            assert "(most lost between output and input)" in shown
            assert browser.problems() == []
        finally:
            browser.close()


def test_a_zero_score_has_no_share_and_no_warning() -> None:
    """A score of 0: the share is NaN (None in the summary), and nothing warns about it."""
    import warnings

    from camkit.relevance import Conservation

    scores = torch.tensor([[0.0], [2.0]])
    record = Conservation.of({"input": torch.tensor([[0.0], [1.5]])}, scores, [])
    assert record.input[0, 0].isnan() and record.input[1, 0] == 0.75
    assert record.summary()[0][0]["input"] is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        record.check(0.5, 1.5, "test")

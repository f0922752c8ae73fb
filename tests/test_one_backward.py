"""The one backward: the plain gradient, the ReLU rules and LRP composites are rule sets that every
gradient method takes. Numbers against hand-written integrals and means under ``rules_applied``,
and against zennit 0.5.1 / captum where they run (float64, tiny models with seeded weights)."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from camkit import LRP, GuidedBackprop, IntegratedGradients, Saliency, SmoothGrad
from camkit.core.call import Call
from camkit.errors import ArgumentError
from camkit.methods.pixel import QUADRATURES, quadrature_rule
from camkit.relevance import Composite, Epsilon, composite, rules_applied

TARGET = 1


def small_cnn() -> nn.Module:
    """conv -> relu -> conv -> relu -> avgpool -> linear, float64, biases included."""
    torch.manual_seed(0)
    return (
        nn.Sequential(
            nn.Conv2d(2, 3, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(3, 4, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(2),
            nn.Flatten(),
            nn.Linear(16, 3),
        )
        .double()
        .eval()
    )


def image(batch: int = 2) -> Tensor:
    return torch.rand(
        batch, 2, 5, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1)
    )


def ruled_gradient(model: nn.Module, x: Tensor, rule_set: object, target: int = TARGET) -> Tensor:
    """The rule set's modified gradient of the target score at ``x``, by hand."""
    leaf = x.detach().clone().requires_grad_(True)
    with rules_applied(model, rule_set):
        out = model(leaf)
    (grad,) = torch.autograd.grad(out[:, target].sum(), leaf)
    return grad


def raw(method: object, x: Tensor) -> Tensor:
    """The method's float64 attribution of ``x`` for TARGET, before the float32 result."""
    (attr,) = method.attribute((x,), TARGET, Call(x))
    return attr[:, 0]


def close(a: Tensor, b: Tensor, rel: float = 1e-6) -> bool:
    return bool((a - b).abs().max() <= rel * b.abs().max())


# --- rule sets ------------------------------------------------------------------------------


def test_guided_is_a_rule_set_of_the_one_engine():
    model, x = small_cnn(), image()
    guided = GuidedBackprop(model)(x, target=TARGET)
    assert torch.equal(Saliency(model, composite="guided")(x, target=TARGET), guided)
    by_hand = ruled_gradient(model, x, "guided").float()
    assert torch.allclose(guided, by_hand, rtol=0, atol=1e-7)
    assert not torch.allclose(guided, Saliency(model)(x, target=TARGET), atol=1e-4)
    assert torch.equal(
        Saliency(model, composite="gradient")(x, target=TARGET), Saliency(model)(x, target=TARGET)
    )


def test_rule_and_composite_together_is_an_error():
    with pytest.raises(ArgumentError, match="not both"):
        Saliency(small_cnn(), rule="guided", composite="epsilon-plus")


def test_saliency_over_an_lrp_composite_is_the_modified_gradient():
    model, x = small_cnn(), image()
    got = raw(Saliency(model, composite="epsilon-plus"), x)
    want = ruled_gradient(model, x, "epsilon-plus").float()
    assert close(got, want)
    assert not close(got, Saliency(model)(x, target=TARGET), rel=1e-2)


# --- Integrated Gradients over a composite ---------------------------------------------------


@pytest.mark.parametrize("name", ["epsilon-plus", "epsilon-gamma-box", "guided"])
@pytest.mark.parametrize("quadrature", ["trapezoid", "riemann_middle", "gausslegendre"])
def test_integrated_gradients_over_a_composite_is_the_hand_integral(name, quadrature):
    model, x = small_cnn(), image()
    steps = 6
    ig = IntegratedGradients(
        model, steps=steps, composite=name, quadrature=quadrature, batch_size=5
    )
    got = raw(ig, x)
    alphas, weights = quadrature_rule(quadrature, steps)
    integral = sum(
        w * ruled_gradient(model, a * x, name) for a, w in zip(alphas, weights, strict=True)
    )
    want = x * integral
    assert got.dtype == torch.float64
    assert close(got, want)


def test_the_quadrature_rules_are_captums():
    from captum.attr._utils.approximation_methods import approximation_parameters

    for method in ("riemann_left", "riemann_right", "riemann_middle", "riemann_trapezoid"):
        sizes, alphas = approximation_parameters(method)
        ours = quadrature_rule(method, 7)
        assert torch.allclose(ours[0], torch.tensor(alphas(7), dtype=torch.float64), atol=1e-7)
        assert torch.allclose(ours[1], torch.tensor(sizes(7), dtype=torch.float64), atol=1e-12)
    sizes, alphas = approximation_parameters("gausslegendre")
    ours = quadrature_rule("gausslegendre", 7)
    assert torch.allclose(ours[0], torch.tensor(alphas(7), dtype=torch.float64), atol=1e-12)
    assert torch.allclose(ours[1], torch.tensor(sizes(7), dtype=torch.float64), atol=1e-12)
    assert set(QUADRATURES) >= {"trapezoid", "zennit", "gausslegendre"}
    with pytest.raises(ArgumentError, match="quadrature"):
        IntegratedGradients(small_cnn(), quadrature="simpson")


def test_integrated_gradients_equals_captums_for_each_quadrature():
    from captum.attr import IntegratedGradients as CaptumIG

    model, x = small_cnn(), image()
    for method in ("riemann_left", "riemann_right", "riemann_middle", "gausslegendre"):
        ours = IntegratedGradients(model, steps=9, quadrature=method)
        theirs = CaptumIG(model).attribute(x, target=TARGET, n_steps=9, method=method)
        assert close(raw(ours, x), theirs)


def test_integrated_gradients_under_guided_rules_equals_zennits():
    pytest.importorskip("zennit")
    from zennit.attribution import IntegratedGradients as ZennitIG
    from zennit.composites import GuidedBackprop as ZennitGuided

    model, x = small_cnn(), image()
    onehot = torch.eye(3, dtype=x.dtype)[[TARGET] * len(x)]
    with ZennitIG(model, composite=ZennitGuided(), n_iter=7) as attributor:
        _, theirs = attributor(x, onehot)
    ig = IntegratedGradients(model, steps=7, rule="guided", quadrature="zennit")
    ours = raw(ig, x)
    assert close(ours, theirs)


def test_zennits_integrated_gradients_over_lrp_integrates_the_relevance():
    """zennit's hooks pass relevance (1 at the target) where camkit passes the modified gradient:
    its IG over an LRP composite is ``(x - x') mean_a x_a g(x_a) / f(x_a)``, with camkit's rules
    giving ``g`` point by point (camkit's own IG integrates ``g``: it is LRP itself on a
    bias-free ReLU network, see the next test); ``integrand="relevance"`` integrates zennit's."""
    pytest.importorskip("zennit")
    from zennit.attribution import IntegratedGradients as ZennitIG
    from zennit.composites import EpsilonPlus

    model, x = small_cnn(), image()
    onehot = torch.eye(3, dtype=x.dtype)[[TARGET] * len(x)]
    with ZennitIG(model, composite=EpsilonPlus(), n_iter=5) as attributor:
        _, theirs = attributor(x, onehot)
    alphas, weights = quadrature_rule("zennit", 5)
    integral = torch.zeros_like(x)
    for a, w in zip(alphas, weights, strict=True):
        score = model(a * x)[:, TARGET].detach().view(-1, 1, 1, 1)
        integral += w * a * x * ruled_gradient(model, a * x, "epsilon-plus") / score
    assert close(x * integral, theirs)
    # asked for zennit's quadrature and integrand, camkit gives zennit's numbers
    ig = IntegratedGradients(
        model, steps=5, composite="epsilon-plus", quadrature="zennit", integrand="relevance"
    )
    assert close(raw(ig, x), theirs)
    with pytest.raises(ArgumentError, match="integrand"):
        IntegratedGradients(model, integrand="input")


def test_integrated_gradients_over_epsilon_rules_is_lrp_without_biases():
    """On a bias-free ReLU network the Epsilon/ZPlus gradient is constant along the ray from 0,
    so IG over the composite from a zero baseline is LRP itself, for any quadrature (up to the
    stabilisers, which do not scale with the input: 1e-12 here)."""
    model, x = small_cnn(), image()
    for module in model.modules():
        if getattr(module, "bias", None) is not None:
            module.bias = None
    rules = composite("epsilon-plus", epsilon=1e-12, stabilizer=1e-12)
    lrp = x * ruled_gradient(model, x, rules)
    for quadrature in ("zennit", "gausslegendre"):
        ig = IntegratedGradients(model, steps=4, composite=rules, quadrature=quadrature)
        assert close(raw(ig, x), lrp)


def test_completeness_with_a_rule_without_the_ends():
    model, x = small_cnn(), image(1)
    for quadrature in ("riemann_middle", "trapezoid"):
        ig = IntegratedGradients(model, steps=200, quadrature=quadrature)
        report = ig.completeness(x, target=TARGET)
        delta = model(x)[0, TARGET] - model(torch.zeros_like(x))[0, TARGET]
        assert torch.allclose(report["delta"][0].double(), delta.detach(), atol=1e-6)  # float32
        assert float(report["relative"][0]) < 1e-2


# --- SmoothGrad over a composite -------------------------------------------------------------


class Recorder(nn.Module):
    """The model, keeping every input it is given (the noisy copies)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.seen: list[Tensor] = []

    def forward(self, x: Tensor) -> Tensor:
        self.seen.append(x.detach().clone())
        return self.model(x)


@pytest.mark.parametrize("name", ["epsilon-plus-flat", "guided"])
def test_smoothgrad_over_a_composite_is_the_mean_of_ruled_gradients(name):
    recorder, x = Recorder(small_cnn()), image()
    smooth = SmoothGrad(recorder, composite=name, samples=4, noise_level=0.2, seed=3, batch_size=2)
    got = raw(smooth, x)
    noisy = torch.cat(recorder.seen)  # row r: copy r // B of sample r % B
    assert noisy.shape[0] == 4 * len(x)
    grads = ruled_gradient(recorder.model, noisy, name)
    want = grads.view(4, len(x), *x.shape[1:]).mean(0)
    assert close(got, want)
    again = SmoothGrad(recorder.model, composite=name, samples=4, noise_level=0.2, seed=3)
    assert close(again(x, target=TARGET).double(), want, rel=1e-5)  # the same noise


# --- LRP takes what Saliency takes ----------------------------------------------------------


def mlp() -> nn.Module:
    torch.manual_seed(0)
    layers = [nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 5), nn.ReLU(), nn.Linear(5, 3)]
    return nn.Sequential(*layers).double().eval()


def vectors() -> Tensor:
    return torch.randn(4, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(2))


def test_lrp_of_an_mlp_over_vectors_equals_zennit_and_captum():
    pytest.importorskip("zennit")
    from captum.attr import LRP as CaptumLRP
    from zennit.attribution import Gradient
    from zennit.composites import EpsilonPlus

    model, x = mlp(), vectors()
    ours = raw(LRP(model, composite="epsilon-plus"), x)
    with Gradient(model, composite=EpsilonPlus()) as attributor:
        out, theirs = attributor(x, torch.eye(3, dtype=x.dtype)[[TARGET] * len(x)])
    assert close(ours, theirs * out[:, TARGET, None])  # zennit starts from 1, camkit the score
    captums = CaptumLRP(model).attribute(x, target=TARGET)  # Epsilon(1e-9) on every layer
    assert close(raw(LRP(model, composite=[(nn.Linear, Epsilon(1e-9))]), x), captums)
    both = LRP(model, composite="epsilon-plus")(x, target=[[0, TARGET]] * 4)  # (B, K, F)
    assert both.shape == (4, 2, 6) and close(both[:, 1].double(), ours, rel=1e-5)
    one = LRP(model, composite="epsilon-plus")(x[0], target=TARGET)  # one vector (F,)
    assert one.shape == (6,) and close(one.double(), ours[0], rel=1e-5)


class Concatenated(nn.Module):
    """``model(a, b)``: two branches concatenated (no functional sum), as captum's LRP needs."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(6, 4), nn.Linear(3, 2)
        self.relu, self.fc = nn.ReLU(), nn.Linear(6, 3)

    def forward(self, a: Tensor, b: Tensor) -> Tensor:
        return self.fc(self.relu(torch.cat([self.a(a), self.b(b)], 1)))


class Summed(Concatenated):
    """``model(a, b)``: two branches summed in ``forward`` (the Norm rule's case)."""

    def __init__(self):
        super().__init__()
        self.b = nn.Linear(3, 4)
        self.fc = nn.Linear(4, 3)

    def forward(self, a: Tensor, b: Tensor) -> Tensor:
        return self.fc(self.relu(self.a(a) + self.b(b)))


def side() -> Tensor:
    return torch.randn(4, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(3))


def test_lrp_of_a_two_input_model_equals_captum():
    from captum.attr import LRP as CaptumLRP

    torch.manual_seed(2)
    model, a, b = Concatenated().double().eval(), vectors(), side()
    lrp = LRP(model, composite=[(nn.Linear, Epsilon(1e-9))])
    ours_a, ours_b = lrp.attribute((a, b), TARGET, Call((a, b)))
    theirs_a, theirs_b = CaptumLRP(model).attribute((a, b), target=TARGET)
    assert close(ours_a[:, 0], theirs_a) and close(ours_b[:, 0], theirs_b)
    # b as additional_forward_args: a's relevance is the same (cat moves the gradient exactly)
    only_a = lrp(a, target=TARGET, additional_forward_args=(b,))
    assert close(only_a.double(), theirs_a, rel=1e-5)


def test_lrp_of_a_summed_two_input_model_equals_the_hand_rules():
    """Epsilon (tiny) on the layers, Pass on the ReLU, Norm on the sum, written out."""
    torch.manual_seed(4)
    model, a, b = Summed().double().eval(), vectors(), side()
    eps = 1e-12
    lrp = LRP(model, composite=Composite([(nn.Linear, Epsilon(eps))], stabilizer=eps))
    ours_a, ours_b = lrp.attribute((a, b), TARGET, Call((a, b)))
    za, zb = model.a(a), model.b(b)
    s = za + zb
    h = s.relu()
    r_h = h * model.fc.weight[TARGET]  # R_out = score; eps negligible
    r_s = r_h  # Pass: o / x is 1 where s > 0, and h = 0 (no relevance) elsewhere
    r_za, r_zb = za / s * r_s, zb / s * r_s  # Norm at the sum
    want_a = a * ((r_za / za) @ model.a.weight)  # Epsilon at each branch
    want_b = b * ((r_zb / zb) @ model.b.weight)
    assert close(ours_a[:, 0], want_a.detach()) and close(ours_b[:, 0], want_b.detach())


def test_lrp_takes_the_relu_rules_and_refuses_two_rule_sets():
    model, x = small_cnn(), image()
    guided = LRP(model, rule="guided")(x, target=TARGET)
    assert close(guided.double(), x * ruled_gradient(model, x, "guided"), rel=1e-5)
    with pytest.raises(ArgumentError, match="not both"):
        LRP(model, rule="guided", composite="epsilon-plus")


# --- concepts take the extra inputs and the rule set -----------------------------------------


class Gated(nn.Module):
    """``model(x, gate)``: channel 2 of the convolution's output is multiplied by ``gate (B,)``."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(5)
        self.conv, self.relu, self.head = nn.Conv2d(2, 4, 3, padding=1), nn.ReLU(), nn.Linear(4, 3)
        with torch.no_grad():  # channel 2 is evidence for every class (guided keeps it)
            self.head.weight[:, 2].abs_()

    def forward(self, x: Tensor, gate: Tensor) -> Tensor:
        ones = torch.ones(len(x), 1, dtype=x.dtype)
        scale = torch.cat([ones, ones, gate[:, None], ones], 1)[:, :, None, None]
        return self.head((self.relu(self.conv(x)) * scale).mean((2, 3)))


@pytest.mark.parametrize("rules", ["gradient", "guided", "epsilon-plus"])
def test_a_gated_channel_has_no_relevance_when_its_gate_is_closed(rules):
    from camkit.methods.concepts import ConceptAttribution, ReferenceCollector

    model = Gated().double().eval()
    x, gate = image(), torch.tensor([0.0, 1.0], dtype=torch.float64)
    concepts = ConceptAttribution(model, "conv", rules=rules, batch_size=1)
    extra = {"additional_forward_args": (gate,)}
    relevance = concepts.relevances(x, TARGET, **extra)
    assert relevance[0, 2] == 0 and relevance[1, 2] != 0
    assert relevance[0].abs().sum() > 0  # the other channels keep theirs
    heat = concepts.heatmaps(x, [2, 0], TARGET, **extra)
    assert heat[0, 0].abs().max() == 0 and heat[1, 0].abs().max() > 0
    top = concepts.top(x, 4, TARGET, **extra)
    assert 2 not in top.channels[0][top.relevance[0] != 0].tolist()
    dominant = concepts.dominant(x[:1], 4, TARGET, additional_forward_args=(gate[:1],))
    assert 2 not in dominant.channels[dominant.relevance != 0].tolist()
    # the relevance under the rules, by hand: A * dS/dA at the layer
    leaf = x.clone().requires_grad_(True)
    with rules_applied(model, rules):
        acts = {}
        handle = model.conv.register_forward_hook(lambda m, i, o: acts.update(a=o))
        try:
            out = model(leaf, gate)
        finally:
            handle.remove()
    (grad,) = torch.autograd.grad(out[:, TARGET].sum(), acts["a"])
    assert close(relevance, (acts["a"] * grad).sum((2, 3)).detach())
    collector = ReferenceCollector(model, "conv", top=2, rules=rules)
    collector.update(x, [0, 1], **extra)
    scores = collector.totals["relevance"]
    assert collector.found["relevance"].values.shape[0] == 4 and torch.isfinite(scores).all()
    with pytest.raises(TypeError):
        concepts.relevances(x, TARGET)  # without its gate the model cannot run


@pytest.mark.parametrize("rules", ["guided", "epsilon-plus-flat"])
def test_a_rule_set_draws_nothing_from_torchs_random_generator(rules):
    """A call under a rule set leaves the user's random numbers alone (each block once built a
    probe ``nn.Linear``, whose initialisation drew from the global generator)."""
    model, x = small_cnn(), image()
    state = torch.get_rng_state()
    ruled_gradient(model, x, rules)
    assert torch.equal(torch.get_rng_state(), state)

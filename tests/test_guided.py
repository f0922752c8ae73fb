"""Guided backpropagation, the deconvnet and Guided Grad-CAM: the ReLU rule reaches every ReLU."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
import torchvision
from conftest import TinyNet, X, assert_untouched, model_state
from torch import Tensor, nn

from camkit import Deconvnet, GradCAM, GuidedBackprop, GuidedGradCAM, Saliency
from camkit.methods.pixel.rules import UnmodifiedActivationWarning, rectifier_rule


class RefGuidedReLU(torch.autograd.Function):
    """The hand-written guided ReLU of the tutorials, to insert by hand in a reference model."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.clamp(min=0)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * (x > 0) * (grad > 0)


def plain_gradient(model: nn.Module, x: Tensor, target: int) -> Tensor:
    leaf = x.detach().clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(model(leaf)[:, target].sum(), leaf)
    return grad


def no_function_mode() -> bool:
    return torch._C._len_torch_function_stack() == 0


# --- every way to apply a ReLU ------------------------------------------------------------


def _ignore_result(x: Tensor) -> Tensor:
    x.relu_()  # in place, the return value is dropped (the tensor itself is used later)
    return x


FUNCTIONAL = {
    "F.relu": F.relu,
    "F.relu(inplace=True)": lambda x: F.relu(x, inplace=True),
    "F.relu_": F.relu_,
    "torch.relu": torch.relu,
    "torch.relu_": torch.relu_,
    "Tensor.relu": Tensor.relu,
    "Tensor.relu_ (result ignored)": _ignore_result,
    "F.threshold(x, 0, 0)": lambda x: F.threshold(x, 0.0, 0.0),
}
MODULES = {
    "nn.ReLU": lambda: nn.ReLU(),
    "nn.ReLU(inplace=True)": lambda: nn.ReLU(inplace=True),
}


class LeNet(nn.Module):
    """LeNet of the classic tutorials, with one ReLU applied four times in ``forward``.

    ``relu`` is a function (functional style), or a module: ``shared=True`` reuses one module
    four times per forward, else every position gets its own. ``reference`` replaces them all by
    :class:`RefGuidedReLU`.
    """

    def __init__(self, relu=F.relu, *, module=None, shared=False, reference=False):
        super().__init__()
        torch.manual_seed(0)
        self.conv1 = nn.Conv2d(1, 4, 3, padding=1)
        self.conv2 = nn.Conv2d(4, 6, 3, padding=1)
        self.fc1 = nn.Linear(6 * 2 * 2, 12)
        self.fc2 = nn.Linear(12, 10)
        self.fc3 = nn.Linear(10, 3)
        if module is not None:
            self.acts = nn.ModuleList([module()] if shared else [module() for _ in range(4)])
        self.relu = RefGuidedReLU.apply if reference else relu
        self.module = module is not None and not reference

    def act(self, x: Tensor, i: int) -> Tensor:
        if self.module:
            return self.acts[i % len(self.acts)](x)
        return self.relu(x)

    def forward(self, x):
        x = F.max_pool2d(self.act(self.conv1(x), 0), 2)
        x = F.max_pool2d(self.act(self.conv2(x), 1), 2).flatten(1)
        x = self.act(self.fc1(x), 2)
        x = self.act(self.fc2(x), 3)
        return self.fc3(x)


IMAGES = torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(1))


def guided_reference(x: Tensor, target: int) -> Tensor:
    return plain_gradient(LeNet(reference=True), x, target)


@pytest.mark.parametrize("style", FUNCTIONAL)
def test_guided_reaches_functional_relus(style):
    model = LeNet(FUNCTIONAL[style])
    before = model_state(model)
    plain = plain_gradient(model, IMAGES, 1)
    guided = GuidedBackprop(model)(IMAGES, target=1)
    reference = guided_reference(IMAGES, 1)
    assert torch.allclose(guided, reference, atol=1e-7)
    assert not torch.allclose(guided, plain, atol=1e-4)  # the rule really changed something
    assert torch.equal(plain_gradient(model, IMAGES, 1), plain)  # plain gradients again
    assert_untouched(model, before)
    assert no_function_mode()


@pytest.mark.parametrize("shared", [False, True], ids=["one module each", "one module reused"])
@pytest.mark.parametrize("style", MODULES)
def test_guided_reaches_relu_modules(style, shared):
    model = LeNet(module=MODULES[style], shared=shared)
    before = model_state(model)
    plain = plain_gradient(model, IMAGES, 2)
    guided = GuidedBackprop(model)(IMAGES, target=2)
    assert torch.allclose(guided, guided_reference(IMAGES, 2), atol=1e-7)
    assert not torch.allclose(guided, plain, atol=1e-4)
    assert torch.equal(plain_gradient(model, IMAGES, 2), plain)
    assert_untouched(model, before)


@pytest.mark.parametrize("inplace", [False, True])
def test_guided_on_tiny_net_by_hand(inplace):
    # class 0: the ReLU outputs get gradients [1, 0, 0, 1] (channel 0) and [0, -1, 1, 0]
    # (channel 1, times the kernel 2); the guided rule drops the -1
    model = TinyNet(inplace_relu=inplace)
    expected = torch.tensor([[[1.0, 0.0], [2.0, 1.0]]])
    assert torch.equal(GuidedBackprop(model)(X, target=0), expected)
    assert torch.equal(Deconvnet(model)(X, target=0), expected)  # every activation positive
    assert torch.equal(Saliency(model)(X, target=0), torch.tensor([[[1.0, -2.0], [2.0, 1.0]]]))


class FourUnits(nn.Module):
    """y = w2 . ReLU(W1 x), with the four (pre-activation, upstream gradient) sign cases.

    x = [1, 2, 3, 4] (shape (1, 1, 4)); pre-activations W1 x = [1, 2, -3, -4];
    upstream gradients w2 = [2, -3, 5, -7].
    """

    def __init__(self, functional: bool):
        super().__init__()
        self.first = nn.Linear(4, 4, bias=False)
        self.second = nn.Linear(4, 1, bias=False)
        self.relu = F.relu if functional else nn.ReLU()
        with torch.no_grad():
            self.first.weight.copy_(torch.diag(torch.tensor([1.0, 1.0, -1.0, -1.0])))
            self.second.weight.copy_(torch.tensor([[2.0, -3.0, 5.0, -7.0]]))

    def forward(self, x):
        return self.second(self.relu(self.first(x.flatten(1))))


@pytest.mark.parametrize("functional", [False, True])
def test_rules_zero_exactly_the_entries_they_should(functional):
    model = FourUnits(functional)
    x = torch.tensor([[[1.0, 2.0, 3.0, 4.0]]])
    # (pre > 0, grad > 0): kept by all; (pre > 0, grad < 0): only saliency keeps it;
    # (pre < 0, grad > 0): only the deconvnet passes it; (pre < 0, grad < 0): nobody
    saliency = torch.tensor([[[2.0, -3.0, 0.0, 0.0]]])
    guided = torch.tensor([[[2.0, 0.0, 0.0, 0.0]]])
    deconvnet = torch.tensor([[[2.0, 0.0, -5.0, 0.0]]])
    assert torch.equal(Saliency(model)(x, target=0), saliency)
    assert torch.equal(GuidedBackprop(model)(x, target=0), guided)
    assert torch.equal(Deconvnet(model)(x, target=0), deconvnet)


def test_relu6_and_hardtanh_from_zero_follow_the_clamp_rule():
    # f = w . ReLU6(x): x = [-1, 3, 7, 2], w = [1, 1, 1, -1]
    x = torch.tensor([[[-1.0, 3.0, 7.0, 2.0]]])
    w = torch.tensor([1.0, 1.0, 1.0, -1.0])
    for act in (nn.ReLU6(), nn.ReLU6(inplace=True), nn.Hardtanh(0.0, 6.0), F.relu6):

        class Net(nn.Module):
            def forward(self, x, act=act):
                return (act(x.flatten(1) * 1) * w).sum(1, keepdim=True)

        model = Net()
        with warnings.catch_warnings():
            warnings.simplefilter("error", UnmodifiedActivationWarning)
            guided = GuidedBackprop(model)(x, target=0)
            deconvnet = Deconvnet(model)(x, target=0)
        assert torch.equal(Saliency(model)(x, target=0), torch.tensor([[[0.0, 1.0, 0.0, -1.0]]]))
        assert torch.equal(guided, torch.tensor([[[0.0, 1.0, 0.0, 0.0]]]))
        assert torch.equal(deconvnet, torch.tensor([[[1.0, 1.0, 1.0, 0.0]]]))


def test_resnet18_runs_and_differs_from_saliency():
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    x = torch.randn(3, 64, 64)
    before = model_state(model)
    plain = plain_gradient(model, x[None], 7)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnmodifiedActivationWarning)  # resnet has only ReLUs
        guided = GuidedBackprop(model)(x, target=7)
    saliency = Saliency(model)(x, target=7)
    assert guided.shape == x.shape and guided.dtype == torch.float32
    assert torch.isfinite(guided).all() and guided.abs().sum() > 0
    assert torch.allclose(saliency, plain[0], atol=1e-6)
    relative = (guided - saliency).norm() / saliency.norm()
    assert relative > 0.1
    assert torch.equal(plain_gradient(model, x[None], 7), plain)
    assert_untouched(model, before)
    assert no_function_mode()


class Exploding(LeNet):
    def forward(self, x):
        self.act(self.conv1(x), 0)
        raise RuntimeError("boom")


@pytest.mark.parametrize("method", [GuidedBackprop, Deconvnet])
def test_exception_in_forward_leaves_model_plain(method):
    model = Exploding(module=MODULES["nn.ReLU(inplace=True)"], shared=True)
    before = model_state(model)
    with pytest.raises(RuntimeError, match="boom"):
        method(model)(IMAGES, target=0)
    assert no_function_mode()
    assert_untouched(model, before)
    working = LeNet(module=MODULES["nn.ReLU(inplace=True)"], shared=True)
    plain = plain_gradient(working, IMAGES, 0)
    # relu calls after the failure are plain again
    assert torch.equal(F.relu(torch.tensor([-1.0, 2.0])), torch.tensor([0.0, 2.0]))
    assert torch.allclose(Saliency(working)(IMAGES, target=0), plain)


def test_works_inside_no_grad_and_leaves_the_input_alone():
    model = LeNet(torch.relu)
    x = IMAGES.clone()
    with torch.no_grad():
        guided = GuidedBackprop(model)(x, target=1)
    assert torch.allclose(guided, guided_reference(IMAGES, 1), atol=1e-7)
    assert not x.requires_grad and torch.equal(x, IMAGES)
    assert guided.grad_fn is None and not guided.requires_grad


def test_several_targets_per_sample():
    model = LeNet(F.relu)
    both = GuidedBackprop(model)(IMAGES, target=[[0, 2], [1, 0]])
    assert both.shape == (2, 2, 1, 8, 8)
    for k in range(2):
        for b, classes in enumerate([[0, 2], [1, 0]]):
            one = GuidedBackprop(model)(IMAGES[b], target=classes[k])
            assert torch.allclose(both[b, k], one, atol=1e-7)


class OtherActivations(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.gelu = nn.GELU()

    def forward(self, x):
        x = self.fc(x.flatten(1))
        x = F.silu(self.gelu(x)) + F.leaky_relu(x) + nn.Hardtanh()(x)
        return F.relu(x)


def test_other_activations_are_named_once_per_call():
    x = torch.randn(1, 1, 4)
    with pytest.warns(UnmodifiedActivationWarning) as caught:
        GuidedBackprop(OtherActivations())(x, target=0)
    reported = [w for w in caught if issubclass(w.category, UnmodifiedActivationWarning)]
    assert len(reported) == 1  # (an all-zero guided map may add an EmptyMapWarning)
    message = str(reported[0].message)
    for name in ("gelu", "silu", "leaky_relu", "hardtanh(min_val=-1.0, max_val=1.0)"):
        assert name in message
    assert reported[0].filename == __file__  # points at the caller


@pytest.mark.parametrize(
    ("module", "name"),
    [
        (nn.LeakyReLU(inplace=True), "leaky_relu"),
        (nn.PReLU(), "prelu"),
        (nn.ELU(), "elu"),
        (nn.SELU(), "selu"),
        (nn.GELU(approximate="tanh"), "gelu"),
        (nn.SiLU(inplace=True), "silu"),
        (nn.Mish(), "mish"),
        (nn.Hardswish(), "hardswish"),
        (nn.Softplus(), "softplus"),
        (nn.Threshold(0.1, 0.0), "threshold(threshold=0.1, value=0.0)"),
    ],
)
def test_every_non_relu_activation_module_is_reported(module, name):
    model = nn.Sequential(nn.Flatten(), nn.Linear(4, 4), module, nn.ReLU(), nn.Sigmoid())
    with pytest.warns(UnmodifiedActivationWarning) as caught:
        GuidedBackprop(model)(torch.randn(1, 1, 4), target=0)
    reported = [w for w in caught if issubclass(w.category, UnmodifiedActivationWarning)]
    assert len(reported) == 1
    assert f"plain gradient: {name} (1 call)" in str(reported[0].message)


def test_a_model_without_relu_warns_and_gives_the_plain_gradient():
    model = nn.Sequential(nn.Flatten(), nn.Linear(4, 2), nn.Sigmoid())
    x = torch.randn(1, 1, 4)
    with pytest.warns(UnmodifiedActivationWarning, match="no ReLU"):
        guided = GuidedBackprop(model)(x, target=1)
    assert torch.equal(guided, Saliency(model)(x, target=1))


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning")
def test_scripted_submodules_are_reported():
    model = nn.Sequential(nn.Flatten(), torch.jit.script(nn.Linear(4, 2)), nn.ReLU())
    with pytest.warns(UnmodifiedActivationWarning, match="scripted"):
        GuidedBackprop(model)(torch.randn(1, 1, 4), target=0)


def test_rectifier_rule_context_manager():
    model = FourUnits(functional=True)
    x = torch.tensor([[[1.0, 2.0, 3.0, 4.0]]], requires_grad=True)
    with rectifier_rule("deconvnet") as log:
        score = model(x)[0, 0]
    assert log.rectifiers == 1 and not log.unmodified
    (grad,) = torch.autograd.grad(score, x)
    assert torch.equal(grad, torch.tensor([[[2.0, 0.0, -5.0, 0.0]]]))
    with pytest.raises(ValueError, match="guided"), rectifier_rule("positive"):
        pass
    assert no_function_mode()


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.features = nn.Sequential(
            nn.Conv2d(3, 4, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.Conv2d(4, 5, 3, padding=1, stride=2),
            nn.ReLU(),
        )
        self.head = nn.Linear(5, 3)

    def forward(self, x):
        return self.head(self.features(x).mean(dim=(2, 3)))


def test_guided_gradcam_is_the_product_of_its_parts():
    model = SmallCNN()
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(4))
    before = model_state(model)
    result = GuidedGradCAM(model, "features.3")(x, target=[0, 2])
    guided = GuidedBackprop(model)(x, target=[0, 2])
    cam = GradCAM(model, "features.3")(x, target=[0, 2])
    assert cam.shape == (2, 8, 8)
    assert torch.equal(result, guided * cam[:, None])
    assert result.abs().sum() > 0
    single = GuidedGradCAM(model, "features.3")(x[1], target=2)
    assert torch.allclose(single, result[1], atol=1e-7)
    several = GuidedGradCAM(model, "features.3")(x, target=[[0, 1], [2, 0]])
    assert several.shape == (2, 2, 3, 8, 8)
    assert torch.allclose(several[:, 0], result, atol=1e-7)
    assert_untouched(model, before)

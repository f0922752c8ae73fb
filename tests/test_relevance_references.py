"""LRP against the reference implementations: zennit 0.5.1 (every named composite, its
canonizers) on torchvision VGG-16 with and without BatchNorm and ResNet-18/50, and captum 0.9's
LRP on a network captum supports. Random weights with a fixed seed, small inputs."""

from __future__ import annotations

import pytest
import torch
import torchvision
from torch import Tensor, nn

from camkit import LRP
from camkit.relevance import Epsilon, composite, rules_applied

zennit = pytest.importorskip("zennit")
from zennit import composites as zc  # noqa: E402
from zennit.attribution import Gradient  # noqa: E402
from zennit.torchvision import ResNetCanonizer, VGGCanonizer  # noqa: E402

ZENNIT = {
    "epsilon-plus": zc.EpsilonPlus,
    "epsilon-plus-flat": zc.EpsilonPlusFlat,
    "epsilon-gamma-box": zc.EpsilonGammaBox,
    "epsilon-alpha2-beta1": zc.EpsilonAlpha2Beta1,
    "epsilon-alpha2-beta1-flat": zc.EpsilonAlpha2Beta1Flat,
}
CLASSES = 10


def _torchvision(name: str) -> nn.Module:
    """A torchvision architecture with random weights and batch norms that do something.

    The batch norms get ``eps = 0``: zennit's merge leaves the emptied BatchNorm dividing by
    ``sqrt(1 + eps)`` (1 - 5e-6 per layer with the default eps), a deviation from its own merged
    network that would dominate the comparison. VGG's 25088x4096 classifier is narrowed to 32
    units (the same layers, 100x fewer weights) to keep the test fast.
    """
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None, num_classes=CLASSES)
    if name.startswith("vgg"):
        model.classifier = nn.Sequential(
            nn.Linear(512 * 7 * 7, 32),
            nn.ReLU(True),
            nn.Dropout(),
            nn.Linear(32, 32),
            nn.ReLU(True),
            nn.Dropout(),
            nn.Linear(32, CLASSES),
        )
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.uniform_(-0.1, 0.1)
            module.running_var.uniform_(0.5, 1.5)
            module.weight.data.uniform_(0.5, 1.5)
            module.bias.data.uniform_(-0.1, 0.1)
            module.eps = 0.0
    return model.eval()


def _zennit(model: nn.Module, x: Tensor, name: str, target: int, **options) -> Tensor:
    """zennit's relevance with the target's score as the output relevance (zennit starts from
    the one-hot vector, camkit from the score: a factor)."""
    canonizer = (
        ResNetCanonizer() if isinstance(model, torchvision.models.ResNet) else VGGCanonizer()
    )
    with Gradient(model=model, composite=ZENNIT[name](canonizers=[canonizer], **options)) as attr:
        out, relevance = attr(x, torch.eye(CLASSES, dtype=x.dtype)[[target] * len(x)])
    return relevance * out[:, target, None, None, None].detach()


def _camkit(model: nn.Module, x: Tensor, name: str, target: int, **options) -> Tensor:
    leaf = x.clone().requires_grad_(True)
    with rules_applied(model, composite(name, **options)):
        out = model(leaf)
    (grad,) = torch.autograd.grad(out[:, target].sum(), leaf)
    return leaf.detach() * grad


def _compare(arch: str, dtype: torch.dtype, names: tuple[str, ...], tolerance: float) -> None:
    model = _torchvision(arch).to(dtype)
    x = torch.randn(1, 3, 32, 32, dtype=dtype, generator=torch.Generator().manual_seed(1))
    for name in names:
        options = {"low": x.amin(), "high": x.amax()} if "box" in name else {}
        expected = _zennit(model, x, name, 3, **options)
        got = _camkit(model, x, name, 3, **options)
        error = float((got - expected).abs().max() / expected.abs().max())
        assert error <= tolerance, (arch, name, error)


# ResNet-50 is slow in float64 on the CPU: the two composites whose rules the others share
FLOAT64 = {
    "vgg16": tuple(ZENNIT),
    "vgg16_bn": tuple(ZENNIT),
    "resnet18": tuple(ZENNIT),
    "resnet50": ("epsilon-plus-flat", "epsilon-gamma-box"),
}


@pytest.mark.parametrize("arch", list(FLOAT64))
def test_equal_to_zennit_in_float64(arch: str) -> None:
    """Every named composite: max abs difference <= 1e-6 of the map's max (float64)."""
    _compare(arch, torch.float64, FLOAT64[arch], 1e-6)


def test_equal_to_zennit_in_float32() -> None:
    """The same in float32: <= 1e-4 of the map's max."""
    _compare("resnet18", torch.float32, tuple(ZENNIT), 1e-4)


class _CaptumNet(nn.Module):
    """Only layers captum's LRP supports (it raises a TypeError for any other)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(2)
        self.conv1, self.relu1, self.pool = nn.Conv2d(3, 6, 3), nn.ReLU(), nn.MaxPool2d(2)
        self.conv2, self.relu2 = nn.Conv2d(6, 8, 3), nn.ReLU()
        self.avg = nn.AdaptiveAvgPool2d(2)
        self.fc1, self.relu3, self.fc2 = nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, CLASSES)

    def forward(self, x: Tensor) -> Tensor:
        h = self.pool(self.relu1(self.conv1(x)))
        h = self.avg(self.relu2(self.conv2(h)))
        return self.fc2(self.relu3(self.fc1(torch.flatten(h, 1))))


def test_equal_to_captum_lrp() -> None:
    """captum 0.9's LRP: the epsilon rule (1e-9) on every layer, the gradient through ReLU,
    max pooling by the epsilon rule (winner takes all): camkit's Epsilon(1e-9) everywhere with
    the same stabiliser for the average pooling."""
    from captum.attr import LRP as CaptumLRP

    model = _CaptumNet().double().eval()
    x = torch.rand(2, 3, 16, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    expected = CaptumLRP(model).attribute(x.clone().requires_grad_(True), target=4).detach()
    spec = [((nn.Conv2d, nn.Linear), Epsilon(1e-9))]
    got = LRP(model, composite=composite(spec, stabilizer=1e-9))(x, 4)
    torch.testing.assert_close(
        got.double(), expected, rtol=1e-5, atol=1e-6 * float(expected.abs().max())
    )


class _Recomputed(Epsilon):
    """Epsilon computing ``z`` again from the (merged) layer, as zennit does."""

    @property
    def reuses_output(self) -> bool:
        return False


@pytest.mark.parametrize("arch", ["resnet18", "vgg11_bn"])
def test_epsilon_on_the_layers_own_graph_equals_the_recomputed_rule(arch: str) -> None:
    """Epsilon keeps the layer's own forward graph (through its BatchNorm, merged or not): the
    same relevance as the rule computed again on the merged layer, float64, within 1e-10 of the
    map's max."""
    model = _torchvision(arch).double()
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    kinds = (nn.Conv2d, nn.Linear)
    reused = LRP(model, composite=composite([(kinds, Epsilon(1e-6))]))(x, 3)
    again = LRP(model, composite=composite([(kinds, _Recomputed(1e-6))]))(x, 3)
    assert reused.abs().max() > 0
    assert (reused - again).abs().max() <= 1e-10 * again.abs().max()


def _relu6_net(inplace: bool) -> nn.Module:
    torch.manual_seed(6)
    return nn.Sequential(
        nn.Conv2d(3, 4, 3),
        nn.BatchNorm2d(4),
        nn.ReLU6(inplace),
        nn.Conv2d(4, 4, 3),
        nn.ReLU(inplace),
        nn.Flatten(),
        nn.LazyLinear(CLASSES),
    )


def test_in_place_activations_give_the_out_of_place_relevance() -> None:
    """``nn.ReLU6(inplace=True)`` (``F.hardtanh(..., inplace=True)``, saturating here) and
    ``nn.ReLU(inplace=True)`` (``relu_``) give the relevance of their out-of-place forms: the
    Pass rule sees the value before the operation."""
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    maps = []
    for inplace in (False, True):
        model = _relu6_net(inplace).double()
        model(x)  # the lazy layer's shape
        torch.manual_seed(8)
        for p in model.parameters():
            nn.init.normal_(p, std=0.5)
        model[1].running_var.fill_(1.5)
        maps.append(LRP(model.eval(), composite="epsilon-plus")(x * 30, 2))
    assert maps[0].abs().max() > 0
    torch.testing.assert_close(maps[1], maps[0], rtol=1e-12, atol=1e-14)

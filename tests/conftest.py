"""Shared tiny models with known weights, and checks that a model was left untouched."""

from __future__ import annotations

import pytest
import torch
from torch import nn

torch.set_num_threads(1)


class TinyNet(nn.Module):
    """x (B,1,2,2) -> 1x1 conv with kernels 1 and 2 -> flatten -> linear(8 -> 2), no biases.

    Known by hand: A_0 = x, A_1 = 2x, and d y_k / d A_cij = W[k, 4c + 2i + j].
    """

    def __init__(self, inplace_relu: bool = False):
        super().__init__()
        self.conv = nn.Conv2d(1, 2, kernel_size=1, bias=False)
        self.relu = nn.ReLU(inplace=inplace_relu)
        self.fc = nn.Linear(8, 2, bias=False)
        with torch.no_grad():
            self.conv.weight.copy_(torch.tensor([1.0, 2.0]).view(2, 1, 1, 1))
            self.fc.weight.copy_(
                torch.tensor(
                    [
                        [1.0, 0.0, 0.0, 1.0, 0.0, -1.0, 1.0, 0.0],  # class 0
                        [1.0, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 2.0],  # class 1
                    ]
                )
            )

    def forward(self, x):
        return self.fc(self.relu(self.conv(x)).flatten(1))


# the image [[1, 2], [3, 4]]: every activation is positive, so the ReLU passes all
X = torch.tensor([[[1.0, 2.0], [3.0, 4.0]]])


@pytest.fixture
def tiny():
    return TinyNet()


def small_cnn() -> nn.Module:
    """Two 3x3 conv/ReLU layers (layer ``"2"`` is the second conv), global pooling, 5 classes;
    seeded, in eval mode."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(4, 6, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(6, 5),
    ).eval()


def model_state(model: nn.Module) -> dict:
    """Everything camkit promises not to change."""
    return {
        "training": [m.training for m in model.modules()],
        "requires_grad": [p.requires_grad for p in model.parameters()],
        "grads": [p.grad for p in model.parameters()],
        "inplace": [getattr(m, "inplace", None) for m in model.modules()],
        "modules": [(n, id(m)) for n, m in model.named_modules()],
        "hooks": [
            (len(m._forward_hooks), len(m._forward_pre_hooks), len(m._backward_hooks))
            for m in model.modules()
        ],
        "params": [p.detach().clone() for p in model.parameters()],
    }


def assert_untouched(model: nn.Module, before: dict) -> None:
    after = model_state(model)
    for key in before:
        if key == "params":
            assert all(torch.equal(a, b) for a, b in zip(before[key], after[key], strict=True))
        elif key == "grads":
            assert all(g is None for g in after[key]), "a .grad was left on a parameter"
        else:
            assert before[key] == after[key], key
    assert torch.is_grad_enabled()


class Function(nn.Module):
    """A module that applies ``fn``: a functional forward written inline in a test."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)

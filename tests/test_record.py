"""camkit.record: the LayerActivations of every tutorial, with its pitfalls fixed."""

from __future__ import annotations

import pytest
import torch
from conftest import TinyNet, X, assert_untouched, model_state
from torch import nn

from camkit import LayerNotFoundError, LayerOutputError, find_layer, record
from camkit.errors import ArgumentError


def test_activations_and_gradients_of_a_user_backward(tiny):
    with record(tiny, ["conv", "fc"]) as rec:
        logits = tiny(torch.stack([X, 2 * X]))
        logits[:, 1].sum().backward()
    torch.testing.assert_close(rec.activations["conv"][0], torch.stack([X[0], 2 * X[0]]))
    torch.testing.assert_close(rec.activations["conv"][1], torch.stack([2 * X[0], 4 * X[0]]))
    torch.testing.assert_close(rec.activations["fc"], logits.detach())
    # d y_1 / d conv output = W[1] reshaped (ones, twos), for each sample
    grad = tiny.fc.weight[1].detach().view(2, 2, 2)
    torch.testing.assert_close(rec.gradients["conv"], torch.stack([grad, grad]))
    torch.testing.assert_close(rec.gradients["fc"], torch.tensor([[0.0, 1.0], [0.0, 1.0]]))
    assert not rec.activations["conv"].requires_grad


def test_no_backward_means_no_gradients(tiny):
    with record(tiny, "conv") as rec:
        tiny(X[None])
    assert set(rec.activations) == {"conv"} and rec.gradients == {}
    with record(tiny, "conv", gradients=False) as rec, torch.no_grad():
        tiny(X[None])
    assert rec.gradients == {}


def test_shared_module_keeps_every_call_in_order():
    relu = nn.ReLU()
    model = nn.Sequential(nn.Linear(2, 2), relu, nn.Linear(2, 2), relu)
    with torch.no_grad():
        model[0].weight.copy_(torch.eye(2))
        model[0].bias.zero_()
        model[2].weight.copy_(-torch.eye(2))
        model[2].bias.fill_(1.0)
    x = torch.tensor([[2.0, -3.0]])
    with record(model, "1") as rec:
        model(x).sum().backward()
    first, second = rec.activations["1"]
    torch.testing.assert_close(first, torch.tensor([[2.0, 0.0]]))
    torch.testing.assert_close(second, torch.tensor([[0.0, 1.0]]))  # relu(1 - first)
    grad_first, grad_second = rec.gradients["1"]
    torch.testing.assert_close(grad_second, torch.tensor([[1.0, 1.0]]))
    # back through relu(1 - h): only the second unit is active
    torch.testing.assert_close(grad_first, torch.tensor([[0.0, -1.0]]))


def test_recorded_output_is_safe_from_later_inplace_ops():
    model = TinyNet(inplace_relu=True)
    x = torch.tensor([[[1.0, -2.0], [3.0, 4.0]]])
    with record(model, "conv") as rec:
        model(x[None])
    assert rec.activations["conv"][0, 0, 0, 1] == -2.0


def test_hooks_removed_when_the_block_raises(tiny):
    before = model_state(tiny)
    with pytest.raises(RuntimeError, match="inside"), record(tiny, ["conv", "relu"]):
        tiny(X[None])
        raise RuntimeError("inside")
    assert_untouched(tiny, before)


def test_layer_errors(tiny):
    with pytest.raises(LayerNotFoundError, match="did you mean 'relu'"), record(tiny, "rleu"):
        pass
    with pytest.raises(LayerNotFoundError, match="no layer given"), record(tiny, []):
        pass
    with pytest.raises(LayerNotFoundError, match="twice"), record(tiny, ["conv", tiny.conv]):
        pass
    with pytest.raises(ArgumentError, match="dotted module name"):
        find_layer(tiny, 3)

    class TupleOut(nn.Module):
        def forward(self, x):
            return x, x

    model = nn.Sequential(TupleOut())
    with pytest.raises(LayerOutputError, match="returns tuple"), record(model, "0"):
        model(X)
    assert not model[0]._forward_hooks

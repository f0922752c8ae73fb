"""The per-call object (core.call.Call) and the one chunking policy (core.call.chunks)."""

import pytest
import torch
from torch import nn

import camkit
from camkit.core.call import Call, chunk_size, chunks
from camkit.errors import ArgumentError


class _Offset(nn.Module):
    """``x * scale + offset`` with a per-sample ``offset (B, 1)`` and a shared ``scale``."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(2, 2, bias=False)
        with torch.no_grad():
            self.linear.weight.copy_(torch.eye(2))

    def forward(self, x, offset, scale=1.0):
        return self.linear(x) * scale + offset


X = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
OFFSET = torch.tensor([[10.0], [20.0], [30.0]])


def test_the_extra_inputs_follow_the_rows_of_each_forward():
    call = Call.of(X, (OFFSET,))
    assert call.size == 3 and call.args == (OFFSET,) and call.kwargs == {}
    rows = torch.tensor([2, 0, 2])  # copies of samples 2, 0, 2
    out = call.forward(_Offset(), X[rows], rows)
    assert out.tolist() == [[35.0, 36.0], [11.0, 12.0], [35.0, 36.0]]
    assert call.forward(_Offset(), X).tolist() == [[11, 12], [23, 24], [35, 36]]


def test_keyword_inputs_and_shared_inputs_pass_as_given():
    call = Call.of(X, {"offset": OFFSET, "scale": 2.0})
    assert call.args == () and set(call.kwargs) == {"offset", "scale"}
    out = call.forward(_Offset(), X[1:2], torch.tensor([1]))
    assert out.tolist() == [[26.0, 28.0]]  # (3, 4) * 2 + 20


def test_patches_follow_their_samples():
    patches = torch.zeros(2, 2)
    following = Call.of(X, (OFFSET,)).following(torch.tensor([1, 1]), patches)
    assert following.size == 2 and following.args[0].tolist() == [[20.0], [20.0]]
    assert following.forward(_Offset(), patches).tolist() == [[20.0, 20.0], [20.0, 20.0]]


def test_a_forward_that_cannot_be_matched_to_its_samples_is_refused():
    with pytest.raises(ArgumentError, match="per-sample additional_forward_args"):
        Call.of(X, (OFFSET,)).forward(_Offset(), X[:2])


def test_one_chunking_policy():
    assert [c.tolist() for c in chunks(5, 2)] == [[0, 1], [2, 3], [4]]
    assert [c.tolist() for c in chunks(5, None)] == [[0, 1, 2, 3, 4]]
    assert list(chunks(0, 4)) == []
    assert list(chunks(0, None)) == []
    sizes = (chunk_size(5, 2), chunk_size(5, None), chunk_size(3, 8), chunk_size(0, None))
    assert sizes == (2, 5, 3, 1)


class _FirstPixels(nn.Module):
    """Logits ``(x[:, 0, 0, 0], x[:, 0, 0, 1]) + offset`` for images ``(B, 3, 2, 2)``."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, x, offset):
        return x[:, 0, 0, :2] * self.scale + offset


def test_a_method_passes_its_call_down():
    """The saliency of logit ``k`` is 1 at pixel ``(0, 0, k)``, 0 elsewhere; the top-1 class
    depends on each sample's own offset, so a wrong row would move the 1."""
    x = torch.zeros(3, 3, 2, 2)
    offset = torch.tensor([[0.0, 5.0], [5.0, 0.0], [0.0, 5.0]])
    saliency = camkit.Saliency(_FirstPixels())(x, None, additional_forward_args=(offset,))
    expected = torch.zeros(3, 3, 2, 2)
    for sample, top1 in enumerate([1, 0, 1]):
        expected[sample, 0, 0, top1] = 1.0
    torch.testing.assert_close(saliency.abs(), expected)

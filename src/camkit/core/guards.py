"""A guard against a PyTorch bug that gives wrong gradients without an error.

On torch 2.14 (CPU), the backward of an eval-mode ``BatchNorm2d`` whose input is contiguous but
whose incoming gradient is channels-last returns wrong input gradients: features flattened into
tokens after a batch norm meet it (timm's LeViT: errors of 3e-6 on gradients of 2e-6, found
with finite differences in float64). camkit's channels-last CPU forwards avoid it, its
fallback to the contiguous format does not. See docs/reliability.md.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from camkit.core.layers import hooked, this_thread


class _ContiguousGradient(torch.autograd.Function):
    """Identity forward (a copy, so that later in-place operations stay legal); the backward
    passes the gradient on in the contiguous format."""

    @staticmethod
    def forward(ctx: object, t: Tensor) -> Tensor:
        return t.clone()

    @staticmethod
    def backward(ctx: object, grad: Tensor) -> Tensor:
        return grad.contiguous()


def _guard(module: nn.Module, inputs: tuple, output: object) -> object:
    given = inputs[0] if inputs else None
    if (
        isinstance(output, Tensor)
        and output.requires_grad
        and output.ndim == 4
        and output.device.type == "cpu"
        and isinstance(given, Tensor)
        and given.is_contiguous()
    ):
        return _ContiguousGradient.apply(output)
    return None


@contextmanager
def batchnorm_gradients_guarded(model: nn.Module) -> Iterator[None]:
    """Inside, the gradient reaching a 2-D batch norm of ``model`` with a contiguous CPU input
    is made contiguous too (what its backward computes correctly), at the cost of a copy of
    its output while gradients are recorded."""
    norms = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    with hooked(lambda: [m.register_forward_hook(this_thread(_guard)) for m in norms]):
        yield


__all__ = ["batchnorm_gradients_guarded"]

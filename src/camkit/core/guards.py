"""A guard against a PyTorch bug that gives wrong gradients without an error.

On torch 2.14 (CPU), the backward of an eval-mode ``BatchNorm2d`` whose input is contiguous
(NCHW) but whose incoming gradient is channels-last returns wrong input gradients. A model meets
this whenever its features are flattened and transposed into tokens after a batch norm (timm's
LeViT: max error 3e-6 on gradients of 2e-6, the map is noise; found with finite differences in
float64). camkit's CPU forwards run channels-last, where input and gradient agree, but the
fallback to the contiguous format (a model that refuses channels-last) and models converted
halfway would hit it. :func:`batchnorm_gradients_guarded` makes the gradient reaching such a
batch norm contiguous, as its input; see docs/reliability.md.
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
    """During the code inside, the gradient reaching any 2-D batch norm of ``model`` that has a
    contiguous CPU input is made contiguous too (the layout its backward computes correctly).
    Costs a copy of such a batch norm's output while gradients are recorded; nothing on the
    channels-last path or on other devices. Hooks are removed on exit, also on error."""
    norms = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    if not norms:
        yield
        return
    with hooked(lambda: [m.register_forward_hook(this_thread(_guard)) for m in norms]):
        yield


__all__ = ["batchnorm_gradients_guarded"]

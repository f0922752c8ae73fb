"""The user's model is never changed, in train mode too: a train-mode model updates its buffers
(batch-norm statistics) at every forward camkit runs, and camkit does not switch it to
``eval()`` (the maps explain the model the user asked about); it writes every buffer back,
bitwise, when the call ends, also when it raises. :func:`model_guarded` is what every entry
point that runs the model enters.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from camkit.core.guards import batchnorm_gradients_guarded


@contextmanager
def buffers_kept(model: nn.Module) -> Iterator[None]:
    """Restore every buffer of ``model`` (the same tensor object, the same bits) on exit; only a
    model with a module in train mode pays for the copies (in eval mode none is written)."""
    if not any(module.training for module in model.modules()):
        yield
        return
    kept = [
        (module, name, buffer, buffer.detach().clone())
        for module in model.modules()
        for name, buffer in module.named_buffers(recurse=False)
    ]
    try:
        yield
    finally:
        with torch.no_grad():
            for module, name, buffer, copy in kept:
                if module._buffers.get(name) is not buffer:
                    module._buffers[name] = buffer
                buffer.copy_(copy)


@contextmanager
def model_guarded(model: nn.Module) -> Iterator[None]:
    """The per-call guards of ``model``: :func:`buffers_kept` and
    :func:`~camkit.core.guards.batchnorm_gradients_guarded`."""
    with buffers_kept(model), batchnorm_gradients_guarded(model):
        yield


__all__ = ["buffers_kept", "model_guarded"]

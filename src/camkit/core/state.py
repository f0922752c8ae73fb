"""The user's model is never changed, in train mode too: buffers restored after every call.

A model left in ``train()`` updates its batch-norm running statistics (and
``num_batches_tracked``, and any other buffer a module writes in its forward) at every forward
camkit runs: noisy copies, path points, masked images. camkit does not switch the model to
``eval()`` (the maps then explain the train-mode model the user asked about); it keeps a copy of
every buffer and writes it back, bitwise, when the call ends, also when it raises.

:func:`model_guarded` is what every public entry point that runs the model enters: the buffers
kept, and the batch-norm gradient guard of :mod:`camkit.core.guards`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from camkit.core.guards import batchnorm_gradients_guarded


def in_training(model: nn.Module) -> bool:
    """Whether any module of ``model`` is in train mode."""
    return any(module.training for module in model.modules())


@contextmanager
def buffers_kept(model: nn.Module) -> Iterator[None]:
    """Restore every buffer of ``model`` (the same tensor object, the same bits) on exit.

    Only a model with a module in train mode pays for the copies: in eval mode PyTorch's
    modules write no buffer. A buffer that a module replaced by another tensor is put back.
    """
    if not in_training(model):
        yield
        return
    kept = [
        (module, name, buffer, buffer.detach().clone())
        for module in model.modules()
        for name, buffer in module.named_buffers(recurse=False)
        if buffer is not None
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
    """The per-call guards of ``model`` while the code inside runs it: its buffers restored on
    exit (:func:`buffers_kept`) and the gradients reaching its batch norms in their input's
    layout (:func:`~camkit.core.guards.batchnorm_gradients_guarded`)."""
    with buffers_kept(model), batchnorm_gradients_guarded(model):
        yield


__all__ = ["buffers_kept", "in_training", "model_guarded"]

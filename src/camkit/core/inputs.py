"""Checking what a caller hands camkit, once: images, sizes, counts; the input memory format."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from contextlib import nullcontext
from numbers import Real
from typing import TypeVar

import torch
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.dropout import _DropoutNd

from camkit.errors import ArgumentError, InputError

MODE_DEPENDENT = (_BatchNorm, _DropoutNd)
VOLUME_LAYERS = (nn.Conv3d, nn.ConvTranspose3d, nn.BatchNorm3d, nn.MaxPool3d, nn.AvgPool3d)
Result = TypeVar("Result")


def as_batch(x: object, model: nn.Module) -> tuple[Tensor, bool]:
    """Validate an image ``(C, H, W)``, a batch ``(B, C, H, W)`` or a batch of volumes / clips
    ``(B, C, D, H, W)`` (a 4-D tensor is always a batch of images); return
    ``(batch, was_single)``."""
    if not isinstance(x, Tensor):
        raise InputError(
            f"expected an image tensor (3, H, W) or a batch (B, 3, H, W), got {type(x).__name__}; "
            "turn images into tensors with camkit.models.load(...).preprocess"
        )
    if x.ndim not in (3, 4, 5):
        raise InputError(
            f"expected an image (3, H, W), a batch (B, 3, H, W) or volumes (B, C, D, H, W), "
            f"got shape {tuple(x.shape)}"
        )
    if x.ndim == 5 and not any(isinstance(m, VOLUME_LAYERS) for m in model.modules()):
        raise InputError(
            f"a 5-D input {tuple(x.shape)} is a batch of volumes (B, C, D, H, W), but the model "
            "has no 3-D layer (Conv3d, pooling or batch norm 3d); pass images as (B, C, H, W)"
        )
    if not x.is_floating_point():
        raise InputError(
            f"expected a floating-point image tensor, got {x.dtype}; "
            "scale and normalise it as the model expects (e.g. with .preprocess)"
        )
    if x.numel() == 0:
        raise InputError(f"the input is empty: shape {tuple(x.shape)}")
    if not torch.isfinite(x).all():
        raise InputError("the input contains NaN or infinite values")
    param = next(model.parameters(), None)
    if param is not None and param.device != x.device:
        raise InputError(
            f"the model is on {param.device} but the input is on {x.device}; "
            "move one of them (camkit computes on the input's device)"
        )
    if param is not None and param.is_floating_point() and param.dtype != x.dtype:
        raise InputError(
            f"the model's parameters are {param.dtype} but the input is {x.dtype}; pass "
            f"x.to({param.dtype}) (or keep a float32 model and use the methods' dtype= autocast)"
        )
    if any(isinstance(m, MODE_DEPENDENT) and m.training for m in model.modules()):
        warnings.warn(
            "the model is in training mode: dropout and batch-norm statistics make the maps "
            "random and batch-dependent (and update running statistics); call model.eval() first",
            UserWarning,
            stacklevel=3,
        )
    x = x.detach()  # camkit never differentiates through (or into) the caller's graph
    if x.is_inference() and not torch.is_inference_mode_enabled():
        x = x.clone()  # made under torch.inference_mode(): a normal copy autograd can use
    return (x.unsqueeze(0), True) if x.ndim == 3 else (x, False)


def positive_int(name: str, value: object, *, optional: bool = False) -> int | None:
    """``value`` as a count >= 1 (``None`` too when ``optional``), else :class:`ArgumentError`."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        allowed = "a positive int or None" if optional else "a positive int"
        raise ArgumentError(f"{name} must be {allowed}, got {value!r}")
    return value


def finite_number(name: str, value: object, *, minimum: float = -math.inf) -> float:
    """``value`` as a finite float ``>= minimum``, else :class:`ArgumentError`."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ArgumentError(f"{name} must be a number, got {type(value).__name__}")
    if not math.isfinite(value) or value < minimum:
        bound = f" >= {minimum}" if minimum > -math.inf else ""
        raise ArgumentError(f"{name} must be a finite number{bound}, got {value}")
    return float(value)


def seed_value(seed: object, *, optional: bool = False) -> int | None:
    """``seed`` as an int (``None`` too when ``optional``), else :class:`ArgumentError`."""
    if seed is None and optional:
        return None
    if isinstance(seed, bool) or not isinstance(seed, int):
        allowed = "an int or None" if optional else "an int"
        raise ArgumentError(f"seed must be {allowed}, got {type(seed).__name__}")
    return seed


def call_seed(seed: int | None) -> int:
    """``seed``, or for None a new one drawn from torch's global generator (so that
    ``torch.manual_seed`` makes an unseeded call reproducible)."""
    return int(torch.randint(2**62, ())) if seed is None else seed


def generator(device: torch.device) -> torch.Generator:
    """A random generator on ``device`` where the backend has one, else on the CPU (draw with
    ``device=generator.device``, then move)."""
    try:
        return torch.Generator(device=device)
    except RuntimeError:
        return torch.Generator()


def as_size(size: int | tuple[int, int]) -> tuple[int, int]:
    """``224`` or ``(224, 320)`` as ``(H, W)``."""
    if isinstance(size, int):
        return (size, size)
    if len(size) != 2:
        raise ArgumentError(f"expected a size as an int or (H, W), got {size!r}")
    return (int(size[0]), int(size[1]))


def autocast(device: torch.device, dtype: torch.dtype | None):
    """``torch.autocast`` on ``device`` when a dtype is asked for, else nothing."""
    return nullcontext() if dtype is None else torch.autocast(device.type, dtype=dtype)


class MemoryFormat:
    """The memory format of the inputs camkit builds itself (copies, noisy or masked images).

    On the CPU a 4-D batch is built ``channels_last``: oneDNN runs CNNs 1.2-2x faster so,
    forward and backward (docs/performance.md). A model that refuses it (an error, e.g. from a
    ``.view``) gets the format of the caller's input instead, from then on. The caller's own
    tensor is never converted.
    """

    def __init__(self, like: Tensor):
        channels_last = like.ndim == 4 and like.is_contiguous(memory_format=torch.channels_last)
        self.given = (
            torch.channels_last
            if channels_last and not like.is_contiguous()
            else torch.contiguous_format
        )
        fast = like.ndim == 4 and like.device.type == "cpu"
        self.preferred = torch.channels_last if fast else self.given

    def run(self, forward: Callable[[torch.memory_format], Result]) -> Result:
        """``forward(memory_format)`` in the preferred format, or in the given one if it fails."""
        try:
            return forward(self.preferred)
        except RuntimeError:
            if self.preferred == self.given:
                raise
            result = forward(self.given)  # raises again when the format was not the cause
            self.preferred = self.given
            return result

"""Checking what a caller hands camkit, once: images, inputs, sizes, counts and numbers."""

from __future__ import annotations

import math
from numbers import Real

import torch
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.dropout import _DropoutNd

from camkit.core.architecture import first_conv
from camkit.core.wrappers import InputLayout, KeywordInput
from camkit.errors import ArgumentError, InputError, warn

VOLUME_LAYERS = (
    nn.Conv3d,
    nn.ConvTranspose3d,
    nn.BatchNorm3d,
    nn.MaxPool3d,
    nn.AvgPool3d,
    nn.AdaptiveAvgPool3d,
    nn.AdaptiveMaxPool3d,
)


def as_batch(x: object, model: nn.Module, *, vectors: bool = False) -> tuple[Tensor, bool]:
    """Validate an image ``(C, H, W)``, a batch ``(B, C, H, W)`` or volumes / clips ``(B, C, D,
    H, W)``, and with ``vectors`` also ``(F,)`` or ``(B, F)`` for a model without convolutions
    (an MLP): ``(batch, was_single)``."""
    if not isinstance(x, Tensor):
        raise InputError(
            f"expected an image tensor (3, H, W) or a batch (B, 3, H, W), got {type(x).__name__}; "
            "turn images into tensors with camkit.models.load(...).preprocess"
        )
    # vectors go to a model without convolutions (an MLP), as wide as its first linear layer
    vectors = vectors and first_conv(model) is None
    linear = next((m for m in model.modules() if isinstance(m, nn.Linear)), None)
    width = "F" if linear is None else linear.in_features
    vector = vectors and x.ndim in (1, 2) and (linear is None or x.shape[-1] == width)
    if x.ndim not in (3, 4, 5) and not vector:
        vectors_too = f" or vectors (B, {width})" if vectors else ""
        raise InputError(
            f"expected an image (3, H, W), a batch (B, 3, H, W) or volumes (B, C, D, H, W)"
            f"{vectors_too}, got shape {tuple(x.shape)}"
        )
    if x.ndim == 5:
        check_clip_layout(x, model)
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
    if any(isinstance(m, _BatchNorm | _DropoutNd) and m.training for m in model.modules()):
        warn(
            "the model is in training mode: dropout and batch-norm statistics make the maps "
            "random and batch-dependent (camkit restores the running statistics and other "
            "buffers after the call, the model is not changed); call model.eval() first",
            UserWarning,
        )
    x = detached(x)
    return (x.unsqueeze(0), True) if x.ndim == (1 if vector else 3) else (x, False)


def detached(x: Tensor) -> Tensor:
    """``x`` without autograd history (camkit never differentiates into the caller's graph);
    an inference tensor as a normal copy autograd can use."""
    x = x.detach()
    return x.clone() if x.is_inference() and not torch.is_inference_mode_enabled() else x


def as_inputs(
    x: tuple | list, model: nn.Module, *, vectors: bool = False
) -> tuple[tuple[Tensor, ...], bool]:
    """Validate a tuple of explained inputs ``(image, *others)`` for ``model(image, *others)``
    (captum's tuples): ``(inputs with a batch axis, was_single)``. The image (:func:`as_batch`)
    decides whether the others are one sample or a batch; each is floating-point, on the
    image's device."""
    if len(x) == 0 or not all(isinstance(t, Tensor) for t in x):
        kinds = ", ".join(type(t).__name__ for t in x) or "nothing"
        raise InputError(
            f"a tuple of inputs must hold tensors (image first), got ({kinds}); inputs that are "
            "not explained go in additional_forward_args"
        )
    first, single = as_batch(x[0], model, vectors=vectors)
    size = first.shape[0]
    inputs = [first]
    for i, t in enumerate(x[1:], start=1):
        if not t.is_floating_point():
            raise InputError(
                f"input {i} is {t.dtype}: only floating-point inputs have gradients; pass it in "
                "additional_forward_args to use it without attributing to it"
            )
        if t.device != first.device:
            raise InputError(f"input {i} is on {t.device} but the image is on {first.device}")
        if not torch.isfinite(t).all():
            raise InputError(f"input {i} contains NaN or infinite values")
        t = detached(t)
        if single:
            t = t.unsqueeze(0)
        elif t.ndim == 0 or t.shape[0] != size:
            raise InputError(
                f"input {i} has shape {tuple(t.shape)}: every input needs the batch's {size} "
                "samples on axis 0 (as the image batch has)"
            )
        inputs.append(t)
    return tuple(inputs), single


def check_clip_layout(x: Tensor, model: nn.Module) -> None:
    """Refuse a 5-D input camkit would misread as ``(B, C, D, H, W)``: a ``(B, T, C, H, W)``
    clip (the model's channel count on axis 2, not 1) must be declared with
    :class:`InputLayout`; a model with no 3-D layer takes no volumes."""
    while isinstance(model, KeywordInput):
        model = model.module
    if isinstance(model, InputLayout):
        return
    shape = tuple(x.shape)
    conv = first_conv(model)
    if conv is not None and shape[2] == conv.in_channels != shape[1]:
        raise InputError(
            f"the 5-D input {shape} has the model's {shape[2]} input channels on axis 2, so it "
            "looks like clips (B, T, C, H, W); camkit reads 5-D inputs as (B, C, T, H, W) and "
            "would take the channels for time. Declare the layout the model takes: "
            'camkit.InputLayout(model, "BTCHW") is called with x.transpose(1, 2)'
        )
    if not any(isinstance(m, VOLUME_LAYERS) for m in model.modules()):
        raise InputError(
            f"a 5-D input {shape} is a batch of volumes (B, C, D, H, W), but the model has no "
            "3-D layer (Conv3d, pooling or batch norm 3d); pass images as (B, C, H, W), or, "
            'for a frame-wise video model, declare its layout: camkit.InputLayout(model, "BTCHW")'
        )


def positive_int(name: str, value: object, *, optional: bool = False) -> int | None:
    """``value`` as a count >= 1 (``None`` too when ``optional``), else :class:`ArgumentError`."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        allowed = "a positive int or None" if optional else "a positive int"
        raise ArgumentError(f"{name} must be {allowed}, got {value!r}")
    return value


def boolean(name: str, value: object) -> bool:
    """``value`` when it is ``True`` or ``False`` (not merely truthy), else ArgumentError."""
    if not isinstance(value, bool):
        raise ArgumentError(f"{name} must be True or False, got {value!r}")
    return value


def finite_number(name: str, value: object, *, minimum: float = -math.inf) -> float:
    """``value`` as a finite float ``>= minimum``, else :class:`ArgumentError`."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ArgumentError(f"{name} must be a number, got {type(value).__name__}")
    if not math.isfinite(value) or value < minimum:
        bound = f" >= {minimum}" if minimum > -math.inf else ""
        raise ArgumentError(f"{name} must be a finite number{bound}, got {value}")
    return float(value)


def as_size(size: int | tuple[int, int]) -> tuple[int, int]:
    """``224`` or ``(224, 320)`` as ``(H, W)``."""
    if isinstance(size, int):
        return (size, size)
    if len(size) != 2:
        raise ArgumentError(f"expected a size as an int or (H, W), got {size!r}")
    return (int(size[0]), int(size[1]))

"""Reading a model's output: the logits among a tuple/dict/object output, one sample's part."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from torch import Tensor

from camkit.errors import OutputError, TargetError

OutputSelector = str | int | Callable[[Any], Tensor] | None


def field(output: Any, key: str) -> Any:
    """``output[key]`` of a mapping holding it, else the attribute ``key``, else None."""
    if isinstance(output, Mapping) and key in output:
        return output[key]
    return getattr(output, key, None)


def select_output(output: Any, selector: OutputSelector = None) -> Tensor:
    """Pick the logits from a model's output by ``selector``: a key (dict key or attribute), an
    index, or a callable. Without one: a tensor as is, else an object's or dict's ``logits``,
    else its ``logits_per_image`` (a dual encoder's ``(B images, T texts)`` similarities: class
    ``t`` is text ``t``), else a tuple's or list's first element.
    """
    if callable(selector):
        picked = selector(output)
    elif isinstance(selector, str):
        if not (isinstance(output, Mapping) and selector in output or hasattr(output, selector)):
            keys = f"; its keys are {list(output)}" if isinstance(output, Mapping) else ""
            raise OutputError(
                f"the model's output ({type(output).__name__}) has no {selector!r}{keys}"
            )
        picked = field(output, selector)
    elif isinstance(selector, int):
        try:
            picked = output[selector]
        except (IndexError, TypeError, KeyError):
            raise OutputError(
                f"output={selector} does not index the model's output ({type(output).__name__})"
            ) from None
    elif isinstance(output, Tensor):
        picked = output
    elif (logits := field(output, "logits")) is not None:
        picked = logits
    elif (similarities := field(output, "logits_per_image")) is not None:  # CLIP, SigLIP...
        picked = similarities
    elif isinstance(output, tuple | list) and output:
        picked = output[0]
    else:
        raise OutputError(
            f"cannot find the logits in the model's output ({type(output).__name__}); "
            "pass output= a key, an index or a callable that picks them, or a callable target"
        )
    if not isinstance(picked, Tensor):
        raise OutputError(f"the selected model output is {type(picked).__name__}, not a tensor")
    return picked


def target_logits(output: Any, who: str, shape: str, hint: str) -> Tensor:
    """The logits target ``who`` reads, of ``shape`` (its commas say the axes), else a
    TargetError saying what came and ``hint`` (what to use instead)."""
    try:
        logits = select_output(output)
    except OutputError as err:
        raise TargetError(
            f"{who} needs {shape} logits (a tensor, a dict or object with 'logits', or a tuple "
            f"starting with them), got {describe(output)}: {err}"
        ) from None
    if logits.ndim != shape.count(",") + 1:
        raise TargetError(f"{who} needs {shape} logits, got shape {tuple(logits.shape)}; {hint}")
    return logits


def class_logits(output: Any, selector: OutputSelector) -> Tensor:
    """The ``(B, num_classes)`` logits class targets score, or a clear TargetError (for a
    detector: one that says it needs a box target)."""
    first = output[0] if isinstance(output, list | tuple) and output else None
    detections = None
    if selector is None and isinstance(first, Mapping) and "boxes" in first:
        detections = "a list of detections (dicts with 'boxes', as torchvision detectors give)"
    elif selector is None and isinstance(field(output, "pred_boxes"), Tensor):
        detections = f"DETR-style detections ({type(output).__name__} with 'pred_boxes')"
    if detections is not None:
        raise TargetError(
            f"the model is a detector: it returns {detections}, so a class index (or no "
            "target) does not say which detection to explain. Pass a box target, e.g. "
            "camkit.targets.BoxTarget(label, [x1, y1, x2, y2]) for the detection of that label "
            "overlapping that box in pixels (DETR-style outputs also need image_size=(H, W)), "
            "such as target=BoxTarget(1, [40, 30, 200, 180])"
        )
    logits = select_output(output, selector)
    if logits.ndim != 2:
        raise TargetError(
            f"class targets need (B, num_classes) logits, but the model gives shape "
            f"{tuple(logits.shape)}; pass a callable target that returns (B,) scores"
        )
    return logits


def describe(output: object) -> str:
    """A short description of a model output for error messages."""
    if isinstance(output, Tensor):
        return f"a tensor of shape {tuple(output.shape)}"
    if isinstance(output, Mapping):
        return f"a {type(output).__name__} with keys {list(output)}"
    if isinstance(output, list | tuple):
        items = type(output[0]).__name__ if output else "items"
        return f"a {type(output).__name__} of {len(output)} {items}"
    return type(output).__name__


__all__ = [
    "OutputSelector",
    "class_logits",
    "describe",
    "field",
    "select_output",
    "target_logits",
]

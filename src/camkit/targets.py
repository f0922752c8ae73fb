"""What "target" means: the model's output and a target turn into a ``(B, K)`` tensor of scores.

Accepted targets, for a batch of ``B`` images:

* ``None`` -- each sample's top-1 class;
* ``int`` -- the same class for every sample;
* a list of ``B`` ints or a ``(B,)`` tensor -- one class per sample;
* a list of ``B`` lists of ``K`` ints or a ``(B, K)`` tensor -- ``K`` classes per sample,
  answered from one forward pass;
* a callable ``f(output) -> (B,)`` or ``(B, K)`` scores -- any other objective.

Scores are the selected logits (before softmax), as in the Grad-CAM paper.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

Target = int | Sequence[int] | Sequence[Sequence[int]] | Tensor | Callable[[Any], Tensor] | None
OutputSelector = str | int | Callable[[Any], Tensor] | None


def select_output(output: Any, selector: OutputSelector = None) -> Tensor:
    """Pick the logits from a model's output.

    ``selector`` is a key (dict key or attribute), an index, or a callable. Without one: a tensor
    is used as is, an object or dict with ``logits`` (HuggingFace style) gives its logits, and a
    tuple or list gives its first element.
    """
    if callable(selector):
        picked = selector(output)
    elif isinstance(selector, str):
        if isinstance(output, Mapping) and selector in output:
            picked = output[selector]
        elif hasattr(output, selector):
            picked = getattr(output, selector)
        else:
            raise KeyError(f"the model's output ({type(output).__name__}) has no {selector!r}")
    elif isinstance(selector, int):
        picked = output[selector]
    elif isinstance(output, Tensor):
        picked = output
    elif isinstance(output, Mapping) and "logits" in output:
        picked = output["logits"]
    elif hasattr(output, "logits"):
        picked = output.logits
    elif isinstance(output, tuple | list) and output:
        picked = output[0]
    else:
        raise TypeError(
            f"cannot find the logits in the model's output ({type(output).__name__}); "
            "pass output= a key, an index or a callable that picks them"
        )
    if not isinstance(picked, Tensor):
        raise TypeError(f"the selected model output is {type(picked).__name__}, not a tensor")
    return picked


def _check_classes(classes: Tensor, num_classes: int) -> None:
    bad = (classes < 0) | (classes >= num_classes)
    if bad.any():
        raise IndexError(
            f"target class {classes[bad][0].item()} is out of range: the model has "
            f"{num_classes} outputs, so classes must be in 0..{num_classes - 1}"
        )


def _check_logits(logits: Tensor) -> None:
    if logits.ndim != 2:
        raise ValueError(
            f"class targets need (B, num_classes) logits, but the model gives shape "
            f"{tuple(logits.shape)}; pass a callable target that returns (B,) scores"
        )


def requested_classes(target: Target, batch: int, device: torch.device) -> tuple[Tensor, bool]:
    """An explicit class target (not None, not a callable) as ``(classes (B, K), several)``:
    type and shape are checked here, the class range against the logits by :func:`class_scores`.
    """
    if isinstance(target, bool) or (
        not isinstance(target, int | Tensor | Sequence) or isinstance(target, str)
    ):
        raise TypeError(
            "target must be None, an int, a list of ints, a list of lists, a tensor or a "
            f"callable, got {type(target).__name__}"
        )
    if isinstance(target, int):
        return torch.full((batch, 1), target, dtype=torch.long, device=device), False
    try:
        classes = torch.as_tensor(target, device=device)
    except (TypeError, ValueError) as err:
        raise ValueError(
            f"target lists must be rectangular lists of ints ({err}); "
            "give every sample the same number of classes"
        ) from None
    if classes.is_floating_point() or classes.is_complex() or classes.dtype == torch.bool:
        raise TypeError(f"target classes must be integers, got {classes.dtype}")
    if classes.ndim not in (1, 2) or classes.shape[0] != batch:
        raise ValueError(
            f"expected one target per sample ({batch},) or several per sample "
            f"({batch}, K), got shape {tuple(classes.shape)} for a batch of {batch}; "
            "for several classes per image pass a list of lists or a (B, K) tensor"
        )
    if classes.ndim == 2 and classes.shape[1] == 0:
        raise ValueError("the target lists no class")
    return classes.long().reshape(batch, -1), classes.ndim == 2


def class_scores(logits: Tensor, classes: Tensor) -> Tensor:
    """``logits.gather(1, classes)``, after checking the logits' shape and the classes' range."""
    _check_logits(logits)
    _check_classes(classes, logits.shape[1])
    return logits.gather(1, classes)


def class_indices(target: Target, logits: Tensor) -> tuple[Tensor, bool]:
    """Turn a class target into ``(classes, several)``: ``(B, K)`` validated class indices, and
    whether the target asked for several classes per sample (a 2-D target)."""
    _check_logits(logits)
    if target is None:
        return logits.argmax(dim=1, keepdim=True), False
    classes, several = requested_classes(target, logits.shape[0], logits.device)
    _check_classes(classes, logits.shape[1])
    return classes, several


def target_scores(output: Any, logits: Tensor, target: Target) -> tuple[Tensor, bool]:
    """Return ``(scores, several)``: scores ``(B, K)`` and whether K classes per sample were asked.

    ``output`` is the model's raw output (given to callable targets), ``logits`` the selected
    tensor (used for class targets).
    """
    batch = logits.shape[0]
    if callable(target):
        scores = target(output)
        if not isinstance(scores, Tensor) or scores.ndim not in (1, 2) or scores.shape[0] != batch:
            got = tuple(scores.shape) if isinstance(scores, Tensor) else type(scores).__name__
            raise ValueError(
                f"a callable target must return scores of shape ({batch},) or ({batch}, K), "
                f"got {got}"
            )
        return scores.reshape(batch, -1), scores.ndim == 2
    classes, several = class_indices(target, logits)
    return logits.gather(1, classes), several

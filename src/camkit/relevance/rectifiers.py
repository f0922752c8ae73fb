"""The ReLU rules of guided backpropagation and the deconvnet, as rule sets of the one backward.

Under ``composite("guided")`` or ``composite("deconvnet")``, every ReLU that Python code applies
(modules, functions, in-place forms) keeps its forward value but backpropagates by:

* ``"guided"`` (Springenberg et al., "Striving for Simplicity: The All Convolutional Net",
  ICLR 2015 workshop): ``grad_in = grad_out * (x > 0) * (grad_out > 0)``;
* ``"deconvnet"`` (Zeiler & Fergus, "Visualizing and Understanding Convolutional Networks",
  ECCV 2014): ``grad_in = grad_out * (grad_out > 0)``, whatever the forward input was.

``ReLU6``, ``hardtanh(x, 0, max)`` (guided: ``(0 < x < max)``) and ``threshold(x, 0, 0)`` are
rectifiers too. Other activations keep their plain gradient and are reported
(:class:`UnmodifiedActivationWarning`), as are scripted submodules; gates keep it silently.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from camkit.errors import ArgumentError, warn

ReLURule = Literal["guided", "deconvnet"]
RULES: tuple[str, ...] = ("guided", "deconvnet")
Backward = Callable[[Tensor, "Tensor | None", float], Tensor]  # (grad, output, upper) -> grad


def check_rule(rule: object) -> ReLURule:
    """``rule`` if it is a known ReLU rule, else :class:`~camkit.errors.ArgumentError`."""
    if rule not in RULES:
        raise ArgumentError(f"unknown ReLU rule {rule!r}; choose from {list(RULES)}")
    return rule


class UnmodifiedActivationWarning(UserWarning):
    """The model applies activations that the guided / deconvnet rule leaves unmodified."""


class _RectifierBackward(torch.autograd.Function):
    """The original rectifier forward; the backward ``rule(grad, out, upper)``."""

    @staticmethod
    def forward(
        ctx: Any, x: Tensor, call: Callable[[], Tensor], rule: Backward, upper: float, inplace: bool
    ) -> Tensor:
        out = call()
        if inplace:
            ctx.mark_dirty(x)
        ctx.rule, ctx.upper = rule, upper
        ctx.save_for_backward(None if rule is _deconvnet else out)  # it ignores the forward
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        return ctx.rule(grad, *ctx.saved_tensors, ctx.upper), None, None, None, None


def _guided(grad: Tensor, out: Tensor, upper: float) -> Tensor:
    passed = out > 0
    if upper != math.inf:
        passed = passed & (out < upper)
    return grad.clamp(min=0) * passed


def _deconvnet(grad: Tensor, out: None, upper: float) -> Tensor:
    return grad.clamp(min=0)


def _relu(bound: dict) -> float | None:
    return math.inf


def _relu6(bound: dict) -> float | None:
    return 6.0


def _hardtanh(bound: dict) -> float | None:
    return float(bound["max_val"]) if bound["min_val"] == 0 else None


def _threshold(bound: dict) -> float | None:
    return math.inf if bound["threshold"] == 0 and bound["value"] == 0 else None


@dataclass(frozen=True)
class _Rectifier:
    """How to read one rectifier function's arguments: ``upper`` is None when not a rectifier."""

    params: tuple[str, ...]
    defaults: dict
    upper: Callable[[dict], float | None]
    inplace: bool = False

    @property
    def plain_relu(self) -> bool:
        """A ReLU proper (no bound, no threshold): LRP's Pass rule is its plain gradient."""
        return self.upper is _relu

    def bind(self, args: tuple, kwargs: dict) -> dict:
        return {**self.defaults, **dict(zip(self.params, args, strict=False)), **kwargs}


def _rectifier_table() -> dict[Callable, _Rectifier]:
    unary, flag = ("input",), ("input", "inplace")
    hardtanh, threshold = ("input", "min_val", "max_val"), ("input", "threshold", "value")
    limits, off = {"min_val": -1.0, "max_val": 1.0}, {"inplace": False}
    aten, nn_ = torch.ops.aten, torch._C._nn
    relu, relu_ = _Rectifier(unary, {}, _relu), _Rectifier(unary, {}, _relu, inplace=True)
    table = {f: relu for f in (torch.relu, Tensor.relu, aten.relu, aten.relu.default)}
    table |= {f: relu_ for f in (torch.relu_, Tensor.relu_, aten.relu_, aten.relu_.default)}
    table |= {
        F.relu: _Rectifier(flag, off, _relu),
        F.relu6: _Rectifier(flag, off, _relu6),
        F.hardtanh: _Rectifier((*hardtanh, "inplace"), {**limits, **off}, _hardtanh),
        nn_.hardtanh: _Rectifier(hardtanh, limits, _hardtanh),
        nn_.hardtanh_: _Rectifier(hardtanh, limits, _hardtanh, inplace=True),
        F.threshold: _Rectifier((*threshold, "inplace"), off, _threshold),
        torch.threshold: _Rectifier(threshold, {}, _threshold),
        torch.threshold_: _Rectifier(threshold, {}, _threshold, inplace=True),
    }
    for name in ("relu6", "relu6_"):
        if hasattr(nn_, name):
            table[getattr(nn_, name)] = _Rectifier(unary, {}, _relu6, inplace=name[-1] == "_")
    return table


RECTIFIERS = _rectifier_table()
_BACKWARDS: dict[str, Backward] = {"guided": _guided, "deconvnet": _deconvnet}


@dataclass
class ActivationLog:
    """What one pass under a ReLU rule met: rectifiers overridden, other activations left."""

    rule: str
    rectifiers: int = 0
    unmodified: Counter = field(default_factory=Counter)

    def warn_if_incomplete(self, method: str, model: nn.Module | None = None) -> None:
        """Warn (once) when activations were left unmodified or no rectifier was met at all."""
        problems = []
        if self.unmodified:
            seen = ", ".join(
                f"{name} ({n} call{'s' * (n > 1)})" for name, n in self.unmodified.items()
            )
            problems.append(
                f"these activations keep their plain gradient: {seen} "
                "(only ReLU, ReLU6, hardtanh(0, max) and threshold(0, 0) follow the rule)"
            )
        scripted = [
            name
            for name, module in (model.named_modules() if model is not None else ())
            if isinstance(module, torch.jit.ScriptModule)
        ]
        if scripted:
            problems.append(
                f"scripted module(s) {[name or '<model>' for name in scripted]} run outside "
                "Python, so their ReLUs cannot be reached"
            )
        if self.rectifiers == 0:
            problems.append("the model applied no ReLU, so the result is the plain gradient")
        if problems:
            warn(
                f"{method} ({self.rule} rule): " + "; ".join(problems), UnmodifiedActivationWarning
            )


def rectified(
    func: Callable, args: tuple, kwargs: dict, log: ActivationLog, rule: Backward | None = None
) -> Any:
    """``func(*args, **kwargs)`` (of :data:`RECTIFIERS`) with ``log.rule``'s backward (or
    ``rule(grad, out, upper)``) when its arguments make it a rectifier, else logged."""
    rectifier = RECTIFIERS[func]
    bound = rectifier.bind(args, kwargs)
    upper = rectifier.upper(bound)
    x = bound["input"]
    if upper is None:
        name = str(getattr(func, "__name__", func)).lstrip("_")
        shown = ", ".join(f"{k}={v}" for k, v in bound.items() if k not in ("input", "inplace"))
        log.unmodified[f"{name}({shown})"] += 1
    elif isinstance(x, Tensor) and x.is_floating_point():
        log.rectifiers += 1
        if torch.is_grad_enabled() and x.requires_grad:
            inplace = bool(bound.get("inplace", rectifier.inplace))
            call = partial(func, *args, **kwargs)
            return _RectifierBackward.apply(x, call, rule or _BACKWARDS[log.rule], upper, inplace)
    return func(*args, **kwargs)


__all__ = [
    "RECTIFIERS",
    "RULES",
    "ActivationLog",
    "ReLURule",
    "UnmodifiedActivationWarning",
    "check_rule",
    "rectified",
]

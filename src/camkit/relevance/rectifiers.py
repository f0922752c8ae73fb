"""The ReLU rules of guided backpropagation and the deconvnet, as rule sets of the one backward.

Under a rule set with a ReLU rule (``composite("guided")``, ``composite("deconvnet")``; applied
by :func:`camkit.relevance.engine.rules_applied`, the one interception), every ReLU that Python
code applies -- ``nn.ReLU`` modules (in-place or not, reused or not), ``F.relu``, ``torch.relu``,
``Tensor.relu`` and their in-place forms -- keeps its forward value but backpropagates by:

* ``"guided"`` (Springenberg et al., "Striving for Simplicity: The All Convolutional Net",
  ICLR 2015 workshop): ``grad_in = grad_out * (x > 0) * (grad_out > 0)``;
* ``"deconvnet"`` (Zeiler & Fergus, "Visualizing and Understanding Convolutional Networks",
  ECCV 2014): ``grad_in = grad_out * (grad_out > 0)``, whatever the forward input was.

``ReLU6`` and ``hardtanh(x, 0, max)`` count as rectifiers (guided: ``grad_out * (0 < x < max) *
(grad_out > 0)``), as does ``threshold(x, 0, 0)``. Other activations (LeakyReLU, GELU, SiLU, ELU,
Hardswish, ...) keep their plain gradient and are reported by an
:class:`UnmodifiedActivationWarning`; gates (sigmoid, tanh, softmax) are not rectifiers and keep
their gradient silently. Code that does not run through Python (TorchScript) cannot be reached;
scripted submodules are reported too. This module holds the rule's backward and how to read each
rectifier's arguments (:data:`RECTIFIERS`); which functions are rectifiers is said by the one
operation table of :mod:`camkit.relevance.engine`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from camkit.errors import ArgumentError, warn

ReLURule = Literal["guided", "deconvnet"]
RULES: tuple[str, ...] = ("guided", "deconvnet")


def check_rule(rule: object) -> ReLURule:
    """``rule`` if it is a known ReLU rule, else :class:`~camkit.errors.ArgumentError`."""
    if rule not in RULES:
        raise ArgumentError(f"unknown ReLU rule {rule!r}; choose from {list(RULES)}")
    return rule


class UnmodifiedActivationWarning(UserWarning):
    """The model applies activations that the guided / deconvnet rule leaves unmodified."""


class _RectifierBackward(torch.autograd.Function):
    """Runs the original rectifier forward; its backward applies the guided or deconvnet rule."""

    @staticmethod
    def forward(
        ctx: Any,
        x: Tensor,
        call: Callable[[], Tensor],
        rule: str,
        upper: float,
        inplace: bool,
    ) -> Tensor:
        out = call()
        if inplace:
            ctx.mark_dirty(x)
        ctx.rule = rule
        ctx.upper = upper
        if rule == "guided":  # the deconvnet rule ignores the forward
            ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        grad = grad.clamp(min=0)
        if ctx.rule == "guided":
            (out,) = ctx.saved_tensors
            passed = out > 0
            if ctx.upper != math.inf:
                passed = passed & (out < ctx.upper)
            grad = grad * passed
        return grad, None, None, None, None


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
        bound = dict(self.defaults)
        bound.update(zip(self.params, args, strict=False))
        bound.update(kwargs)
        return bound


def _rectifier_table() -> dict[Callable, _Rectifier]:
    unary = ("input",)
    flag = ("input", "inplace")
    hardtanh = ("input", "min_val", "max_val")
    threshold = ("input", "threshold", "value")
    limits = {"min_val": -1.0, "max_val": 1.0}
    aten = torch.ops.aten
    entries: list[tuple[Any, _Rectifier]] = [
        (F.relu, _Rectifier(flag, {"inplace": False}, _relu)),
        (torch.relu, _Rectifier(unary, {}, _relu)),
        (Tensor.relu, _Rectifier(unary, {}, _relu)),
        (aten.relu, _Rectifier(unary, {}, _relu)),
        (aten.relu.default, _Rectifier(unary, {}, _relu)),
        (torch.relu_, _Rectifier(unary, {}, _relu, inplace=True)),
        (Tensor.relu_, _Rectifier(unary, {}, _relu, inplace=True)),
        (aten.relu_, _Rectifier(unary, {}, _relu, inplace=True)),
        (aten.relu_.default, _Rectifier(unary, {}, _relu, inplace=True)),
        (F.relu6, _Rectifier(flag, {"inplace": False}, _relu6)),
        (F.hardtanh, _Rectifier((*hardtanh, "inplace"), {**limits, "inplace": False}, _hardtanh)),
        (torch._C._nn.hardtanh, _Rectifier(hardtanh, limits, _hardtanh)),
        (torch._C._nn.hardtanh_, _Rectifier(hardtanh, limits, _hardtanh, inplace=True)),
        (F.threshold, _Rectifier((*threshold, "inplace"), {"inplace": False}, _threshold)),
        (torch.threshold, _Rectifier(threshold, {}, _threshold)),
        (torch.threshold_, _Rectifier(threshold, {}, _threshold, inplace=True)),
    ]
    for name in ("relu6", "relu6_"):
        if hasattr(torch._C._nn, name):
            rectifier = _Rectifier(unary, {}, _relu6, inplace=name.endswith("_"))
            entries.append((getattr(torch._C._nn, name), rectifier))
    return dict(entries)


RECTIFIERS = _rectifier_table()


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


def _args(bound: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in bound.items() if k not in ("input", "inplace"))


def rectified(func: Callable, args: tuple, kwargs: dict, log: ActivationLog) -> Any:
    """``func(*args, **kwargs)``, a rectifier of :data:`RECTIFIERS`, with ``log.rule``'s
    backward when its arguments make it one (else its plain gradient, logged)."""
    rectifier = RECTIFIERS[func]
    bound = rectifier.bind(args, kwargs)
    upper = rectifier.upper(bound)
    x = bound["input"]
    if upper is None:
        name = str(getattr(func, "__name__", func)).lstrip("_")
        log.unmodified[f"{name}({_args(bound)})"] += 1
    elif isinstance(x, Tensor) and x.is_floating_point():
        log.rectifiers += 1
        if torch.is_grad_enabled() and x.requires_grad:
            inplace = bool(bound.get("inplace", rectifier.inplace))
            return _RectifierBackward.apply(
                x, lambda: func(*args, **kwargs), log.rule, upper, inplace
            )
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

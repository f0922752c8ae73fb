"""The LRP engine: under :func:`rules_applied`, ordinary autograd computes LRP's modified gradient.

Modules that a composite gives a rule (``nn.Linear``, ``nn.Conv``, or any module a user's
composite names) get it through forward hooks; every other operation of the forward is seen by a
:class:`torch.overrides.TorchFunctionMode`, functional calls included (``F.relu``, ``x + y``,
``torch.cat``, ``F.adaptive_avg_pool2d``, ``flatten``), and gets its rule from one table:

* ``relu``: its plain gradient, which is the Pass rule's exactly (``o / x`` is 1 where ``x > 0``
  and 0 elsewhere), with no copy and no extra operation;
* other activations (``relu6``, ``hardtanh``, ``silu``, ``gelu``, ``sigmoid``, ``tanh``,
  ``leaky_relu``, ``elu``, ``hardswish``, ...; in-place forms too): :class:`~.rules.Pass`;
* additions and subtractions of two tensors on the relevance path (residual sums), sums, means,
  average pooling, resampling (``F.interpolate``): :class:`~.rules.Norm` with the composite's
  stabiliser;
* structural operations (views, reshapes, ``flatten``, ``cat``, ``stack``, indexing, padding,
  max pooling, dropout, dtype casts), a tensor plus or times a constant (a bias, a scale), and an
  un-merged ``batch_norm``: their plain gradient, which moves ``g = R / A`` exactly as relevance
  must move (zennit does the same for these);
* gathers, embeddings and writes (``masked_scatter``, ``index_put``, ``scatter``): their plain
  gradient; additive scatters: :class:`~.rules.Norm` (:mod:`camkit.relevance.layers`);
* softmax, matmul and products of two activations, layer / RMS / group norm, ``F.normalize``,
  norms and their pieces (``pow``, ``sqrt``: constants) and fused attention: AttnLRP's rules
  (:mod:`~.transformers`); gates (``x * sigmoid(s)``): the composite's (:mod:`~.gates`);
* anything else on the relevance path (``exp``, ``cumsum``, a functional convolution outside
  a ruled module, ...): :class:`~camkit.errors.RelevanceError` naming the operation and the line
  that called it, instead of letting relevance through unchecked.

A tensor is on the relevance path when it requires grad and is not an ``nn.Parameter``.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from camkit.core.layers import explained_module, find_layers, hooked, this_thread
from camkit.errors import ArgumentError, RelevanceError
from camkit.relevance.canonizers import merged_after, merged_before
from camkit.relevance.composites import Composite, Match, composite
from camkit.relevance.gates import GateTracker
from camkit.relevance.layers import ADDITIVE, CONV_TRANSPOSE, COPIES
from camkit.relevance.rules import Affine, Norm, Pass, Rule
from camkit.relevance.transformers import bilinear, handlers

_T, _N = torch.Tensor, torch._C._nn
PASS, NORM, SUMS, SCALE, GRADIENT = "pass", "norm", "sums", "scale", "gradient"
BILINEAR = "bilinear"


def _table() -> dict[Any, str]:
    table: dict[Any, str] = {}

    def add(kind: str, *funcs: Any) -> None:
        table.update({f: kind for f in funcs if f is not None})

    def named(owner: Any, *names: str) -> list:
        return [getattr(owner, n, None) for n in names]

    acts = ("relu6", "hardtanh", "hardtanh_", "silu", "gelu", "elu", "elu_")
    acts += ("leaky_relu", "leaky_relu_", "hardswish", "hardsigmoid", "mish", "softplus", "selu")
    acts += ("celu", "sigmoid", "tanh", "threshold", "threshold_", "sigmoid_", "tanh_")
    add(PASS, *named(F, *acts), *named(torch, *acts), *named(_T, *acts), *named(_N, *acts))
    sums = ("add", "add_", "__add__", "__radd__", "__iadd__", "sub", "sub_", "__sub__")
    sums += ("__rsub__", "__isub__", "subtract")
    add(SUMS, *named(torch, *sums), *named(_T, *sums))
    pools = ("avg_pool1d", "avg_pool2d", "avg_pool3d")
    pools += ("adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_avg_pool3d")
    add(NORM, *named(torch, "sum", "mean"), *named(_T, "sum", "mean"))
    add(NORM, *named(F, *pools), *named(torch, *pools), *named(_N, *pools))
    add(NORM, F.interpolate, F.upsample, F.upsample_nearest, F.upsample_bilinear, F.fold)
    add(SUMS, *named(torch, *ADDITIVE), *named(_T, *ADDITIVE))
    scale = ("mul", "mul_", "__mul__", "__rmul__", "__imul__", "div", "div_", "__truediv__")
    scale += ("__itruediv__", "multiply", "divide", "true_divide")
    add(SCALE, *named(torch, *scale), *named(_T, *scale))
    shape = ("view", "reshape", "flatten", "unflatten", "permute", "transpose", "t", "contiguous")
    shape += ("clone", "squeeze", "unsqueeze", "expand", "expand_as", "repeat", "cat", "concat")
    shape += ("concatenate", "stack", "split", "chunk", "unbind", "narrow", "select", "movedim")
    shape += ("index_select", "to", "float", "double", "half", "bfloat16", "type_as", "roll")
    shape += ("__getitem__", "neg", "__neg__", "view_as", "reshape_as", "flip", "pad", "tile")
    shape += ("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "batch_norm")
    shape += ("max_pool1d", "max_pool2d", "max_pool3d", "adaptive_max_pool1d")
    shape += ("adaptive_max_pool2d", "adaptive_max_pool3d", "max_pool2d_with_indices")
    shape += ("permute_copy", "swapaxes", "moveaxis", "unfold", *COPIES)
    shape += ("softmax",)  # AttnLRP's softmax rule is the softmax's own gradient
    add(GRADIENT, *named(torch, *shape), *named(_T, *shape), *named(F, *shape))
    add(GRADIENT, *named(_N, *shape))
    rectifiers = ("relu", "relu_")  # the Pass rule's gradient: o / x is the ReLU's own mask
    add(GRADIENT, *named(F, *rectifiers), *named(torch, *rectifiers), *named(_T, *rectifiers))
    add(GRADIENT, *(getattr(_T, name).__get__ for name in ("T", "mT", "H", "mH")))
    products = ("matmul", "__matmul__", "__rmatmul__", "bmm", "einsum", "mm")
    add(BILINEAR, *named(torch, *products), *named(_T, *products))
    return table


_TABLE = _table()


def _in_place_name(name: str) -> bool:
    dunder = name.startswith("__") and name.endswith("__")
    return name.startswith("__i") and dunder or name.endswith("_") and not dunder


_IN_PLACE = {f for f in _TABLE if _in_place_name(getattr(f, "__name__", ""))}
_BN_FORWARD = nn.BatchNorm2d.forward
_PLAIN_FORWARDS = (nn.Linear.forward, nn.Conv1d.forward, nn.Conv2d.forward, nn.Conv3d.forward)
_PLAIN_FORWARDS += tuple(kind.forward for kind in CONV_TRANSPOSE)
_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TORCH = os.path.dirname(os.path.abspath(torch.__file__))


def on_path(t: object) -> bool:
    """Whether ``t`` is a tensor on the relevance path (requires grad, not a parameter)."""
    return isinstance(t, Tensor) and t.requires_grad and not isinstance(t, nn.Parameter)


def _operands(args: tuple, kwargs: dict) -> list[Tensor]:
    found = []
    for arg in (*args, *kwargs.values()):
        if isinstance(arg, list | tuple):
            found.extend(a for a in arg if on_path(a))
        elif on_path(arg):
            found.append(arg)
    return found


def _call_site() -> str:
    for frame in reversed(traceback.extract_stack()):
        path = os.path.abspath(frame.filename)
        if not path.startswith((_HERE, _TORCH)):
            return f"{frame.filename}:{frame.lineno} ({frame.line})"
    return "unknown"


def _name(func: Any) -> str:
    owner = getattr(func, "__objclass__", None) or getattr(func, "__module__", None) or "torch"
    owner = getattr(owner, "__name__", owner)
    return f"{owner}.{getattr(func, '__name__', func)}"


class Session:
    """One :func:`rules_applied` block: the rules of the modules, what the canonizers track, and
    the recorded layer outputs (``recorded[name]``: every call's output, in order)."""

    def __init__(self, model: nn.Module, comp: Composite, record: Sequence[str]):
        self.model, self.composite = model, comp
        self.rules: dict[str, tuple[nn.Module, Rule]] = comp.assign(model)
        self.norm = Norm(comp.stabilizer)
        self.handlers = handlers(comp.stabilizer)
        self.gates = GateTracker(comp.gates)
        self.bypass = 0
        self.produced: dict[int, tuple[Tensor, int, Affine, Rule, Tensor]] = {}
        self.normalized: dict[int, tuple[Tensor, int, nn.Module, Tensor]] = {}
        self.grad_modes: list[bool] = []
        self.substitute: dict[int, tuple[Tensor, Tensor | None]] = {}
        self.substituted = 0
        self.record = list(record)
        self.recorded: dict[str, list[Tensor]] = {name: [] for name in self.record}
        self.passed_on: dict[str, Tensor] = {}  # the copy a recorded layer's downstream got
        self.merged: set[int] = set()  # outputs merged away into the BatchNorm after them
        self.deferred: set[nn.Module] = set()  # layers a BatchNorm follows (MergeBatchNorm)
        self.pending: dict[int, str] = {}  # their outputs, until that BatchNorm merges them
        self.names = {module: name for name, module in model.named_modules()}

    @staticmethod
    def guard(hook: Any) -> Any:
        return this_thread(hook)

    def register(self) -> list:
        handles = []
        for module, rule in self.rules.values():
            handles.append(module.register_forward_pre_hook(self.guard(self._enter(rule))))
            handles.append(module.register_forward_hook(self.guard(self._rule_hook(rule))))
        for canonizer in self.composite.canonizers:
            handles.extend(canonizer.apply(self.model, self))
        for name, module in find_layers(self.model, self.record) if self.record else ():
            handles.append(module.register_forward_hook(self.guard(self._record_hook(name))))
        return handles

    def _enter(self, rule: Rule):
        def hook(module: nn.Module, args: tuple) -> tuple | None:
            self.bypass += 1
            if rule.parametric and not rule.reuses_output:  # the rule computes the layer
                self.grad_modes.append(torch.is_grad_enabled())  # again: its own pass needs
                torch.set_grad_enabled(False)  # no graph
            elif getattr(module, "inplace", False) and args and on_path(args[0]):
                return (args[0].clone(), *args[1:])  # the module works on a copy: the rule
            return None  # needs its input

        return hook

    def _rule_hook(self, rule: Rule):
        def hook(module: nn.Module, args: tuple, o: object) -> object:
            self.bypass -= 1
            if rule.parametric and not rule.reuses_output:
                torch.set_grad_enabled(self.grad_modes.pop())
            x = args[0] if args else None
            if not (on_path(x) and isinstance(o, Tensor)):
                return None
            self.bypass += 1
            try:
                if not rule.parametric:
                    return rule.output(None, x, o)
                layer, source = self._affine(module), x
                before = self.normalized.get(id(x))
                if before is not None and before[0] is x and before[1] == x._version:
                    layer = merged_before(before[2], layer, before[3])
                    source = before[3]
                if module in self.deferred and source is x:
                    # the BatchNorm right after it merges the rule in: no terms computed twice
                    self.produced[id(o)] = (o, o._version, layer, rule, source)
                    self.pending[id(o)] = self.names[module]
                    return None
                # o carries the layer's graph (and the BatchNorm's before it) when reused
                y = rule.reused(o) if rule.reuses_output else rule.output(layer, source, o)
                self.produced[id(y)] = (y, y._version, layer, rule, source)
                return y
            finally:
                self.bypass -= 1

        return hook

    def _affine(self, module: nn.Module) -> Affine:
        """The module's affine map; a subclass with its own forward (timm's ``Conv2dSame`` pads
        first) is run with its weight swapped for the rule's inside the function mode."""
        if type(module).forward in _PLAIN_FORWARDS:
            return Affine.of(module)
        plain = Affine.of(module)
        weight = module.weight

        def op(x: Tensor, w: Tensor) -> Tensor:
            swap = {id(weight): (weight, w)}
            if module.bias is not None:
                swap[id(module.bias)] = (module.bias, None)
            self.substitute, self.substituted = swap, 0
            try:
                out = module.forward(x)
            finally:
                self.substitute = {}
            if not self.substituted:
                raise RelevanceError(
                    f"{type(module).__name__} computes the weight it applies in its forward: "
                    "camkit's rules modify the module's own weight and cannot reach it"
                )
            return out

        return Affine(op, plain.weight, plain.bias)

    def swapped(self, values: Any) -> Any:
        """``values`` with the module's parameters replaced by the rule's (see :meth:`_affine`)."""
        if isinstance(values, list | tuple):
            return type(values)(self.swapped(v) for v in values)
        entry = self.substitute.get(id(values))
        if entry is not None and entry[0] is values:
            self.substituted += 1
            return entry[1]
        return values

    def batch_norm_hook(self, bn: nn.Module, args: tuple, out: object) -> object:
        x = args[0] if args else None
        if not (isinstance(x, Tensor) and isinstance(out, Tensor)):
            return None
        after = self.produced.get(id(x))  # a deferred layer's output carries no graph
        if after is not None and after[0] is x and after[1] == x._version:
            _, _, layer, rule, source = after
            self.merged.add(id(x))
            deferred = self.pending.pop(id(x), None) is not None
            self.bypass += 1
            try:
                if deferred and rule.reuses_output:  # out's graph: the BatchNorm, the layer
                    return rule.reused(out)
                return rule.output(merged_after(layer, bn), source, out)
            finally:
                self.bypass -= 1
        if on_path(x) and type(bn).forward is _BN_FORWARD:  # no activation inside (timm's)
            self.normalized[id(out)] = (out, out._version, bn, x)
        return None

    def merged_away(self, name: str) -> bool:
        """Whether recorded layer ``name``'s output was merged into the BatchNorm after it (its
        relevance is then the BatchNorm's)."""
        copy = self.passed_on.get(name)
        return copy is not None and id(copy) in self.merged

    def _record_hook(self, name: str):
        def hook(module: nn.Module, args: tuple, out: object) -> object:
            if not isinstance(out, Tensor):
                raise RelevanceError(f"layer {name!r} returns {type(out).__name__}, not a tensor")
            self.recorded[name].append(out)
            pending = self.pending.pop(id(out), None)
            if pending is not None:
                raise ArgumentError(
                    f"layer {name!r} is merged with the BatchNorm that follows it (the "
                    "canonizer): its relevance is at the BatchNorm's output; record that layer"
                )
            copy = out.clone()  # in-place operations downstream leave the recorded tensor alone
            produced = self.produced.get(id(out))
            if produced is not None and produced[0] is out:  # the copy may be merged in turn
                self.produced[id(copy)] = (copy, copy._version, *produced[2:])
            self.passed_on[name] = copy
            return copy

        return hook


class _RelevanceMode(TorchFunctionMode):
    def __init__(self, session: Session):
        super().__init__()
        self.session = session

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.session.substitute:
            args = self.session.swapped(args)
            kwargs = {key: self.session.swapped(value) for key, value in kwargs.items()}
        kind = _TABLE.get(func)
        if self.session.bypass or kind == GRADIENT:
            return func(*args, **kwargs)
        operands = _operands(args, kwargs)
        if not operands:
            return func(*args, **kwargs)
        if kind in (SCALE, SUMS, BILINEAR) and len(operands) == 1:
            # a constant scale or matrix: the gradient; a constant added (a bias) absorbs its share
            return func(*args, **kwargs)
        if kind == SCALE:  # a product of two activations: the gate rule, else AttnLRP's uniform
            uniform = lambda: self._apply(func, BILINEAR, args, kwargs)  # noqa: E731
            return self.session.gates.product(func, args, kwargs, operands, uniform)
        if kind in (PASS, NORM, SUMS, BILINEAR):
            return self._apply(func, kind, args, kwargs)
        handler = self.session.handlers.get(func)
        if handler is not None:
            return handler(*args, **kwargs)
        out = func(*args, **kwargs)
        outs = out if isinstance(out, list | tuple) else (out,)
        if any(isinstance(o, Tensor) and o.requires_grad for o in outs):
            raise RelevanceError(
                f"{_name(func)} on the relevance path has no LRP rule (called at "
                f"{_call_site()}); camkit's rules cover linear and convolutional modules, "
                "activations, sums, pooling and reshaping: give the module a rule in the "
                "composite, or rewrite the operation with supported ones"
            )
        return out

    def _apply(self, func: Any, kind: str, args: tuple, kwargs: dict) -> Tensor:
        x = args[0]
        # F.hardtanh(x, 0.0, 6.0, True) (nn.ReLU6) reaches the mode with inplace=True by name
        in_place = isinstance(x, Tensor) and (func in _IN_PLACE or kwargs.get("inplace") is True)
        first = x.clone() if in_place else x  # in-place forms act on a copy, then write back
        o = func(first, *args[1:], **kwargs)
        if not isinstance(o, Tensor):
            return o
        if kind == PASS:
            y = self.session.gates.tagged(func, Pass().output(None, x, o))
        elif kind == BILINEAR:
            y = bilinear(o, self.session.norm.stabilizer)
        else:
            y = self.session.norm.output(None, x, o)
        if in_place and o is first:
            return x.copy_(y)
        return y


@contextmanager
def rules_applied(
    model: nn.Module,
    composite_spec: str | Composite | Sequence[tuple[Match, Rule]] = "epsilon-plus-flat",
    *,
    record: Sequence[str] = (),
) -> Iterator[Session]:
    """Run the forward inside with LRP's rules in the autograd graph (see the package docs).

    After ``y = model(x)`` inside the block (``x`` requiring grad), ``x * grad_x`` of the target
    score is the input relevance and ``A * grad_A`` the relevance of any intermediate tensor
    ``A``; the backward may run after the block. ``record``: layer names whose outputs are kept
    in ``session.recorded`` (their downstream gets a copy). Hooks are removed on exit, also
    when the forward raises; the model's parameters and buffers are never written.
    """
    comp = composite(composite_spec)
    module = explained_module(model)
    session = Session(module, comp, record)
    # the grad mode is restored also when a ruled layer's forward raises (see Session._enter)
    grad_mode = torch.set_grad_enabled(torch.is_grad_enabled())
    with grad_mode, hooked(session.register), _RelevanceMode(session):
        yield session
    if session.pending:
        raise RelevanceError(
            f"layer(s) {sorted(set(session.pending.values()))} come before a BatchNorm in the "
            "model's modules but their output did not go into it: pass a composite with "
            "canonizers=[] (no BatchNorm merging) for this model"
        )


__all__ = ["Session", "on_path", "rules_applied"]

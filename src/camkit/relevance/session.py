"""One block of the one backward: the rules of a rule set's modules, what its canonizers track,
the recorded layer outputs, and the log of the ReLU rules (:func:`~.engine.rules_applied`)."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Collection, Sequence
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from camkit.core.layers import find_layers, this_thread
from camkit.errors import ArgumentError, RelevanceError
from camkit.relevance.affine import CONV_TRANSPOSE, Affine
from camkit.relevance.bias_units import BiasUnitTracker, Marks
from camkit.relevance.canonizers import channel_scale, merged_after, merged_before
from camkit.relevance.composites import Composite
from camkit.relevance.gates import GateTracker
from camkit.relevance.rectifiers import ActivationLog
from camkit.relevance.rules import Norm, Rule
from camkit.relevance.transformers import handlers

_BN_FORWARD = nn.BatchNorm2d.forward
_PLAIN_FORWARDS = (nn.Linear.forward, nn.Conv1d.forward, nn.Conv2d.forward, nn.Conv3d.forward)
_PLAIN_FORWARDS += tuple(kind.forward for kind in CONV_TRANSPOSE)


def on_path(t: object) -> bool:
    """Whether ``t`` is a tensor on the relevance path (requires grad, not a parameter)."""
    return isinstance(t, Tensor) and t.requires_grad and not isinstance(t, nn.Parameter)


class Session:
    """One :func:`~.engine.rules_applied` block: the modules' rules, what the canonizers track,
    the recorded layer outputs (``recorded[name]``: every call's, in order) and, under a ReLU
    rule, ``log`` (:class:`~.rectifiers.ActivationLog`). ``model``: None for a rule set that
    names no module."""

    def __init__(self, model: nn.Module | None, comp: Composite, record: Sequence[str]):
        self.model, self.composite = model, comp
        if model is None and (comp.rules or comp.first or comp.canonizers or record):
            raise ArgumentError(
                f"the rule set {comp.name!r} gives modules rules: it needs the model"
            )
        self.rules = comp.assign(model) if model is not None else {}
        self.log = ActivationLog(comp.rectifier) if comp.rectifier is not None else None
        self.norm = Norm(comp.stabilizer)
        self.handlers = handlers(comp.linear_rule(), comp.attention)
        self.gates = GateTracker(comp.gates)
        self.bias_units = BiasUnitTracker(comp.bias_units)
        self.bypass = 0
        self.produced = Marks()  # ruled outputs: (layer, rule, source)
        self.normalized = Marks()  # BatchNorm outputs: (bn, its input)
        self.grad_modes: list[bool] = []
        self.substitute: dict[int, tuple[Tensor, Tensor | None]] = {}
        self.substituted = 0
        self.record = list(record)
        self.recorded: dict[str, list[Tensor]] = {name: [] for name in self.record}
        self.passed_on: dict[str, Tensor] = {}  # the copy a recorded layer's downstream got
        self.merged: dict[int, weakref.ref] = {}  # outputs merged into the BatchNorm after
        self.deferred: set[nn.Module] = set()  # layers a BatchNorm follows (MergeBatchNorm)
        self.pending: dict[int, str] = {}  # their outputs, until that BatchNorm merges them
        self.names = {m: name for name, m in model.named_modules()} if model is not None else {}

    def register(self) -> list:
        handles = []
        for module, rule in self.rules.values():
            handles.append(module.register_forward_pre_hook(this_thread(self._enter(rule))))
            handles.append(module.register_forward_hook(this_thread(self._rule_hook(rule))))
        for canonizer in self.composite.canonizers:
            handles.extend(canonizer.apply(self.model, self))
        for name, module in find_layers(self.model, self.record) if self.record else ():
            handles.append(module.register_forward_hook(this_thread(self._record_hook(name))))
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
                before = self.normalized.of(x)
                if before is not None:
                    layer, source = merged_before(before[0], layer, before[1]), before[1]
                if module in self.deferred and source is x:
                    # the BatchNorm right after it merges the rule in: no terms computed twice
                    self.produced.put(o, layer, rule, source)
                    self.pending[id(o)] = self.names[module]
                    return None
                # o carries the layer's graph (and the BatchNorm's before it) when reused
                y = self._ruled(rule, lambda: layer, source, o)
                self.produced.put(y, layer, rule, source)
                return y
            finally:
                self.bypass -= 1

        return hook

    def _ruled(
        self,
        rule: Rule,
        layer: Callable[[], Affine],
        source: Tensor,
        o: Tensor,
        reusable: bool = True,
        via: tuple[Tensor, Tensor] | None = None,
    ) -> Tensor:
        """The rule's output for ``layer()`` (built only where needed), ``o`` from ``source``:
        ``o`` reused where ``reusable`` (it carries the layer's graph, or ``via = (graph,
        scale)``: a BatchNorm run without a graph after it) and ``source`` has no bias units;
        else the rule's terms on ``source`` without them (:mod:`camkit.relevance.bias_units`)."""
        kept = self.bias_units.kept(source)
        if reusable and rule.reuses_output and kept is source:
            return rule.reused(o) if via is None else rule.reused(o, *via)
        y, z = rule.output_and_denominator(layer(), kept, o)
        self.bias_units.found(y, z, o)
        return y

    def _affine(self, module: nn.Module) -> Affine:
        """The module's affine map; a subclass with its own forward (timm's ``Conv2dSame``) runs
        with its weight swapped for the rule's inside the function mode."""
        plain = Affine.of(module)
        if type(module).forward in _PLAIN_FORWARDS:
            return plain
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

    def merge_batch_norms(
        self, norms: Collection[nn.Module], followed: Collection[nn.Module]
    ) -> list:
        """:class:`~.canonizers.Edits`: each BatchNorm merged into its neighbour layer's rule."""
        self.deferred.update(followed)
        enter, hook = this_thread(self._batch_norm_enter), this_thread(self._batch_norm_hook)
        handles = [bn.register_forward_pre_hook(enter) for bn in norms]
        return handles + [bn.register_forward_hook(hook) for bn in norms]

    def _batch_norm_enter(self, bn: nn.Module, args: tuple) -> None:
        x = args[0] if args else None
        after = self.produced.of(x)  # the layer whose rule the BatchNorm merges
        # a merged BatchNorm needs no graph: the rule's backward reaches past it (by the scale
        # where the rule keeps the layer's graph), unless an activation is inside (timm's)
        plain = type(bn).forward is _BN_FORWARD
        keeps = after is not None and id(x) in self.pending and after[1].reuses_output
        self.grad_modes.append(torch.is_grad_enabled())
        torch.set_grad_enabled((after is None or keeps and not plain) and torch.is_grad_enabled())

    def _batch_norm_hook(self, bn: nn.Module, args: tuple, out: object) -> object:
        torch.set_grad_enabled(self.grad_modes.pop())
        x = args[0] if args else None
        if not (isinstance(x, Tensor) and isinstance(out, Tensor)):
            return None
        after = self.produced.of(x)  # a deferred layer's output carries no graph
        if after is not None:
            layer, rule, source = after
            del self.produced[id(x)]
            self.merged[id(x)] = weakref.ref(x)
            deferred = self.pending.pop(id(x), None) is not None
            self.bypass += 1
            try:
                # a deferred layer's graph: x's for a plain BatchNorm (run without a graph,
                # reached by its scale), out's (the BatchNorm's, the layer's) for timm's
                via = (x, channel_scale(bn, out)) if type(bn).forward is _BN_FORWARD else None
                merged = partial(merged_after, layer, bn, source)
                return self._ruled(rule, merged, source, out, reusable=deferred, via=via)
            finally:
                self.bypass -= 1
        if on_path(x) and type(bn).forward is _BN_FORWARD:  # no activation inside (timm's)
            self.normalized.put(out, bn, x)
        return None

    def merged_away(self, name: str) -> bool:
        """Whether recorded layer ``name``'s output was merged into the BatchNorm after it."""
        copy = self.passed_on.get(name)
        merged = self.merged.get(id(copy))
        return merged is not None and merged() is copy

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
            produced = self.produced.of(out)
            if produced is not None:  # the copy may be merged in turn
                self.produced.put(copy, *produced)
            self.bias_units.passed(self.bias_units.mask(out), copy)
            self.passed_on[name] = copy
            return copy

        return hook


__all__ = ["Session", "on_path"]

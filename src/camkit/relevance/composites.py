"""Composites: which LRP rule each layer gets, as data.

A :class:`Composite` is a list of ``(match, rule)`` pairs, the first match winning; ``match`` is
a module type (or a tuple of types) or a layer-name pattern (``fnmatch``: ``"features.*"``).
``first`` does the same for the first module it matches (zennit's
``SpecialFirstLayerMapComposite``). Every other operation gets its rule from the table of
:mod:`camkit.relevance.engine` (activations: :class:`~.rules.Pass`; sums and average pooling:
:class:`~.rules.Norm` with the composite's ``stabilizer``), module or functional call.

The named composites are zennit 0.5.1's, by the names researchers use in papers (Kohlbrenner et
al., "Towards Best Practice in Explaining Neural Network Decisions with LRP", IJCNN 2020;
Montavon et al. 2019):

============================  =============  ============  ===========
name                          first layer    convolutions  dense layers
============================  =============  ============  ===========
``epsilon-plus``              (as the rest)  ZPlus         Epsilon
``epsilon-plus-flat``         Flat           ZPlus         Epsilon
``epsilon-gamma-box``         ZBox (conv)    Gamma(0.25)   Epsilon
``epsilon-alpha2-beta1``      (as the rest)  AlphaBeta     Epsilon
``epsilon-alpha2-beta1-flat`` Flat           AlphaBeta     Epsilon
============================  =============  ============  ===========

Convolutions are ``nn.Conv1d/2d/3d`` and ``nn.ConvTranspose1d/2d/3d`` alike.

``epsilon-plus-flat-nobias`` (camkit's default, :data:`DEFAULT_COMPOSITE`) is
``epsilon-plus-flat`` with ``zero_params="bias"`` in every rule, ``gates="constant"`` and
``bias_units="bias"``: it keeps 50%-150% of the score at the input where zennit's composites lose
most of it on BatchNorm networks (``benchmarks/CONSERVATION.md``). The other rule sets
(:data:`RULE_SETS`) are composites too, not strict: ``"gradient"``, ``"guided"``, ``"deconvnet"``.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from camkit.errors import ArgumentError
from camkit.relevance.affine import CONV_TRANSPOSE
from camkit.relevance.bias_units import BIAS_UNITS
from camkit.relevance.canonizers import Canonizer, MergeBatchNorm
from camkit.relevance.gates import GATES
from camkit.relevance.rectifiers import RULES, ReLURule, check_rule
from camkit.relevance.rules import AlphaBeta, Epsilon, Flat, Gamma, Rule, ZBox, ZPlus
from camkit.relevance.transformers import ATTENTION

Match = type | tuple | str
# transposed convolutions get the convolutions' rules (camkit.relevance.affine)
CONV = (nn.Conv1d, nn.Conv2d, nn.Conv3d, *CONV_TRANSPOSE)
DENSE = (nn.Linear,)
_CHOICES = {"gates": GATES, "bias_units": BIAS_UNITS, "attention": ATTENTION}


def _matches(match: Match, name: str, kind: type) -> bool:
    """Whether ``match`` takes a module named ``name`` of type ``kind``."""
    return fnmatch.fnmatchcase(name, match) if isinstance(match, str) else issubclass(kind, match)


@dataclass
class Composite:
    """A rule set of the one backward, e.g. ``Composite([(nn.Conv2d, Gamma(0.25)),
    ("classifier.*", Epsilon())])``: ``rules`` by module type or layer-name pattern (first match
    wins), a special ``first`` layer, the ``stabilizer`` of the table's Norm rule, the
    ``canonizers``, the rule of ``gates`` (``"uniform"``, ``"constant"``), what ``bias_units``
    are (``"input"``, ``"bias"``), the rule of ``attention`` weights (``"softmax"``, AttnLRP's,
    or ``"constant"``, CP-LRP's), the ReLU ``rectifier`` (``"guided"``, ``"deconvnet"`` or None)
    and whether it is ``strict`` (an operation on the relevance path without a rule raises)."""

    rules: Sequence[tuple[Match, Rule]]
    first: Sequence[tuple[Match, Rule]] = ()
    stabilizer: float = 1e-6
    canonizers: Sequence[Canonizer] = field(default_factory=lambda: [MergeBatchNorm()])
    name: str = "custom"
    gates: str = "uniform"
    bias_units: str = "input"
    attention: str = "softmax"
    rectifier: ReLURule | None = None
    strict: bool = True

    def __post_init__(self) -> None:
        for option, choices in _CHOICES.items():
            if (value := getattr(self, option)) not in choices:
                raise ArgumentError(f"{option} must be one of {list(choices)}, got {value!r}")
        if self.rectifier is not None:
            check_rule(self.rectifier)
        for entry in (*self.rules, *self.first):
            if not (isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[1], Rule)):
                raise ArgumentError(
                    f"a composite entry is (module type or name pattern, rule), got {entry!r}"
                )
            match = entry[0]
            types = match if isinstance(match, tuple) else (match,)
            if not isinstance(match, str) and not all(isinstance(t, type) for t in types):
                raise ArgumentError(
                    f"a composite entry matches a module type, a tuple of types or a name "
                    f"pattern, got {match!r}"
                )

    def assign(self, model: nn.Module) -> dict[str, tuple[nn.Module, Rule]]:
        """``{layer name: (module, rule)}`` for every module a rule matches."""
        assigned: dict[str, tuple[nn.Module, Rule]] = {}
        first_done = not self.first
        for name, module in model.named_modules():
            rule = None
            if not first_done:
                rule = next((r for m, r in self.first if _matches(m, name, type(module))), None)
                first_done = rule is not None
            if rule is None:
                rule = next((r for m, r in self.rules if _matches(m, name, type(module))), None)
            if rule is not None:
                assigned[name] = (module, rule)
        return assigned

    def linear_rule(self) -> Epsilon:
        """The rule of ``F.linear`` outside a ruled module (fused attention's projections): the
        composite's rule for ``nn.Linear`` if an :class:`~.rules.Epsilon`, else Epsilon with the
        stabiliser and that rule's ``zero_params`` (AttnLRP's rule for linear layers)."""
        dense = next((r for m, r in self.rules if _matches(m, "", nn.Linear)), None)
        if isinstance(dense, Epsilon):
            return dense
        return Epsilon(self.stabilizer, zero_params=getattr(dense, "zero_params", ()))


def _named(
    name: str,
    epsilon: float = 1e-6,
    stabilizer: float = 1e-6,
    gamma: float = 0.25,
    low: Any = None,
    high: Any = None,
    zero_params: str | Sequence[str] | None = None,
    gates: str | None = None,
    attention: str = "softmax",
    canonizers: Sequence[Canonizer] | None = None,
    bias_units: str | None = None,
) -> Composite:
    nobias = name == DEFAULT_COMPOSITE
    z = {"zero_params": "bias" if nobias and zero_params is None else zero_params}
    dense = (DENSE, Epsilon(epsilon, **z))
    zplus, alphabeta = ZPlus(stabilizer, **z), AlphaBeta(2.0, 1.0, stabilizer, **z)
    flat = [(CONV + DENSE, Flat(stabilizer, **z))]
    rules, first = {
        "epsilon-plus": ([(CONV, zplus), dense], []),
        "epsilon-plus-flat": ([(CONV, zplus), dense], flat),
        DEFAULT_COMPOSITE: ([(CONV, zplus), dense], flat),
        "epsilon-gamma-box": (
            [(CONV, Gamma(gamma, stabilizer, **z)), dense],
            [(CONV, ZBox(low, high, stabilizer, **z))],
        ),
        "epsilon-alpha2-beta1": ([(CONV, alphabeta), dense], []),
        "epsilon-alpha2-beta1-flat": ([(CONV, alphabeta), dense], flat),
    }[name]
    return Composite(
        rules,
        first,
        stabilizer,
        [MergeBatchNorm()] if canonizers is None else list(canonizers),
        name=name,
        gates=("constant" if nobias else "uniform") if gates is None else gates,
        bias_units=("bias" if nobias else "input") if bias_units is None else bias_units,
        attention=attention,
    )


RULE_SETS: tuple[str, ...] = ("gradient", *RULES)
DEFAULT_COMPOSITE = "epsilon-plus-flat-nobias"  # LRP's, the front ends' (--composite, menus)
COMPOSITES: tuple[str, ...] = (
    DEFAULT_COMPOSITE,
    "epsilon-plus",
    "epsilon-plus-flat",
    "epsilon-gamma-box",
    "epsilon-alpha2-beta1",
    "epsilon-alpha2-beta1-flat",
)


def composite(spec: str | Composite | Sequence[tuple[Match, Rule]], **options: Any) -> Composite:
    """A composite from its name (``options``: zennit's ``epsilon``, ``stabilizer``, ``gamma``,
    ``low``, ``high``, ``zero_params`` (for every rule), ``canonizers``, and :class:`Composite`'s
    ``gates``, ``bias_units``, ``attention``), a :class:`Composite`, or a list of ``(match,
    rule)``; the names of :data:`RULE_SETS` give the plain gradient and the ReLU rules."""
    if isinstance(spec, Composite):
        return spec
    if isinstance(spec, str):
        if spec in RULE_SETS and not options:
            rectifier = spec if spec in RULES else None
            return Composite([], canonizers=[], name=spec, rectifier=rectifier, strict=False)
        if spec not in COMPOSITES:
            raise ArgumentError(
                f"unknown composite {spec!r}; choose from {list(COMPOSITES)} (LRP) or "
                f"{list(RULE_SETS)}"
            )
        return _named(spec, **options)
    if isinstance(spec, list | tuple):
        return Composite(list(spec), **options)
    raise ArgumentError(
        f"composite must be a name ({list(COMPOSITES)}), a Composite or a list of "
        f"(module type or name pattern, rule), got {type(spec).__name__}"
    )


__all__ = ["COMPOSITES", "DEFAULT_COMPOSITE", "RULE_SETS", "Composite", "composite"]

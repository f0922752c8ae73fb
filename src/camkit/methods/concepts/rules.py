"""Which backward the concepts use. The forward inside ``rules.applied(model)`` records the
rule's backward, so that ``t * dS/dt`` is the relevance of any tensor ``t`` on the path, linear in
the incoming gradient: the conditions of Concept Relevance Propagation are masks on that
gradient (Achtibat et al., Nature Machine Intelligence 5, 2023).

* :data:`GRADIENT`: relevance = gradient x activation (Shrikumar et al., "Not Just a Black
  Box", 2016); works on every model camkit explains.
* :class:`LRPRules`: Layer-wise Relevance Propagation (Bach et al., PLOS ONE 2015), Concept
  Relevance Propagation proper (zennit-crp's with the same composite), or the ReLU rules.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from torch import nn

from camkit.errors import ArgumentError
from camkit.relevance import COMPOSITES, RULE_SETS, Composite, rules_applied
from camkit.relevance import composite as relevance_composite


@runtime_checkable
class Rules(Protocol):
    """A backward rule context: ``applied(model)`` leaves the model as it found it;
    ``batched``: whether its backward can be vmapped (``is_grads_batched``)."""

    batched: bool

    def applied(self, model: nn.Module) -> AbstractContextManager[object]:
        """The context inside which autograd computes the rule's gradient for ``model``."""
        ...


@dataclass(frozen=True)
class GradientRules:
    """The plain gradient: relevance = gradient x activation (x input for the heatmap)."""

    batched = True

    def applied(self, model: nn.Module) -> AbstractContextManager[None]:
        return nullcontext()


GRADIENT = GradientRules()


class LRPRules:
    """A rule set of the one backward (:func:`camkit.relevance.rules_applied`): an LRP
    composite, or ``"guided"`` / ``"deconvnet"`` (whose backward cannot be vmapped)."""

    def __init__(self, composite: object = "epsilon-plus-flat"):
        self.composite = relevance_composite(composite)
        self.batched = self.composite.rectifier is None

    def applied(self, model: nn.Module) -> AbstractContextManager[object]:
        return rules_applied(model, self.composite)

    def __repr__(self) -> str:
        return f"LRPRules({self.composite!r})"


RulesSpec = Rules | str | Composite | Sequence


def check_rules(rules: object) -> Rules:
    """``rules`` if it is a rule context; a rule set's name (``"gradient"``, ``"guided"``,
    ``"deconvnet"``, an LRP composite's), a :class:`~camkit.relevance.Composite` or a list of
    ``(match, rule)`` as its :class:`LRPRules`; else :class:`~camkit.errors.ArgumentError`."""
    if rules == "gradient":
        return GRADIENT
    if isinstance(rules, str) and rules not in (*COMPOSITES, *RULE_SETS):
        raise ArgumentError(
            f"rules must be a rule context or a rule set's name ({list(RULE_SETS)} or an LRP "
            f"composite, {list(COMPOSITES)}), got {rules!r}"
        )
    if isinstance(rules, str | Composite | list):
        return LRPRules(rules)
    if not isinstance(rules, Rules):
        raise ArgumentError(
            "rules must be a rule context with applied(model) and batched (e.g. "
            "camkit.methods.concepts.GRADIENT or camkit.methods.concepts.LRPRules()) or a rule "
            f"set's name, got {type(rules).__name__}"
        )
    return rules


__all__ = [
    "GRADIENT",
    "RulesSpec",
    "GradientRules",
    "LRPRules",
    "Rules",
    "check_rules",
]

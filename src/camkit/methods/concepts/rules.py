"""Which backward the concepts use: a rule set of the one backward (plain gradients, the ReLU
rules, LRP's modified gradient).

A rule context is the backward under which conditional relevance is computed. The forward run
inside ``rules.applied(model)`` records the rule's backward in the autograd graph (the scoring
and the backward passes run after the block), so that ordinary autograd computes the rule's
gradient: ``t * dS/dt`` is the relevance of any tensor ``t`` on the path (the input, a layer's
output) and the backward is linear in the incoming gradient: the conditions of Concept Relevance
Propagation are masks on that gradient (Achtibat et al., Nature Machine Intelligence 5, 2023).

* :data:`GRADIENT` (:class:`GradientRules`): the plain gradient, so the relevance of a layer is
  gradient x activation and the heatmap gradient x input (Shrikumar et al., "Not Just a Black
  Box", 2016); it works on every model camkit explains, ViT tokens included, without changing
  anything in it.

* :class:`LRPRules`: a rule set of the one backward (:func:`camkit.relevance.rules_applied`):
  camkit's Layer-wise Relevance Propagation (Bach et al., PLOS ONE 2015) with a named composite
  (``"epsilon-plus-flat"``, the CRP paper's) or a composite of one's own: Concept Relevance
  Propagation proper, equal to zennit-crp's with the same composite; or the ReLU rules
  (``LRPRules("guided")``: concepts under guided backpropagation). Every ``rules=`` also takes
  the rule set's name or composite directly (:func:`check_rules`).

A rule context of one's own implements :class:`Rules`: ``applied(model)`` a context manager that
leaves the model exactly as it found it, ``batched`` whether its backward can be vmapped (several
conditions in one ``is_grads_batched`` call; otherwise they run one after the other on the same
graph).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Protocol, runtime_checkable

from torch import nn

from camkit.errors import ArgumentError
from camkit.relevance import COMPOSITES, RULE_SETS, Composite, rules_applied
from camkit.relevance import composite as relevance_composite


@runtime_checkable
class Rules(Protocol):
    """A backward rule context for conditional relevance (see the module docstring)."""

    name: str
    batched: bool

    def applied(self, model: nn.Module) -> AbstractContextManager[object]:
        """The context inside which autograd computes the rule's gradient for ``model``."""
        ...


class GradientRules:
    """The plain gradient: relevance = gradient x activation (x input for the heatmap)."""

    name = "gradient"
    batched = True

    @contextmanager
    def applied(self, model: nn.Module) -> Iterator[None]:
        yield

    def __repr__(self) -> str:
        return "GradientRules()"


GRADIENT = GradientRules()


class LRPRules:
    """A rule set of the one backward (:func:`camkit.relevance.rules_applied`): under an LRP
    composite ``A * dS/dA`` is the LRP relevance of ``A``; ``"guided"`` / ``"deconvnet"``
    give the ReLU rules' gradients. ``batched``: an LRP composite's backward can be vmapped
    (the ReLU rules' autograd function is run one pass after the other)."""

    def __init__(self, composite: object = "epsilon-plus-flat"):
        self.composite = relevance_composite(composite)
        self.name = "lrp" if self.composite.strict else self.composite.name
        self.batched = self.composite.rectifier is None

    @contextmanager
    def applied(self, model: nn.Module) -> Iterator[None]:
        with rules_applied(model, self.composite):
            yield

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
            "set's name, got "
            f"{type(rules).__name__}"
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

"""The ReLU rules of guided backpropagation and the deconvnet (:mod:`camkit.relevance.rectifiers`)
as a context of their own, for code that is not a camkit method."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from camkit.relevance.composites import composite
from camkit.relevance.engine import rules_applied
from camkit.relevance.rectifiers import (
    RULES,
    ActivationLog,
    ReLURule,
    UnmodifiedActivationWarning,
    check_rule,
)


@contextmanager
def rectifier_rule(rule: ReLURule) -> Iterator[ActivationLog]:
    """Run the forward inside with every ReLU backpropagating by ``rule`` (guided or deconvnet)
    when a later ``torch.autograd.grad`` runs; yields an :class:`ActivationLog` of what was met::

        with camkit.methods.pixel.rules.rectifier_rule("guided") as log:
            score = model(x.requires_grad_())[0, 281]
        (grad,) = torch.autograd.grad(score, x)
    """
    with rules_applied(None, composite(check_rule(rule))) as session:
        yield session.log


__all__ = ["RULES", "ActivationLog", "UnmodifiedActivationWarning", "check_rule", "rectifier_rule"]

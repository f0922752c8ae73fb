"""Which backward the concepts use: plain gradients, or LRP's modified gradient.

A rule context is the backward under which conditional relevance is computed. Inside
``rules.applied(model)`` ordinary autograd computes the rule's gradient, so that ``t * dS/dt``
is the relevance of any tensor ``t`` on the path (the input, a layer's output) and the backward
is linear in the incoming gradient: the conditions of Concept Relevance Propagation are masks on
that gradient (Achtibat et al., Nature Machine Intelligence 5, 2023).

* :data:`GRADIENT` (:class:`GradientRules`): the plain gradient, so the relevance of a layer is
  gradient x activation and the heatmap gradient x input (Shrikumar et al., "Not Just a Black
  Box", 2016); it works on every model camkit explains, ViT tokens included, without changing
  anything in it.

* :class:`ZennitRules`: a zennit composite (``zennit.composites.EpsilonPlusFlat()``...) as a rule
  context, zennit-crp's backward: zennit's hooks make the gradient itself the relevance, and the
  backward starts from the target's logit.

A rule context of one's own implements :class:`Rules`: ``applied(model)`` a context manager that
leaves the model exactly as it found it, ``batched`` whether its backward can be vmapped (several
conditions in one ``is_grads_batched`` call; otherwise they run one after the other on the same
graph), ``multiplies`` whether a tensor's relevance is ``t * grad`` (True) or the gradient itself
(False: then the backward starts from the score's value, as LRP initialises the relevance).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor, nn

from camkit.errors import ArgumentError


@runtime_checkable
class Rules(Protocol):
    """A backward rule context for conditional relevance (see the module docstring)."""

    name: str
    batched: bool
    multiplies: bool

    def applied(self, model: nn.Module) -> AbstractContextManager[object]:
        """The context inside which autograd computes the rule's gradient for ``model``."""
        ...


class GradientRules:
    """The plain gradient: relevance = gradient x activation (x input for the heatmap)."""

    name = "gradient"
    batched = True
    multiplies = True

    @contextmanager
    def applied(self, model: nn.Module) -> Iterator[None]:
        yield

    def __repr__(self) -> str:
        return "GradientRules()"


GRADIENT = GradientRules()


class ZennitRules:
    """A zennit composite as a rule context (no zennit import here: the composite brings it).

    Inside, zennit's hooks sit on the model's modules and are removed on exit (zennit's
    ``composite.context``); its backward hooks cannot be vmapped, so conditions run one after
    the other on one graph.
    """

    name = "zennit"
    batched = False
    multiplies = False

    def __init__(self, composite: object):
        if not callable(getattr(composite, "context", None)):
            raise ArgumentError(
                "expected a zennit composite (with .context(model)), got "
                f"{type(composite).__name__}"
            )
        self.composite = composite

    @contextmanager
    def applied(self, model: nn.Module) -> Iterator[None]:
        with self.composite.context(model):
            yield

    def __repr__(self) -> str:
        return f"ZennitRules({type(self.composite).__name__})"


def seed(rules: Rules, scores: Tensor) -> Tensor:
    """Where the backward starts: ones (gradient convention) or the scores (relevance)."""
    return torch.ones_like(scores) if rules.multiplies else scores.detach()


def relevance(rules: Rules, tensor: Tensor, grad: Tensor) -> Tensor:
    """A tensor's relevance from its gradient under ``rules`` (``grad`` may have leading axes)."""
    return tensor * grad if rules.multiplies else grad


def check_rules(rules: object) -> Rules:
    """``rules`` if it is a rule context, else :class:`~camkit.errors.ArgumentError`."""
    if not isinstance(rules, Rules):
        raise ArgumentError(
            "rules must be a rule context with applied(model), batched and multiplies (e.g. "
            f"camkit.concepts.GRADIENT), got {type(rules).__name__}"
        )
    return rules


__all__ = [
    "GRADIENT",
    "GradientRules",
    "Rules",
    "ZennitRules",
    "check_rules",
    "relevance",
    "seed",
]

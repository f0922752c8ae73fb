"""Layer-wise Relevance Propagation (Bach et al., PLOS ONE 2015; Montavon et al., "Layer-Wise
Relevance Propagation: An Overview", 2019): rules, composites, canonizers, the one backward
that runs them, and the conservation record. :class:`camkit.LRP`
(:mod:`camkit.methods.pixel.lrp`) is input x gradient under a composite.

The interface other code builds on (concept relevance, class-artifact compensation)::

    with camkit.relevance.rules_applied(model, "epsilon-plus-flat") as session:
        out = model(x.requires_grad_())          # the forward runs inside the block
    score = out[:, 281].sum()
    (grad,) = torch.autograd.grad(score, x)      # the backward may run after it
    relevance = x * grad                         # the input relevance

Under the block, autograd computes LRP's *modified gradient*: for every tensor ``A`` of the
forward, ``A * dS/dA`` is the relevance of ``A`` (``record=[names]`` keeps layer outputs in
``session.recorded``). The backward is linear in the incoming gradient, so masking the gradient
at a layer (per channel: a concept) gives the relevance of that part only, and ``K`` targets
can be one batched backward (:func:`camkit.core.engine.batched_backward`).

Modules: :mod:`~.rules` (the rules, each with its formula and paper), :mod:`~.rescale` (a rule's
modified gradient as one autograd node), :mod:`~.composites` (which layer gets which rule),
:mod:`~.canonizers` (BatchNorm merged, as hooks living only inside the block), :mod:`~.engine`
(the block and the one table of rules for functional operations), :mod:`~.session` (one block's
state), :mod:`~.rectifiers` (the ReLU rules, guided and deconvnet), :mod:`~.transformers`
(AttnLRP's rules; Achtibat et al., ICML 2024), :mod:`~.gates` (multiplicative gates),
:mod:`~.bias_units` (units only their bias drives), :mod:`~.conservation` (the share of the
score that reached each layer).

The numbers equal zennit 0.5.1's for its composites and canonizers
(``tests/test_relevance_references.py``); camkit's default, ``epsilon-plus-flat-nobias``, drops
the biases from the rules, treats gates as constants and units that only their bias drives as
biases (docs/relevance.md says which composite to choose, with the measured conservation).
"""

from camkit.relevance.canonizers import Canonizer, MergeBatchNorm
from camkit.relevance.composites import (
    COMPOSITES,
    DEFAULT_COMPOSITE,
    RULE_SETS,
    Composite,
    composite,
)
from camkit.relevance.conservation import Conservation
from camkit.relevance.engine import Session, rules_applied
from camkit.relevance.rules import (
    AlphaBeta,
    Epsilon,
    Flat,
    Gamma,
    Norm,
    Pass,
    Rule,
    WSquare,
    ZBox,
    ZPlus,
)

__all__ = [
    "COMPOSITES",
    "RULE_SETS",
    "AlphaBeta",
    "Canonizer",
    "Composite",
    "Conservation",
    "DEFAULT_COMPOSITE",
    "Epsilon",
    "Flat",
    "Gamma",
    "MergeBatchNorm",
    "Norm",
    "Pass",
    "Rule",
    "Session",
    "WSquare",
    "ZBox",
    "ZPlus",
    "composite",
    "rules_applied",
]

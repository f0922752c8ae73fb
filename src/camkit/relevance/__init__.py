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

Under the block, ``A * dS/dA`` is the relevance of every tensor ``A`` of the forward
(``record=[names]`` keeps layer outputs in ``session.recorded``). The backward is linear in the
incoming gradient: masking it at a layer (per channel: a concept) gives the relevance of that
part only, and ``K`` targets can be one batched backward.

AttnLRP's rules for transformers (Achtibat et al., ICML 2024) are in :mod:`~.transformers`. The
numbers equal zennit 0.5.1's for its composites and canonizers
(``tests/test_relevance_references.py``); camkit's default, ``epsilon-plus-flat-nobias``, drops
the biases from the rules, treats gates as constants and units that only their bias drives as
biases (docs/relevance.md says which composite to choose).
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

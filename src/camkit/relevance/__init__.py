"""Layer-wise Relevance Propagation (Bach et al., PLOS ONE 2015; Montavon et al., "Layer-Wise
Relevance Propagation: An Overview", 2019): rules, composites, canonizers, the one backward
that runs them, and the conservation record. The method, :class:`camkit.LRP`
(:mod:`camkit.methods.pixel.lrp`), is a pixel method above this package: input x gradient under a
composite.

The interface other code builds on (concept relevance, class-artifact compensation)::

    with camkit.relevance.rules_applied(model, "epsilon-plus-flat") as session:
        out = model(x.requires_grad_())          # the forward runs inside the block
    score = out[:, 281].sum()
    (grad,) = torch.autograd.grad(score, x)      # the backward may run after it
    relevance = x * grad                         # the input relevance

Under the block, ordinary autograd computes LRP's *modified gradient*: for every tensor ``A``
of the forward, ``A * dS/dA`` is the relevance of ``A`` (``record=[names]`` keeps layer
outputs in ``session.recorded``). The backward is linear in the incoming gradient, so scaling or
masking the gradient at a layer (per channel: a concept) and continuing the backward gives the
relevance of that part only, conditional relevances add up, and ``K`` targets can be one
batched backward (``is_grads_batched=True``; on the CPU ``K`` passes over the one graph,
:func:`camkit.core.engine.batched_backward`).

* :mod:`~camkit.relevance.rules`: Epsilon, ZPlus, AlphaBeta, Gamma, Flat, WSquare, ZBox, Pass,
  Norm, each with its formula and paper; :mod:`~camkit.relevance.rescale`: a rule's modified
  gradient as one autograd node, its ratios computed in place (the speed of the rules);
* :mod:`~camkit.relevance.composites`: which layer gets which rule (the named composites of the
  papers, or a user's list of ``(module type or name pattern, rule)``);
* :mod:`~camkit.relevance.canonizers`: BatchNorm merged into the adjacent layer, as hooks that
  live only inside the block;
* :mod:`~camkit.relevance.engine`: the one backward: the block, and the one table of rules for
  functional operations (an operation on the relevance path without a rule raises a
  :class:`~camkit.errors.RelevanceError` naming it); every gradient method runs through it;
* :mod:`~camkit.relevance.rectifiers`: the ReLU rules (guided, deconvnet) as rule sets;
* :mod:`~camkit.relevance.session`: one block's state (module rules, canonizers, records);
* :mod:`~camkit.relevance.transformers`: AttnLRP's rules (softmax, matmul, layer norm, fused
  attention; Achtibat et al., ICML 2024);
* :mod:`~camkit.relevance.gates`: the rule of multiplicative gates (``x * sigmoid(s)``), chosen
  in the composite (``gates="uniform"`` or ``"constant"``);
* :mod:`~camkit.relevance.bias_units`: what units that only their bias drives (a rule credits
  none of their inputs) are to the layers that read them, chosen in the composite
  (``bias_units="input"`` or ``"bias"``);
* :mod:`~camkit.relevance.conservation`: :class:`Conservation`, the share of the score that
  reached the input and each recorded layer, and the step that loses most;

The numbers equal zennit 0.5.1's for its composites and canonizers
(``tests/test_relevance_references.py``); camkit's default, ``epsilon-plus-flat-nobias``, drops
the biases from the rules, treats gates as constants and units that only their bias drives as
biases (docs/relevance.md says which composite
to choose, with the measured conservation).
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

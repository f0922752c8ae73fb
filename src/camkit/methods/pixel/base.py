"""The base of the pixel methods: forwards, input gradients, copies, and the heatmap policy.

A pixel method maps an image ``(C, H, W) -> (C, H, W)``, a batch ``(B, C, H, W) -> (B, C, H, W)``
and ``K`` targets per sample (a ``(B, K)`` target) ``-> (B, K, C, H, W)``: signed float32
attributions on the input's device, with no autograd history. A tuple of inputs ``(image,
*others)`` (a model called as ``model(image, *others)``, e.g. an image and its metadata vector)
gives a tuple of attributions, one shaped like each input (as captum's tuples): the methods work
on tuples of inputs throughout, a single tensor being a tuple of one.

Gradients come from ``torch.autograd.grad`` on a detached copy of the input, so the user's tensor
and the parameters' ``.grad`` are never touched, and the methods work inside ``torch.no_grad()``.
``composite=`` runs the forward under a rule set of the one backward
(:func:`camkit.relevance.rules_applied`): an LRP composite or the ReLU rules (``rule=`` names
these: ``"guided"``, ``"deconvnet"``), so guided SmoothGrad, SmoothGrad and Integrated Gradients
over LRP's modified gradient come for free (zennit's attributors taking a composite).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from camkit.core.call import Call, chunks
from camkit.core.engine import layer_gradients
from camkit.core.explainer import Explainer, Explanation
from camkit.core.finish import checked
from camkit.core.formats import MemoryFormat, autocast
from camkit.errors import ArgumentError, GradientError, ZeroGradientWarning, warn
from camkit.methods.pixel.heatmap import to_heatmap
from camkit.relevance.composites import Composite, Match
from camkit.relevance.composites import composite as as_composite
from camkit.relevance.engine import rules_applied
from camkit.relevance.rectifiers import RULES, ReLURule, check_rule
from camkit.relevance.rules import Rule
from camkit.targets.base import TargetSpec
from camkit.targets.resolver import RowScorer, resolve

HEATMAP_PERCENTILE = 99.0


Inputs = tuple[Tensor, ...]


def rows_of(inputs: Inputs, rows: Tensor) -> Inputs:
    """The rows ``rows`` of every input."""
    return tuple(t[rows] for t in inputs)


class SampleTotals:
    """Per-sample totals of values computed on rows ``r`` that belong to sample ``r % B``; one
    total per value given to :meth:`add` (``totals``)."""

    def __init__(self, samples: int):
        self.samples = samples
        self.totals: Inputs = ()

    def add(self, sample: Tensor, *values: Tensor) -> None:
        if not self.totals:
            self.totals = tuple(v.new_zeros((self.samples, *v.shape[1:])) for v in values)
        for total, value in zip(self.totals, values, strict=True):
            total.index_add_(0, sample, value)


class PixelAttribution(Explainer):
    """Base of the pixel methods: checks the input, runs forwards, takes input gradients.

    A method implements :meth:`attribute` ``(B, C, H, W) -> (B, K, C, H, W)``, on a tuple of
    inputs (one tensor: a tuple of one).

    Args (besides those of :class:`~camkit.core.explainer.Explainer`; pixel methods read no
    layer, except Guided Grad-CAM's Grad-CAM):
        rule: ``"guided"`` or ``"deconvnet"`` backpropagates every ReLU by that rule, ``None``
            keeps the method's own (the plain gradient, except for the named shortcuts
            :class:`~camkit.methods.pixel.methods.GuidedBackprop` and
            :class:`~camkit.methods.pixel.methods.Deconvnet`).
        composite: the rule set of the backward (instead of ``rule``): an LRP composite's name
            (:data:`~camkit.relevance.COMPOSITES`), ``"gradient"``, ``"guided"``,
            ``"deconvnet"``, a :class:`~camkit.relevance.Composite` or a list of ``(module type
            or name pattern, rule)``. The gradients are then the rule set's modified gradients.
        batch_size: rows per forward pass (copies of the inputs are cut in chunks of this
            many); None runs them all at once. Results do not depend on it.
    """

    family: ClassVar[str] = "pixel"
    several_inputs: ClassVar[bool] = True
    takes_vectors: ClassVar[bool] = True
    default_rule: ClassVar[ReLURule | None] = None
    default_composite: ClassVar[str | None] = None  # the LRP composite of composite=None

    def __init__(
        self,
        model: nn.Module,
        *,
        rule: ReLURule | None = None,
        composite: str | Composite | Sequence[tuple[Match, Rule]] | None = None,
        **options: Any,
    ):
        super().__init__(model, **options)
        if rule is not None and composite is not None:
            raise ArgumentError("give rule= (a ReLU rule) or composite= (a rule set), not both")
        self.rule = check_rule(rule) if rule is not None else self.default_rule
        if composite is None and rule is None:
            composite = self.default_composite
        spec = composite if composite is not None else self.rule
        rule_set = as_composite(spec) if spec is not None else None
        plain = rule_set is not None and rule_set.name == "gradient" and not rule_set.strict
        self.rule_set: Composite | None = None if plain else rule_set

    def _explain(self, call: Call, scorer: RowScorer) -> Explanation:
        attrs = self.attribute(as_tuple(call.batch), scorer, call)
        return Explanation.of(as_given(call.batch, finished(attrs)), scorer)

    def attribute(self, inputs: Inputs, target: TargetSpec | RowScorer, call: Call) -> Inputs:
        """The family's step: ``(B, C, H, W)`` (and the other inputs ``(B, ...)``) ``->`` one
        ``(B, K, C, H, W)`` (``(B, K, ...)``) per input; the model runs as ``call.forward``."""
        raise NotImplementedError

    def display_heat(self, result: Tensor) -> Tensor:
        """``(B, K, C, H, W)`` attribution -> heat ``(B, K, H, W)``: ``max_c |attribution|``
        divided by its 99th percentile and clipped at 1: gradients are spiky, and without the
        clipping a handful of pixels would take the whole colour range (Smilkov et al. 2017)."""
        return to_heatmap(result.detach().float(), "abs-max", percentile=HEATMAP_PERCENTILE)

    def forward(self, inputs: Inputs, call: Call, rows: Tensor | None = None) -> object:
        """The model's forward pass of ``call``'s samples ``rows``, under the rule set if any."""
        if self.rule_set is None:
            return call.forward(self.model, inputs, rows)
        with rules_applied(self.model, self.rule_set) as session:
            output = call.forward(self.model, inputs, rows)
        if session.log is not None:
            session.log.warn_if_incomplete(type(self).__name__, self.model)
        return output

    def input_gradients(
        self, inputs: Inputs, call: Call, scorer: RowScorer, rows: Tensor, memory: MemoryFormat
    ) -> tuple[Inputs, Tensor]:
        """One forward, the backward of the ``K`` targets: ``(grads (n, K, *input) per input,
        scores (n, K))``.

        The gradients are taken with respect to detached aliases of ``inputs`` (the caller's
        tensors are never set to require grad); ``K`` targets are ``K`` vector-Jacobian products
        on the one graph (:func:`~camkit.core.engine.layer_gradients`). The model gets copies,
        the image in ``memory``'s format (channels_last on the CPU), so in-place operations on
        its inputs stay inside camkit. An input the score does not depend on gets zeros, with a
        warning.
        """
        leaves = tuple(t.detach().requires_grad_(True) for t in inputs)

        def scores_in(memory_format: torch.memory_format) -> Tensor:
            with torch.enable_grad(), autocast(leaves[0].device, self.dtype):
                copies = (leaves[0].clone(memory_format=memory_format),)
                output = self.forward(copies + tuple(t.clone() for t in leaves[1:]), call, rows)
                return scorer(output, rows)

        scores = memory.run(scores_in)
        if not scores.requires_grad:
            raise GradientError(
                "the target score does not depend on the input: the model's output is "
                "detached from it (a torch.no_grad() or .detach() inside the model?)"
            )
        names = ["input"] if len(leaves) == 1 else [f"input {i}" for i in range(len(leaves))]
        grads = layer_gradients(scores, list(leaves), names, allow_unused=len(leaves) > 1)
        unused = [name for name, grad in zip(names, grads, strict=True) if grad is None]
        if unused:
            warn(
                f"the target score does not depend on {unused}: their attribution is zero",
                ZeroGradientWarning,
            )
        grads = tuple(
            t.new_zeros((*scores.shape, *t.shape[1:])) if grad is None else grad
            for grad, t in zip(grads, leaves, strict=True)
        )
        return grads, scores.detach().float()

    def over_copies(
        self,
        inputs: Inputs,
        target: TargetSpec | RowScorer,
        call: Call,
        copies: int,
        make_inputs: Callable[[Tensor, range], Inputs] | None,
        accumulate: Callable[[Tensor, Inputs, Tensor], None],
    ) -> None:
        """Gradients of ``copies`` copies of every sample of ``call``, ``batch_size`` rows at a
        time.

        Row ``r`` (of ``copies * B``) is copy ``r // B`` of sample ``r % B``.
        ``make_inputs(rows, span)`` builds one chunk's rows of every input (given as a tensor
        and as a ``range``; None: the samples themselves); ``accumulate(rows, grads, scores)``
        consumes their results. A top-1 target is fixed on the clean batch when the copies
        differ from it, so every copy explains the same class.
        """
        first = inputs[0]
        size = first.shape[0]
        scorer = resolve(target, size, first.device, self.output)
        if make_inputs is not None:  # copies that differ from the clean batch
            scorer = self.pinned(inputs, scorer, call)
        memory = MemoryFormat(first)
        for rows in chunks(copies * size, self.batch_size, first.device):
            span = range(int(rows[0]), int(rows[-1]) + 1)
            chunk = rows_of(inputs, rows % size) if make_inputs is None else make_inputs(rows, span)
            grads, scores = self.input_gradients(chunk, call, scorer, rows % size, memory)
            accumulate(rows, grads, scores)

    def backward_name(self) -> str | None:
        """The name of the rule set the gradients follow; None: the plain gradient."""
        return None if self.rule_set is None else self.rule_set.name

    def __repr__(self) -> str:
        rule = "" if self.rule_set is None else f"composite={self.backward_name()!r}"
        return f"{type(self).__name__}({rule})"


def as_tuple(batch: Tensor | Inputs) -> Inputs:
    """A batch as a tuple of one input; a tuple of inputs as it is."""
    return batch if isinstance(batch, tuple) else (batch,)


def finished(attrs: Inputs) -> Inputs:
    """float32 attributions, checked (:func:`~camkit.core.finish.checked`); an all-zero one
    warns for the image only (another input's zeros were warned about as unused, or are its
    true attribution)."""
    return tuple(checked(attr.float(), warn_empty=i == 0) for i, attr in enumerate(attrs))


def summed(attrs: Inputs) -> Tensor:
    """Every input's attribution summed per sample and target: ``(B, K, ...) -> (B, K)`` (the
    side of completeness and conservation checks that the map gives)."""
    return sum(attr.reshape(*attr.shape[:2], -1).sum(dim=2) for attr in attrs)


def as_given(batch: Tensor | Inputs, results: Inputs) -> Tensor | Inputs:
    """One result per input, as a tuple when the inputs came as a tuple, else the only one."""
    return results if isinstance(batch, tuple) else results[0]


def maps_and_totals(batch: Tensor | Inputs, attrs: Inputs) -> tuple[Tensor | Inputs, Tensor]:
    """The maps of a method that checks what its map adds up to (IG's completeness, LRP's
    conservation): the attributions :func:`finished` and :func:`as_given`, and their
    :func:`summed` totals ``(B, K)``."""
    found = finished(attrs)
    return as_given(batch, found), summed(found)


__all__ = [
    "HEATMAP_PERCENTILE",
    "RULES",
    "Inputs",
    "SampleTotals",
    "PixelAttribution",
    "as_given",
    "as_tuple",
    "finished",
    "maps_and_totals",
    "rows_of",
    "summed",
]

"""The base of the pixel methods: forwards, input gradients, copies, and the heatmap policy.

A pixel method maps ``(C, H, W) -> (C, H, W)``, ``(B, C, H, W) -> (B, C, H, W)`` and ``(B, K)``
targets ``-> (B, K, C, H, W)``, signed float32; a tuple of inputs gives a tuple of
attributions, as captum's. ``composite=`` runs the forward under a rule set of the one backward
(:func:`camkit.relevance.rules_applied`): SmoothGrad or IG over guided or LRP gradients, as
zennit's attributors taking a composite.
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
from camkit.relevance.rectifiers import ReLURule, check_rule
from camkit.relevance.rules import Rule
from camkit.targets.base import TargetSpec
from camkit.targets.resolver import RowScorer, resolve

HEATMAP_PERCENTILE = 99.0
Inputs = tuple[Tensor, ...]


class SampleTotals:
    """Per-sample ``totals`` of the values that :meth:`add` gets for the rows of ``sample``."""

    def __init__(self, samples: int):
        self.samples = samples
        self.totals: Inputs = ()

    def add(self, sample: Tensor, *values: Tensor) -> None:
        if not self.totals:
            self.totals = tuple(v.new_zeros((self.samples, *v.shape[1:])) for v in values)
        for total, value in zip(self.totals, values, strict=True):
            total.index_add_(0, sample, value)


class PixelAttribution(Explainer):
    """Base of the pixel methods; a method implements :meth:`attribute`.

    Args (besides those of :class:`~camkit.core.explainer.Explainer`; no layer):
        rule: ``"guided"`` or ``"deconvnet"`` backpropagates every ReLU by that rule; ``None``
            keeps the method's own (the plain gradient, but for
            :class:`~camkit.methods.pixel.methods.GuidedBackprop` and
            :class:`~camkit.methods.pixel.methods.Deconvnet`).
        composite: the backward's rule set instead of ``rule``: an LRP composite's name
            (:data:`~camkit.relevance.COMPOSITES`), ``"gradient"``, ``"guided"``,
            ``"deconvnet"``, a :class:`~camkit.relevance.Composite` or a list of ``(module type
            or name pattern, rule)``.
        batch_size: rows (copies of the inputs) per forward pass; None: all at once.
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
        return Explanation.of(finished(call.batch, attrs)[0], scorer)

    def attribute(self, inputs: Inputs, target: TargetSpec | RowScorer, call: Call) -> Inputs:
        """The family's step: each input ``(B, ...) -> (B, K, ...)``."""
        raise NotImplementedError

    def display_heat(self, result: Tensor) -> Tensor:
        """``(B, K, C, H, W) -> (B, K, H, W)``: ``max_c |attribution|`` over its 99th percentile,
        clipped at 1 (gradients are spiky, Smilkov et al. 2017)."""
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
        """``(grads (n, K, *input) per input, scores (n, K))`` from one forward of copies of
        ``inputs`` (in-place operations stay inside camkit); an unused input gets zeros, warned."""
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
        """Gradients of ``copies`` copies of every sample, ``batch_size`` rows at a time (row
        ``r``: copy ``r // B`` of sample ``r % B``), built by ``make_inputs(rows, span)`` (None:
        the samples) and passed to ``accumulate(rows, grads, scores)``. Copies that differ from
        the samples explain the clean batch's top-1 class."""
        first = inputs[0]
        size = first.shape[0]
        scorer = resolve(target, size, first.device, self.output)
        if make_inputs is not None:  # copies that differ from the clean batch
            scorer = self.pinned(inputs, scorer, call)
        memory = MemoryFormat(first)
        for rows in chunks(copies * size, self.batch_size, first.device):
            span = range(int(rows[0]), int(rows[-1]) + 1)
            chunk = (
                make_inputs(rows, span) if make_inputs else tuple(t[rows % size] for t in inputs)
            )
            grads, scores = self.input_gradients(chunk, call, scorer, rows % size, memory)
            accumulate(rows, grads, scores)

    def backward_name(self) -> str | None:
        """The name of the gradients' rule set; None: the plain gradient."""
        return None if self.rule_set is None else self.rule_set.name

    def __repr__(self) -> str:
        rule = "" if self.rule_set is None else f"composite={self.backward_name()!r}"
        return f"{type(self).__name__}({rule})"


def as_tuple(batch: Tensor | Inputs) -> Inputs:
    """A batch as a tuple of one input; a tuple of inputs as it is."""
    return batch if isinstance(batch, tuple) else (batch,)


def summed(attrs: Inputs) -> Tensor:
    """Every input's attribution summed per sample and target: ``(B, K, ...) -> (B, K)``."""
    return sum(attr.reshape(*attr.shape[:2], -1).sum(dim=2) for attr in attrs)


def finished(batch: Tensor | Inputs, attrs: Inputs) -> tuple[Tensor | Inputs, Tensor]:
    """The attributions float32 and checked (only the image's zeros warn), a tuple when the
    inputs came as one, and their :func:`summed` totals ``(B, K)``."""
    found = tuple(checked(attr.float(), warn_empty=i == 0) for i, attr in enumerate(attrs))
    return (found if isinstance(batch, tuple) else found[0]), summed(found)


__all__ = ["HEATMAP_PERCENTILE", "Inputs", "PixelAttribution", "SampleTotals"]

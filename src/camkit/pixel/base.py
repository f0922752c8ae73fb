"""The base of the pixel methods: forwards, input gradients, copies, and the heatmap policy.

A pixel method maps an image ``(C, H, W) -> (C, H, W)``, a batch ``(B, C, H, W) -> (B, C, H, W)``
and ``K`` targets per sample (a ``(B, K)`` target) ``-> (B, K, C, H, W)``: signed float32
attributions on the input's device, with no autograd history.

Gradients come from ``torch.autograd.grad`` on a detached copy of the input, so the user's tensor
and the parameters' ``.grad`` are never touched, and the methods work inside ``torch.no_grad()``.
``rule=`` runs the forward under a ReLU backward rule (:mod:`camkit.pixel.rules`): guided
SmoothGrad and guided Integrated Gradients come for free.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from camkit.core.copies import chunks, pin_top1
from camkit.core.engine import layer_gradients, run_model
from camkit.core.explainer import Explainer
from camkit.core.finish import checked
from camkit.core.inputs import MemoryFormat, autocast
from camkit.core.layers import LayerSpec
from camkit.core.targets import RowScorer, TargetSpec, resolve
from camkit.errors import GradientError
from camkit.pixel.heatmap import to_heatmap
from camkit.pixel.rules import RULES, Rule, check_rule, rectifier_rule

HEATMAP_PERCENTILE = 99.0


class PerSample:
    """Per-sample totals of values computed on rows ``r`` that belong to sample ``r % B``."""

    def __init__(self, samples: int):
        self.samples = samples
        self.total: Tensor | None = None

    def add(self, sample: Tensor, values: Tensor) -> None:
        if self.total is None:
            self.total = values.new_zeros((self.samples, *values.shape[1:]))
        self.total.index_add_(0, sample, values)


class PixelAttribution(Explainer):
    """Base of the pixel methods: checks the input, runs forwards, takes input gradients.

    A method implements :meth:`attribute` ``(B, C, H, W) -> (B, K, C, H, W)``.

    Args (besides those of :class:`~camkit.core.explainer.Explainer`; pixel methods read no
    layer, except Guided Grad-CAM's Grad-CAM):
        rule: ``"guided"`` or ``"deconvnet"`` backpropagates every ReLU by that rule, ``None``
            keeps the method's own (the plain gradient, except for the named shortcuts
            :class:`~camkit.pixel.methods.GuidedBackprop` and
            :class:`~camkit.pixel.methods.Deconvnet`).
        batch_size: rows per forward pass (copies of the inputs are cut in chunks of this
            many); None runs them all at once. Results do not depend on it.
    """

    family: ClassVar[str] = "pixel"
    default_rule: ClassVar[Rule | None] = None

    def __init__(
        self,
        model: nn.Module,
        layer: LayerSpec | None = None,
        *,
        rule: Rule | None = None,
        **options: Any,
    ):
        super().__init__(model, layer, **options)
        self.rule = check_rule(rule) if rule is not None else self.default_rule

    def explain(self, batch: Tensor, target: TargetSpec) -> tuple[Tensor, bool]:
        attr, several = self.attribute(batch, target)
        return checked(attr.float()), several

    def attribute(self, batch: Tensor, target: TargetSpec) -> tuple[Tensor, bool]:
        """``(B, C, H, W) -> ((B, K, C, H, W), several)``."""
        raise NotImplementedError

    def heatmaps(self, batch: Tensor, target: TargetSpec) -> tuple[Tensor, Tensor]:
        """``(heat (B, K, H, W) in [0, 1], attribution (B, K, C, H, W))`` for display.

        The heat is ``max_c |attribution|`` divided by its 99th percentile and clipped at 1:
        gradients are spiky, and without the clipping a handful of pixels would take the whole
        colour range (Smilkov et al. 2017).
        """
        attr, _ = self.attribute(batch, target)
        attr = attr.detach().float()
        return to_heatmap(attr, "abs-max", percentile=HEATMAP_PERCENTILE), attr

    def forward(self, inputs: Tensor, rows: Tensor | None = None) -> object:
        """The model's forward pass of the samples ``rows``, under the ReLU rule if any."""
        if self.rule is None:
            return run_model(self.model, inputs, rows)
        with rectifier_rule(self.rule) as log:
            output = run_model(self.model, inputs, rows)
        log.warn_if_incomplete(type(self).__name__, self.model)
        return output

    def input_gradients(
        self, inputs: Tensor, scorer: RowScorer, rows: Tensor, memory: MemoryFormat
    ) -> tuple[Tensor, Tensor, bool]:
        """One forward, one batched backward: ``(grads (n, K, C, H, W), scores (n, K), several)``.

        The gradient is taken with respect to a detached alias of ``inputs`` (the caller's tensor
        is never set to require grad); ``K`` targets are one batched vector-Jacobian product.
        The model gets a copy in ``memory``'s format (channels_last on the CPU), so
        in-place operations on its input stay inside camkit.
        """
        leaf = inputs.detach().requires_grad_(True)

        def scores_in(memory_format: torch.memory_format) -> tuple[Tensor, bool]:
            with torch.enable_grad(), autocast(inputs.device, self.dtype):
                output = self.forward(leaf.clone(memory_format=memory_format), rows)
                return scorer(output, rows)

        scores, several = memory.run(scores_in)
        if not scores.requires_grad:
            raise GradientError(
                "the target score does not depend on the input: the model's output is "
                "detached from it (a torch.no_grad() or .detach() inside the model?)"
            )
        (grads,) = layer_gradients(scores, [leaf], ["input"])
        return grads, scores.detach().float(), several

    def over_copies(
        self,
        batch: Tensor,
        target: TargetSpec,
        copies: int,
        make_inputs: Callable[[Tensor, range], Tensor] | None,
        accumulate: Callable[[Tensor, Tensor, Tensor], None],
    ) -> bool:
        """Gradients of ``copies`` copies of every sample, ``batch_size`` rows at a time.

        Row ``r`` (of ``copies * B``) is copy ``r // B`` of sample ``r % B``.
        ``make_inputs(rows, span)`` builds one chunk's rows (given as a tensor and as a
        ``range``; None: the samples themselves); ``accumulate(rows, grads, scores)`` consumes
        their results. A top-1 target is fixed on the clean batch when the copies differ from
        it, so every copy explains the same class. Returns ``several``.
        """
        self.check_autograd()
        size = batch.shape[0]
        scorer = resolve(target, size, batch.device, self.output)
        if make_inputs is not None:  # copies that differ from the clean batch
            scorer = pin_top1(
                self.model, batch, scorer, dtype=self.dtype, batch_size=self.batch_size
            )
        memory = MemoryFormat(batch)
        several = False
        for rows in chunks(copies * size, self.batch_size, batch.device):
            span = range(int(rows[0]), int(rows[-1]) + 1)
            inputs = batch[rows % size] if make_inputs is None else make_inputs(rows, span)
            grads, scores, several = self.input_gradients(inputs, scorer, rows % size, memory)
            accumulate(rows, grads, scores)
        return several

    def __repr__(self) -> str:
        rule = "" if self.rule is None else f"rule={self.rule!r}"
        return f"{type(self).__name__}({rule})"


__all__ = ["HEATMAP_PERCENTILE", "RULES", "PerSample", "PixelAttribution"]

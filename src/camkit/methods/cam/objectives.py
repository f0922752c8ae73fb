"""The CAMs that change what is differentiated, with passes of their own (so :func:`camkit.cams`
runs them apart): Shapley-CAM and Finer-CAM. Notation as in :mod:`camkit.methods.cam.gradient`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal

import torch
from torch import Tensor, nn

from camkit.core.attention import unfused_attention
from camkit.core.call import Call
from camkit.core.engine import over_rows
from camkit.core.inputs import finite_number, positive_int
from camkit.core.layers import LayerSpec, single_call
from camkit.errors import ArgumentError, LayerOutputError, TargetError
from camkit.methods.cam.base import BaseCAM, RawMaps, WrapperCAM
from camkit.methods.cam.gradient import GradCAM
from camkit.registry import register
from camkit.targets.outputs import select_output
from camkit.targets.resolver import RowScorer, resolve


@register("shapleycam", "Cai, 2025")
class ShapleyCAM(GradCAM):
    """Shapley-CAM: Grad-CAM with the gradient corrected by the Hessian-vector product.

    Cai, "CAMs as Shapley Value-based Explainers", 2025 (arXiv:2501.06261; pytorch-grad-cam's
    ``ShapleyCAM``): the channels' second-order Shapley values, ``w_c = mean_ij (g - H A /
    2)_cij`` with ``H = d^2 S / dA^2`` (one double backward per target; 0 where ``S`` is
    piecewise linear in ``A``: then Grad-CAM; the paper uses a ``logit - cross-entropy`` target).
    """

    def raw_maps(self, batch: Tensor, scorer: RowScorer, call: Call) -> RawMaps:
        with unfused_attention(self.model):  # fused attention kernels have no double backward
            return over_rows(
                batch, self.batch_size, lambda part, rows: self._pass(part, call, scorer, rows)
            )

    def _pass(self, part: Tensor, call: Call, scorer: RowScorer, rows: Tensor) -> dict[str, Tensor]:
        names = self.capture.names
        output, taps = self.capture.forward(
            part, call, start_graph=True, dtype=self.dtype, rows=rows
        )
        acts = single_call(taps)
        with torch.enable_grad():
            scores = scorer(output, rows)
            if not scores.requires_grad:
                raise LayerOutputError(f"the target score does not depend on layer(s) {names}")
            corrected: list[list[Tensor]] = [[] for _ in acts]
            for k in range(scores.shape[1]):
                grads = torch.autograd.grad(
                    scores[:, k].sum(), acts, create_graph=True, allow_unused=True
                )
                for i, (act, grad) in enumerate(zip(acts, grads, strict=True)):
                    if grad is None:
                        raise LayerOutputError(
                            f"the target score does not depend on layer {names[i]!r}"
                        )
                    hvp = None
                    if grad.requires_grad:  # else the score is linear in A: H A = 0
                        (hvp,) = torch.autograd.grad(
                            grad, act, act.detach(), retain_graph=True, allow_unused=True
                        )
                    corrected[i].append((grad if hvp is None else grad - 0.5 * hvp).detach())
        grads = [torch.stack(per_target, dim=1) for per_target in corrected]
        acts = [act.detach().unsqueeze(1) for act in acts]
        return self.maps_from(acts, grads, scores.shape[1], tuple(part.shape[2:]))


@register("finercam", "Zhang et al., CVPR 2025")
class FinerCAM(WrapperCAM):
    """Finer-CAM: the map of the target's score relative to the most similar classes.

    Zhang et al., "Finer-CAM: Spotting the Difference Reveals Finer Details for Visual
    Explanation", CVPR 2025. A gradient CAM ``base`` explains the contrast of ``y_c`` with the
    ``references`` classes ``d_t`` of closest logits: ``weighting="mean"`` (torchcam) ``y_c -
    gamma * mean_t y_{d_t}``; ``"softmax"`` (pytorch-grad-cam, the authors') ``sum_t p_t (y_c -
    gamma y_{d_t}) / sum_t p_t`` with the softmax probabilities ``p`` (differentiated too).
    Class targets only; ``gamma >= 0`` (0: the base map); other options go to ``base``.
    """

    def __init__(
        self,
        model: nn.Module,
        layer: LayerSpec | None = None,
        *,
        base: type[BaseCAM] = GradCAM,
        gamma: float = 0.6,
        references: int = 3,
        weighting: Literal["mean", "softmax"] = "mean",
        **options: Any,
    ):
        if not (isinstance(base, type) and issubclass(base, BaseCAM)) or not base.needs_gradients:
            raise ArgumentError(f"base must be a gradient CAM class such as GradCAM, got {base!r}")
        if weighting not in ("mean", "softmax"):
            raise ArgumentError(f"weighting must be 'mean' or 'softmax', got {weighting!r}")
        super().__init__(model, layer, base=base, **options)
        self.gamma = finite_number("gamma", gamma, minimum=0.0)
        self.references = positive_int("references", references)
        self.weighting = weighting

    def objective(self, scorer: RowScorer, rows: Tensor) -> Callable[[Any], Tensor]:
        """The contrastive score of samples ``rows``: ``output -> (n,)`` or ``(n, K)``."""

        def contrast(output: Any) -> Tensor:
            logits = select_output(output, self.output)
            classes = scorer.classes_of(output, rows).to(logits.device)
            count = min(self.references, logits.shape[1] - 1)
            if count < 1:
                raise TargetError("Finer-CAM needs a model with at least two classes")
            chosen = logits.gather(1, classes)  # (n, K)
            distance = (logits.detach()[:, None, :] - chosen.detach()[..., None]).abs()
            distance.scatter_(2, classes[..., None], math.inf)
            refs = distance.topk(count, dim=2, largest=False).indices  # (n, K, T)
            ref_logits = logits[:, None, :].expand(-1, refs.shape[1], -1).gather(2, refs)
            if self.weighting == "mean":
                score = chosen - self.gamma * ref_logits.mean(dim=2)
            else:
                probs = logits.softmax(dim=1)[:, None, :].expand(-1, refs.shape[1], -1)
                p = probs.gather(2, refs)
                weighted = (p * (chosen[..., None] - self.gamma * ref_logits)).sum(2)
                score = weighted / (p.sum(2) + 1e-9)
            return score if scorer.several else score[:, 0]

        return contrast

    def raw_maps(self, batch: Tensor, scorer: RowScorer, call: Call) -> RawMaps:
        if not scorer.has_classes:
            raise TargetError(
                "Finer-CAM compares class logits: pass class indices as target, not a callable"
            )

        def one_pass(part: Tensor, rows: Tensor) -> dict[str, Tensor]:
            local = resolve(self.objective(scorer, rows), part.shape[0], part.device)
            acts, grads, scores = self.capture.run(
                part, call, local, rows, gradients=True, dtype=self.dtype
            )
            return self.maps_from(acts, grads, scores.shape[1], tuple(part.shape[2:]))

        return over_rows(batch, self.batch_size, one_pass)

    def layer_map(self, act: Tensor, grad: Tensor | None) -> Tensor:
        return self.base.layer_map(act, grad)


__all__ = ["FinerCAM", "ShapleyCAM"]

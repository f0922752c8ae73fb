"""Perturbation CAMs: channel weights measured with masked or ablated forward passes.

Score-CAM masks the input with each channel's activation map, Ablation-CAM zeroes each channel
of the layer's output; both then read the target score. That is one forward per channel, so:

* the forwards run in chunks of ``batch_size`` (masks are built chunk by chunk: memory is
  bounded by ``batch_size``, and results do not depend on it);
* identical perturbations run once: in Score-CAM every constant channel (e.g. all zero after a
  ReLU) gives the same all-zero mask, and channels whose min-max normalised maps are equal give
  the same mask; in Ablation-CAM zeroing an all-zero channel changes nothing, so its weight is
  0 without a forward;
* ``top_k`` (opt-in) evaluates only the ``k`` channels of largest ``|sum_ij g_cij A_cij|`` per
  sample (one extra backward pass ranks them), the others weigh 0. Measured on the default
  pretrained model (EfficientNet-Lite0, layer ``bn2``, 1280 channels, 5 scikit-image photos),
  the mean Pearson correlation with the exact map is 0.994 (Score-CAM) / 0.996 (Ablation-CAM)
  for ``top_k=64`` and 1.000 / 1.000 for ``top_k=256`` (docs/performance.md);
* on the CPU the perturbed images are built ``channels_last``, as every input camkit forwards
  (:class:`camkit.inputs.Layout`: faster there; the caller's own input is never converted);
* ``progress=True`` writes a one-line counter of forward passes to stderr.

The finishing (ReLU, upsampling, min-max normalisation, fusing layers, ``(B, K)`` targets,
``dtype``) is the one of :class:`camkit.cam.base.CAM`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from camkit.cam.base import CAM, Reshape, autocast, layer_gradients, minmax
from camkit.capture import LayerOutputError, LayerSpec, hooked, single_call
from camkit.inputs import Layout
from camkit.targets import OutputSelector, Target, class_indices, select_output, target_scores

RowScorer = Callable[[Any, Tensor], Tensor]


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _chunks(items: Tensor, size: int) -> Iterator[Tensor]:
    for start in range(0, items.shape[0], size):
        yield items[start : start + size]


class _Progress:
    """A one-line ``label: done/total forward passes`` counter on stderr (when enabled)."""

    def __init__(self, label: str, total: int, enabled: bool):
        self.label, self.total, self.enabled, self.done = label, total, enabled, 0

    def step(self, count: int) -> None:
        if not self.enabled:
            return
        self.done += count
        end = "\n" if self.done >= self.total else ""
        sys.stderr.write(f"\r{self.label}: {self.done}/{self.total} forward passes{end}")
        sys.stderr.flush()


class _PerturbationCAM(CAM):
    """Shared by Score-CAM and Ablation-CAM: the clean forward, target scores, chunked forwards.

    Args (besides those of :class:`CAM`):
        batch_size: forward passes per chunk (the memory knob); results do not depend on it.
        top_k: evaluate only the ``top_k`` channels of largest ``|sum_ij g_cij A_cij|`` per
            sample (others weigh 0; see the module docstring for the measured agreement);
            ``None`` evaluates every channel (exact).
        progress: write a forward-pass counter to stderr.

    Each layer must run once per forward pass (a shared module that runs twice is refused).
    """

    needs_gradients = False
    reshape_refused: str | None = None  # why a subclass cannot take reshape=, if it cannot

    def __init__(
        self,
        model: nn.Module,
        layer: LayerSpec,
        batch_size: int = 32,
        *,
        top_k: int | None = None,
        progress: bool = False,
        output: OutputSelector = None,
        reshape: Reshape | None = None,
        dtype: torch.dtype | None = None,
    ):
        if reshape is not None and self.reshape_refused:
            raise ValueError(self.reshape_refused)
        super().__init__(model, layer, output=output, reshape=reshape, dtype=dtype)
        if not _positive_int(batch_size):
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        if top_k is not None and not _positive_int(top_k):
            raise ValueError(f"top_k must be None or a positive int, got {top_k!r}")
        self.batch_size = batch_size
        self.top_k = top_k
        self.progress = progress

    def perturbed_map(
        self, run: _Runs, name: str, module: nn.Module, raw: Tensor, grid: Tensor, kept: Tensor
    ) -> Tensor:
        """``(B, K, h, w)`` map of one layer from its raw output, its ``(B, C, h, w)`` grid and the
        ``(B, C)`` channels to evaluate."""
        raise NotImplementedError

    def raw_maps(self, batch: Tensor, target: Target) -> tuple[dict[str, Tensor], bool]:
        ranked = self.top_k is not None
        layout = Layout(batch)
        output, taps = self.capture.forward(
            batch, start_graph=ranked, dtype=self.dtype, layout=layout
        )
        acts = single_call(taps)
        run = _Runs(self, batch, output, target, layout)
        grads: list[Tensor | None] = [None] * len(acts)
        if ranked:
            grads = list(layer_gradients(run.graph_scores, acts, self.capture.names))
        maps = {}
        for (name, module), raw, grad in zip(self.capture.layers, acts, grads, strict=True):
            if len(taps[name]) > 1:
                raise LayerOutputError(
                    f"layer {name!r} runs {len(taps[name])} times in one forward pass; "
                    f"{type(self).__name__} needs a layer that runs once"
                )
            raw = raw.detach()
            grid = self._as_grid(raw.unsqueeze(1)).squeeze(1)
            kept = self.kept(grid, None if grad is None else self._as_grid(grad))
            maps[name] = self.perturbed_map(run, name, module, raw, grid, kept)
        return maps, run.several

    def kept(self, grid: Tensor, grad: Tensor | None) -> Tensor:
        """``(B, C)`` bool: the channels to evaluate: all, or the ``top_k`` of largest
        ``|sum_ij g_cij A_cij|`` (summed over the K targets), the first-order estimate of the
        score change when channel ``c`` is removed, from one backward pass."""
        if self.top_k is None or self.top_k >= grid.shape[1]:
            return torch.ones(grid.shape[:2], dtype=torch.bool, device=grid.device)
        importance = (grad * grid.unsqueeze(1)).sum(dim=(-2, -1)).abs().sum(dim=1)
        top = importance.topk(self.top_k, dim=1).indices
        return torch.zeros_like(importance, dtype=torch.bool).scatter_(1, top, True)


class _Runs:
    """The clean pass's target scores ``(B, K)`` and the scorer of later (perturbed) passes."""

    def __init__(
        self, cam: _PerturbationCAM, batch: Tensor, output: Any, target: Target, layout: Layout
    ):
        self.model, self.dtype, self.selector = cam.model, cam.dtype, cam.capture.output
        self.batch = batch
        self.layout = layout
        with torch.enable_grad():
            logits = select_output(output, self.selector)
            if callable(target):
                scores, self.several = target_scores(output, logits, target)
            else:
                classes, self.several = class_indices(target, logits)
                scores = logits.gather(1, classes)
        self.graph_scores = scores  # (B, K), with a graph to the layers when top_k ranks
        self.scores = scores.detach().float()
        if callable(target):
            self._rows: RowScorer = lambda out, rows: target_scores(
                out, select_output(out, self.selector), target
            )[0]
        else:
            self._rows = lambda out, rows: select_output(out, self.selector).gather(
                1, classes[rows]
            )

    def score(self, inputs: Tensor, rows: Tensor) -> Tensor:
        """Forward ``inputs`` (``n`` rows, whatever the hooks do) and score row ``i`` for the
        targets of sample ``rows[i]``: ``(n, K)`` float32. Callable targets must score each row
        of the output on its own: they are called on batches of perturbed copies."""
        return self.layout.run(lambda memory_format: self._score(inputs, rows, memory_format))

    def _score(self, inputs: Tensor, rows: Tensor, memory_format: torch.memory_format) -> Tensor:
        with torch.inference_mode(), autocast(inputs.device, self.dtype):
            output = self.model(inputs.contiguous(memory_format=memory_format))
            scores = self._rows(output, rows)
        if scores.shape[0] != rows.shape[0]:
            raise _BatchMismatch(f"{rows.shape[0]} perturbed rows gave {scores.shape[0]} scores")
        return scores.float()


class _BatchMismatch(Exception):
    """The model's output batch does not match the number of perturbed rows."""


class ScoreCAM(_PerturbationCAM):
    """Score-CAM: each channel weighs by the target score of the input masked by that channel.

    Wang et al., "Score-CAM: Score-Weighted Visual Explanations for Convolutional Neural
    Networks", CVPRW 2020, Algorithm 1. Per channel ``c`` of ``A (B, C, h, w)``: the mask
    ``H_c = minmax(upsample_bilinear(A_c)) (H, W)`` in [0, 1] (a constant map gives zeros), the
    score ``S_c = y(x * H_c)`` (the target logit), ``w = softmax_c(S)``, map
    ``= ReLU(sum_c w_c A_c)``; ``(B, C, H, W) -> (B, H, W)``, or ``(B, K, H, W)`` for K targets
    (the masked forwards are shared by all K targets).

    As in the paper's Algorithm 1, pytorch-grad-cam and torchcam, the softmax is over channels
    of the target *logits* (the paper's baseline term ``- y(X_b)`` cancels in the softmax). The
    authors' repository instead weighs by the softmax-over-classes probability of the target
    and skips constant channels; that is not what is computed here. Masks are upsampled
    (``align_corners=False``) before normalising, as in the paper (torchcam normalises first,
    pytorch-grad-cam upsamples with ``align_corners=True``).

    ``top_k`` evaluates only the ``k`` channels of largest ``|sum_ij g_cij A_cij|`` (softmax over
    those, the rest weigh 0): on EfficientNet-Lite0 ``bn2`` (1280 channels) ``top_k=64`` gave a
    mean correlation of 0.994 with the exact map in 5% of the time (docs/performance.md).
    """

    name = "scorecam"

    def perturbed_map(
        self, run: _Runs, name: str, module: nn.Module, raw: Tensor, grid: Tensor, kept: Tensor
    ) -> Tensor:
        batch, channels = grid.shape[:2]
        # masks are equal when the normalised maps are (constant maps all normalise to zeros):
        # one key per (sample, channel) is the sample index and the normalised map
        keys = minmax(grid).flatten(-2)
        sample = torch.arange(batch, device=grid.device, dtype=keys.dtype)
        keys = torch.cat([sample[:, None, None].expand(-1, channels, 1), keys], dim=-1)
        rows = kept.flatten().nonzero().squeeze(1)  # b * C + c
        unique, inverse = torch.unique(keys.flatten(0, 1)[rows], dim=0, return_inverse=True)
        first = torch.full((unique.shape[0],), rows.shape[0], device=grid.device)
        first.scatter_reduce_(0, inverse, torch.arange(rows.shape[0], device=grid.device), "amin")
        jobs = rows[first]
        progress = _Progress(f"Score-CAM {name}", jobs.shape[0], self.progress)
        scores = []
        for part in _chunks(jobs, self.batch_size):
            samples = part // channels
            scores.append(run.score(self._masked(run, grid, samples, part % channels), samples))
            progress.step(part.shape[0])
        per_row = torch.cat(scores)[inverse]  # (R, K)
        logits = per_row.new_full((batch * channels, per_row.shape[1]), float("-inf"))
        weights = logits.index_copy_(0, rows, per_row).unflatten(0, (batch, channels))
        return torch.einsum("bck,bchw->bkhw", weights.softmax(dim=1), grid)

    @staticmethod
    def _masked(run: _Runs, grid: Tensor, samples: Tensor, channels: Tensor) -> Tensor:
        """``x[samples[i]] * H`` with ``H = minmax(upsample(A[samples[i], channels[i]]))``:
        ``(n, C_in, H, W)`` in the runs' memory format (only these n masks exist at once)."""
        batch = run.batch
        masks = F.interpolate(
            grid[samples, channels].unsqueeze(1),
            size=tuple(batch.shape[-2:]),
            mode="bilinear",
            align_corners=False,
        )
        images = batch if batch.shape[0] == 1 else batch[samples]  # one image: broadcast
        shape = (samples.shape[0], *batch.shape[1:])
        out = torch.empty(
            shape, dtype=batch.dtype, device=batch.device, memory_format=run.layout.preferred
        )
        return torch.mul(images, minmax(masks), out=out)


class AblationCAM(_PerturbationCAM):
    """Ablation-CAM: each channel weighs by the relative drop of the score when it is zeroed.

    Desai & Ramaswamy, "Ablation-CAM: Visual Explanations for Deep Convolutional Network via
    Gradient-free Localization", WACV 2020: ``w_c = (y - y_c) / y`` with ``y`` the target score
    (logit) and ``y_c`` the score with channel ``c`` of the layer's output set to 0; map
    ``= ReLU(sum_c w_c A_c)``; ``(B, C, H, W) -> (B, H, W)`` or ``(B, K, H, W)``. A score of
    exactly 0 is not divided by (the weights are then ``y - y_c``).

    As in the paper, ablation is zeroing (pytorch-grad-cam does the same when the layer's
    minimum is 0, as after a ReLU; otherwise it sets ``min - 1e7``). All-zero channels weigh 0
    without a forward. ``top_k`` ablates only the ``k`` channels of largest
    ``|sum_ij g_cij A_cij|``, the first-order estimate of ``y - y_c`` (the rest weigh 0): on
    EfficientNet-Lite0 ``bn2`` ``top_k=64`` of 1280 gave a mean correlation of 0.996 with the
    exact map (docs/performance.md).

    Speed: the layer's prefix is computed once per sample: a hook replaces the layer's output
    by a batch of ablated copies of its captured output. A model whose later layers combine
    tensors from before the layer in a way that does not broadcast over that batch (a
    ``torch.cat`` skip connection, a reshape by the input's batch size) is detected (an error
    or an output of the wrong batch size) and the layer falls back to full forward passes of
    repeated inputs. Layers must run once per forward and ``reshape`` is not supported.
    """

    name = "ablationcam"
    reshape_refused = (
        "AblationCAM zeroes channels of the layer's own output (dim 1) and cannot "
        "undo reshape=; use ScoreCAM or a gradient CAM for token models"
    )

    def perturbed_map(
        self, run: _Runs, name: str, module: nn.Module, raw: Tensor, grid: Tensor, kept: Tensor
    ) -> Tensor:
        batch, channels = grid.shape[:2]
        kept = kept & (raw.flatten(2) != 0).any(dim=-1)
        drops = run.scores.new_zeros(batch, channels, run.scores.shape[1])  # y - y_c
        progress = _Progress(f"Ablation-CAM {name}", int(kept.sum()), self.progress)
        reuse_prefix = True
        for sample in range(batch):
            for part in _chunks(kept[sample].nonzero().squeeze(1), self.batch_size):
                if reuse_prefix:
                    try:
                        ablated = self._ablated_suffix(run, module, raw, sample, part)
                    except (RuntimeError, _BatchMismatch):
                        reuse_prefix = False
                if not reuse_prefix:
                    ablated = self._ablated_forward(run, module, sample, part)
                drops[sample, part] = run.scores[sample] - ablated
                progress.step(part.shape[0])
        scale = torch.where(run.scores == 0, torch.ones_like(run.scores), run.scores)
        return torch.einsum("bck,bchw->bkhw", drops / scale[:, None], grid)

    @staticmethod
    def _ablate(act: Tensor, channels: Tensor) -> Tensor:
        """Row ``i`` of ``act (n, C, ...)`` with channel ``channels[i]`` zeroed (a new tensor)."""
        act = act.clone()
        act[torch.arange(act.shape[0], device=act.device), channels] = 0
        return act

    def _ablated_suffix(
        self, run: _Runs, module: nn.Module, raw: Tensor, sample: int, channels: Tensor
    ) -> Tensor:
        """Scores with the layer's output replaced by ablated copies of its captured output."""
        copies = raw[sample].expand(channels.shape[0], *raw.shape[1:])

        def replace(mod: nn.Module, inputs: tuple, output: Tensor) -> Tensor:
            return self._ablate(copies, channels)

        rows = torch.full_like(channels, sample)
        with hooked(lambda: [module.register_forward_hook(replace)]):
            return run.score(run.batch[sample : sample + 1], rows)

    def _ablated_forward(
        self, run: _Runs, module: nn.Module, sample: int, channels: Tensor
    ) -> Tensor:
        """Scores of full forwards of repeated inputs, channel ``channels[i]`` zeroed in row i."""

        def zero(mod: nn.Module, inputs: tuple, output: Tensor) -> Tensor:
            return self._ablate(output, channels)

        rows = torch.full_like(channels, sample)
        image = run.batch[sample : sample + 1]
        inputs = image.expand(channels.shape[0], *image.shape[1:]).contiguous(
            memory_format=run.layout.preferred
        )
        with hooked(lambda: [module.register_forward_hook(zero)]):
            return run.score(inputs, rows)


__all__ = ["AblationCAM", "ScoreCAM"]

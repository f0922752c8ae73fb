"""Perturbation CAMs: channel weights measured with masked or ablated forward passes.

Score-CAM masks the input with each channel's activation map, Ablation-CAM zeroes each channel
of the layer's output; one forward per channel, in chunks of ``batch_size`` (results do not
depend on it); identical perturbations run once (equal normalised masks; an all-zero channel
weighs 0 in Ablation-CAM without one); ``top_channels=k`` evaluates the ``k`` channels of
largest ``|sum_ij g_cij A_cij|`` (agreement with the exact map in docs/performance.md).

A method is :meth:`PerturbationCAM.perturbed_scores` then :meth:`PerturbationCAM.score_weights`
(Score-CAM's variants change only :meth:`ScoreCAM.perturb`).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from camkit.core.call import Call, chunk_size, chunks
from camkit.core.copies import CopyScorer
from camkit.core.engine import layer_gradients, require_autograd
from camkit.core.finish import RESAMPLING, extremes, flat_between, minmax
from camkit.core.formats import MemoryFormat
from camkit.core.inputs import positive_int
from camkit.core.layers import LayerSpec, hooked, replacing_output, single_call
from camkit.core.layouts import Layout
from camkit.core.progress import progress_bar
from camkit.errors import LayerOutputError, TargetError
from camkit.methods.cam.base import BaseCAM, RawMaps
from camkit.registry import register
from camkit.targets.resolver import RowScorer


def score_masks(grid: Tensor, samples: Tensor, channels: Tensor, like: Tensor) -> Tensor:
    """``H = minmax(upsample(A[samples[i], channels[i]]))`` ``(n, 1, [D,] H, W)`` at ``like``'s
    size, normalised in place (no temporary of the masks' size)."""
    dims = grid.ndim - 2
    masks = F.interpolate(
        grid[samples, channels].unsqueeze(1),
        size=tuple(like.shape[-dims:]),
        mode=RESAMPLING[dims],
        align_corners=False,
    )
    low, high = extremes(masks, dims)
    is_flat = flat_between(low, high)  # the flat-map policy of core.finish.minmax
    span = high.sub_(low)
    return masks.sub_(low).div_(span.masked_fill_(is_flat, 1)).masked_fill_(is_flat, 0)


class MaskedBuffer:
    """One ``(rows, C_in, H, W)`` buffer of masked inputs ``x[samples[i]] * masks[i]``, in the
    runs' memory format, reused chunk after chunk."""

    def __init__(self, run: CopyScorer, rows: int):
        self.run, self.rows = run, rows
        self.buffer = self._allocate()

    def _allocate(self) -> Tensor:
        batch, self.format = self.run.batch, self.run.memory.preferred
        shape = (self.rows, *batch.shape[1:])
        return torch.empty(shape, dtype=batch.dtype, device=batch.device, memory_format=self.format)

    def masked(self, masks: Tensor, samples: Tensor) -> Tensor:
        """``x[samples[i]] * masks[i]`` in the buffer (overwritten by the next chunk)."""
        batch = self.run.batch
        if self.format != self.run.memory.preferred:  # the model refused channels_last
            self.buffer = self._allocate()
        images = batch if batch.shape[0] == 1 else batch[samples]  # one image: broadcast
        return torch.mul(images, masks.to(batch.dtype), out=self.buffer[: samples.shape[0]])


class PerturbationCAM(BaseCAM):
    """Base of the CAMs whose channel weights come from perturbed forward passes.

    Args (besides those of :class:`~camkit.methods.cam.base.BaseCAM`):
        batch_size: perturbed inputs per forward pass (default 32).
        top_channels: evaluate the ``top_channels`` channels of largest ``|sum_ij g_cij
            A_cij|`` per sample (others weigh 0); ``None``: all (exact).
        progress: show a progress bar of the forward passes (on a terminal).
    """

    family = "perturbation-cam"
    needs_gradients = False
    default_batch_size = 32
    perturbed_layouts: tuple[str, ...] = ("grid", "volume")  # what check_reader lets through
    takes_volumes = True  # layer maps (B, C, d, h, w) of a volume model

    def __init__(
        self,
        model: nn.Module,
        layer: LayerSpec | None = None,
        *,
        top_channels: int | None = None,
        progress: bool = False,
        **options: Any,
    ):
        super().__init__(model, layer, **options)
        self.top_channels = positive_int("top_channels", top_channels, optional=True)
        self.progress = progress

    @classmethod
    def clean_batch_first(cls) -> bool:
        return True  # the clean pass pins the top-1 classes before any copy is scored

    @classmethod
    def reads_frame_wise(cls) -> bool:
        """A frame-wise layer is read as a volume ``(B, C, T, h, w)`` (a channel's mask or
        ablation spans the clip's frames)."""
        return True

    def forward_rows(self, layer_shape: tuple[int, ...] | None = None) -> int:
        """One perturbed copy per evaluated channel of the layer (``top_channels`` at most)."""
        if layer_shape is None or len(layer_shape) < 3:
            return 1
        channels = layer_shape[-1] if len(layer_shape) == 3 else layer_shape[1]  # tokens: last
        return min(channels, self.top_channels) if self.top_channels else channels

    def perturbed_scores(
        self, run: CopyScorer, name: str, module: nn.Module, raw: Tensor, grid: Tensor, kept: Tensor
    ) -> Tensor:
        """``(B, C, K)`` target scores of one layer's perturbed passes (``kept``: the ``(B, C)``
        channels to evaluate)."""
        raise NotImplementedError

    def score_weights(self, scores: Tensor, run: CopyScorer, kept: Tensor) -> Tensor:
        """``(B, C, K)`` channel weights from the perturbed scores."""
        raise NotImplementedError

    def raw_maps(self, batch: Tensor, scorer: RowScorer, call: Call) -> RawMaps:
        ranked = self.top_channels is not None
        if ranked:
            require_autograd(type(self).__name__)
        memory = MemoryFormat(batch)
        output, taps = self.capture.forward(
            batch, call, start_graph=ranked, dtype=self.dtype, memory=memory
        )
        acts = single_call(taps)
        scorer = scorer.pinned(output)
        with torch.set_grad_enabled(ranked):
            scores = scorer(output, torch.arange(batch.shape[0]))
        run = CopyScorer(
            self.model, batch, scorer, call, dtype=self.dtype, scores=scores, memory=memory
        )
        grads = layer_gradients(scores, acts, self.capture.names) if ranked else [None] * len(acts)
        maps = {}
        for (name, module), raw, grad in zip(self.capture.layers, acts, grads, strict=True):
            raw = raw.detach()
            reader = self.grid_reader(
                name, raw.unsqueeze(1), tuple(batch.shape[2:]), batch.shape[0]
            )
            kind = getattr(reader, "kind", None)  # a layout it can perturb, or refused
            if self.reshape_refused and reader is not None and kind not in self.perturbed_layouts:
                raise LayerOutputError(
                    f"{self.reshape_refused} (layer {name!r} is read as {reader})"
                )
            grid = self.as_grid(raw.unsqueeze(1), reader).squeeze(1)
            if grid.ndim != 4 and not (self.takes_volumes or getattr(reader, "frames", 0)):
                raise LayerOutputError(
                    f"{type(self).__name__} needs a 2-D layer map (B, C, h, w), layer {name!r} "
                    f"gives {tuple(grid.shape)}; use a gradient CAM for volumes"
                )
            kept = self.kept(grid, None if grad is None else self.as_grid(grad, reader))
            maps[name] = self.perturbed_map(run, name, module, raw, grid, kept)
        return maps

    def perturbed_map(
        self, run: CopyScorer, name: str, module: nn.Module, raw: Tensor, grid: Tensor, kept: Tensor
    ) -> Tensor:
        """``(B, K, h, w)``: ``sum_c w_c A_c`` with :meth:`score_weights`."""
        perturbed = self.perturbed_scores(run, name, module, raw, grid, kept)
        weights = self.score_weights(perturbed, run, kept)
        if self.eigen_smooth:
            weights = weights.transpose(1, 2)  # (B, K, C)
            weights = weights.view(*weights.shape, *[1] * (grid.ndim - 2))
            return self.combine(weights * grid.unsqueeze(1))
        return torch.einsum("bck,bc...->bk...", weights, grid)

    def edited_scores(
        self,
        run: CopyScorer,
        module: nn.Module,
        raw: Tensor,
        sample: int,
        n: int,
        edit: Callable[[Tensor], Tensor],
        suffix: list[bool],
        frames: int = 1,
    ) -> Tensor:
        """``(n, K)`` scores of sample ``sample`` with the layer's output of ``n`` copies
        replaced by ``edit(output)``.

        The layer's prefix runs once (a hook swaps a one-image forward's output for ``edit`` of
        ``n`` copies of ``raw[sample]``); where the model's later layers do not broadcast over
        that batch (a ``torch.cat`` skip), ``suffix[0]`` turns False and full forwards of ``n``
        repeated inputs run from then on. A frame-wise layer: ``edit`` gets ``n * frames`` rows,
        row ``i * frames + t``."""
        rows = torch.full((n,), sample, dtype=torch.long, device=run.batch.device)
        image = run.batch[sample : sample + 1]
        if suffix[0]:
            own = raw[sample * frames : (sample + 1) * frames]
            copies = own.expand(n, *own.shape).flatten(0, 1)  # a view for one frame
            try:
                with hooked(lambda: [replacing_output(module, lambda *_: edit(copies))]):
                    return run.score(image, rows)
            except (RuntimeError, TargetError):
                suffix[0] = False
        inputs = image.expand(n, *image.shape[1:]).contiguous(memory_format=run.memory.preferred)
        with hooked(lambda: [replacing_output(module, lambda _, __, output: edit(output))]):
            return run.score(inputs, rows)

    def kept(self, grid: Tensor, grad: Tensor | None) -> Tensor:
        """``(B, C)`` bool: all channels, or the ``top_channels`` of largest ``|sum_ij g_cij
        A_cij|`` (summed over targets), the first-order estimate of removing channel ``c``."""
        if self.top_channels is None or self.top_channels >= grid.shape[1]:
            return torch.ones(grid.shape[:2], dtype=torch.bool, device=grid.device)
        importance = (grad * grid.unsqueeze(1)).flatten(3).sum(dim=-1).abs().sum(dim=1)
        top = importance.topk(self.top_channels, dim=1).indices
        return torch.zeros_like(importance, dtype=torch.bool).scatter_(1, top, True)

    def _progress(self, label: str, total: int):
        return progress_bar(total, label, "forward", enabled=self.progress)


@register("scorecam", "Wang et al., CVPR-W 2020")
class ScoreCAM(PerturbationCAM):
    """Score-CAM: each channel weighs by the target score of the input masked by that channel.

    Wang et al., "Score-CAM: Score-Weighted Visual Explanations for Convolutional Neural
    Networks", CVPRW 2020, Algorithm 1. Per channel ``c`` of ``A (B, C, h, w)``: the mask
    ``H_c = minmax(upsample_bilinear(A_c)) (H, W)`` (a constant map gives zeros), the score
    ``S_c = y(x * H_c)`` (the target logit), ``w = softmax_c(S)``, map ``= ReLU(sum_c w_c
    A_c)`` (the ``K`` targets share the forwards).

    As the paper, pytorch-grad-cam and torchcam: the softmax of the target *logits* (the
    baseline ``- y(X_b)`` cancels; the authors' repository uses probabilities and skips
    constant channels); masks upsampled (``align_corners=False``) before normalising, as the
    paper (torchcam normalises first, pytorch-grad-cam uses ``align_corners=True``).
    ``top_channels=k``: the softmax over those. Volumes: trilinear masks (pytorch-grad-cam's
    Score-CAM is 2-D only).
    """

    label = "Score-CAM"  # in the progress bar
    draws = 1  # masked inputs per mask (their scores are averaged): variants draw several

    def forward_rows(self, layer_shape: tuple[int, ...] | None = None) -> int:
        """One masked copy per evaluated channel, ``draws`` times (SS-CAM, IS-CAM)."""
        return super().forward_rows(layer_shape) * self.draws

    shares_masks = True  # whether channels with equal masks share their forwards

    def perturb(self, masks: Tensor, draw: Tensor, random: torch.Generator | None) -> Tensor:
        """The masks ``(n, 1, H, W)`` of draw ``draw[i]`` for row ``i`` (in place allowed),
        drawing from ``random`` in row order; Score-CAM's as they are."""
        return masks

    def generator(self, device: torch.device) -> torch.Generator | None:
        """A seeded generator for :meth:`perturb`, or None (Score-CAM draws nothing)."""
        return None

    def perturbed_scores(
        self, run: CopyScorer, name: str, module: nn.Module, raw: Tensor, grid: Tensor, kept: Tensor
    ) -> Tensor:
        """Mean over the ``draws`` of the scores of the masked inputs, per evaluated channel."""
        batch, channels = grid.shape[:2]
        rows = kept.flatten().nonzero().squeeze(1)  # b * C + c
        if self.shares_masks:
            # masks are equal when the normalised maps are (constant maps all normalise to
            # zeros): one key per (sample, channel) is the sample index and the normalised map
            keys = minmax(grid, grid.ndim - 2).flatten(2)
            sample = torch.arange(batch, device=grid.device, dtype=keys.dtype)
            keys = torch.cat([sample[:, None, None].expand(-1, channels, 1), keys], dim=-1)
            unique, inverse = torch.unique(keys.flatten(0, 1)[rows], dim=0, return_inverse=True)
            del keys
            order = torch.arange(rows.shape[0], device=grid.device)
            first = torch.full((unique.shape[0],), rows.shape[0], device=grid.device)
            jobs = rows[first.scatter_reduce_(0, inverse, order, "amin")]
        else:
            jobs, inverse = rows, torch.arange(rows.shape[0], device=grid.device)
        count = jobs.shape[0]
        # the long-lived tensors first, before the loop's transient ones (fewer heap holes)
        sums = run.scores.new_zeros((count, run.scores.shape[1]))
        buffer = MaskedBuffer(run, chunk_size(count * self.draws, self.batch_size))
        random = self.generator(run.batch.device)
        with self._progress(f"{self.label} {name}", count * self.draws) as bar:
            # draw by draw (a variant's random draws come in this order), jobs inside
            for part in chunks(count * self.draws, self.batch_size, grid.device):
                draw, job = part // count, part % count
                samples, chans = jobs[job] // channels, jobs[job] % channels
                masks = self.perturb(score_masks(grid, samples, chans, run.batch), draw, random)
                masked = buffer.masked(masks, samples)
                del masks  # not alive during the forward
                sums.index_add_(0, job, run.score(masked, samples))
                bar.update(part.shape[0])
        per_row = (sums / self.draws)[inverse]  # (R, K)
        table = per_row.new_zeros((batch * channels, per_row.shape[1]))
        return table.index_copy_(0, rows, per_row).unflatten(0, (batch, channels))

    def score_weights(self, scores: Tensor, run: CopyScorer, kept: Tensor) -> Tensor:
        """``softmax_c`` of the masked scores over the evaluated channels."""
        return scores.masked_fill(~kept.unsqueeze(-1), float("-inf")).softmax(dim=1)


@register("ablationcam", "Desai & Ramaswamy, WACV 2020")
class AblationCAM(PerturbationCAM):
    """Ablation-CAM: each channel weighs by the relative drop of the score when it is zeroed.

    Desai & Ramaswamy, "Ablation-CAM: Visual Explanations for Deep Convolutional Network via
    Gradient-free Localization", WACV 2020: ``w_c = (y - y_c) / y`` with ``y`` the target score
    (logit) and ``y_c`` the score with channel ``c`` of the layer's output set to 0 (``y - y_c``
    where ``y`` is exactly 0); map ``= ReLU(sum_c w_c A_c)``. Ablation is zeroing, as the paper
    (pytorch-grad-cam sets ``min - 1e7`` when the layer's minimum is not 0). ``top_channels=k``
    ablates the ``k`` channels of largest ``|sum_ij g_cij A_cij|``, the first-order estimate of
    ``y - y_c``. Token and channels-last layers (ViT, Swin) are ablated in their own layout, as
    pytorch-grad-cam's ``AblationLayerVit`` (the class token too); ``reshape=`` is refused.
    """

    reshape_refused = (
        "AblationCAM zeroes channels of the layer's own output and cannot undo a reshape= "
        'function; leave reshape="auto" (tokens and channels-last outputs are ablated in '
        "their own layout) or use ScoreCAM or a gradient CAM"
    )
    perturbed_layouts = ("grid", "volume", "tokens", "channels_last")

    def perturbed_scores(
        self, run: CopyScorer, name: str, module: nn.Module, raw: Tensor, grid: Tensor, kept: Tensor
    ) -> Tensor:
        batch, channels = grid.shape[:2]
        reader = self.layouts[name]
        axis = reader.channel_axis if isinstance(reader, Layout) else 1
        frames = max(getattr(reader, "frames", 0), 1)  # a frame-wise layer: B * frames rows
        live = (raw.movedim(axis, 1).flatten(2) != 0).any(dim=-1).unflatten(0, (batch, frames))
        kept = kept & live.any(dim=1)
        # channels not ablated keep the clean score: zeroing an all-zero channel changes nothing
        ablated = run.scores[:, None, :].repeat(1, channels, 1)  # y_c
        suffix = [True]  # reuse the layer's prefix until the model refuses
        with self._progress(f"Ablation-CAM {name}", int(kept.sum())) as bar:
            for sample in range(batch):
                evaluated = kept[sample].nonzero().squeeze(1)
                for rows in chunks(evaluated.shape[0], self.batch_size, evaluated.device):
                    part = evaluated[rows]
                    n = part.shape[0]
                    repeated = part.repeat_interleave(frames)  # the channel in each frame
                    ablate = partial(self._ablate, channels=repeated, axis=axis)
                    ablated[sample, part] = self.edited_scores(
                        run, module, raw, sample, n, ablate, suffix, frames
                    )
                    bar.update(n)
        return ablated

    def score_weights(self, scores: Tensor, run: CopyScorer, kept: Tensor) -> Tensor:
        """``(y - y_c) / y``, or ``y - y_c`` where ``y`` is exactly 0."""
        clean = run.scores[:, None, :]
        return (clean - scores) / torch.where(clean == 0, torch.ones_like(clean), clean)

    @staticmethod
    def _ablate(act: Tensor, channels: Tensor, axis: int = 1) -> Tensor:
        """A copy of ``act`` whose row ``i`` has channel ``channels[i]`` (on ``axis``) zeroed."""
        act = act.clone()
        act.movedim(axis, 1)[torch.arange(act.shape[0], device=act.device), channels] = 0
        return act

"""CAMs that draw random numbers, seeded, on the input's device: Smooth Grad-CAM++ and the
Random-CAM baseline. Their results do not depend on ``batch_size``."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from torch import Tensor, nn

from camkit.core.call import Call, chunks
from camkit.core.engine import over_rows
from camkit.core.layers import LayerSpec, single_call
from camkit.core.seeds import call_seed, generator
from camkit.methods.cam.base import BaseCAM, NoisyDraws, RawMaps, spatial
from camkit.registry import register
from camkit.targets.resolver import RowScorer


@register("smoothgradcam++", "Omeiza et al., 2019")
class SmoothGradCAMPlusPlus(NoisyDraws, BaseCAM):
    """Smooth Grad-CAM++: Grad-CAM++ with gradients averaged over noisy copies of the input.

    Omeiza et al., "Smooth Grad-CAM++: An Enhanced Inference Level Visualization Technique for
    Deep Convolutional Neural Network Models", 2019 (torchcam's ``SmoothGradCAMpp``): with the
    layer gradients ``g_m`` of copies ``x + N(0, std^2)``, ``D_p = mean_m g_m^p``, ``alpha = D2 /
    (2 D2 + (sum_ab A_ab) D3)`` (0 where the denominator is), ``w_c = sum_ij alpha_cij
    ReLU(D1_cij)``, map ``= sum_c w_c A_c`` (clean activations, clean top-1 class).

    Args (besides those of :class:`~camkit.methods.cam.base.BaseCAM`):
        samples: noisy copies per image.
        std: standard deviation of the Gaussian noise, in input units.
        seed: seeds the noise: copy ``m`` of the batch is the ``m``-th ``(B, C, H, W)`` standard
            normal draw, as torchcam's from the global generator (None: a seed from it).
        batch_size: rows (clean or noisy) per forward pass.
    """

    default_samples, default_std = 4, 0.3

    def forward_rows(self, layer_shape: tuple[int, ...] | None = None) -> int:
        return self.samples

    def raw_maps(self, batch: Tensor, scorer: RowScorer, call: Call) -> RawMaps:
        size, input_size = batch.shape[0], tuple(batch.shape[2:])

        def clean(part: Tensor, rows: Tensor) -> dict[str, Any]:
            output, taps = self.capture.forward(
                part, call, start_graph=False, dtype=self.dtype, rows=rows
            )
            found = {"acts": dict(zip(self.capture.names, single_call(taps), strict=True))}
            if scorer.has_classes:
                found["classes"] = scorer.classes_of(output, rows)
            return found

        first = over_rows(batch, self.batch_size, clean)
        if scorer.top1:  # explain the clean prediction in every noisy copy
            scorer = replace(scorer, classes=first["classes"])
        noise = _Noise(batch.shape, generator(batch.device).manual_seed(call_seed(self.seed)))
        total = self.samples * size
        moments: dict[str, Tensor] = {}  # per layer: sums of g, g^2, g^3, (3, B, K, C, h, w)
        for index in chunks(total, self.batch_size):
            copy, rows = index // size, index % size
            inputs = batch[rows] + self.std * noise.rows(copy, rows).to(batch)
            _, grads, _ = self.capture.run(
                inputs, call, scorer, rows, gradients=True, dtype=self.dtype
            )
            for name, grad in zip(self.capture.names, grads, strict=True):
                grad = grad.float()
                sums = torch.stack([grad, grad**2, grad**3])
                if name not in moments:
                    moments[name] = sums.new_zeros(3, size, *sums.shape[2:])
                moments[name].index_add_(1, rows.to(sums.device), sums)
        maps = {}
        for name, act in first["acts"].items():
            reader = self.grid_reader(name, act.unsqueeze(1), input_size)
            act = self.as_grid(act.unsqueeze(1), reader)
            d1, d2, d3 = (self.as_grid(d / self.samples, reader) for d in moments[name])
            denominator = 2 * d2 + act.sum(dim=spatial(act), keepdim=True) * d3
            safe = torch.where(denominator != 0, denominator, torch.ones_like(denominator))
            alpha = torch.where(denominator != 0, d2 / safe, torch.zeros_like(d2))
            weights = (alpha * d1.relu()).sum(dim=spatial(d1), keepdim=True)
            maps[name] = self.combine(weights * act)
        return maps


class _Noise:
    """Standard normal ``(B, C, H, W)`` per copy, drawn in copy order whatever the chunks."""

    def __init__(self, shape: torch.Size, random: torch.Generator):
        self.shape, self.random = shape, random
        self.drawn: dict[int, Tensor] = {}
        self.next = 0

    def rows(self, copy: Tensor, rows: Tensor) -> Tensor:
        first, last = int(copy[0]), int(copy[-1])
        while self.next <= last:
            self.drawn[self.next] = torch.randn(
                self.shape, generator=self.random, device=self.random.device
            )
            self.next += 1
        self.drawn = {m: noise for m, noise in self.drawn.items() if m >= first}
        return torch.stack([self.drawn[int(m)][int(r)] for m, r in zip(copy, rows, strict=True)])


@register("random", "pytorch-grad-cam's random baseline")
class RandomCAM(BaseCAM):
    """Random-CAM: channels weighted by seeded uniform random weights, a baseline for metrics.

    As pytorch-grad-cam's ``RandomCAM``: ``w_c ~ U(-1, 1)`` drawn for every sample and target,
    map ``= sum_c w_c A_c``: the layer's spatial structure, no relation to the target. The same
    ``seed`` gives the same weights (one ``(B, K, C)`` draw per layer); ``(B, K)`` targets give
    ``K`` independent maps (unlike every other method, not the map of that class alone).
    """

    seeded = True
    needs_gradients = False
    target_free = True

    def __init__(
        self, model: nn.Module, layer: LayerSpec | None = None, *, seed: int = 0, **options: Any
    ):
        super().__init__(model, layer, seed=seed, **options)

    def raw_maps(self, batch: Tensor, scorer: RowScorer, call: Call) -> RawMaps:
        random = generator(batch.device).manual_seed(self.seed)
        drawn: dict[str, Tensor] = {}  # (B, K, C) per layer, drawn at the first chunk

        def one_pass(part: Tensor, rows: Tensor) -> dict[str, Tensor]:
            acts, _, scores = self.capture.run(
                part, call, scorer, rows, gradients=False, dtype=self.dtype
            )
            maps = {}
            for name, act in zip(self.capture.names, acts, strict=True):
                act = self.as_grid(act, self.grid_reader(name, act, tuple(part.shape[2:])))
                if name not in drawn:
                    shape = (batch.shape[0], scores.shape[1], act.shape[2])
                    uniform = torch.rand(shape, generator=random, device=random.device)
                    drawn[name] = (uniform * 2 - 1).to(act.device)
                weights = drawn[name][rows.to(act.device)]
                weights = weights.view(*weights.shape, *[1] * (act.ndim - 3))
                maps[name] = self.combine(weights * act)
            return maps

        return over_rows(batch, self.batch_size, one_pass)


__all__ = ["RandomCAM", "SmoothGradCAMPlusPlus"]

"""Score-CAM's variants (SS-CAM, IS-CAM), which change only the masks of each channel
(:meth:`ScoreCAM.perturb`, several draws per mask whose scores are averaged), and Recipro-CAM,
which masks the layer's feature map around each position and runs only the network after it.
"""

from __future__ import annotations

import copy
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from camkit.core.call import chunks
from camkit.core.copies import CopyScorer
from camkit.core.inputs import positive_int
from camkit.core.layers import LayerSpec
from camkit.core.seeds import call_seed, generator
from camkit.errors import ArgumentError, LayerOutputError
from camkit.methods.cam.base import NoisyDraws
from camkit.methods.cam.perturbation import PerturbationCAM, ScoreCAM
from camkit.registry import register


@register("sscam", "Wang et al., 2020")
class SSCAM(NoisyDraws, ScoreCAM):
    """SS-CAM: Score-CAM with each channel's score averaged over noisy masks.

    Wang et al., "SS-CAM: Smoothed Score-CAM for Sharper Visual Feature Localization", 2020
    (arXiv:2006.14255), noise on the masks, as torchcam 0.5's ``SSCAM``: with Score-CAM's mask
    ``H_c``, ``w = softmax_c(mean_m y(x * (H_c + d_mc)))``, ``d_mc ~ N(0, std^2)`` of size
    ``(H, W)`` (shared by the input's channels), map ``= ReLU(sum_c w_c A_c)``; ``samples * C``
    forwards per sample.

    Args (besides those of :class:`~camkit.methods.cam.perturbation.PerturbationCAM`):
        samples: noisy masks per channel (torchcam's ``num_samples``).
        std: standard deviation of the noise added to the [0, 1] masks (torchcam's default).
        seed: seeds the noise (None: from torch's global generator). Row ``(m, b, c)`` (draw,
            sample, channel) gets one ``(H, W)`` standard normal draw, in that order, as
            torchcam's per ``m``: on the CPU, for float32 inputs with ``H * W`` a multiple of
            16, ``seed=s`` gives torchcam's noise after ``torch.manual_seed(s)``.
    """

    label = "SS-CAM"
    shares_masks = False
    default_samples, default_std = 35, 2.0

    @property
    def draws(self) -> int:
        return self.samples

    def generator(self, device: torch.device) -> torch.Generator:
        return generator(device).manual_seed(call_seed(self.seed))

    def perturb(self, masks: Tensor, draw: Tensor, random: torch.Generator | None) -> Tensor:
        """``H + std * z``, one ``(H, W)`` standard normal ``z`` per row, in row order."""
        for row in masks:
            noise = torch.randn(row.shape, generator=random, device=random.device)
            row.add_(noise.mul_(self.std).to(row.device))
        return masks


@register("iscam", "Naidu et al., 2020")
class ISCAM(ScoreCAM):
    """IS-CAM: Score-CAM with each channel's score integrated over scaled masks.

    Naidu et al., "IS-CAM: Integrated Score-CAM for axiomatic-based explanations", 2020
    (arXiv:2010.03023), as torchcam 0.5's ``ISCAM``: with Score-CAM's mask ``H_c``, ``w =
    softmax_c(mean_i y(x * s_i H_c))`` with torchcam's cumulative scales ``s_i = i (i + 1) /
    (2N)``, ``i = 1..N = samples``, map ``= ReLU(sum_c w_c A_c)``.

    Args (besides those of :class:`~camkit.methods.cam.perturbation.PerturbationCAM`):
        samples: scaled masks per channel (torchcam's ``num_samples``).
    """

    label = "IS-CAM"

    def __init__(
        self, model: nn.Module, layer: LayerSpec | None = None, *, samples: int = 10, **options: Any
    ):
        super().__init__(model, layer, **options)
        self.samples = self.draws = positive_int("samples", samples)

    def perturb(self, masks: Tensor, draw: Tensor, random: torch.Generator | None) -> Tensor:
        """``s_i H`` with ``s_i = (i + 1)(i + 2) / (2N)`` for the 0-based draw ``i``."""
        scale = (draw + 1) * (draw + 2) / (2 * self.samples)
        return masks.mul_(scale.to(masks).view(-1, *[1] * (masks.ndim - 1)))


GAUSSIAN = ((1 / 16, 1 / 8, 1 / 16), (1 / 8, 1 / 4, 1 / 8), (1 / 16, 1 / 8, 1 / 16))


@register("reciprocam", "Byun & Lee, 2022")
class ReciproCAM(PerturbationCAM):
    """Recipro-CAM: the map at each position is the target's probability when the layer's
    feature map is kept only around that position.

    Byun & Lee, "Recipro-CAM: Fast gradient-free visual explanations for convolutional neural
    networks", 2022 (arXiv:2209.14074). For each position ``(i, j)`` of the layer's output ``A``,
    ``A * M_ij`` runs through the network after the layer, ``M_ij`` the 3x3 Gaussian
    :data:`GAUSSIAN` at ``(i, j)`` (``kernel="gaussian"``, the authors' code) or the one-hot
    position (``kernel="point"``, the paper's, OpenVINO's); map ``(i, j) = softmax(logits)[target]``
    (a callable target's score as it is). ``h * w`` suffix forwards per sample
    (:meth:`~camkit.methods.cam.perturbation.PerturbationCAM.edited_scores`); no ``reshape``.
    A frame-wise layer: positions ``(t, i, j)``, zero in the other frames, a map ``(B, T, H, W)``.

    Args (besides ``batch_size``, ``progress``, ``output``, ``dtype``):
        kernel: ``"gaussian"`` or ``"point"``, the spatial mask.
    """

    reshape_refused = (
        "ReciproCAM masks the layer's own output (dims -2, -1) and cannot undo reshape=; "
        "use ScoreCAM or a gradient CAM for token models"
    )
    kernels = ("gaussian", "point")
    takes_volumes = False
    eigen_refused = "its map is a probability per position, not a weighted sum of channels"

    def __init__(
        self,
        model: nn.Module,
        layer: LayerSpec | None = None,
        *,
        kernel: str = "gaussian",
        **options: Any,
    ):
        super().__init__(model, layer, **options)
        if kernel not in self.kernels:
            raise ArgumentError(f"kernel must be one of {self.kernels}, got {kernel!r}")
        self.kernel = kernel

    def forward_rows(self, layer_shape: tuple[int, ...] | None = None) -> int:
        """One copy per position (and frame: ``layer_shape[0]`` of a one-sample trace)."""
        if layer_shape is None or len(layer_shape) != 4:
            return 1
        return layer_shape[0] * layer_shape[-1] * layer_shape[-2]

    def masks(
        self, positions: Tensor, frames: int, size: tuple[int, int], device: torch.device
    ) -> Tensor:
        """``(n * frames, 1, h, w)`` masks of flat positions ``t h w + i w + j``: the kernel at
        ``(i, j)`` in frame ``t``, zero in other frames."""
        (h, w), n = size, positions.shape[0]
        masks = torch.zeros((n, 1, h * w), device=device)
        masks[torch.arange(n), 0, (positions % (h * w)).to(device)] = 1
        masks = masks.view(-1, 1, h, w)
        if self.kernel == "gaussian":
            gaussian = torch.tensor(GAUSSIAN, device=device).view(1, 1, 3, 3)
            masks = F.conv2d(masks, gaussian, padding=1)
        if frames == 1:
            return masks
        in_frame = F.one_hot(positions.to(device) // (h * w), frames).to(masks)
        return (in_frame[:, :, None, None, None] * masks[:, None]).flatten(0, 1)

    def perturbed_map(
        self, run: CopyScorer, name: str, module: nn.Module, raw: Tensor, grid: Tensor, kept: Tensor
    ) -> Tensor:
        batch, (h, w) = grid.shape[0], grid.shape[-2:]
        frames = max(getattr(self.layouts[name], "frames", 0), 1)  # a frame-wise layer's T
        if raw.ndim != 4:
            raise LayerOutputError(
                f"ReciproCAM needs a (B, C, h, w) layer output, {name!r} gives {tuple(raw.shape)}"
            )
        if run.scorer.has_classes:  # class targets: their softmax probability
            run = copy.copy(run)
            run.probabilities = True
        maps, suffix = [], [True]  # suffix: reuse the layer's prefix until the model refuses
        positions = frames * h * w
        with self._progress(f"Recipro-CAM {name}", batch * positions) as bar:
            for sample in range(batch):
                scores = []
                for part in chunks(positions, self.batch_size):
                    masks = self.masks(part, frames, (h, w), raw.device).to(raw.dtype)
                    masked = partial(torch.mul, other=masks)
                    n = part.shape[0]
                    scores.append(
                        self.edited_scores(run, module, raw, sample, n, masked, suffix, frames)
                    )
                    bar.update(n)
                grid_shape = (frames, h, w) if frames > 1 else (h, w)
                maps.append(torch.cat(scores).T.unflatten(1, grid_shape))  # (K, [T,] h, w)
        return torch.stack(maps).float()


__all__ = ["ISCAM", "SSCAM", "ReciproCAM"]

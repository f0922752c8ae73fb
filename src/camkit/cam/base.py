"""The CAM pipeline shared by every method: capture, scores, gradients, weighted sum, finishing.

A method only says how it weighs a layer's activations ``A`` and their gradients ``dS/dA``
(:meth:`CAM.channel_weights`, or :meth:`CAM.layer_map` for maps that are not a weighted sum);
this base does the forward pass, the batched vector-Jacobian products, the ReLU, the bilinear
upsampling and the per-map min-max normalisation.

Shapes inside the pipeline: activations ``(B, 1, C, h, w)`` and gradients ``(B, K, C, h, w)``
for ``K`` targets per sample, so methods broadcast over the target axis.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from camkit.capture import LayerOutputError, LayerSpec, capture_outputs, find_layers, single_call
from camkit.inputs import Layout, as_batch
from camkit.targets import OutputSelector, Target, select_output, target_scores

Reshape = Callable[[Tensor], Tensor]


def autocast(device: torch.device, dtype: torch.dtype | None):
    """``torch.autocast`` on ``device`` when a dtype is asked for, else nothing."""
    return nullcontext() if dtype is None else torch.autocast(device.type, dtype=dtype)


def layer_gradients(scores: Tensor, acts: list[Tensor], names: list[str]) -> list[Tensor]:
    """``d scores / d acts`` for ``scores (B, K)``: one ``(B, K, *act.shape[1:])`` per layer.

    Samples are independent, so the batch is summed; the ``K`` targets are one batched
    vector-Jacobian product (``is_grads_batched``), not ``K`` backward passes.
    """
    if not scores.requires_grad:
        raise LayerOutputError(
            f"the target score does not depend on layer(s) {names}: their output does not "
            "reach the model's output"
        )
    k = scores.shape[1]
    if k == 1:
        with torch.enable_grad():
            grads = torch.autograd.grad(scores.sum(), acts, allow_unused=True)
    else:
        one_hot = torch.eye(k, dtype=scores.dtype, device=scores.device)
        grad_outputs = one_hot[:, None, :].expand(k, *scores.shape)
        grads = torch.autograd.grad(
            scores, acts, grad_outputs=grad_outputs, is_grads_batched=True, allow_unused=True
        )
    unused = [name for name, grad in zip(names, grads, strict=True) if grad is None]
    if unused:
        raise LayerOutputError(f"the target score does not depend on layer(s) {unused}")
    return [grad.unsqueeze(1) if k == 1 else grad.transpose(0, 1) for grad in grads]


def minmax(maps: Tensor) -> Tensor:
    """Min-max normalise each map over its last two dims to [0, 1]; a constant map gives zeros."""
    low = maps.amin(dim=(-2, -1), keepdim=True)
    high = maps.amax(dim=(-2, -1), keepdim=True)
    span = high - low
    flat = span <= 1e-6 * torch.maximum(low.abs(), high.abs())
    return torch.where(flat, torch.zeros_like(maps), (maps - low) / span.masked_fill(flat, 1))


def finish(
    maps: dict[str, Tensor],
    size: tuple[int, int],
    *,
    relu: bool,
    upsample: bool,
    normalize: bool,
    fuse: bool,
    single: bool,
    several: bool,
) -> Tensor | dict[str, Tensor]:
    """ReLU, upsample to ``size`` and normalise ``(B, K, h, w)`` maps; fuse layers; squeeze.

    Several layers are fused by the mean of their (finished) maps, normalised again; with
    ``fuse=False`` a dict ``{layer: map}`` comes back.
    """
    finished = {}
    for name, cam in maps.items():
        cam = cam.float()
        if relu:
            cam = cam.relu()
        if upsample:
            cam = F.interpolate(cam, size=size, mode="bilinear", align_corners=False)
        if normalize:
            cam = minmax(cam)
        finished[name] = cam
    if fuse and len(finished) > 1:
        if len({tuple(cam.shape) for cam in finished.values()}) > 1:
            raise ValueError(
                "layers of different resolutions can only be fused with upsample=True; "
                "pass fuse=False to get one map per layer"
            )
        fused = torch.stack(list(finished.values())).mean(0)
        finished = {"fused": minmax(fused) if normalize else fused}

    if fuse:
        return drop_axes(next(iter(finished.values())), single, several)
    return {name: drop_axes(cam, single, several) for name, cam in finished.items()}


def drop_axes(t: Tensor, single: bool, several: bool) -> Tensor:
    """Drop the target axis (1) unless K targets were asked, and the batch axis (0) for one
    image; the result is detached."""
    t = t if several else t.squeeze(1)
    return (t.squeeze(0) if single else t).detach()


class Capture:
    """One forward pass with the target layers tapped, and the gradients a method needs."""

    def __init__(self, model: nn.Module, layer: LayerSpec, output: OutputSelector = None):
        self.model = model
        self.layers = find_layers(model, layer)
        self.output = output

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.layers]

    def forward(
        self,
        batch: Tensor,
        *,
        start_graph: bool,
        dtype: torch.dtype | None = None,
        layout: Layout | None = None,
    ) -> tuple[Any, dict[str, list[Tensor]]]:
        """One forward pass with the layers tapped: ``(model output, {layer: outputs})``.

        Runs under ``torch.no_grad()`` (see :func:`~camkit.capture.capture_outputs` for
        ``start_graph``); the model sees the batch in the :class:`~camkit.inputs.Layout`'s
        memory format (channels_last on the CPU: a copy, the caller's tensor is not converted);
        pass ``layout`` to share what it learns with later forwards.
        """

        def attempt(memory_format: torch.memory_format) -> tuple[Any, dict[str, list[Tensor]]]:
            with (
                torch.no_grad(),
                autocast(batch.device, dtype),
                capture_outputs(self.model, self.layers, start_graph=start_graph) as taps,
            ):
                return self.model(batch.contiguous(memory_format=memory_format)), taps

        return (layout or Layout(batch)).run(attempt)

    def run(
        self, batch: Tensor, target: Target, *, gradients: bool, dtype: torch.dtype | None = None
    ) -> tuple[list[Tensor], list[Tensor] | None, bool]:
        """Return ``(activations (B, 1, C, h, w), gradients (B, K, C, h, w) or None, several)``."""
        output, taps = self.forward(batch, start_graph=gradients, dtype=dtype)
        acts = single_call(taps)
        if not gradients:
            return [act.unsqueeze(1) for act in acts], None, False
        with torch.enable_grad():
            logits = select_output(output, self.output)
            scores, several = target_scores(output, logits, target)
        grads = layer_gradients(scores, acts, self.names)
        return [act.detach().unsqueeze(1) for act in acts], grads, several


class CAM:
    """Base class of the class-activation-map methods.

    ``CAM(model, layer)(x, target)`` maps an image ``(C, H, W) -> (H, W)``, a batch
    ``(B, C, H, W) -> (B, H, W)``, or ``K`` targets per sample ``-> (B, K, H, W)``.

    Args:
        model: any ``nn.Module``; it is never modified (no mode switch, no lasting hooks).
        layer: dotted name as in ``model.named_modules()``, a submodule, or a list of either.
        output: picks the logits from a tuple/dict/object output (key, index or callable).
        reshape: turns a layer's output into ``(B, C, h, w)``, e.g. ViT tokens to a grid.
        dtype: run the forward under ``torch.autocast`` in this dtype; maps stay float32.
    """

    name: ClassVar[str]
    needs_gradients: ClassVar[bool] = True

    def __init__(
        self,
        model: nn.Module,
        layer: LayerSpec,
        *,
        output: OutputSelector = None,
        reshape: Reshape | None = None,
        dtype: torch.dtype | None = None,
    ):
        self.model = model
        self.capture = Capture(model, layer, output)
        self.reshape = reshape
        self.dtype = dtype

    def channel_weights(self, act: Tensor, grad: Tensor) -> Tensor:
        """Weights broadcastable to ``act (B, K, C, h, w)``: ``(B, K, C, 1, 1)`` or element-wise."""
        raise NotImplementedError

    def layer_map(self, act: Tensor, grad: Tensor | None) -> Tensor:
        """``(B, 1, C, h, w), (B, K, C, h, w) -> (B, K, h, w)``: the weighted sum over channels."""
        return (self.channel_weights(act, grad) * act).sum(dim=-3)

    def raw_maps(self, batch: Tensor, target: Target) -> tuple[dict[str, Tensor], bool]:
        """The unfinished maps ``{layer: (B, K, h, w)}``, and whether K targets were asked."""
        acts, grads, several = self.capture.run(
            batch, target, gradients=self.needs_gradients, dtype=self.dtype
        )
        return self.maps_from(acts, grads), several

    def maps_from(self, acts: list[Tensor], grads: list[Tensor] | None) -> dict[str, Tensor]:
        """Apply :meth:`layer_map` to captured activations and gradients, layer by layer."""
        grads = grads if grads is not None else [None] * len(acts)
        maps = {}
        for name, act, grad in zip(self.capture.names, acts, grads, strict=True):
            act, grad = self._as_grid(act), None if grad is None else self._as_grid(grad)
            maps[name] = self.layer_map(act, grad)
        return maps

    def _as_grid(self, t: Tensor) -> Tensor:
        lead = t.shape[:2]
        t = t.flatten(0, 1).float()
        if self.reshape is not None:
            t = self.reshape(t)
        if t.ndim != 4:
            raise LayerOutputError(
                f"CAM needs layer outputs of shape (B, C, h, w), got {tuple(t.shape)}; "
                "pass reshape= a function that turns them into a (B, C, h, w) grid"
            )
        return t.unflatten(0, lead)

    def __call__(
        self,
        x: Tensor,
        target: Target = None,
        *,
        relu: bool = True,
        upsample: bool = True,
        normalize: bool = True,
        fuse: bool = True,
    ) -> Tensor | dict[str, Tensor]:
        """Map ``x`` for ``target`` (see :mod:`camkit.targets`); a float32 tensor on x's device.

        ``relu``, ``upsample`` (bilinear, to x's H, W) and ``normalize`` (min-max per map to
        [0, 1]) can be switched off for the raw map; ``fuse=False`` returns ``{layer: map}``.
        """
        batch, single = as_batch(x, self.model)
        maps, several = self.raw_maps(batch, target)
        return finish(
            maps,
            tuple(batch.shape[-2:]),
            relu=relu,
            upsample=upsample,
            normalize=normalize,
            fuse=fuse,
            single=single,
            several=several,
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(layers={self.capture.names})"

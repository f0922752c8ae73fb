"""The base of every class activation map: a method only says how it weighs a layer.

A gradient CAM implements :meth:`BaseCAM.channel_weights` (or :meth:`BaseCAM.layer_map` for maps
that are not a weighted sum of channels); the engine (:mod:`camkit.core`) does the tapped
forward, the target scores, the batched gradients and the finishing.

Shapes inside: activations ``(B, 1, C, h, w)`` and gradients ``(B, K, C, h, w)`` for ``K``
targets per sample, so methods broadcast over the target axis.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from camkit.core.engine import Capture, over_rows, require_autograd
from camkit.core.engine import additional_forward_args as extra_args
from camkit.core.finish import Finishing, drop_axes
from camkit.core.inputs import as_batch, positive_int
from camkit.core.layers import LayerSpec
from camkit.core.layouts import check_reshape, resolve_reshape
from camkit.core.targets import OutputSelector, RowScorer, Target, resolve
from camkit.errors import ArgumentError, LayerOutputError

Reshape = Callable[[Tensor], Tensor]


class BaseCAM:
    """Base class of the class-activation-map methods.

    ``Method(model, layer)(x, target)`` maps an image ``(C, H, W) -> (H, W)``, a batch
    ``(B, C, H, W) -> (B, H, W)``, or ``K`` targets per sample ``-> (B, K, H, W)``.

    Args:
        model: any ``nn.Module``; it is never modified (no mode switch, no lasting hooks).
        layer: dotted name as in ``model.named_modules()``, a submodule, or a list of either.
        output: picks the logits from a tuple/dict/object output (key, index or callable).
        reshape: how a layer's output becomes a ``(B, C, h, w)`` grid: ``"auto"`` (default)
            reads ViT tokens (prefix tokens dropped) and channels-last outputs (Swin,
            ConvNeXt) by :func:`camkit.core.layouts.infer_layout` and raises rather than guess;
            the reading of the last call is in ``cam.layouts``; a callable overrides it; None
            uses the output as it is.
        dtype: run the forward under ``torch.autocast`` in this dtype; maps stay float32.
        batch_size: rows per forward pass: the input batch is cut in chunks of this many
            samples (None: all at once). Results do not depend on it.
    """

    name: ClassVar[str]
    family: ClassVar[str] = "gradient-cam"
    needs_layer: ClassVar[bool] = True
    needs_gradients: ClassVar[bool] = True
    needs_target: ClassVar[bool] = True  # False: the map does not depend on the target
    reshape_refused: ClassVar[str | None] = None  # why a method cannot take reshape=, if so

    def __init__(
        self,
        model: nn.Module,
        layer: LayerSpec,
        *,
        output: OutputSelector = None,
        reshape: Reshape | str | None = "auto",
        dtype: torch.dtype | None = None,
        batch_size: int | None = None,
    ):
        check_reshape(reshape)
        if callable(reshape) and self.reshape_refused:
            raise ArgumentError(self.reshape_refused)
        self.capture = Capture(model, layer, output)
        self.model = self.capture.model  # the eager, unwrapped module
        self.reshape = reshape
        self.layouts: dict[str, Reshape | None] = {}  # how each layer was read at the last call
        self.dtype = dtype
        self.batch_size = positive_int("batch_size", batch_size, optional=True)

    # ------------------------------------------------------------------ what a method says

    def channel_weights(self, act: Tensor, grad: Tensor) -> Tensor:
        """Weights broadcastable to ``act (B, K, C, h, w)``: ``(B, K, C, 1, 1)`` or element-wise."""
        raise NotImplementedError

    def layer_map(self, act: Tensor, grad: Tensor | None) -> Tensor:
        """``(B, 1, C, h, w), (B, K, C, h, w) -> (B, K, h, w)``: the weighted sum over channels
        (volumes likewise, ``d, h, w``)."""
        return (self.channel_weights(act, grad) * act).sum(dim=2)

    # ------------------------------------------------------------------ the pipeline

    def __call__(
        self,
        x: Tensor,
        target: Target = None,
        *,
        relu: bool = True,
        upsample: bool = True,
        normalize: bool = True,
        fuse: bool = True,
        additional_forward_args: Any = None,
    ) -> Tensor | dict[str, Tensor]:
        """Map ``x`` for ``target`` (see :mod:`camkit.core.targets`); float32 on x's device.

        ``relu``, ``upsample`` (to x's size) and ``normalize`` (min-max per map to [0, 1]) can
        be switched off for the raw map; ``fuse=False`` returns ``{layer: map}``.
        ``additional_forward_args``: more inputs of a model called as ``model(x, *args)``
        (per-sample tensors follow their samples, see
        :func:`~camkit.core.engine.additional_forward_args`).
        """
        batch, single = as_batch(x, self.model)
        finishing = Finishing(relu, upsample, normalize, fuse)
        with extra_args(additional_forward_args, batch.shape[0]):
            maps, several = self.maps(batch, target, finishing)
        return drop_axes(maps, single, several)

    def maps(
        self, batch: Tensor, target: Target = None, finishing: Finishing | None = None
    ) -> tuple[Tensor | dict[str, Tensor], bool]:
        """``(B, C, H, W) ->`` finished maps ``(B, K, H, W)`` (or ``{layer: map}``), with the
        target axis always kept, and whether ``K`` targets per sample were asked. ``finishing``
        defaults to ReLU, upsampling, normalisation and fusing."""
        finishing = finishing or Finishing()
        if self.needs_gradients:
            require_autograd(type(self).__name__)
        if target is None and not self.needs_target:  # never read the output (a detector's)
            scorer = RowScorer(free=True)
        else:
            scorer = resolve(target, batch.shape[0], batch.device, self.capture.output)
        raw, several = self.raw_maps(batch, scorer)
        return finishing(raw, tuple(batch.shape[2:])), several

    def heatmaps(self, batch: Tensor, target: Target) -> tuple[Tensor, Tensor]:
        """``(heat (B, K, H, W) in [0, 1], raw map)`` for display: for a CAM both are the
        finished map."""
        maps, _ = self.maps(batch, target)
        return maps, maps

    def raw_maps(self, batch: Tensor, scorer: RowScorer) -> tuple[dict[str, Tensor], bool]:
        """The unfinished maps ``{layer: (B, K, h, w)}``, and whether K targets were asked."""

        def one_pass(part: Tensor, rows: Tensor) -> tuple[dict[str, Tensor], bool]:
            acts, grads, scores, several = self.capture.run(
                part, scorer, rows, gradients=self.needs_gradients, dtype=self.dtype
            )
            return self.maps_from(acts, grads, scores.shape[1], tuple(part.shape[2:])), several

        return over_rows(batch, self.batch_size, one_pass)

    def maps_from(
        self,
        acts: list[Tensor],
        grads: list[Tensor] | None,
        targets: int,
        input_size: tuple[int, ...],
    ) -> dict[str, Tensor]:
        """Apply :meth:`layer_map` to captured activations and gradients, layer by layer; a
        map that does not depend on the target is repeated for the ``targets`` targets."""
        grads = grads if grads is not None else [None] * len(acts)
        maps = {}
        for name, act, grad in zip(self.capture.names, acts, grads, strict=True):
            reader = self.grid_reader(name, act, input_size)
            act = self.as_grid(act, reader)
            grad = None if grad is None else self.as_grid(grad, reader)
            cam = self.layer_map(act, grad)
            maps[name] = cam.expand(-1, targets, *cam.shape[2:])
        return maps

    def grid_reader(self, name: str, act: Tensor, input_size: tuple[int, ...]) -> Reshape | None:
        """How layer ``name``'s output ``(B, 1, ...)`` becomes a grid (kept in ``layouts``)."""
        shape = (act.shape[0], *act.shape[2:])
        reader = resolve_reshape(self.reshape, self.model, input_size, shape)
        self.layouts[name] = reader
        return reader

    @staticmethod
    def as_grid(t: Tensor, reader: Reshape | None) -> Tensor:
        """``(B, K, ...)`` layer output or gradient ``-> (B, K, C, h, w)`` (or ``(B, K, C, d, h,
        w)`` for volumes) float32, through ``reader``."""
        lead = t.shape[:2]
        t = t.flatten(0, 1).float()
        if reader is not None:
            t = reader(t)
        if t.ndim not in (4, 5):
            raise LayerOutputError(
                f"CAM needs layer outputs of shape (B, C, h, w), got {tuple(t.shape)}; "
                "pass reshape= a function that turns them into a (B, C, h, w) grid"
            )
        return t.unflatten(0, lead)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(layers={self.capture.names})"


def spatial(t: Tensor) -> tuple[int, ...]:
    """The spatial dims of a ``(B, K, C, h, w)`` or ``(B, K, C, d, h, w)`` tensor."""
    return tuple(range(3 - t.ndim, 0))

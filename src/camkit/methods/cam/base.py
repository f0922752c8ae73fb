"""The base of every class activation map: a method only says how it weighs a layer
(:meth:`BaseCAM.channel_weights`, or :meth:`BaseCAM.layer_map`); the engine does the rest.

Shapes inside: activations ``(B, 1, C, h, w)`` and gradients ``(B, K, C, h, w)`` for ``K``
targets per sample, so methods broadcast over the target axis.
"""

from __future__ import annotations

import copy
from typing import Any, ClassVar

from torch import Tensor, nn

from camkit.core.architecture import folded_rows
from camkit.core.call import Call
from camkit.core.engine import over_rows
from camkit.core.explainer import Explainer, Explanation, Reshape
from camkit.core.finish import Finishing
from camkit.core.inputs import boolean, finite_number, positive_int
from camkit.core.layers import LayerSpec
from camkit.core.layouts import Layout, resolve_reshape
from camkit.core.spacetime import folded_frames
from camkit.errors import ArgumentError, LayerOutputError
from camkit.methods.cam.smoothing import explained, principal_component
from camkit.targets.base import TargetSpec
from camkit.targets.resolver import RowScorer

RawMaps = dict[str, Tensor]  # unfinished maps {layer: (B, K, h, w)}


class BaseCAM(Explainer):
    """Base class of the class-activation-map methods.

    ``Method(model, layer)(x, target)``: ``(C, H, W) -> (H, W)``, ``(B, C, H, W) -> (B, H, W)``,
    ``K`` targets per sample ``-> (B, K, H, W)``. Constructor arguments: those of
    :class:`~camkit.core.explainer.Explainer`; the last call's layer readings are in ``layouts``.

    Call options: ``relu``, ``upsample``, ``normalize`` (min-max to [0, 1]) and ``fuse``, as
    :class:`~camkit.core.finish.Finishing` (``"tanh"``: torchcam's LayerCAM fusion, Jiang et
    al., TIP 2021); ``aug_smooth=True``: pytorch-grad-cam's test-time augmentation
    (:func:`~camkit.methods.cam.smoothing.explained`); ``eigen_smooth=True``: each layer's map
    is the first principal component of ``w_c A_c`` instead of their sum
    (:func:`~camkit.methods.cam.smoothing.principal_component`), refused where the map is no
    weighted sum of channels (Recipro-CAM).
    """

    family: ClassVar[str] = "gradient-cam"
    needs_layer: ClassVar[bool] = True
    eigen_smooth: bool = False  # True on the copy that :meth:`smoothed` returns
    eigen_refused: ClassVar[str | None] = None  # why a method takes no eigen_smooth, if so

    def _explain(
        self,
        call: Call,
        scorer: RowScorer,
        *,
        relu: bool = True,
        upsample: bool = True,
        normalize: bool = True,
        fuse: bool | str = True,
        aug_smooth: bool = False,
        eigen_smooth: bool = False,
    ) -> Explanation:
        finishing, batch = Finishing(relu, upsample, normalize, fuse), call.batch
        shape = tuple(batch.shape)
        frames, rows = folded_frames(self.model, shape), folded_rows(self.model, shape)
        if (frames and not self.reads_frame_wise()) or (
            rows and not frames and not self.shares_one_pass()
        ):
            raise LayerOutputError(
                f"{type(self).__name__} does not read the layers of a frame-wise model (frames "
                "folded into the batch) yet, nor of one that reads flattened patches or tiles "
                "(Qwen2-VL, LLaVA-NeXt); use a gradient CAM that weighs the captured layer "
                "(Grad-CAM, Grad-CAM++, LayerCAM, HiResCAM, Eigen-CAM...), FullGrad, Score-CAM, "
                "Ablation-CAM (frame-wise models) or a pixel method"
            )
        method = self.smoothed() if boolean("eigen_smooth", eigen_smooth) else self
        return explained(method, call, scorer, finishing, aug_smooth)

    def smoothed(self) -> BaseCAM:
        """A shallow copy with ``eigen_smooth`` on (concurrent calls do not interfere)."""
        if self.eigen_refused:
            options = [o for o in self.call_options() if o != "eigen_smooth"]
            raise ArgumentError(
                f"{type(self).__name__} takes no eigen_smooth: {self.eigen_refused}; its call "
                f"options are: {', '.join(options)}"
            )
        twin = copy.copy(self)
        twin.eigen_smooth = True
        return twin

    @classmethod
    def shares_one_pass(cls) -> bool:
        """A gradient CAM that only weighs the captured layer (keeps :meth:`raw_maps`)."""
        return cls.raw_maps is BaseCAM.raw_maps

    @classmethod
    def reads_frame_wise(cls) -> bool:
        """Whether it reads a frame-wise model's layers (``B * T`` rows as ``(B, C, T, h, w)``)."""
        return cls.shares_one_pass()

    def channel_weights(self, act: Tensor, grad: Tensor) -> Tensor:
        """Weights broadcastable to ``act (B, K, C, h, w)``: ``(B, K, C, 1, 1)`` or element-wise."""
        raise NotImplementedError

    def weighted_activations(self, act: Tensor, grad: Tensor | None) -> Tensor:
        """``(B, 1, C, h, w), (B, K, C, h, w) -> (B, K, C, h, w)``: the terms ``w_c A_c``."""
        return self.channel_weights(act, grad) * act

    def layer_map(self, act: Tensor, grad: Tensor | None) -> Tensor:
        """``(B, 1, C, h, w), (B, K, C, h, w) -> (B, K, h, w)``."""
        return self.combine(self.weighted_activations(act, grad))

    def combine(self, weighted: Tensor) -> Tensor:
        """``(B, K, C, *spatial) -> (B, K, *spatial)``: the sum, or ``eigen_smooth``'s PCA."""
        return principal_component(weighted) if self.eigen_smooth else weighted.sum(dim=2)

    def maps(
        self, batch: Tensor, target: TargetSpec | RowScorer, finishing: Finishing, call: Call
    ) -> Tensor | dict[str, Tensor]:
        """``(B, C, H, W) ->`` finished maps ``(B, K, H, W)`` (or ``{layer: map}``)."""
        raw = self.raw_maps(batch, self.target_scorer(target, batch), call)
        return finishing(raw, tuple(batch.shape[2:]))

    def raw_maps(self, batch: Tensor, scorer: RowScorer, call: Call) -> RawMaps:
        """The unfinished maps ``{layer: (B, K, h, w)}``."""
        return one_pass_maps({"": self}, batch, scorer, call, self.batch_size)[""]

    def maps_from(
        self,
        acts: list[Tensor],
        grads: list[Tensor] | None,
        targets: int,
        input_size: tuple[int, ...],
        names: list[str] | None = None,
        *,
        batch: int | None = None,
    ) -> dict[str, Tensor]:
        """:meth:`layer_map` of each captured layer ``names`` (default: this capture's) for the
        ``targets`` targets; ``batch``: the input's rows (a frame-wise layer has ``batch * T``)."""
        grads = grads if grads is not None else [None] * len(acts)
        names, maps = self.capture.names if names is None else names, {}
        for name, act, grad in zip(names, acts, grads, strict=True):
            reader = self.grid_reader(name, act, input_size, batch)
            act = self.as_grid(act, reader)
            grad = None if grad is None else self.as_grid(grad, reader)
            cam = self.layer_map(act, grad)
            cam = reader.place(cam) if isinstance(reader, Layout) else cam  # tiled views
            maps[name] = cam.expand(-1, targets, *cam.shape[2:])
        return maps

    def grid_reader(
        self, name: str, act: Tensor, input_size: tuple[int, ...], batch: int | None = None
    ) -> Reshape | None:
        """How layer ``name``'s output ``(B, 1, ...)`` becomes a grid (kept in ``layouts``)."""
        shape = (act.shape[0], *act.shape[2:])
        reader = resolve_reshape(self.reshape, self.model, input_size, shape, batch)
        self.layouts[name] = reader
        return reader

    @staticmethod
    def as_grid(t: Tensor, reader: Reshape | None) -> Tensor:
        """``(B, K, ...)`` layer output or gradient ``-> (B, K, C, [d,] h, w)`` float32 through
        ``reader`` (frame-wise ``(B * T, K, ...)`` gives ``(B, K, C, T, h, w)``)."""
        frames = getattr(reader, "frames", 0)
        folded = frames or getattr(reader, "rows", 0)
        if folded:  # rows b * T + t (frames) or b * N + n (patches) -> (B, K, T or N, ...)
            t = t.unflatten(0, (-1, folded)).transpose(1, 2)
        lead = t.shape[:2]
        t = t.flatten(0, 2 if frames else 1).float()
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


class WrapperCAM(BaseCAM):
    """Base of the CAMs that wrap another CAM ``self.base`` of the same model, layer and options
    (RefineCAM, SESS, Finer-CAM; torchcam's ``_CAMWrapper``), sharing its capture and layouts."""

    def __init__(
        self, model: nn.Module, layer: LayerSpec | None, *, base: type[BaseCAM], **options: Any
    ):
        own = ("output", "reshape", "dtype", "batch_size")
        super().__init__(model, layer, **{k: v for k, v in options.items() if k in own})
        self.base = base(model, layer, **options)
        self.capture, self.layouts = self.base.capture, self.base.layouts  # one capture

    def check_autograd(self) -> None:
        self.base.check_autograd()

    def smoothed(self) -> WrapperCAM:
        """``eigen_smooth`` reaches the wrapped method."""
        twin = super().smoothed()
        twin.base = self.base.smoothed()
        return twin


def one_pass_maps(
    cams: dict[str, BaseCAM], batch: Tensor, scorer: RowScorer, call: Call, batch_size: int | None
) -> dict[str, RawMaps]:
    """The unfinished maps of gradient CAMs that only weigh a layer: one tapped forward (the
    first CAM's capture) and one backward per chunk."""
    first = next(iter(cams.values()))
    gradients = any(cam.needs_gradients for cam in cams.values())

    def one_pass(part: Tensor, rows: Tensor) -> dict[str, RawMaps]:
        acts, grads, scores = first.capture.run(
            part, call, scorer, rows, gradients=gradients, dtype=first.dtype
        )
        captured = (acts, grads, scores.shape[1], tuple(part.shape[2:]), first.capture.names)
        # batch: the input's rows (a frame-wise model's layers have rows * T)
        return {n: cam.maps_from(*captured, batch=part.shape[0]) for n, cam in cams.items()}

    return over_rows(batch, batch_size, one_pass)


class NoisyDraws:
    """The seeded noise settings of SS-CAM and Smooth Grad-CAM++ (``samples`` >= 1, ``std`` >=
    0); listed before the CAM base: ``class SSCAM(NoisyDraws, ScoreCAM)``."""

    seeded = True
    default_samples: ClassVar[int]
    default_std: ClassVar[float]

    def __init__(
        self,
        model: nn.Module,
        layer: LayerSpec | None = None,
        *,
        samples: int | type[Ellipsis] = ...,
        std: float | type[Ellipsis] = ...,
        **options: Any,
    ):
        super().__init__(model, layer, **options)
        samples = self.default_samples if samples is ... else samples
        self.samples = positive_int("samples", samples)
        self.std = finite_number("std", self.default_std if std is ... else std, minimum=0.0)


def spatial(t: Tensor) -> tuple[int, ...]:
    """The spatial dims of a ``(B, K, C, h, w)`` or ``(B, K, C, d, h, w)`` tensor."""
    return tuple(range(3 - t.ndim, 0))

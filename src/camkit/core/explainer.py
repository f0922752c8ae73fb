"""The one base of every camkit method: :class:`Explainer`, over one template::

    check the input -> Call (samples, additional_forward_args) -> target resolved once
    (a RowScorer) -> _explain(call, scorer) -> Explanation (maps (B, K, ...), targets (B, K))
    -> the call drops the axes the caller did not ask for

A family implements :meth:`Explainer._explain`; a method overrides the family's steps, never
the template. Front ends read a method's typed class flags (:class:`Capabilities`).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, fields, replace
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from camkit.core.call import Call
from camkit.core.copies import pin_top1
from camkit.core.engine import Capture, require_autograd
from camkit.core.finish import drop_axes
from camkit.core.inputs import as_batch, as_inputs, positive_int
from camkit.core.layers import LayerSpec, explained_module
from camkit.core.layouts import Reshape, check_reshape
from camkit.core.seeds import seed_value
from camkit.core.state import model_guarded
from camkit.errors import ArgumentError, InputError
from camkit.targets.base import TargetSpec
from camkit.targets.outputs import OutputSelector
from camkit.targets.resolver import RowScorer, resolve

FAMILIES = ("gradient-cam", "perturbation-cam", "pixel", "attention")


@dataclass(frozen=True)
class Capabilities:
    """What a method is and needs, read from its class (never rewritten per instance)."""

    family: str
    needs_layer: bool
    needs_gradients: bool
    seeded: bool
    target_free: bool
    several_inputs: bool


@dataclass(frozen=True)
class Explanation:
    """What :meth:`Explainer.explain_batch` returns (LRP returns a subclass,
    :class:`~camkit.methods.pixel.lrp.Relevance`).

    ``maps``: ``(B, K, ...)``, ``{layer: (B, K, ...)}`` for unfused layers, or a tuple of them
    (one per input of a tuple of inputs). ``targets``: the classes explained ``(B, K)`` (None
    for a callable target). ``several``: whether ``K`` targets per sample were asked;
    ``single``: whether one sample came without its batch axis."""

    maps: Any
    targets: Tensor | None
    several: bool
    single: bool = False

    @classmethod
    def of(cls, maps: Any, scorer: RowScorer, **extra: Any) -> Explanation:
        """The result ``maps`` for the target ``scorer`` scored."""
        return cls(maps, scorer.explained, scorer.several, **extra)

    def shaped(self) -> Any:
        """The maps as a call returns them (:func:`~camkit.core.finish.drop_axes`)."""
        return drop_axes(self.maps, self.single, self.several)


class Explainer:
    """Base of every method: ``Method(model, layer)(x, target)``.

    Args:
        model: any ``nn.Module`` (DataParallel / DDP / compiled models are unwrapped); never
            modified: no mode switch, no lasting hooks, no ``.grad``; in train mode its buffers
            are restored after every call.
        layer: for the methods that read a layer (``needs_layer``): a dotted name, a submodule,
            or a list of either; ``None`` (or ``"auto"``) picks the model's default layer
            (:func:`camkit.core.trace.default_layer`) at the first call. Others refuse one.
        output: picks the logits from a tuple/dict/object output (key, index or callable).
        reshape: how a layer's output becomes a ``(B, C, h, w)`` grid: ``"auto"`` (ViT tokens,
            channels-last outputs, raising rather than guessing), a callable, or None (as it
            is). Only for methods that read a layer.
        dtype: run the forwards under ``torch.autocast`` in this dtype; results stay float32.
        batch_size: rows per forward pass, whatever the method forwards; None runs all at once,
            not given: the class's ``default_batch_size``. Results do not depend on it.
        seed: for the methods that draw at random (``seeded``): the call's draws depend only
            on it (None draws one from torch's global generator); the others refuse it.

    ``with Method(model, layer) as cam:`` works as in pytorch-grad-cam (nothing to undo).
    """

    name: ClassVar[str]
    family: ClassVar[str]
    needs_layer: ClassVar[bool] = False
    needs_gradients: ClassVar[bool] = True
    seeded: ClassVar[bool] = False  # takes seed= (its results depend on random draws)
    target_free: ClassVar[bool] = False  # the map does not depend on the target
    several_inputs: ClassVar[bool] = False  # attributes a tuple of inputs, one result each
    takes_vectors: ClassVar[bool] = False  # explains vectors (B, F) as well as images
    default_batch_size: ClassVar[int | None] = None
    reshape_refused: ClassVar[str | None] = None  # why a method cannot take reshape=, if so
    # the call options whose result is the raw map that display_heat colours (the CLI's raw)
    display_options: ClassVar[dict[str, Any]] = {}

    def __init__(
        self,
        model: nn.Module,
        layer: LayerSpec | None = None,
        *,
        output: OutputSelector = None,
        reshape: Reshape | str | None = "auto",
        dtype: torch.dtype | None = None,
        batch_size: int | None | type[Ellipsis] = ...,
        seed: int | None = None,
    ):
        if not isinstance(model, nn.Module):
            raise ArgumentError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        self.model = explained_module(model)
        self.output = output
        self.dtype = dtype
        size = self.default_batch_size if batch_size is ... else batch_size
        self.batch_size = positive_int("batch_size", size, optional=True)
        if seed is not None and not self.seeded:
            raise ArgumentError(f"{type(self).__name__} draws nothing at random: it takes no seed")
        self.seed = seed_value(seed, optional=True)
        self.reshape = reshape
        self.layouts: dict[str, Reshape | None] = {}  # how each layer was read at the last call
        if self.needs_layer:
            check_reshape(reshape)
            if callable(reshape) and self.reshape_refused:
                raise ArgumentError(self.reshape_refused)
            self.capture = Capture(self.model, None if layer == "auto" else layer, output)
        elif layer is not None:
            raise ArgumentError(
                f"{type(self).__name__} reads no layer (it explains the input/the whole model); "
                f"got layer={layer!r}"
            )

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.__signature__ = merged_signature(cls)

    @classmethod
    def capabilities(cls) -> Capabilities:
        """The class's typed flags, as the registry reports them."""
        return Capabilities(*(getattr(cls, flag.name) for flag in fields(Capabilities)))

    # ------------------------------------------------------------------ what a front end asks

    @classmethod
    def fits(cls, model: nn.Module) -> str | None:
        """Why the method cannot explain ``model`` (None: it can)."""
        return None

    @classmethod
    def takes_layer(cls) -> bool:
        """Whether its constructor takes a ``layer``."""
        return cls.needs_layer

    @classmethod
    def shares_one_pass(cls) -> bool:
        """Whether :func:`camkit.cams` can compute it from the one shared forward/backward pass."""
        return False

    @classmethod
    def clean_batch_first(cls) -> bool:
        """Whether its first forward is the plain batch, so that the model's output there is
        also the prediction (a front end then needs no forward of its own)."""
        return cls.shares_one_pass()

    def forward_rows(self, layer_shape: tuple[int, ...] | None = None) -> int:
        """About how many rows of forward passes one sample costs, the clean pass not counted
        (for progress bars): 1, or the copies it scores for a layer output of ``layer_shape``."""
        return 1

    @property
    def layers(self) -> list[str]:
        """The layers the method reads (the default one once resolved); [] for none."""
        return self.capture.names if self.needs_layer else []

    # ------------------------------------------------------------------ the template

    def __call__(self, x: Tensor, target: TargetSpec = None, **options: Any) -> Any:
        """:meth:`explain_batch` without the axes the caller did not ask for: the target axis
        unless ``K`` targets per sample were asked, the batch axis for one sample."""
        return self.explain_batch(x, target, **options).shaped()

    def explain_batch(
        self,
        x: Tensor,
        target: TargetSpec = None,
        *,
        additional_forward_args: Any = None,
        **options: Any,
    ) -> Explanation:
        """Explain ``x`` (one sample, or a batch) for ``target`` (see :mod:`camkit.targets`):
        the :class:`Explanation` with maps ``(B, K, ...)``. ``additional_forward_args``: more
        inputs of a model called as ``model(x, *args)`` (per-sample tensors follow their
        samples). ``options``: the family's call options (e.g. ``fuse`` for CAMs). Methods with
        ``several_inputs`` also take a tuple ``(image, *others)``: one attribution per input,
        as captum's."""
        self.check_options(options)
        batch, single = self.checked_input(x)
        self.check_autograd()
        call = Call.of(batch, additional_forward_args)
        first = batch[0] if isinstance(batch, tuple) else batch
        with model_guarded(self.model):
            if self.needs_layer:
                self.capture.resolve(first, call)
            found = self._explain(call, self.target_scorer(target, first), **options)
        return replace(found, single=True) if single else found

    def target_scorer(self, target: TargetSpec, batch: Tensor) -> RowScorer:
        """The call's target resolved once for ``batch`` (:func:`~camkit.targets.resolve`)."""
        if target is None and self.target_free:  # never read the output (a detector's)
            return RowScorer(free=True)
        return resolve(target, batch.shape[0], batch.device, self.output)

    @classmethod
    def call_options(cls) -> tuple[str, ...]:
        """The call options besides ``additional_forward_args``: :meth:`_explain`'s keywords."""
        parameters = inspect.signature(cls._explain).parameters.values()
        return tuple(p.name for p in parameters if p.kind is p.KEYWORD_ONLY)

    def check_options(self, options: dict[str, Any]) -> None:
        """Refuse call options the method does not take, naming those it takes."""
        takes = self.call_options() if options else ()  # the common call: no signature to read
        unknown = [name for name in options if name not in takes]
        if unknown:
            takes = ", ".join(takes) or "none"
            raise ArgumentError(
                f"{type(self).__name__} takes no call option {', '.join(unknown)}; its call "
                f"options are: {takes} (constructor options such as batch_size= go to "
                f"{type(self).__name__}(...))"
            )

    def checked_input(self, x: object) -> tuple[Tensor | tuple[Tensor, ...], bool]:
        """``(batch or tuple of inputs, was_single)``; tuples for ``several_inputs`` only."""
        if not isinstance(x, tuple | list):
            return as_batch(x, self.model, vectors=self.takes_vectors)
        if not self.several_inputs:
            raise InputError(
                f"{type(self).__name__} explains one input tensor, got a {type(x).__name__} of "
                f"{len(x)}; pass the model's other inputs as additional_forward_args (the pixel "
                "methods attribute a tuple of inputs)"
            )
        return as_inputs(x, self.model, vectors=self.takes_vectors)

    def _explain(self, call: Call, scorer: RowScorer, **options: Any) -> Explanation:
        """The family's step: the result for ``call.batch`` and ``scorer``, axes ``(B, K, ...)``."""
        raise NotImplementedError

    def measured(self) -> list[list[dict]] | None:
        """What the last call measured about its result, per sample and target, as JSON dicts
        (LRP's conservation); None for a method that measures nothing."""
        return None

    def display_heat(self, result: Tensor) -> Tensor:
        """The one display policy of a method, read by every front end: maps ``(B, K, ...)``
        under :attr:`display_options` -> heat ``(B, K, H, W)`` (volumes ``(B, K, D, H, W)``) in
        [0, 1]. Maps are shown as they are; the pixel methods and FullGrad override it."""
        return result.detach().float()

    def pinned(
        self, batch: Tensor | tuple[Tensor, ...], scorer: RowScorer, call: Call
    ) -> RowScorer:
        """:func:`~camkit.core.copies.pin_top1` in this method's ``dtype`` and ``batch_size``."""
        return pin_top1(
            self.model, batch, scorer, call, dtype=self.dtype, batch_size=self.batch_size
        )

    def check_autograd(self) -> None:
        """Refuse ``torch.inference_mode()`` for a method that needs gradients."""
        if self.needs_gradients:
            require_autograd(type(self).__name__)

    def __enter__(self) -> Explainer:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def __repr__(self) -> str:
        layers = f"layers={self.layers}" if self.needs_layer else ""
        return f"{type(self).__name__}({layers})"


def displayed(
    explainer: Explainer, x: Any, target: TargetSpec = None, **options: Any
) -> tuple[Any, Explanation]:
    """The one way a front end shows a method's maps: ``(heat, explanation)``, the
    :meth:`~Explainer.explain_batch` result under :attr:`~Explainer.display_options` (plus
    ``options``) and its :meth:`~Explainer.display_heat` (a dict per layer when unfused)."""
    found = explainer.explain_batch(x, target, **{**explainer.display_options, **options})
    maps = found.maps
    if isinstance(maps, dict):
        return {name: explainer.display_heat(m) for name, m in maps.items()}, found
    return explainer.display_heat(maps), found


def merged_signature(cls: type) -> inspect.Signature:
    """The constructor's own parameters, then the keyword options it passes on to its bases
    through ``**options``, so that ``inspect.signature`` and ``help()`` show every option."""
    positional: list[inspect.Parameter] = []
    keywords: dict[str, inspect.Parameter] = {}
    inits = [klass.__dict__["__init__"] for klass in cls.__mro__ if "__init__" in klass.__dict__]
    for depth, init in enumerate(inits):
        parameters = list(inspect.signature(init).parameters.values())[1:]  # without self
        for parameter in parameters:
            if parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD):
                if depth == 0:  # the most derived constructor's own
                    positional.append(parameter)
            elif parameter.kind is parameter.KEYWORD_ONLY:
                keywords.setdefault(parameter.name, parameter)
        if not any(p.kind is p.VAR_KEYWORD for p in parameters):
            break
    if not cls.seeded:  # refused by the methods that draw nothing
        keywords.pop("seed", None)
    if not cls.needs_layer:  # a layer's reading: only for the methods that read a layer
        keywords.pop("reshape", None)
    for name, parameter in keywords.items():  # the sentinel ... stands for the class's default
        if parameter.default is ...:
            keywords[name] = parameter.replace(default=getattr(cls, f"default_{name}"))
    return inspect.Signature([*positional, *keywords.values()])


__all__ = ["FAMILIES", "Capabilities", "Explainer", "Explanation", "Reshape", "displayed"]

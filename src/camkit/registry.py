"""Which methods exist: one registry read by the CLI, :func:`camkit.cams`, the tests and docs.

A method registers itself with one line above its class::

    @register("gradcam", "Selvaraju et al., ICCV 2017")
    class GradCAM(BaseCAM): ...

What the registry knows of a method (its family, whether it needs a layer or gradients, whether
it can share :func:`camkit.cams`' single pass) comes from the class's own attributes, so it can
never disagree with the class.

One way to build a method for every front end (the CLI, the report, the explorer, the
notebook): :func:`build` from the model, the layer and one :class:`Settings` record. Which of
the settings a method takes is decided once, by :meth:`Method.options`, from the class's own
answers, so the same settings give the same map everywhere.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from torch import nn

from camkit.errors import UnknownMethodError

Cls = TypeVar("Cls", bound=type)

BATCH_SIZE = 32  # rows per forward pass, in every front end and every method that loops


@dataclass(frozen=True)
class Settings:
    """How a front end builds every method: one record, read by :meth:`Method.options`.

    ``seed``: the random draws of the seeded methods (SmoothGrad, SS-CAM, ...), so that reruns
    and front ends agree; ``batch_size``: rows per forward pass in the methods that run passes
    of their own (results do not depend on it); ``composite``: the LRP composite of the methods
    that take one (None: the method's own default).
    """

    seed: int = 0
    batch_size: int | None = BATCH_SIZE
    composite: str | None = None


@dataclass(frozen=True)
class Method:
    """A registered method: its ``--method`` name, class and paper."""

    name: str
    cls: type
    reference: str

    @property
    def capabilities(self) -> Any:
        """The class's typed flags (:class:`camkit.core.explainer.Capabilities`): ``family``
        (``"gradient-cam"``, ``"perturbation-cam"``, ``"pixel"`` or ``"attention"``),
        ``needs_layer``, ``needs_gradients``, ``seeded`` (takes ``seed=``) and ``target_free``
        (the same map for every target); each is also an attribute of the entry."""
        return self.cls.capabilities()

    def __getattr__(self, flag: str) -> Any:
        if flag.startswith("_") or flag == "cls":
            raise AttributeError(flag)
        try:
            return getattr(self.capabilities, flag)
        except AttributeError:
            raise AttributeError(f"a registered method has no {flag!r}") from None

    @property
    def shares_pass(self) -> bool:
        """Whether :func:`camkit.cams` computes it from the one shared forward/backward pass
        (the class's own answer, :meth:`~camkit.core.explainer.Explainer.shares_one_pass`)."""
        return self.cls.shares_one_pass()

    @property
    def takes_composite(self) -> bool:
        """Whether it runs an LRP composite by default, the one the front ends' composite
        (``--composite``, the explorer's menu) names: asked of its class (``default_composite``),
        not of its constructor (every pixel method takes ``composite=``, the plain gradient or
        its ReLU rule being its own by default)."""
        return getattr(self.cls, "default_composite", None) is not None

    def options(self, settings: Settings) -> dict[str, Any]:
        """The constructor options ``settings`` gives this method, exactly those it takes:
        ``batch_size`` unless it shares the one plain pass (which explains a batch in one
        forward, whose output is also the prediction), ``seed`` if it is ``seeded``, and
        ``composite`` if it takes one (and one is set)."""
        options: dict[str, Any] = {}
        if not self.shares_pass:
            options["batch_size"] = settings.batch_size
        if self.seeded:
            options["seed"] = settings.seed
        if self.takes_composite and settings.composite is not None:
            options["composite"] = settings.composite
        return options

    def build(
        self,
        model: nn.Module,
        layer: Any = None,
        settings: Settings | None = None,
        **options: Any,
    ) -> Callable:
        """The explainer ``cls(model, layer, **options)`` (``layer`` None: the model's default
        layer, or all attention blocks; methods that take no layer are built without it).
        ``settings``: the options it gives this method (:meth:`options`) come first, ``options``
        add to them (None: the class's own defaults)."""
        if settings is not None:
            options = self.options(settings) | options
        if self.cls.takes_layer():
            return self.cls(model, layer, **options)
        return self.cls(model, **options)


METHODS: dict[str, Method] = {}


def register(name: str, reference: str) -> Callable[[Cls], Cls]:
    """Class decorator: add the class to :data:`METHODS` under ``name``."""

    def add(cls: Cls) -> Cls:
        if name in METHODS and METHODS[name].cls is not cls:
            raise ValueError(f"method name {name!r} is already used by {METHODS[name].cls}")
        METHODS[name] = Method(name, cls, reference)
        cls.name = name
        return cls

    return add


def get(name: str) -> Method:
    """The method called ``name``; an unknown name names the closest ones."""
    if name in METHODS:
        return METHODS[name]
    close = difflib.get_close_matches(name, list(METHODS), n=3, cutoff=0.5)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    raise UnknownMethodError(f"unknown method {name!r}{hint}; choose from {', '.join(METHODS)}")


def build(
    name: str, model: nn.Module, layer: Any = None, settings: Settings = Settings()
) -> Callable:
    """The method called ``name`` on ``model`` (and ``layer``), built with ``settings``: the one
    way every front end builds a method (:meth:`Method.build`)."""
    return get(name).build(model, layer, settings)


def names(family: str | None = None) -> list[str]:
    """Registered names, in registration order, optionally of one family."""
    return [name for name, method in METHODS.items() if family in (None, method.family)]

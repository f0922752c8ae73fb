"""Which methods exist: one registry read by the CLI, :func:`camkit.cams`, the tests and docs.

A method registers itself with one line above its class::

    @register("gradcam", "Selvaraju et al., ICCV 2017")
    class GradCAM(BaseCAM): ...

What it knows of a method comes from the class's attributes; every front end builds a method
with :func:`build` and one :class:`Settings` record, so the same settings give the same map.
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
    """How a front end builds every method, read by :meth:`Method.options`: the ``seed`` of the
    seeded methods, ``batch_size`` (rows per forward pass) and the LRP ``composite`` of the
    methods that take one (None: the method's own default)."""

    seed: int = 0
    batch_size: int | None = BATCH_SIZE
    composite: str | None = None


@dataclass(frozen=True)
class Method:
    """A registered method: its ``--method`` name, class and paper."""

    name: str
    cls: type
    reference: str

    def __getattr__(self, flag: str) -> Any:
        """The class's typed flags (:class:`camkit.core.explainer.Capabilities`)."""
        if flag.startswith("_") or flag == "cls":
            raise AttributeError(flag)
        try:
            return getattr(self.cls.capabilities(), flag)
        except AttributeError:
            raise AttributeError(f"a registered method has no {flag!r}") from None

    @property
    def shares_pass(self) -> bool:
        """:meth:`~camkit.core.explainer.Explainer.shares_one_pass` of the class."""
        return self.cls.shares_one_pass()

    @property
    def takes_composite(self) -> bool:
        """Whether it runs an LRP composite by default (its class's ``default_composite``), the
        one the front ends' ``--composite`` names (every pixel method takes ``composite=``)."""
        return getattr(self.cls, "default_composite", None) is not None

    def options(self, settings: Settings) -> dict[str, Any]:
        """The constructor options ``settings`` gives this method, exactly those it takes:
        ``batch_size`` unless it shares the one plain pass, ``seed`` if ``seeded``, and
        ``composite`` if it takes one (and one is set)."""
        taken = {
            "batch_size": not self.shares_pass,
            "seed": self.seeded,
            "composite": self.takes_composite and settings.composite is not None,
        }
        return {name: getattr(settings, name) for name, takes in taken.items() if takes}

    def build(
        self,
        model: nn.Module,
        layer: Any = None,
        settings: Settings | None = None,
        **options: Any,
    ) -> Callable:
        """The explainer ``cls(model, layer, **options)`` (without ``layer`` if it takes none),
        with :meth:`options` of ``settings`` under ``options``."""
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
    """The method called ``name`` on ``model`` (and ``layer``), built with ``settings``."""
    return get(name).build(model, layer, settings)


def names(family: str | None = None) -> list[str]:
    """Registered names, in registration order, optionally of one family."""
    return [name for name, method in METHODS.items() if family in (None, method.family)]

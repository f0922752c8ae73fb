"""Which methods exist: one registry read by the CLI, :func:`camkit.cams`, the tests and docs.

A method registers itself with one line above its class::

    @register("gradcam", "Selvaraju et al., ICCV 2017")
    class GradCAM(BaseCAM): ...

What the registry knows of a method (its family, whether it needs a layer or gradients, whether
it can share :func:`camkit.cams`' single pass) comes from the class's own attributes, so it can
never disagree with the class.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from torch import nn

from camkit.errors import UnknownMethodError

Cls = TypeVar("Cls", bound=type)


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

    def build(self, model: nn.Module, layer: Any = None, **options: Any) -> Callable:
        """The explainer ``cls(model, layer, **options)`` (``layer`` None: the model's default
        layer, or all attention blocks; methods that take no layer are built without it)."""
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


def names(family: str | None = None) -> list[str]:
    """Registered names, in registration order, optionally of one family."""
    return [name for name, method in METHODS.items() if family in (None, method.family)]

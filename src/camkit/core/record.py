"""``record(...)``: keep layers' activations and gradients during the user's own passes."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial

from torch import Tensor, nn

from camkit.core.layers import (
    LayerSpec,
    explained_module,
    find_layers,
    hooked,
    replacing_output,
    tensor_output,
)


@dataclass
class Recording:
    """What :func:`record` captured: ``activations[name]`` and ``gradients[name]`` (after the
    user's backward), detached, a tensor per layer, or a list in call order for a module that
    ran several times."""

    calls: dict[str, list[Tensor]] = field(default_factory=dict)
    grads: dict[str, list[Tensor | None]] = field(default_factory=dict)

    @staticmethod
    def _unwrap(store: dict[str, list]) -> dict[str, Tensor | list[Tensor]]:
        return {
            name: items[0] if len(items) == 1 else list(items)
            for name, items in store.items()
            if items and all(item is not None for item in items)
        }

    @property
    def activations(self) -> dict[str, Tensor | list[Tensor]]:
        return self._unwrap(self.calls)

    @property
    def gradients(self) -> dict[str, Tensor | list[Tensor]]:
        return self._unwrap(self.grads)


@contextmanager
def record(model: nn.Module, layers: LayerSpec, gradients: bool = True) -> Iterator[Recording]:
    """Capture ``layers``' outputs during any forward, and their gradients during any backward::

        with camkit.record(model, ["conv1", "layer4"]) as rec:
            model(x)[0, 281].backward()
        rec.activations["conv1"], rec.gradients["layer4"]

    Outputs are kept detached, safe from later in-place operations; every hook is removed on
    exit, also when the code inside raises.
    """
    found = find_layers(explained_module(model), layers)
    rec = Recording({name: [] for name, _ in found}, {name: [] for name, _ in found})

    def tap(name: str, module: nn.Module, inputs: tuple, output: object) -> Tensor:
        output = tensor_output(name, output)
        call = len(rec.calls[name])
        rec.calls[name].append(output.detach())
        rec.grads[name].append(None)
        if gradients and output.requires_grad:

            def keep(grad: Tensor) -> None:
                rec.grads[name][call] = grad.detach()

            output.register_hook(keep)
        return output.clone()

    with hooked(lambda: [replacing_output(m, partial(tap, n)) for n, m in found]):
        yield rec

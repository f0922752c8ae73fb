"""Finding layers, hooking them and always unhooking: the one place that touches the user's model.

Every hook camkit registers goes through :func:`hooked`, which removes it in a ``finally`` block,
so the model is left exactly as it was even when the forward pass raises.
"""

from __future__ import annotations

import difflib
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial

import torch
from torch import Tensor, nn

from camkit.errors import ArgumentError, LayerNotFoundError, LayerOutputError

LayerSpec = str | nn.Module | Sequence[str | nn.Module]
_WRAPPER_PREFIXES = ("module.", "_orig_mod.")


def explained_module(model: nn.Module) -> nn.Module:
    """The module camkit runs: DataParallel / DDP's ``.module`` (no replica or gradient sync
    needed), a ``torch.compile``d model's eager original (hooks on a compiled graph can be
    skipped silently)."""
    while True:
        if isinstance(model, nn.DataParallel | nn.parallel.DistributedDataParallel):
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), nn.Module):
            model = model._orig_mod
        else:
            return model


def user_name(model: nn.Module, name: str) -> str | None:
    """A module's dotted name as the user's own model names it, without the ``module.`` of
    camkit's input wrappers (nested too); None for the wrapped model itself."""
    while getattr(model, "wraps_model", False):
        if name == "module":
            return None
        if not name.startswith("module."):
            return name
        name, model = name.removeprefix("module."), model.module
    return name


def find_layer(model: nn.Module, layer: str | nn.Module) -> tuple[str, nn.Module]:
    """Resolve a dotted name (as in ``model.named_modules()``) or a submodule to the user's
    ``(name, module)`` (:func:`user_name`); a misspelt name raises
    :class:`LayerNotFoundError` naming the closest real ones."""
    if isinstance(layer, nn.Module):
        for name, module in model.named_modules(remove_duplicate=False):
            if module is layer:
                return user_name(model, name) or name, module
        raise LayerNotFoundError(
            f"the module {type(layer).__name__} passed as layer is not a submodule of the model"
        )
    if not isinstance(layer, str):
        raise ArgumentError(
            f"layer must be a dotted module name, an nn.Module or a list of them, "
            f"got {type(layer).__name__}"
        )
    modules = dict(model.named_modules())
    wrapped = next((p for p in _WRAPPER_PREFIXES if layer.startswith(p)), None)
    if layer not in modules and wrapped:  # a name of the wrapped model: "module.layer4"
        layer = layer.removeprefix(wrapped)
    inner, prefix = model, ""
    while layer not in modules and getattr(inner, "wraps_model", False):  # camkit's wrappers
        inner, prefix = inner.module, f"{prefix}module."  # nested too: InputLayout(KeywordInput)
        layer = f"{prefix}{layer}" if f"{prefix}{layer}" in modules else layer
    if layer in modules:
        return user_name(model, layer) or layer, modules[layer]
    names = [user_name(model, name) or name for name in modules if name]
    close = difflib.get_close_matches(layer.removeprefix("module."), names, n=5, cutoff=0.5)
    hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    raise LayerNotFoundError(
        f"the model has no layer named {layer!r}{hint} "
        "(see model.named_modules() or `camkit layers`)"
    )


def find_layers(model: nn.Module, layers: LayerSpec) -> list[tuple[str, nn.Module]]:
    """Resolve one layer or a list of layers to a list of ``(name, module)`` pairs."""
    specs = [layers] if isinstance(layers, str | nn.Module) else list(layers)
    if not specs:
        raise LayerNotFoundError("no layer given: pass a layer name, a module or a list of them")
    found = [find_layer(model, spec) for spec in specs]
    names = [name for name, _ in found]
    if len(set(names)) != len(names):
        raise LayerNotFoundError(f"the same layer is listed twice: {names}")
    return found


@contextmanager
def hooked(handles_factory: Callable[[], list]) -> Iterator[None]:
    """Register hooks (a callable returning their handles) and remove every one on exit."""
    handles: list = []
    try:
        handles = handles_factory()
        yield
    finally:
        for handle in handles:
            handle.remove()


def this_thread(hook: Callable) -> Callable:
    """``hook``, firing only in the thread that registers it: concurrent calls on one model
    get exactly their one-by-one results, without a lock."""
    owner = threading.get_ident()

    def guarded(*args: object) -> object:
        return hook(*args) if threading.get_ident() == owner else None

    guarded.camkit_hook = True  # type: ignore[attr-defined]  # (see replacing_output)
    return guarded


def replacing_output(module: nn.Module, hook: Callable) -> torch.utils.hooks.RemovableHandle:
    """Register a forward ``hook`` that replaces ``module``'s output, for this thread only.

    It runs after camkit's own hooks on the module and before every other one: a hook that
    keeps the output (transformers 5 collects ``hidden_states`` so, LLaVA's projector reads
    them) then keeps camkit's replacement, so the gradient reaches the tapped layer.
    """
    handle = module.register_forward_hook(this_thread(hook))
    hooks = module._forward_hooks
    for key in [k for k, added in hooks.items() if not getattr(added, "camkit_hook", False)]:
        hooks.move_to_end(key)
    return handle


def tensor_output(name: str, output: object) -> Tensor:
    if not isinstance(output, Tensor):
        raise LayerOutputError(
            f"layer {name!r} returns {type(output).__name__}, not a tensor; "
            "choose one of its submodules whose output is a tensor"
        )
    return output


@contextmanager
def capture_outputs(
    model: nn.Module, layers: Sequence[tuple[str, nn.Module]], *, start_graph: bool
) -> Iterator[dict[str, list[Tensor]]]:
    """Keep the outputs of ``layers`` (every call, in order) during the forward passes inside.

    With ``start_graph=True`` (the forward under ``torch.no_grad()``) the first captured output
    turns autograd on and becomes a leaf, so the graph starts at the target layers. Downstream
    modules receive a clone, so later in-place operations cannot alter what was captured.
    """
    taps: dict[str, list[Tensor]] = {name: [] for name, _ in layers}
    grad_mode = torch.is_grad_enabled()

    def tap(name: str, module: nn.Module, inputs: tuple, output: object) -> Tensor:
        output = tensor_output(name, output)
        if start_graph and not output.requires_grad:
            torch.set_grad_enabled(True)
            output = output.detach().requires_grad_(True)
        taps[name].append(output)
        return output.clone()

    try:
        with hooked(lambda: [replacing_output(m, partial(tap, n)) for n, m in layers]):
            yield taps
    finally:
        torch.set_grad_enabled(grad_mode)


def single_call(taps: dict[str, list[Tensor]]) -> list[Tensor]:
    """The one call's output of each tapped layer; a layer that never ran, or ran several
    times (a map of one call would silently leave the others out), is an error."""
    missing = [name for name, calls in taps.items() if not calls]
    if missing:
        raise LayerOutputError(
            f"layer(s) {missing} did not run during the forward pass; "
            "pick a layer that the model's forward actually calls"
        )
    for name, calls in taps.items():
        if len(calls) > 1:
            listed = ", ".join(f"call {i}: {tuple(out.shape)}" for i, out in enumerate(calls))
            raise LayerOutputError(
                f"layer {name!r} runs {len(calls)} times in one forward pass ({listed}); a map "
                "of one call would silently leave the others out. Choose a layer that runs "
                "once: the module that makes the input of the call you want (for a head shared "
                "by pyramid levels, that level's feature map, e.g. an FPN output), or a module "
                "inside a block rather than one the block reuses; camkit.record(model, layer) "
                "keeps every call's output and gradient if you need them all"
            )
    return [calls[0] for calls in taps.values()]


def check_batch_axes(taps: dict[str, list[Tensor]], batch: int, frames: int | None = None) -> None:
    """Raise :class:`LayerOutputError` unless the last call of every tapped layer that ran has
    the input's ``batch`` rows on its first axis (``batch * frames`` for a frame-wise model):
    a detection head's proposals or a shared position embedding would give wrong maps."""
    for name, calls in taps.items():
        rows = calls[-1].shape[0] if calls and calls[-1].ndim else None
        if not calls or rows == batch or (frames and rows == batch * frames):
            continue
        raise LayerOutputError(
            f"layer {name!r} gives {rows} rows on its first axis for an input batch of {batch}: "
            "its leading axis is not the input's batch (proposals of a detection head, frames "
            "folded into the batch, a position embedding shared by every image), so no map per "
            "input can be read from it (frames folded into the batch of a clip model are read "
            "once declared: camkit.InputLayout(model, layout, frame_wise=True)); choose a "
            "layer whose output is (B, ...) for B inputs "
            "(see camkit.models.layer_shapes(model, example=x) or `camkit layers`)"
        )


@contextmanager
def first_output(model: nn.Module) -> Iterator[list]:
    """Keep the output of the model's first forward pass inside (in a list, detached where a
    tensor): the clean pass of a method also gives the prediction."""
    kept: list = []

    def keep(module: nn.Module, inputs: tuple, output: object) -> None:
        if not kept:
            kept.append(output.detach() if isinstance(output, Tensor) else output)

    with hooked(lambda: [model.register_forward_hook(this_thread(keep))]):
        yield kept

"""The one backward: under :func:`rules_applied`, ordinary autograd computes a rule set's gradient.

A rule set (a :class:`~.composites.Composite`: the plain gradient, the ReLU rules, LRP's
composites) is applied by one :class:`torch.overrides.TorchFunctionMode` with one operation
table. Under the ReLU rules the rectifiers get the rule's backward, other activations are
reported, the rest keeps its plain gradient. Under an LRP composite (strict), modules the
composite gives a rule get it through forward hooks, and every other operation is ruled by the
table:

* ``relu``: its plain gradient, the Pass rule's exactly; other activations: :class:`~.rules.Pass`;
* residual sums of two tensors on the relevance path (one that requires grad and is not an
  ``nn.Parameter``), sums, means, average pooling, resampling, additive scatters:
  :class:`~.rules.Norm` with the composite's stabiliser;
* structural operations, a tensor plus or times a constant, an un-merged ``batch_norm``: their
  plain gradient, which moves ``g = R / A`` as relevance must move (as zennit does);
* softmax, matmul and products of two activations, norms, fused attention and ``F.linear``
  outside a ruled module: AttnLRP's rules (:mod:`~.transformers`); gates: :mod:`~.gates`;
* anything else on the relevance path (``exp``, ``cumsum``, ...): a
  :class:`~camkit.errors.RelevanceError` naming the operation and the line that called it.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from camkit.core.layers import explained_module, hooked
from camkit.errors import RelevanceError
from camkit.relevance.composites import Composite, Match, composite
from camkit.relevance.rectifiers import RECTIFIERS, rectified
from camkit.relevance.rescale import proportional
from camkit.relevance.rules import Pass, Rule
from camkit.relevance.session import Session, on_path
from camkit.relevance.transformers import bilinear

_T, _N = torch.Tensor, torch._C._nn
PASS, NORM, SUMS, SCALE, GRADIENT = "pass", "norm", "sums", "scale", "gradient"
BILINEAR = "bilinear"
RECTIFIER = "rectifier"  # a ReLU rule's; LRP: a ReLU's gradient, Pass for the bounded ones
ACTIVATION = "activation"  # Pass under LRP; its plain gradient (reported) under a ReLU rule


def _table() -> dict[Any, str]:
    table: dict[Any, str] = {}

    def add(kind: str, names: str, *funcs: Any) -> None:
        found = [getattr(owner, n, None) for n in names.split() for owner in (torch, _T, F, _N)]
        table.update({f: kind for f in (*found, *funcs) if f is not None})

    add(PASS, "hardsigmoid sigmoid tanh sigmoid_ tanh_")
    add(ACTIVATION, "silu gelu elu elu_ leaky_relu leaky_relu_ hardswish mish softplus selu")
    add(ACTIVATION, "selu_ celu celu_ rrelu rrelu_ prelu")
    add(SUMS, "add add_ __add__ __radd__ __iadd__ sub sub_ __sub__ __rsub__ __isub__ subtract")
    add(NORM, "sum mean avg_pool1d avg_pool2d avg_pool3d adaptive_avg_pool1d")
    add(NORM, "adaptive_avg_pool2d adaptive_avg_pool3d", F.interpolate, F.upsample, F.fold)
    add(NORM, "", F.upsample_nearest, F.upsample_bilinear)
    add(SUMS, "scatter_add scatter_add_ index_add index_add_")  # writes that add: their sum
    add(SCALE, "mul mul_ __mul__ __rmul__ __imul__ div div_ __truediv__ __itruediv__ multiply")
    add(SCALE, "divide true_divide")
    add(GRADIENT, "view reshape flatten unflatten permute transpose t contiguous clone squeeze")
    add(GRADIENT, "unsqueeze expand expand_as repeat cat concat concatenate stack split chunk")
    add(GRADIENT, "unbind narrow select movedim index_select to float double half bfloat16")
    add(GRADIENT, "type_as type roll __getitem__ neg __neg__ view_as reshape_as flip pad tile")
    add(GRADIENT, "dropout dropout1d dropout2d dropout3d alpha_dropout batch_norm max_pool1d")
    add(GRADIENT, "max_pool2d max_pool3d adaptive_max_pool1d adaptive_max_pool2d")
    add(GRADIENT, "adaptive_max_pool3d max_pool2d_with_indices permute_copy swapaxes moveaxis")
    add(GRADIENT, "unfold")
    # outputs that are copies of input entries, relevance moving with them: gathers, embeddings,
    # shuffles, and writes (masked_scatter puts a VLM's image features into the text sequence;
    # index_put, scatter, x[i] = v): the written values get the relevance of their positions
    add(GRADIENT, "gather take take_along_dim masked_select embedding pixel_shuffle diagonal")
    add(GRADIENT, "pixel_unshuffle channel_shuffle tril triu where masked_scatter index_put")
    add(GRADIENT, "masked_scatter_ index_put_ scatter scatter_ index_copy index_copy_ index_fill")
    add(GRADIENT, "masked_fill masked_fill_ index_fill_ __setitem__")
    add(RECTIFIER, "", *RECTIFIERS)  # relu, relu6, hardtanh, threshold, in place or not
    add(GRADIENT, "", *(getattr(_T, name).__get__ for name in ("T", "mT", "H", "mH")))
    add(BILINEAR, "matmul __matmul__ __rmatmul__ bmm einsum mm")
    return table


_TABLE = _table()


def _in_place_name(name: str) -> bool:
    dunder = name.startswith("__") and name.endswith("__")
    return name.startswith("__i") and dunder or name.endswith("_") and not dunder


_IN_PLACE = {f for f in _TABLE if _in_place_name(getattr(f, "__name__", ""))}
_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TORCH = os.path.dirname(os.path.abspath(torch.__file__))


def _operands(args: tuple, kwargs: dict) -> list[Tensor]:
    listed = (a if isinstance(a, list | tuple) else (a,) for a in (*args, *kwargs.values()))
    return [a for arg in listed for a in arg if on_path(a)]


def _call_site() -> str:
    for frame in reversed(traceback.extract_stack()):
        path = os.path.abspath(frame.filename)
        if not path.startswith((_HERE, _TORCH)):
            return f"{frame.filename}:{frame.lineno} ({frame.line})"
    return "unknown"


def _name(func: Any) -> str:
    owner = getattr(func, "__objclass__", None) or getattr(func, "__module__", None) or "torch"
    owner = getattr(owner, "__name__", owner)
    return f"{owner}.{getattr(func, '__name__', func)}"


class _BackwardMode(TorchFunctionMode):
    """The one interception: every operation of the forward gets its rule set's backward."""

    def __init__(self, session: Session):
        super().__init__()
        self.session = session

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        session = self.session
        if session.substitute:
            args = session.swapped(args)
            kwargs = {key: session.swapped(value) for key, value in kwargs.items()}
        kind = _TABLE.get(func)
        if session.log is not None and not session.bypass:
            if kind == RECTIFIER:
                return rectified(func, args, kwargs, session.log)
            if kind == ACTIVATION:
                session.log.unmodified[str(getattr(func, "__name__", func))] += 1
        if not session.composite.strict or session.bypass or kind == GRADIENT:
            return func(*args, **kwargs)
        if kind == RECTIFIER and RECTIFIERS[func].plain_relu:
            # the Pass rule is a ReLU's gradient: the ReLU itself, its input's bias units kept
            units = session.bias_units.mask(RECTIFIERS[func].bind(args, kwargs)["input"])
            out = func(*args, **kwargs)
            session.bias_units.passed(units, out)
            return out
        if kind in (RECTIFIER, ACTIVATION):  # the bounded rectifiers, the other activations
            kind = PASS
        operands = _operands(args, kwargs)
        # a constant scale or matrix: the gradient; a constant added (a bias) absorbs its share
        if not operands or kind in (SCALE, SUMS, BILINEAR) and len(operands) == 1:
            return func(*args, **kwargs)
        if kind == SCALE:  # a product of two activations: the gate rule, else AttnLRP's uniform
            out = session.gates.product(func, args, kwargs, operands)
            return self._apply(func, BILINEAR, args, kwargs) if out is None else out
        if kind in (PASS, NORM, SUMS, BILINEAR):
            return self._apply(func, kind, args, kwargs)
        handler = self.session.handlers.get(func)
        if handler is not None:
            return handler(*args, **kwargs)
        out = func(*args, **kwargs)
        outs = out if isinstance(out, list | tuple) else (out,)
        if any(isinstance(o, Tensor) and o.requires_grad for o in outs):
            raise RelevanceError(
                f"{_name(func)} on the relevance path has no LRP rule (called at "
                f"{_call_site()}); camkit's rules cover linear and convolutional modules, "
                "activations, sums, pooling and reshaping: give the module a rule in the "
                "composite, or rewrite the operation with supported ones"
            )
        return out

    def _apply(self, func: Any, kind: str, args: tuple, kwargs: dict) -> Tensor:
        x = args[0]
        # F.hardtanh(x, 0.0, 6.0, True) (nn.ReLU6) reaches the mode with inplace=True by name
        in_place = isinstance(x, Tensor) and (func in _IN_PLACE or kwargs.get("inplace") is True)
        if in_place and kind in (NORM, SUMS) and x._base is None:  # `out += identity`: its
            o = func(*args, **kwargs)  # own in-place graph with the Norm rule's backward on it
            return proportional(o, self.session.norm.stabilizer, in_place=True)  # (no copy)
        first = x.clone() if in_place else x  # in-place forms act on a copy, then write back
        o = func(first, *args[1:], **kwargs)
        if not isinstance(o, Tensor):
            return o
        bias_units = None
        if kind == PASS:
            bias_units = self.session.bias_units.mask(x)  # an activation keeps them
            y = self.session.gates.tagged(func, Pass().output(None, x, o))
        elif kind == BILINEAR:
            y = bilinear(o)
        else:
            y = self.session.norm.output(None, x, o)
        if in_place and o is first:
            y = x.copy_(y)
        self.session.bias_units.passed(bias_units, y)
        return y


@contextmanager
def rules_applied(
    model: nn.Module | None,
    composite_spec: str | Composite | Sequence[tuple[Match, Rule]] = "epsilon-plus-flat",
    *,
    record: Sequence[str] = (),
) -> Iterator[Session]:
    """Run the forward inside with a rule set's backward (an LRP composite, ``"guided"``,
    ``"deconvnet"`` or ``"gradient"``) in the autograd graph: ``A * grad_A`` of the target score
    is then the relevance of any tensor ``A`` of the forward; the backward may run after the
    block. ``record``: layer names whose outputs are kept in ``session.recorded``. Hooks are
    removed on exit, also when the forward raises. ``model``: None for a rule set that gives no
    module a rule (the ReLU rules)."""
    comp = composite(composite_spec)
    module = explained_module(model) if model is not None else None
    session = Session(module, comp, record)
    # the grad mode is restored also when a ruled layer's forward raises (see Session._enter)
    grad_mode = torch.set_grad_enabled(torch.is_grad_enabled())
    with grad_mode, hooked(session.register), _BackwardMode(session):
        try:
            yield session
        finally:
            session.bias_units.clear()
    if session.pending:
        raise RelevanceError(
            f"layer(s) {sorted(set(session.pending.values()))} come before a BatchNorm in the "
            "model's modules but their output did not go into it: pass a composite with "
            "canonizers=[] (no BatchNorm merging) for this model"
        )


__all__ = ["Session", "on_path", "rules_applied"]

"""AttnLRP's rules for the operations of transformers (Achtibat et al., "AttnLRP:
Attention-Aware Layer-Wise Relevance Propagation for Transformers", ICML 2024), in camkit's
modified gradient ``g = R / A`` (:mod:`camkit.relevance.rules`):

* **softmax**, ``R_i = x_i (R^out_i - s_i sum_j R^out_j)`` (Prop. 3.1): in ``g`` the softmax's
  own Jacobian, its plain gradient. Not conservative (its zeroth-order Taylor term is a bias);
  lxt 2.1 does the same;
* **attention weights as constants** (``attention="constant"``): CP-LRP (Ali et al., "XAI for
  Transformers: Better Explanations through Conservative Propagation", ICML 2022; lxt's
  ``cp_LRP``): ``attn @ v`` gives ``v`` all the relevance;
* **matmul and the product of two activations** (``q k^T``, ``attn @ v``, gates): the uniform
  rule, ``R_A = R_B = 1/2 * A (dy/dA) R / y`` (Prop. 3.3), half the gradient to each factor
  (lxt's ``divide_gradient``);
* **layer, RMS and group norm**, ``F.normalize`` and hand-written norms: the identity rule, the
  standard deviation a constant (Prop. 3.4); activations: :class:`~.rules.Pass`;
* ``F.scaled_dot_product_attention``: itself with the gradient of ``q`` and ``k`` quartered and
  of ``v`` halved (lxt's Gradient x Input form); ``F.multi_head_attention_forward``: computed
  again from its parts, bitwise the fused value;
* ``F.linear`` outside a ruled module: the Epsilon rule, AttnLRP's (and lxt's) for linear layers.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from functools import partial
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from camkit.errors import RelevanceError
from camkit.relevance.affine import Affine
from camkit.relevance.rescale import rescaled
from camkit.relevance.rules import Epsilon, modified_output

# the rules of the attention weights (the composite's ``attention``): AttnLRP's softmax rule, or
# the weights as constants (CP-LRP)
ATTENTION: tuple[str, ...] = ("softmax", "constant")
_SOFTMAXES = [F.softmax, torch.softmax, Tensor.softmax, getattr(torch.special, "softmax", None)]


def bilinear(o: Tensor) -> Tensor:
    """``o = f(a, b)`` bilinear, carrying its graph: each factor gets half of the relevance (the
    uniform rule, AttnLRP Prop. 3.3, in lxt's Gradient x Input form)."""
    return shared(o, 0.5)


def layer_norm(
    x: Tensor,
    shape: Any,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,
) -> Tensor:
    """``F.layer_norm`` with the identity rule on the normalisation: ``y = w (x - mean(x)) /
    std + b`` with ``std`` a constant, a linear map of ``x`` whose gradient is
    ``c - mean(c)``, ``c = g w / std`` (one backward node, :class:`_Centred`)."""
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    return _Centred.apply(x, shape, weight, bias, eps)


class _Centred(torch.autograd.Function):
    """``F.layer_norm``'s value (under autocast too) and the identity rule's gradient (see
    :func:`layer_norm`)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, shape: tuple, weight: Any, bias: Any, eps: float) -> Tensor:
        weight = None if weight is None else weight.detach()
        out = F.layer_norm(x, shape, weight, None if bias is None else bias.detach(), eps)
        ctx.dims = tuple(range(-len(shape), 0))
        same = x.to(out.dtype)  # autocast runs layer norm in float32
        rstd = (same.var(ctx.dims, keepdim=True, unbiased=False) + eps).rsqrt()
        ctx.save_for_backward(rstd, weight)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None, None, None]:
        rstd, weight = ctx.saved_tensors
        c = grad * rstd if weight is None else grad * weight * rstd
        return c - c.mean(ctx.dims, keepdim=True), None, None, None, None


def rms_norm(
    x: Tensor, shape: Any, weight: Tensor | None = None, eps: float | None = None
) -> Tensor:
    """``F.rms_norm`` with the identity rule on the normalisation (no centring)."""
    dims = tuple(range(-len(tuple(shape) if not isinstance(shape, int) else (shape,)), 0))
    out = F.rms_norm(x, shape, weight, eps)
    eps = torch.finfo(x.dtype).eps if eps is None else eps
    rms = (x.pow(2).mean(dim=dims, keepdim=True) + eps).sqrt().detach()
    t = x / rms
    return modified_output(out, t if weight is None else t * weight.detach())


def group_norm(
    x: Tensor,
    num_groups: int,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,
) -> Tensor:
    """``F.group_norm`` with the identity rule on the normalisation: each group's standard
    deviation a constant (layer norm's rule over a group's channels and positions)."""
    out = F.group_norm(x, num_groups, weight, bias, eps)
    groups = x.unflatten(1, (num_groups, -1))
    dims = tuple(range(2, groups.dim()))
    mean = groups.mean(dim=dims, keepdim=True)
    std = (groups.var(dim=dims, keepdim=True, unbiased=False) + eps).sqrt().detach()
    t = ((groups - mean) / std).flatten(1, 2)
    channel = (1, -1) + (1,) * (x.dim() - 2)
    if weight is not None:
        t = t * weight.detach().view(channel)
    if bias is not None:
        t = t + bias.detach().view(channel)
    return modified_output(out, t)


def normalize(x: Tensor, p: float = 2.0, dim: int = 1, eps: float = 1e-12, out: None = None):
    """``F.normalize`` with the identity rule: the norm a constant, ``R_x = R_y`` element-wise
    (lxt's ``normalize``; CLIP's embedding normalisation)."""
    y = F.normalize(x, p, dim, eps)
    norm = x.detach().norm(p, dim, keepdim=True).clamp_min(eps)
    return modified_output(y, x / norm)


def _constant(func: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """``func``'s value as a constant: no relevance flows through it (a divisor's norm)."""

    def constant(*args: Any, **kwargs: Any) -> Tensor:
        exponent = kwargs.get("exponent", args[1] if len(args) > 1 else None)
        if isinstance(exponent, Tensor) and exponent.requires_grad:
            raise RelevanceError(
                f"{getattr(func, '__name__', func)} with an exponent on the relevance path "
                "(an exponential) has no LRP rule: only powers of an activation (norms) have one"
            )
        return func(*args, **kwargs).detach()

    return constant


# norms and the pieces norms are built from (x.pow(2).sum().sqrt(), rsqrt(var + eps)): their
# value is a constant scale, as lxt treats the divisor of RMS norm and F.normalize
_NORMS = {
    "torch": ("norm", "pow", "sqrt", "rsqrt", "square", "var", "std", "var_mean", "std_mean"),
    "tensor": ("norm", "pow", "__pow__", "sqrt", "rsqrt", "square", "var", "std"),
    "linalg": ("norm", "vector_norm", "matrix_norm"),
}


def handlers(linear_rule: Epsilon, weights: str = "softmax") -> dict[Any, Callable[..., Any]]:
    """The functions these rules replace (looked up by the function mode); ``linear_rule``: the
    rule of ``F.linear`` outside a ruled module; ``weights``: the rule of the attention weights
    (:data:`ATTENTION`)."""
    constant = weights == "constant"
    found: dict[Any, Callable[..., Any]] = {
        F.linear: partial(linear, rule=linear_rule),
        F.multi_head_attention_forward: partial(
            multi_head_attention, rule=linear_rule, constant=constant
        ),
        F.layer_norm: layer_norm,
        F.group_norm: group_norm,
        F.normalize: normalize,
        F.scaled_dot_product_attention: partial(attention, constant=constant),
    }
    if hasattr(F, "rms_norm"):
        found[F.rms_norm] = rms_norm
    for owner, names in zip((torch, Tensor, torch.linalg), _NORMS.values(), strict=True):
        found.update({f: _constant(f) for n in names if (f := getattr(owner, n, None))})
    # AttnLRP's softmax rule is the softmax's own gradient; CP-LRP's a constant
    found.update({f: _constant(f) if constant else f for f in _SOFTMAXES if f is not None})
    return found


def _additive(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """A boolean mask (``True``: masked) as ``0`` / ``-inf``; a float one as it is."""
    if mask.dtype != torch.bool:
        return mask.detach()
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(mask, -math.inf)


def attention(
    q: Tensor, k: Tensor, v: Tensor, *args: Any, constant: bool = False, **kwargs: Any
) -> Tensor:
    """``F.scaled_dot_product_attention`` with AttnLRP's rules as lxt 2.1's LLaMA patches apply
    them: the gradient of ``q`` and ``k`` quartered and of ``v`` halved (the uniform rule on
    ``q k^T`` and ``attn @ v``). ``constant`` (CP-LRP): ``q`` and ``k`` constants (lxt's
    ``cp_LRP``)."""
    if constant:
        q, k = q.detach(), k.detach()
    else:
        q, k, v = shared(q, 0.25), shared(k, 0.25), shared(v, 0.5)
    return F.scaled_dot_product_attention(q, k, v, *args, **kwargs)


def shared(x: Tensor, share: float) -> Tensor:
    """A copy of ``x`` whose gradient is ``share`` times the incoming one (lxt's
    ``divide_gradient``)."""
    return rescaled(x, x, share, copy=True)


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, *, rule: Epsilon) -> Tensor:
    """``F.linear`` outside a ruled module (inside attention functions) with the Epsilon rule,
    as AttnLRP and lxt treat every linear layer (``lxt.explicit.functional.linear_epsilon``)."""
    if isinstance(weight, Tensor) and not _from_parameters(weight):
        raise RelevanceError(
            "F.linear with a weight computed from the input (a product of two activations) has "
            "no LRP rule: write it as a matmul, which gets AttnLRP's uniform rule"
        )
    return _linear(x, weight, bias, rule)


def _from_parameters(t: Tensor, limit: int = 64) -> bool:
    """Whether ``t``'s graph (at most ``limit`` steps) ends in parameters only, not the input."""
    if not t.requires_grad or isinstance(t, nn.Parameter):
        return True
    seen, todo = 0, [t.grad_fn]
    while todo:
        node = todo.pop()
        seen += 1
        if node is None:
            continue
        if seen > limit or (
            hasattr(node, "variable") and not isinstance(node.variable, nn.Parameter)
        ):
            return False
        todo.extend(next_node for next_node, _ in node.next_functions)
    return True


def _linear(x: Tensor, weight: Tensor, bias: Tensor | None, rule: Epsilon) -> Tensor:
    o = F.linear(x, weight, bias)
    if rule.reuses_output:  # z = w x + b is the output: the layer's own graph, rescaled
        return rule.reused(o)
    layer = Affine(F.linear, weight.detach(), None if bias is None else bias.detach())
    return rule.output(layer, x, o)


_MHA = inspect.signature(F.multi_head_attention_forward)


def multi_head_attention(
    *args: Any, rule: Epsilon, constant: bool = False, **kwargs: Any
) -> tuple[Tensor, Tensor | None]:
    """``F.multi_head_attention_forward`` recomputed from its parts: the projections with the
    Epsilon rule, the attention with AttnLRP's; the values are the fused function's bitwise."""
    out, weights = F.multi_head_attention_forward(*args, **kwargs)
    bound = _MHA.bind(*args, **kwargs)
    bound.apply_defaults()
    a = SimpleNamespace(**bound.arguments)
    unsupported = [
        name
        for name, used in (
            ("bias_k/bias_v", a.bias_k is not None or a.bias_v is not None),
            ("add_zero_attn", a.add_zero_attn),
            ("static_k/static_v", a.static_k is not None or a.static_v is not None),
            ("dropout in training", a.training and a.dropout_p > 0),
            ("unbatched input", a.query.dim() != 3),
        )
        if used
    ]
    if unsupported:
        raise RelevanceError(
            f"torch.nn.functional.multi_head_attention_forward with {', '.join(unsupported)} "
            "has no LRP rule: explain the model in eval mode, batched, without them"
        )
    length, batch, dim = a.query.shape
    separate = (a.q_proj_weight, a.k_proj_weight, a.v_proj_weight)
    weights_qkv = separate if a.use_separate_proj_weight else a.in_proj_weight.chunk(3)
    biases = (None,) * 3 if a.in_proj_bias is None else a.in_proj_bias.chunk(3)

    def heads(t: Tensor, w: Tensor, b: Tensor | None) -> Tensor:  # (L, B, E) -> (B, H, L, d)
        t = _linear(t, w, b, rule)
        return t.reshape(t.shape[0], batch, a.num_heads, -1).permute(1, 2, 0, 3)

    inputs = (a.query, a.key, a.value)
    q, k, v = (heads(t, w, b) for t, w, b in zip(inputs, weights_qkv, biases, strict=True))
    mask = None
    if a.attn_mask is not None:
        mask = _additive(a.attn_mask, q.dtype)
        mask = mask.view(batch, a.num_heads, *mask.shape[-2:]) if mask.dim() == 3 else mask
    if a.key_padding_mask is not None:
        padding = _additive(a.key_padding_mask, q.dtype).view(batch, 1, 1, -1)
        mask = padding if mask is None else mask + padding
    # AttnLRP's rules (constant: the probabilities as constants, CP-LRP)
    with torch.set_grad_enabled(torch.is_grad_enabled() and not constant):
        logits = bilinear((q * (1 / math.sqrt(q.shape[-1]))) @ k.transpose(-2, -1))
        probs = logits.softmax(dim=-1) if mask is None else (logits + mask).softmax(dim=-1)
    mixed = probs @ v if constant else bilinear(probs @ v)
    mixed = mixed.permute(2, 0, 1, 3).reshape(length, batch, dim)
    t = _linear(mixed, a.out_proj_weight, a.out_proj_bias, rule)
    if weights is not None:
        weights = modified_output(weights, probs.mean(1) if a.average_attn_weights else probs)
    return modified_output(out, t), weights


__all__ = [
    "ATTENTION",
    "attention",
    "bilinear",
    "group_norm",
    "handlers",
    "layer_norm",
    "linear",
    "multi_head_attention",
    "normalize",
    "rms_norm",
    "shared",
]

"""AttnLRP's rules for the operations of transformers (Achtibat et al., "AttnLRP:
Attention-Aware Layer-Wise Relevance Propagation for Transformers", ICML 2024).

In camkit's modified gradient ``g = R / A`` (see :mod:`camkit.relevance.rules`):

* **softmax**, ``R_i = x_i (R^out_i - s_i sum_j R^out_j)`` (AttnLRP Prop. 3.1, the Taylor
  decomposition at ``x``): in ``g`` this is ``g_in = s (g - sum_j s_j g_j)``, the softmax's own
  Jacobian, so the plain gradient implements it exactly;
* **matmul and the element-wise product of two activations** (``q k^T``, ``attn @ v``, gates),
  the uniform rule, ``R_A = R_B = 1/2 * A (dy/dA) R / stab(y)`` (AttnLRP Prop. 3.3, with the
  epsilon stabiliser): half the gradient to each factor, so that ``R_A + R_B = R_y``;
* **layer norm** (and RMS norm), the identity rule on the normalisation: the standard deviation
  is taken as a constant, ``y = w (x - mean(x)) / std.detach() + b``, a linear map of ``x``
  (AttnLRP Prop. 3.4; the centring is linear, the bias absorbs its share);
* **GELU, SiLU and the other activations**: the identity rule, :class:`~.rules.Pass`;
* ``F.scaled_dot_product_attention`` (fused attention): computed again from its parts with the
  rules above, the forward value being the fused one bitwise.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from camkit.errors import RelevanceError
from camkit.relevance.rules import modified_output, proportional


def bilinear(o: Tensor, stabilizer: float) -> Tensor:
    """``o = f(a, b)`` bilinear, carrying its graph: each factor gets half of the relevance."""
    return proportional(o, stabilizer, share=0.5)


def layer_norm(
    x: Tensor,
    shape: Any,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,
) -> Tensor:
    """``F.layer_norm`` with the identity rule on the normalisation."""
    dims = tuple(range(-len(tuple(shape) if not isinstance(shape, int) else (shape,)), 0))
    out = F.layer_norm(x, shape, weight, bias, eps)
    mean = x.mean(dim=dims, keepdim=True)
    std = (x.var(dim=dims, keepdim=True, unbiased=False) + eps).sqrt().detach()
    t = (x - mean) / std
    if weight is not None:
        t = t * weight.detach()
    if bias is not None:
        t = t + bias.detach()
    return modified_output(out, t)


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


def handlers(stabilizer: float) -> dict[Any, Callable[..., Tensor]]:
    """The functions these rules replace (looked up by the function mode)."""
    sdpa = lambda *a, **k: attention(*a, **k, stabilizer=stabilizer)  # noqa: E731
    found: dict[Any, Callable[..., Tensor]] = {
        F.layer_norm: layer_norm,
        F.group_norm: group_norm,
        F.normalize: normalize,
        F.scaled_dot_product_attention: sdpa,
    }
    if hasattr(F, "rms_norm"):
        found[F.rms_norm] = rms_norm
    for owner, names in zip((torch, Tensor, torch.linalg), _NORMS.values(), strict=True):
        found.update({f: _constant(f) for n in names if (f := getattr(owner, n, None))})
    return found


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    *,
    stabilizer: float,
) -> Tensor:
    """``F.scaled_dot_product_attention`` (no dropout) recomputed from its parts with the rules."""
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
    )
    if enable_gqa and k.shape[-3] != q.shape[-3]:
        repeat = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(repeat, -3), v.repeat_interleave(repeat, -3)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    logits = bilinear((q * scale) @ k.transpose(-2, -1), stabilizer)
    if is_causal:
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        logits = logits.masked_fill(~keep, float("-inf"))
    if attn_mask is not None:
        mask = attn_mask.detach()
        logits = (
            logits.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else logits + mask
        )
    t = bilinear(logits.softmax(dim=-1) @ v, stabilizer)
    return modified_output(out, t)


__all__ = [
    "attention",
    "bilinear",
    "group_norm",
    "handlers",
    "layer_norm",
    "normalize",
    "rms_norm",
]

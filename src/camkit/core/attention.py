"""Capturing a vision transformer's attention probabilities: a reversible model edit.

The attention methods (:mod:`camkit.attention`) read the post-softmax attention probabilities
``A_l (B, heads, N, N)`` of a ViT's blocks (timm ``Attention`` modules, torchvision
``EncoderBlock.self_attention``). :func:`captured_attention` is the engine's reversible edit
that makes them exist, for the duration of a ``with`` block only, on the same hook handling as
every other capture (:func:`~camkit.core.layers.hooked`: removed in ``finally``):

* timm: the attention's ``fused_attn`` flag is switched off so that the probabilities exist as a
  tensor (the output of its ``attn_drop``, identity in eval mode), then switched back;
* torchvision: ``nn.MultiheadAttention`` is asked for per-head weights (``need_weights=True,
  average_attn_weights=False``) and its output is recomputed from them, so that gradients reach
  the probabilities (the same replay as torchcam 0.5.0); what the block receives is unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from functools import partial
from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from camkit.core.layers import hooked, this_thread
from camkit.errors import AttentionError


def _is_timm_attention(module: nn.Module) -> bool:
    return all(hasattr(module, a) for a in ("qkv", "attn_drop", "fused_attn", "num_heads"))


def attention_blocks(model: nn.Module) -> list[tuple[str, nn.Module, nn.Module]]:
    """``(name, block, attention)`` for every transformer block, in order: timm blocks with an
    ``attn`` child (timm ``Attention``), torchvision blocks with ``self_attention``
    (``nn.MultiheadAttention``, batch-first)."""
    found = []
    for name, module in model.named_modules():
        attn = getattr(module, "attn", None)
        if isinstance(attn, nn.Module) and _is_timm_attention(attn):
            found.append((name, module, attn))
            continue
        attn = getattr(module, "self_attention", None)
        if isinstance(attn, nn.MultiheadAttention):
            if not attn.batch_first or not attn._qkv_same_embed_dim:
                raise AttentionError(f"{name}.self_attention must be batch-first self-attention")
            found.append((name, module, attn))
    if not found:
        raise AttentionError(
            f"{type(model).__name__} has no supported attention blocks (timm Attention with "
            "qkv/attn_drop, or torchvision blocks with an nn.MultiheadAttention self_attention)"
        )
    return found


def _mha_pre(module: nn.MultiheadAttention, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    args = list(args)
    if len(args) > 4:
        args[4] = True
    else:
        kwargs["need_weights"] = True
    if len(args) > 6:
        args[6] = False
    else:
        kwargs["average_attn_weights"] = False
    return tuple(args), kwargs


def _mha_post(store: list, module: nn.MultiheadAttention, args: tuple, kwargs: dict, out: Any):
    """Recompute the attention output from the per-head probabilities (so gradients reach
    them) and return ``(output, None)`` as the block asked (torchvision passes need_weights=False
    and ignores the weights)."""
    weights = out[1]
    value = args[2] if len(args) > 2 else kwargs["value"]
    batch, length, dim = value.shape
    heads = module.num_heads
    bias = None if module.in_proj_bias is None else module.in_proj_bias[2 * dim :]
    v = F.linear(value, module.in_proj_weight[2 * dim :], bias)
    v = v.reshape(batch, length, heads, dim // heads).transpose(1, 2)
    mixed = (weights @ v).transpose(1, 2).reshape(batch, weights.shape[-2], dim)
    store.append(weights)
    return module.out_proj(mixed), None


@contextmanager
def switched(module: nn.Module, attribute: str, value: Any) -> Iterator[None]:
    """Set ``module.attribute`` to ``value`` inside the block, restore it on exit."""
    before = getattr(module, attribute)
    setattr(module, attribute, value)
    try:
        yield
    finally:
        setattr(module, attribute, before)


@contextmanager
def captured_attention(attentions: Sequence[nn.Module]) -> Iterator[list[list[Tensor]]]:
    """Collect each attention module's probabilities ``(B, heads, N, N)`` during the forward
    passes inside; every flag and hook is restored/removed on exit."""
    stores: list[list[Tensor]] = [[] for _ in attentions]

    def handles() -> list:
        registered = []
        for store, attn in zip(stores, attentions, strict=True):
            if isinstance(attn, nn.MultiheadAttention):
                pre = attn.register_forward_pre_hook(this_thread(_mha_pre), with_kwargs=True)
                post = partial(_mha_post, store)
                registered += [
                    pre,
                    attn.register_forward_hook(this_thread(post), with_kwargs=True),
                ]
            else:
                keep = this_thread(lambda module, args, out, store=store: store.append(out))
                registered.append(attn.attn_drop.register_forward_hook(keep))
        return registered

    with ExitStack() as edits:
        for attn in attentions:
            if not isinstance(attn, nn.MultiheadAttention):
                edits.enter_context(switched(attn, "fused_attn", False))
        edits.enter_context(hooked(handles))
        yield stores


__all__ = ["attention_blocks", "captured_attention", "switched"]

"""Capturing a vision transformer's post-softmax attention probabilities ``(B, heads, N, N)``:
:func:`captured_attention`, a reversible model edit for a ``with`` block only:

* timm: ``fused_attn`` switched off, so the probabilities exist (its ``attn_drop``'s output);
* HuggingFace ViT / DeiT / DINOv2: the config's kernel set to ``"eager"`` (SDPA returns none);
* torchvision: ``nn.MultiheadAttention`` asked for per-head weights and its output recomputed
  from them, so that gradients reach them (torchcam 0.5.0's replay); the block's input is
  unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from functools import partial
from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from camkit.core.layers import this_thread
from camkit.errors import AttentionError


def _is_timm_attention(module: nn.Module) -> bool:
    return all(hasattr(module, a) for a in ("qkv", "attn_drop", "fused_attn", "num_heads"))


def _is_hf_attention(module: nn.Module) -> bool:
    """A HuggingFace attention (ViT, DeiT, DINOv2), whose eager kernel returns probabilities."""
    config = getattr(module, "config", None)
    projections = ("q_proj", "k_proj", "v_proj", "o_proj")
    return hasattr(config, "_attn_implementation") and all(hasattr(module, a) for a in projections)


def attention_blocks(model: nn.Module) -> list[tuple[str, nn.Module, nn.Module]]:
    """``(name, block, attention)`` for every transformer block, in order (timm ``attn``,
    HuggingFace ``attention``, torchvision batch-first ``self_attention``). Windowed attention
    (Swin) is refused: its probabilities cover one window each, not the image."""
    found = []
    for name, module in model.named_modules():
        attn = getattr(module, "attn", None)
        if isinstance(attn, nn.Module) and hasattr(attn, "window_size"):
            raise AttentionError(
                f"{name}.attn is windowed attention ({type(attn).__name__}): its probabilities "
                "cover one window, not the image; the attention methods need global "
                "self-attention (ViT, DeiT); use a CAM for this model"
            )
        hf, mha = getattr(module, "attention", None), getattr(module, "self_attention", None)
        if isinstance(attn, nn.Module) and _is_timm_attention(attn):
            found.append((name, module, attn))
        elif isinstance(hf, nn.Module) and _is_hf_attention(hf):
            found.append((name, module, hf))
        elif isinstance(mha, nn.MultiheadAttention):
            if not mha.batch_first or not mha._qkv_same_embed_dim:
                raise AttentionError(f"{name}.self_attention must be batch-first self-attention")
            found.append((name, module, mha))
    if not found:
        raise AttentionError(
            f"{type(model).__name__} has no supported attention blocks (timm Attention with "
            "qkv/attn_drop, torchvision blocks with an nn.MultiheadAttention self_attention, or "
            "HuggingFace ViT / DeiT / DINOv2 layers)"
        )
    return found


def _mha_pre(module: nn.MultiheadAttention, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    args = list(args)
    for index, key, value in ((4, "need_weights", True), (6, "average_attn_weights", False)):
        if len(args) > index:
            args[index] = value
        else:
            kwargs[key] = value
    return tuple(args), kwargs


def _mha_post(store: list, module: nn.MultiheadAttention, args: tuple, kwargs: dict, out: Any):
    """The output recomputed from the per-head probabilities (so gradients reach them)."""
    weights = out[1]
    value = args[2] if len(args) > 2 else kwargs["value"]
    batch, _, dim = value.shape
    bias = None if module.in_proj_bias is None else module.in_proj_bias[2 * dim :]
    v = F.linear(value, module.in_proj_weight[2 * dim :], bias)
    v = v.unflatten(-1, (module.num_heads, -1)).transpose(1, 2)
    mixed = (weights @ v).transpose(1, 2).reshape(batch, weights.shape[-2], dim)
    store.append(weights)
    return module.out_proj(mixed), None


@contextmanager
def switched(module: Any, attribute: str, value: Any) -> Iterator[None]:
    """Set ``module.attribute`` to ``value`` inside the block, restore it on exit."""
    before = getattr(module, attribute)
    setattr(module, attribute, value)
    try:
        yield
    finally:
        setattr(module, attribute, before)


@contextmanager
def unfused_attention(model: nn.Module) -> Iterator[None]:
    """Inside, every timm attention of ``model`` computes its probabilities explicitly
    (``fused_attn`` off): for what a fused kernel cannot do, e.g. a double backward."""
    with ExitStack() as edits:
        for module in model.modules():
            if isinstance(getattr(module, "fused_attn", None), bool):
                edits.enter_context(switched(module, "fused_attn", False))
        yield


@contextmanager
def captured_attention(attentions: Sequence[nn.Module]) -> Iterator[list[list[Tensor]]]:
    """Collect each attention module's probabilities ``(B, heads, N, N)`` during the forward
    passes inside; every flag and hook is restored/removed on exit."""
    stores: list[list[Tensor]] = [[] for _ in attentions]
    with ExitStack() as edits:

        def hook(register: Callable, function: Callable, **options: bool) -> None:
            edits.callback(register(this_thread(function), **options).remove)

        for store, attn in zip(stores, attentions, strict=True):
            if _is_hf_attention(attn):  # SDPA returns none; a shared config is restored last
                edits.enter_context(switched(attn.config, "_attn_implementation", "eager"))
                hook(attn.register_forward_hook, lambda m, a, out, s=store: s.append(out[1]))
            elif isinstance(attn, nn.MultiheadAttention):
                hook(attn.register_forward_pre_hook, _mha_pre, with_kwargs=True)
                hook(attn.register_forward_hook, partial(_mha_post, store), with_kwargs=True)
            else:
                edits.enter_context(switched(attn, "fused_attn", False))
                hook(attn.attn_drop.register_forward_hook, lambda m, a, out, s=store: s.append(out))
        yield stores


__all__ = ["attention_blocks", "captured_attention", "switched", "unfused_attention"]

"""Attention maps for vision transformers: Attention Rollout and LeGrad.

Both read the post-softmax attention probabilities ``A_l (B, heads, N, N)`` of a ViT's blocks
(timm ``Attention`` modules, torchvision ``EncoderBlock.self_attention``), drop the prefix keys
(class, distillation, register tokens) and lay the patch keys out on the patch grid
(:func:`camkit.core.layouts.infer_layout`).

Capture, per family, for the duration of one call only (restored in ``finally``):

* timm: the attention's ``fused_attn`` flag is switched off so that the probabilities exist as a
  tensor (the output of its ``attn_drop``, identity in eval mode), then switched back;
* HuggingFace ViT / DeiT / DINOv2: the config's attention kernel is set to ``"eager"``, whose
  attention returns its probabilities (SDPA returns None), then set back;
* torchvision: ``nn.MultiheadAttention`` is asked for per-head weights (``need_weights=True,
  average_attn_weights=False``) and its output is recomputed from them, so that gradients reach
  the probabilities (the same replay as torchcam 0.5.0); what the block receives is unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from camkit.core.engine import additional_forward_args as extra_args
from camkit.core.engine import over_rows, require_autograd, run_model
from camkit.core.finish import Finishing, drop_axes
from camkit.core.inputs import as_batch, autocast, positive_int
from camkit.core.layers import explained_module, hooked, this_thread
from camkit.core.layouts import infer_layout
from camkit.core.targets import OutputSelector, RowScorer, Target, resolve
from camkit.errors import AttentionError, LayoutError, TargetError
from camkit.registry import register


def _is_timm_attention(module: nn.Module) -> bool:
    return all(hasattr(module, a) for a in ("qkv", "attn_drop", "fused_attn", "num_heads"))


def _is_hf_attention(module: nn.Module) -> bool:
    """A HuggingFace attention (ViT, DeiT, DINOv2): ``q/k/v/o_proj`` and a config naming the
    attention kernel; it returns ``(output, probabilities)`` with the eager kernel."""
    config = getattr(module, "config", None)
    projections = ("q_proj", "k_proj", "v_proj", "o_proj")
    return hasattr(config, "_attn_implementation") and all(hasattr(module, a) for a in projections)


def attention_blocks(model: nn.Module) -> list[tuple[str, nn.Module, nn.Module]]:
    """``(name, block, attention)`` for every transformer block, in order: timm blocks with an
    ``attn`` child (timm ``Attention``), torchvision blocks with ``self_attention``
    (``nn.MultiheadAttention``, batch-first), HuggingFace ViT / DeiT / DINOv2 layers with an
    ``attention`` child."""
    found = []
    for name, module in model.named_modules():
        attn = getattr(module, "attn", None)
        if isinstance(attn, nn.Module) and _is_timm_attention(attn):
            found.append((name, module, attn))
            continue
        attn = getattr(module, "attention", None)
        if isinstance(attn, nn.Module) and _is_hf_attention(attn):
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
            "qkv/attn_drop, torchvision blocks with an nn.MultiheadAttention self_attention, or "
            "HuggingFace ViT / DeiT / DINOv2 layers)"
        )
    return found


def _select_blocks(model: nn.Module, layers: Sequence[str] | None) -> list[tuple[str, nn.Module]]:
    blocks = attention_blocks(model)
    if layers is None:
        return [(name, attn) for name, _, attn in blocks]
    by_name = {name: attn for name, _, attn in blocks}
    missing = [name for name in layers if name not in by_name]
    if missing:
        raise AttentionError(
            f"{missing} are not attention blocks of {type(model).__name__}; "
            f"blocks are {list(by_name)[:3]}...{list(by_name)[-1:]}"
        )
    return [(name, by_name[name]) for name in layers]


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
def captured_attention(
    attentions: Sequence[nn.Module],
) -> Iterator[list[list[Tensor]]]:
    """Collect each attention module's probabilities ``(B, heads, N, N)`` during the forward
    passes inside; every flag and hook is restored/removed on exit."""
    stores: list[list[Tensor]] = [[] for _ in attentions]
    handles = []
    fused = []
    kernels: list[tuple[Any, str]] = []  # HuggingFace configs and their attention kernel
    try:
        for store, attn in zip(stores, attentions, strict=True):
            if _is_hf_attention(attn):
                if all(config is not attn.config for config, _ in kernels):
                    kernels.append((attn.config, attn.config._attn_implementation))
                    attn.config._attn_implementation = "eager"  # SDPA returns no probabilities
                handles.append(
                    attn.register_forward_hook(
                        this_thread(lambda module, args, out, store=store: store.append(out[1]))
                    )
                )
            elif isinstance(attn, nn.MultiheadAttention):
                handles.append(
                    attn.register_forward_pre_hook(this_thread(_mha_pre), with_kwargs=True)
                )
                handles.append(
                    attn.register_forward_hook(
                        this_thread(partial(_mha_post, store)), with_kwargs=True
                    )
                )
            else:
                fused.append((attn, attn.fused_attn))
                attn.fused_attn = False
                handles.append(
                    attn.attn_drop.register_forward_hook(
                        this_thread(lambda module, args, out, store=store: store.append(out))
                    )
                )
        yield stores
    finally:
        for handle in handles:
            handle.remove()
        for attn, flag in fused:
            attn.fused_attn = flag
        for config, kernel in reversed(kernels):
            config._attn_implementation = kernel


def _patch_layout(model: nn.Module, tokens: int, size: tuple[int, int]):
    try:
        return infer_layout((1, tokens, 1), model, size)
    except LayoutError as err:
        raise AttentionError(f"cannot lay the attention's {tokens} keys on a grid: {err}") from None


def rollout(
    attentions: Sequence[Tensor],
    head_fusion: Literal["mean", "max", "min"] = "mean",
    discard_ratio: float = 0.0,
) -> Tensor:
    """Attention rollout (Abnar & Zuidema, ACL 2020, eq. 1): ``R = Â_L ... Â_1`` with
    ``Â_l = 0.5 A_l + 0.5 I`` (residual connection), ``A_l`` fused over heads.

    ``attentions``: ``L`` tensors ``(B, heads, N, N)``; returns ``(B, N, N)``. ``discard_ratio``
    zeroes that fraction of the lowest fused attentions per row before adding the identity (the
    optional filtering of Gildenblat's vit-explain); rows are renormalised to sum to 1.
    """
    if not attentions:
        raise AttentionError("rollout needs at least one attention matrix")
    if not 0 <= discard_ratio < 1:
        raise AttentionError(f"discard_ratio must be in [0, 1), got {discard_ratio}")
    fuse = {"mean": lambda a: a.mean(1), "max": lambda a: a.amax(1), "min": lambda a: a.amin(1)}
    if head_fusion not in fuse:
        raise AttentionError(f'head_fusion must be "mean", "max" or "min", got {head_fusion!r}')
    result = None
    for attention in attentions:
        fused = fuse[head_fusion](attention.float())
        if discard_ratio > 0:
            drop = int(fused.shape[-1] * discard_ratio)
            lowest = fused.topk(drop, dim=-1, largest=False).indices
            fused = fused.scatter(-1, lowest, 0.0)
        eye = torch.eye(fused.shape[-1], device=fused.device)
        mixed = 0.5 * fused + 0.5 * eye
        mixed = mixed / mixed.sum(dim=-1, keepdim=True)
        result = mixed if result is None else mixed @ result
    return result


class AttentionMethod:
    """Base of the attention maps: the blocks read, the per-chunk passes, finishing.

    ``Method(model)(x, target)``: ``(C, H, W) -> (H, W)``, ``(B, C, H, W) -> (B, H, W)``, or
    ``(B, K, H, W)`` for K targets per sample, like every CAM. ``layers``: block names (default
    all blocks); ``output``, ``dtype`` and ``batch_size`` (samples per forward) as for every
    method.
    """

    name: str
    family = "attention"
    needs_layer = False
    needs_gradients = False

    def __init__(
        self,
        model: nn.Module,
        layers: Sequence[str] | None = None,
        *,
        output: OutputSelector = None,
        dtype: torch.dtype | None = None,
        batch_size: int | None = None,
    ):
        self.model = explained_module(model)
        self.blocks = _select_blocks(self.model, layers)
        self.output = output
        self.dtype = dtype
        self.batch_size = positive_int("batch_size", batch_size, optional=True)

    @property
    def layers(self) -> list[str]:
        return [name for name, _ in self.blocks]

    def __call__(
        self,
        x: Tensor,
        target: Target = None,
        *,
        upsample: bool = True,
        normalize: bool = True,
        additional_forward_args: Any = None,
    ) -> Tensor:
        batch, single = as_batch(x, self.model)
        with extra_args(additional_forward_args, batch.shape[0]):
            maps, several = self.maps(batch, target, Finishing(True, upsample, normalize))
        return drop_axes(maps, single, several)

    def maps(
        self, batch: Tensor, target: Target = None, finishing: Finishing | None = None
    ) -> tuple[Tensor, bool]:
        """``(B, C, H, W) ->`` finished maps ``(B, K, H, W)``, and whether K targets were asked."""
        if self.needs_gradients:
            require_autograd(type(self).__name__)
        scorer = resolve(target, batch.shape[0], batch.device, self.output)
        raw, several = over_rows(
            batch, self.batch_size, lambda part, rows: self.relevance(part, scorer, rows)
        )
        size = tuple(batch.shape[-2:])
        grids = torch.stack([self._grid(raw[:, k], size) for k in range(raw.shape[1])], dim=1)
        return (finishing or Finishing())({"attention": grids}, size), several

    def heatmaps(self, batch: Tensor, target: Target) -> tuple[Tensor, Tensor]:
        """``(heat (B, K, H, W) in [0, 1], the same)`` for display."""
        maps, _ = self.maps(batch, target)
        return maps, maps

    def relevance(self, batch: Tensor, scorer: RowScorer, rows: Tensor) -> tuple[Tensor, bool]:
        """``(B, K, N)`` relevance of the ``N`` keys for the targets, and ``several``."""
        raise NotImplementedError

    def _grid(self, relevance: Tensor, size: tuple[int, int]) -> Tensor:
        """``(B, N)`` key relevances -> ``(B, h, w)`` patch maps (prefix keys dropped)."""
        layout = _patch_layout(self.model, relevance.shape[-1], size)
        return layout.to_grid(relevance[..., None])[:, 0]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(layers={self.layers})"


@register("rollout", "Abnar & Zuidema, ACL 2020")
class AttentionRollout(AttentionMethod):
    """Attention Rollout (Abnar & Zuidema, "Quantifying Attention Flow in Transformers", ACL
    2020): the class token's row of the rolled-out attention (:func:`rollout`), over the patch
    keys. Class-agnostic: the map is the same for every target (repeated along the target
    axis). Models without a class token use the mean over all query rows.
    """

    def __init__(
        self,
        model: nn.Module,
        layers: Sequence[str] | None = None,
        *,
        head_fusion: Literal["mean", "max", "min"] = "mean",
        discard_ratio: float = 0.0,
        **options: Any,
    ):
        super().__init__(model, layers, **options)
        rollout([torch.ones(1, 1, 2, 2)], head_fusion, discard_ratio)  # validates the options
        self.head_fusion = head_fusion
        self.discard_ratio = discard_ratio

    def relevance(self, batch: Tensor, scorer: RowScorer, rows: Tensor) -> tuple[Tensor, bool]:
        with (
            torch.no_grad(),
            autocast(batch.device, self.dtype),
            captured_attention([a for _, a in self.blocks]) as stores,
        ):
            output = run_model(self.model, batch, rows)
            scores, several = scorer(output, rows)  # checks the target, gives K
        attentions = [_last(store, name) for store, name in zip(stores, self.layers, strict=True)]
        rolled = rollout(attentions, self.head_fusion, self.discard_ratio)
        layout = _patch_layout(self.model, rolled.shape[-1], tuple(batch.shape[-2:]))
        keys = rolled[:, 0] if layout.prefix else rolled.mean(1)
        return keys[:, None].expand(-1, scores.shape[1], -1), several


def _last(store: list[Tensor], name: str) -> Tensor:
    if not store:
        raise AttentionError(f"the attention of block {name!r} did not run during the forward")
    return store[-1]


def default_projection(model: nn.Module) -> Callable[[Tensor], Tensor]:
    """Block tokens ``(B, N, C)`` -> class logits ``(B, classes)``: the mean token through the
    model's final norm and head, as in the LeGrad authors' code and torchcam 0.5.0.

    timm: ``head(fc_norm(norm(mean)))``; torchvision: ``heads(encoder.ln(mean))``; HuggingFace
    ViT / DeiT: ``classifier(layernorm(mean))``; DINOv2, whose classifier reads the class token
    and the mean patch token side by side: ``classifier([norm(t)_0, mean_i>0 norm(t)_i])``.
    """
    if all(hasattr(model, a) for a in ("norm", "fc_norm", "head")):
        return lambda tokens: model.head(model.fc_norm(model.norm(tokens.mean(1))))
    base = getattr(model, getattr(model, "base_model_prefix", "") or "_", None)
    norm, head = getattr(base, "layernorm", None), getattr(model, "classifier", None)
    if isinstance(norm, nn.LayerNorm) and isinstance(head, nn.Linear):
        width = norm.normalized_shape[-1]
        if head.in_features == width:
            return lambda tokens: head(norm(tokens.mean(1)))
        if head.in_features == 2 * width:
            return lambda tokens: head(_class_and_patches(norm(tokens)))
    encoder = getattr(model, "encoder", None)
    if isinstance(getattr(encoder, "ln", None), nn.Module) and hasattr(model, "heads"):
        return lambda tokens: model.heads(encoder.ln(tokens.mean(1)))
    raise AttentionError(
        f"no default score projection for {type(model).__name__}: pass score_projection= a "
        "function (B, N, C) tokens -> (B, classes) logits"
    )


def _class_and_patches(tokens: Tensor) -> Tensor:
    return torch.cat([tokens[:, 0], tokens[:, 1:].mean(1)], dim=1)


@register("legrad", "Bousselham et al., 2024")
class LeGrad(AttentionMethod):
    """LeGrad (Bousselham et al., "LeGrad: An Explainability Method for Vision Transformers via
    Feature Formation Sensitivity", 2024).

    For each block ``l``: the block's tokens go through the score projection to logits ``s^l``;
    the map is ``mean_{heads, queries} relu(d s^l_c / d A_l)`` over the patch keys; the maps of
    the blocks are averaged (paper eq. 5-7; the attention values are not multiplied in).
    ``target``: None (each sample's top class of the model's output), an int, ``B`` ints, or
    ``(B, K)`` classes; the per-block scores are class logits, so a callable target is refused.
    ``score_projection``: block tokens ``(B, N, C)`` -> logits (default
    :func:`default_projection`).
    """

    needs_gradients = True

    def __init__(
        self,
        model: nn.Module,
        layers: Sequence[str] | None = None,
        *,
        score_projection: Callable[[Tensor], Tensor] | None = None,
        **options: Any,
    ):
        super().__init__(model, layers, **options)
        self.score_projection = score_projection or default_projection(model)
        modules = dict(model.named_modules())
        self._block_modules = [modules[name] for name in self.layers]

    def relevance(self, batch: Tensor, scorer: RowScorer, rows: Tensor) -> tuple[Tensor, bool]:
        if scorer.function is not None:
            raise TargetError(
                "LeGrad explains classes (its per-block scores are class logits): target must "
                "be None, an int, B ints or (B, K) classes"
            )
        outputs: list[list[Tensor]] = [[] for _ in self.blocks]

        def keep(store: list[Tensor]) -> Callable:
            return lambda module, args, out: store.append(out)

        hooks = zip(outputs, self._block_modules, strict=True)
        with (
            hooked(
                lambda: [
                    block.register_forward_hook(this_thread(keep(store))) for store, block in hooks
                ]
            ),
            torch.enable_grad(),
            autocast(batch.device, self.dtype),
            captured_attention([a for _, a in self.blocks]) as stores,
        ):
            # the input requires grad so that the attentions are in a graph even when no
            # parameter requires it; only torch.autograd.grad is used: no .grad is left
            output = run_model(self.model, batch.detach().requires_grad_(True), rows)
            scorer = scorer.pinned(output)
            classes = scorer.classes[rows.to(scorer.classes.device)].to(batch.device)
            scorer(output, rows)  # checks the class range
            relevances = []
            last = len(self.layers) * classes.shape[1] - 1
            for i, (name, store, tokens) in enumerate(
                zip(self.layers, stores, outputs, strict=True)
            ):
                attention, block_out = _last(store, name), _last(tokens, name)
                scores = self.score_projection(block_out)
                if scores.ndim != 2 or scores.shape[0] != batch.shape[0]:
                    raise AttentionError(
                        f"score_projection must return (B, classes), got {tuple(scores.shape)}"
                    )
                per_target = []
                for k in range(classes.shape[1]):
                    selected = scores.gather(1, classes[:, k : k + 1]).sum()
                    retain = i * classes.shape[1] + k < last
                    (grad,) = torch.autograd.grad(selected, attention, retain_graph=retain)
                    per_target.append(grad.float().relu().mean(dim=(1, 2)))
                relevances.append(torch.stack(per_target, dim=1))  # (B, K, N)
        return torch.stack(relevances).mean(0), scorer.several


__all__ = [
    "AttentionError",
    "AttentionMethod",
    "AttentionRollout",
    "LeGrad",
    "attention_blocks",
    "captured_attention",
    "default_projection",
    "rollout",
]

"""Attention maps for vision transformers, Attention Rollout and LeGrad, from the post-softmax
attention probabilities ``A_l (B, heads, N, N)`` of a ViT's blocks
(:func:`camkit.core.attention.captured_attention`), the patch keys laid out on the patch grid.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch
from torch import Tensor, nn

from camkit.core.attention import attention_blocks, captured_attention
from camkit.core.call import Call
from camkit.core.engine import over_rows
from camkit.core.explainer import Explainer, Explanation
from camkit.core.finish import Finishing
from camkit.core.formats import autocast
from camkit.core.layers import explained_module, hooked, this_thread
from camkit.core.layouts import infer_layout
from camkit.errors import AttentionError, LayoutError, TargetError
from camkit.registry import register
from camkit.targets.resolver import RowScorer


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
    ``Â_l = 0.5 A_l + 0.5 I`` (residual connection), ``A_l`` fused over heads, rows
    renormalised: ``L`` tensors ``(B, heads, N, N) -> (B, N, N)``. ``discard_ratio`` zeroes that
    fraction of the lowest fused attentions per row first (Gildenblat's vit-explain).
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
        mixed = 0.5 * fused + 0.5 * torch.eye(fused.shape[-1], device=fused.device)
        mixed = mixed / mixed.sum(dim=-1, keepdim=True)
        result = mixed if result is None else mixed @ result
    return result


class AttentionMethod(Explainer):
    """Base of the attention maps: ``Method(model, layer=None)(x, target)``, shaped as every
    CAM's. ``layer``: the attention blocks read (names; default all). Call options:
    ``upsample``, ``normalize``.
    """

    family = "attention"
    needs_gradients = False

    def __init__(self, model: nn.Module, layer: Sequence[str] | None = None, **options: Any):
        super().__init__(model, **options)
        by_name = {name: attn for name, _, attn in attention_blocks(self.model)}
        layers = list(by_name) if layer is None else [layer] if isinstance(layer, str) else layer
        missing = [name for name in layers if name not in by_name]
        if missing:
            raise AttentionError(
                f"{missing} are not attention blocks of {type(self.model).__name__}; "
                f"blocks are {list(by_name)[:3]}...{list(by_name)[-1:]}"
            )
        self.blocks = [(name, by_name[name]) for name in layers]

    @classmethod
    def takes_layer(cls) -> bool:
        return True

    @classmethod
    def fits(cls, model: nn.Module) -> str | None:
        try:
            found = attention_blocks(explained_module(model))
        except AttentionError as error:
            found, why = [], str(error)
        else:
            why = "no attention blocks"
        return None if found else f"an attention method: only for vision transformers ({why})"

    @property
    def layers(self) -> list[str]:
        return [name for name, _ in self.blocks]

    def _explain(
        self, call: Call, scorer: RowScorer, *, upsample: bool = True, normalize: bool = True
    ) -> Explanation:
        batch, finishing = call.batch, Finishing(True, upsample, normalize)
        raw = over_rows(
            batch, self.batch_size, lambda part, rows: self._keys(part, call, scorer, rows)
        )
        size = tuple(batch.shape[-2:])
        layout = _patch_layout(self.model, raw.shape[-1], size)  # prefix keys dropped
        grids = torch.stack(
            [layout.to_grid(raw[:, k, :, None])[:, 0] for k in range(raw.shape[1])], 1
        )
        return Explanation.of(finishing({"attention": grids}, size), scorer)

    def _keys(self, batch: Tensor, call: Call, scorer: RowScorer, rows: Tensor) -> Tensor:
        """The method's step: ``(B, K, N)`` relevance of the ``N`` keys for the targets."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(layers={self.layers})"


@register("rollout", "Abnar & Zuidema, ACL 2020")
class AttentionRollout(AttentionMethod):
    """Attention Rollout (Abnar & Zuidema, "Quantifying Attention Flow in Transformers", ACL
    2020): the class token's row of the rolled-out attention (:func:`rollout`; without a class
    token the mean row) over the patch keys, the same for every target.
    """

    target_free = True

    def __init__(
        self,
        model: nn.Module,
        layer: Sequence[str] | None = None,
        *,
        head_fusion: Literal["mean", "max", "min"] = "mean",
        discard_ratio: float = 0.0,
        **options: Any,
    ):
        super().__init__(model, layer, **options)
        rollout([torch.ones(1, 1, 2, 2)], head_fusion, discard_ratio)  # validates the options
        self.head_fusion, self.discard_ratio = head_fusion, discard_ratio

    def _keys(self, batch: Tensor, call: Call, scorer: RowScorer, rows: Tensor) -> Tensor:
        with (
            torch.no_grad(),
            autocast(batch.device, self.dtype),
            captured_attention([a for _, a in self.blocks]) as stores,
        ):
            output = call.forward(self.model, batch, rows)
            scores = scorer(output, rows)  # checks the target, gives K
        attentions = [
            _last(store, name, batch.shape[0])
            for store, name in zip(stores, self.layers, strict=True)
        ]
        counts = {a.shape[-1] for a in attentions}
        if len(counts) > 1:
            raise AttentionError(
                f"the blocks' attentions cover different token counts {sorted(counts)} (a "
                "hierarchical transformer that merges tokens between stages): rollout multiplies "
                "them and needs one count; pass layer= the blocks of one stage"
            )
        rolled = rollout(attentions, self.head_fusion, self.discard_ratio)
        layout = _patch_layout(self.model, rolled.shape[-1], tuple(batch.shape[-2:]))
        keys = rolled[:, 0] if layout.prefix else rolled.mean(1)
        return keys[:, None].expand(-1, scores.shape[1], -1)


def _last(store: list[Tensor], name: str, batch: int | None = None) -> Tensor:
    """The block's last captured tensor, checked as ``(batch, heads, N, N)`` with ``batch``."""
    if not store:
        raise AttentionError(f"the attention of block {name!r} did not run during the forward")
    found = store[-1]
    if batch is not None and (
        found.ndim != 4 or found.shape[0] != batch or found.shape[-1] != found.shape[-2]
    ):
        raise AttentionError(
            f"the attention of block {name!r} has shape {tuple(found.shape)}, not (B, heads, N, "
            f"N) for the {batch} image(s): windowed or local attention (Swin, MaxViT, MobileViT "
            "fold windows or patches into the first axis) has no image-wide attention to roll "
            "out; use a gradient CAM on the block's output instead, e.g. camkit.GradCAM(model)"
        )
    return found


def default_projection(model: nn.Module) -> Callable[[Tensor], Tensor]:
    """Block tokens ``(B, N, C)`` -> class logits ``(B, classes)``: the mean token through the
    model's final norm and head (the LeGrad authors' code, torchcam 0.5.0) for timm,
    torchvision and HuggingFace ViTs; DINOv2's reads ``[norm(t)_0, mean_i>0 norm(t)_i]``."""
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

    Block ``l``'s tokens through ``score_projection`` (default :func:`default_projection`) give
    logits ``s^l``; the map is ``mean_{l, heads, queries} relu(d s^l_c / d A_l)`` over the patch
    keys (eq. 5-7). Class targets only.
    """

    needs_gradients = True

    def __init__(
        self,
        model: nn.Module,
        layer: Sequence[str] | None = None,
        *,
        score_projection: Callable[[Tensor], Tensor] | None = None,
        **options: Any,
    ):
        super().__init__(model, layer, **options)
        self.score_projection = score_projection or default_projection(self.model)
        self._block_modules = [self.model.get_submodule(name) for name in self.layers]

    def _keys(self, batch: Tensor, call: Call, scorer: RowScorer, rows: Tensor) -> Tensor:
        if not scorer.has_classes:
            raise TargetError(
                "LeGrad explains classes (its per-block scores are class logits): target must "
                "be None, an int, B ints or (B, K) classes"
            )
        outputs: list[list[Tensor]] = [[] for _ in self.blocks]

        def keep(store: list[Tensor]) -> Callable:
            return this_thread(lambda module, args, out: store.append(out))

        hooks = zip(outputs, self._block_modules, strict=True)
        with (
            hooked(lambda: [block.register_forward_hook(keep(store)) for store, block in hooks]),
            torch.enable_grad(),
            autocast(batch.device, self.dtype),
            captured_attention([a for _, a in self.blocks]) as stores,
        ):
            # the input requires grad so that the attentions are in a graph even when no
            # parameter requires it; only torch.autograd.grad is used: no .grad is left
            output = call.forward(self.model, batch.detach().requires_grad_(True), rows)
            classes = scorer.classes_of(output, rows).to(batch.device)  # range checked
            relevances = []
            last = len(self.layers) * classes.shape[1] - 1
            for i, (name, store, tokens) in enumerate(
                zip(self.layers, stores, outputs, strict=True)
            ):
                attention, block_out = _last(store, name, batch.shape[0]), _last(tokens, name)
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
        return torch.stack(relevances).mean(0)


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

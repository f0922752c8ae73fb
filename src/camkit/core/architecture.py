"""What a model's architecture says about its layers' layouts: prefix tokens, patch size and
grid, channel counts, and the layer to explain in a transformer."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass

from torch import Tensor, nn

from camkit.core.spacetime import default_video_layer, folded_frames

# attributes that hold tokens prepended to the patch tokens (timm, torchvision, HuggingFace);
# ``mask_token`` is deliberately absent: it replaces patch tokens, it is not prepended
_PREFIX_ATTRIBUTES = (
    "cls_token",
    "class_token",
    "dist_token",
    "distillation_token",
    "reg_token",
    "register_tokens",
    "class_embedding",  # HuggingFace CLIP: one (C,) vector
)
# attributes that hold tokens appended after the patch tokens: HuggingFace YOLOS
# ``detection_tokens``, the YOLOS authors' ``det_token`` (Fang et al., NeurIPS 2021)
_SUFFIX_ATTRIBUTES = ("detection_tokens", "det_token")
# last name component of the first normalisation in a transformer block, per family:
# timm ViT/DeiT/Eva/Swin and torchvision Swin ``norm1``, torchvision ViT ``ln_1``, HuggingFace
# ViT/DeiT ``layernorm_before``, HuggingFace CLIP ``layer_norm1``
_BLOCK_NORM_NAMES = ("norm1", "ln_1", "layernorm_before", "layer_norm1")
# the list of a vision tower's encoder layers: CLIP, SigLIP ``encoder.layers``; InternVL's
# ``encoder.layer``; Qwen2-VL's ``blocks``
_ENCODER_LISTS = ("layers", "layer", "blocks")
# a vision config's fields that say its images come as flattened patches (Qwen2-VL)
_PATCH_ROW_FIELDS = ("patch_size", "temporal_patch_size", "spatial_merge_size")


def _count(value: object) -> bool:
    """Whether ``value`` is an int > 0 (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _pair(value: object) -> tuple[int, int] | None:
    if _count(value):
        return value, value
    if isinstance(value, Sequence) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return int(value[0]), int(value[1])
    return None


def prefix_tokens(model: nn.Module | None) -> tuple[int, str] | None:
    """``(count, source)`` of the tokens a transformer prepends to its patch tokens, or None:
    timm's ``num_prefix_tokens``, else the first module's token parameters
    (``_PREFIX_ATTRIBUTES``)."""
    if model is None:
        return None
    for name, module in model.named_modules():
        count = getattr(module, "num_prefix_tokens", None)
        if isinstance(count, int) and not isinstance(count, bool):
            return count, f"{name + '.' if name else ''}num_prefix_tokens"
    return _token_attributes(model, _PREFIX_ATTRIBUTES)


def suffix_tokens(model: nn.Module | None) -> tuple[int, str] | None:
    """``(count, source)`` of the tokens a transformer appends after its patch tokens, or None:
    YOLOS's token parameters, else a ``config.num_detection_tokens``."""
    if model is None:
        return None
    found = _token_attributes(model, _SUFFIX_ATTRIBUTES)
    if found is not None:
        return found
    for name, module in model.named_modules():
        count = getattr(getattr(module, "config", None), "num_detection_tokens", None)
        if _count(count):
            return count, f"{name + '.' if name else ''}config.num_detection_tokens"
    return None


def _token_attributes(model: nn.Module, attributes: Sequence[str]) -> tuple[int, str] | None:
    """The tokens of the first module with any of ``attributes`` (``(1, n, C)``: ``n``, else 1)."""
    for name, module in model.named_modules():
        found = []
        for attr in attributes:
            token = getattr(module, attr, None)
            if isinstance(token, Tensor) and token.ndim >= 1:
                found.append((attr, token.shape[-2] if token.ndim == 3 else 1))
        if found:
            where = ", ".join(f"{attr} x{n}" for attr, n in found)
            return sum(n for _, n in found), f"{name or 'model'}: {where}"
    return None


def first_conv(model: nn.Module) -> nn.Module | None:
    """The model's first convolution (in registration order), or None."""
    return next((m for m in model.modules() if isinstance(m, nn.modules.conv._ConvNd)), None)


def patch_size(model: nn.Module | None) -> tuple[int, int] | None:
    """The patch size ``(ph, pw)``: timm ``patch_embed.patch_size``, torchvision ``patch_size``,
    HuggingFace ``config.patch_size`` (or any submodule's ``patch_size``), else None."""
    if model is None:
        return None
    first = (getattr(model, "patch_embed", None), model, getattr(model, "config", None))
    found = (_pair(getattr(m, "patch_size", None)) for m in (*first, *model.modules()))
    return next(filter(None, found), None)


def patch_grid(model: nn.Module | None, size: tuple[int, int]) -> tuple[int, int] | None:
    """The patch grid for an input ``(H, W)``: timm's ``patch_embed.dynamic_feat_size`` (it
    knows dynamic padding), else ``(H // ph, W // pw)``; None without a patch size."""
    embed = getattr(model, "patch_embed", None)
    feat_size = getattr(embed, "dynamic_feat_size", None)
    if callable(feat_size):
        with suppress(Exception):  # an unexpected signature: the plain rule below
            grid = _pair(tuple(feat_size(size)))
            if grid:
                return grid
    patch = patch_size(model)
    return None if patch is None else (size[0] // patch[0], size[1] // patch[1])


def channel_counts(model: nn.Module | None) -> tuple[set[int], set[int]]:
    """``(channels-first counts, channels-last counts)`` of the model's modules: convolutions,
    batch/group/instance norms and ``*2d`` layer norms (timm ``LayerNorm2d``); other
    ``nn.LayerNorm`` s and ``nn.Linear``."""
    first: set[int] = set()
    last: set[int] = set()
    for module in model.modules() if model is not None else ():
        if isinstance(module, nn.modules.conv._ConvNd):
            first.update((module.in_channels, module.out_channels))
        elif isinstance(
            module, nn.modules.batchnorm._BatchNorm | nn.modules.instancenorm._InstanceNorm
        ):
            first.add(module.num_features)
        elif isinstance(module, nn.GroupNorm):
            first.add(module.num_channels)
        elif isinstance(module, nn.LayerNorm) and module.normalized_shape:
            target = first if type(module).__name__.lower().endswith("2d") else last
            target.add(module.normalized_shape[-1])
        elif isinstance(module, nn.Linear):
            last.update((module.in_features, module.out_features))
    return first, last


def has_last_axis_norm(model: nn.Module | None) -> bool:
    return model is not None and any(
        isinstance(m, nn.LayerNorm) and not type(m).__name__.lower().endswith("2d")
        for m in model.modules()
    )


@dataclass(frozen=True)
class PatchRows:
    """How a model that reads its images as flattened patches (Qwen2-VL: ``pixel_values``
    ``(sum of t * h * w, C * t * p * p)`` and ``image_grid_thw``) lays them out, from its vision
    config: ``patch`` pixels a side, ``temporal`` frames per patch, ``merge`` x ``merge``
    patches per token after the vision blocks (patches ordered window by window)."""

    patch: int
    temporal: int
    merge: int
    channels: int

    def grid(self, size: Sequence[int]) -> tuple[int, int]:
        """The ``(h, w)`` patch grid of an ``(H, W)`` image."""
        return size[-2] // self.patch, size[-1] // self.patch


def patch_rows(model: nn.Module | None) -> PatchRows | None:
    """:class:`PatchRows` of a model whose vision config names ``patch_size``,
    ``temporal_patch_size`` and ``spatial_merge_size`` (Qwen2-VL and its kin), else None."""
    for module in model.modules() if model is not None else ():
        config = getattr(module, "config", None)
        vision = getattr(config, "vision_config", config)
        values = [getattr(vision, f, None) for f in _PATCH_ROW_FIELDS]
        if all(map(_count, values)):
            channels = getattr(vision, "in_channels", getattr(vision, "num_channels", 3))
            return PatchRows(*values, channels=int(channels))
    return None


@dataclass(frozen=True)
class Tiles:
    """How a model that splits its images into tiles (LLaVA-NeXt's anyres, Liu et al. 2024)
    reads them, from its config: an image at one of the ``pinpoints`` resolutions is read as
    views, the image resized to ``side``, then its ``side`` x ``side`` tiles row by row."""

    side: int
    pinpoints: tuple[tuple[int, int], ...]

    def grid(self, size: Sequence[int]) -> tuple[int, int] | None:
        """The ``(rows, columns)`` of tiles of an ``(H, W)`` image at a pinpoint, else None."""
        height, width = int(size[-2]), int(size[-1])
        if (height, width) not in self.pinpoints:
            return None
        return height // self.side, width // self.side


def image_tiles(model: nn.Module | None) -> Tiles | None:
    """:class:`Tiles` of a model whose config names ``image_grid_pinpoints`` and a square
    vision ``image_size``, else None."""
    for module in model.modules() if model is not None else ():
        config = getattr(module, "config", None)
        pinpoints = getattr(config, "image_grid_pinpoints", None)
        side = getattr(getattr(config, "vision_config", None), "image_size", None)
        if pinpoints and isinstance(side, int) and not isinstance(side, bool):
            return Tiles(side, tuple((int(h), int(w)) for h, w in pinpoints))
    return None


def folded_rows(model: nn.Module | None, input_shape: tuple[int, ...]) -> int | None:
    """How many rows per input a model folds into the first axis of its layers, or None: a
    frame-wise model's frames, a flattened-patch model's patches, a tiling model's views."""
    frames = folded_frames(model, input_shape)
    if frames is not None or len(input_shape) != 4:
        return frames
    rows, tiles = patch_rows(model), image_tiles(model)
    if rows is not None:
        return math.prod(rows.grid(input_shape))
    grid = tiles.grid(input_shape) if tiles is not None else None
    return None if grid is None else 1 + math.prod(grid)


def default_token_layer(model: nn.Module, ran: Callable[[str], bool] | None = None) -> str | None:
    """The layer to explain in a transformer: the first normalisation of its last block
    (``_BLOCK_NORM_NAMES``), whose output feeds the last attention, so every patch token
    reaches the score (pytorch-grad-cam's advice); a video transformer's
    :func:`~camkit.core.spacetime.default_video_layer`; None without such blocks (CNNs).
    ``ran``: which module names ran in the explained forward (OpenCLIP's text tower does not).
    """
    norms = [
        name
        for name, module in model.named_modules()
        if isinstance(module, nn.LayerNorm)
        and name.rsplit(".", 1)[-1] in _BLOCK_NORM_NAMES
        and (ran is None or ran(name))
    ]
    return default_video_layer(model) or (norms[-1] if norms else None)


def vision_feature_layer(model: nn.Module) -> str | None:
    """Where a generative vision-language model's vision features leave its vision tower
    (a ``vision_tower``, or Qwen2-VL's ``visual`` with its ``merger``) for the projector, or
    None for other models.

    With a ``config.vision_feature_layer`` (LLaVA): the projector reads ``hidden_states[i]``,
    the output of encoder layer ``i - 1`` (``hidden_states[0]`` is the embedding; of a list,
    the deepest). Without (PaliGemma, Qwen2-VL): the tower's ``post_layernorm``, else its last
    encoder layer.
    """
    towers = [
        (name, m)
        for name, m in model.named_modules()
        if name.endswith("vision_tower") or (name.endswith("visual") and hasattr(m, "merger"))
    ]
    if not towers:
        return None
    prefix, module = towers[0]
    encoders = [
        (name, m)
        for name, m in module.named_modules()
        if name.rsplit(".", 1)[-1] in _ENCODER_LISTS and isinstance(m, nn.ModuleList) and len(m)
    ]
    if not encoders:
        return None
    blocks, layers = f"{prefix}.{encoders[0][0]}", encoders[0][1]
    index = _feature_index(model)
    if index is None:
        norms = [n for n, _ in module.named_modules() if n.endswith("post_layernorm")]
        if norms:  # the tower's own, else the one inside its wrapper (vision_model.post_layernorm)
            return f"{prefix}.{'post_layernorm' if 'post_layernorm' in norms else norms[0]}"
        return f"{blocks}.{len(layers) - 1}"
    states = len(layers) + 1
    index = index % states if -states <= index < states else None
    return None if not index else f"{blocks}.{index - 1}"


def _feature_index(model: nn.Module) -> int | None:
    """The first ``config.vision_feature_layer`` (the deepest of a list), or None."""
    configs = (getattr(m, "config", None) for m in model.modules())
    value = next(
        (c.vision_feature_layer for c in configs if hasattr(c, "vision_feature_layer")), None
    )
    if isinstance(value, Sequence) and value and all(isinstance(v, int) for v in value):
        return max(value, key=lambda v: v if v >= 0 else 10**6 + v)
    return value if isinstance(value, int) and not isinstance(value, bool) else None

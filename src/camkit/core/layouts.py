"""Reading a layer's output as a spatial grid: CNN maps, 3-D volumes, ViT tokens, channels-last.

A CAM needs activations ``(B, C, h, w)`` (or ``(B, C, d, h, w)`` for volumes). Transformers give
other layouts, and pytorch-grad-cam / torchcam make the user write the conversion by hand
(``reshape_transform`` with a hard-coded 14x14 grid). :func:`infer_layout` decides it from the
layer's output shape, the model's attributes and the input size:

* ``"grid"`` ``(B, C, h, w)`` and ``"volume"`` ``(B, C, d, h, w)``: used as they are;
* ``"tokens"`` ``(B, N, C)`` with ``N = prefix + h * w`` (ViT, DeiT, DINOv2 with registers,
  HuggingFace hidden states): the prefix tokens (class, distillation, register) are dropped and
  the patch tokens laid out row-major on the ``(h, w)`` patch grid, as the patch embedding
  flattens them (Dosovitskiy et al., ICLR 2021);
* ``"channels_last"`` ``(B, h, w, C)`` (Swin blocks, Liu et al., ICCV 2021; ConvNeXt blocks
  with a linear MLP, Liu et al., CVPR 2022; torchvision ``swin_t``): channels moved to axis 1.

How a 4-D (or 5-D) output is told apart from its channels-last reading: the spatial axes of the
right reading are the input's axes divided by one common stride (each within one pixel, equal
axes for equal input axes); when both or neither readings fit, the model's channel counts
decide (channels-first modules: convolutions and batch/group norms; channels-last modules:
``nn.LayerNorm`` over the last axis and ``nn.Linear``). A case still undecided raises
:class:`LayoutError` naming every candidate. The one exception is a model without any
``nn.LayerNorm``: PyTorch's channels-first convention is then taken, since nothing in such a
model can produce channels-last activations without a permute that it does not have.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from torch import Tensor, nn

from camkit.errors import ArgumentError, LayoutError

Kind = Literal["grid", "volume", "tokens", "channels_last"]
Reshape = Callable[[Tensor], Tensor]

#: token counts tried as "prefix" when neither the model nor the patch size tells it
MAX_GUESSED_PREFIX = 16

# attributes that hold tokens prepended to the patch tokens (timm, torchvision, HuggingFace);
# ``mask_token`` is deliberately absent: it replaces patch tokens, it is not prepended
_PREFIX_ATTRIBUTES = (
    "cls_token",
    "class_token",
    "dist_token",
    "distillation_token",
    "reg_token",
    "register_tokens",
)
_CHANNELS_FIRST_MODULES = (
    nn.modules.conv._ConvNd,
    nn.modules.batchnorm._BatchNorm,
    nn.GroupNorm,
    nn.modules.instancenorm._InstanceNorm,
)
# last name component of the first normalisation in a transformer block, per family:
# timm ViT/DeiT/Eva/Swin and torchvision Swin ``norm1``, torchvision ViT ``ln_1``, HuggingFace
# ViT/DeiT ``layernorm_before``, HuggingFace CLIP ``layer_norm1``
_BLOCK_NORM_NAMES = ("norm1", "ln_1", "layernorm_before", "layer_norm1")


@dataclass(frozen=True)
class Layout:
    """How to read a layer output as a grid; ``to_grid`` (or calling it) does the conversion.

    Attributes:
        kind: ``"grid"`` ``(B, C, h, w)``, ``"volume"`` ``(B, C, d, h, w)``, ``"tokens"``
            ``(B, prefix + h*w, C)`` or ``"channels_last"`` ``(B, h, w, C)`` / ``(B, d, h, w, C)``.
        grid: the spatial size ``(h, w)`` or ``(d, h, w)``.
        channels: ``C``.
        prefix: tokens before the patch tokens (class, distillation, registers), dropped.
        reason: how the layout was decided (for ``str``; not part of equality).
    """

    kind: Kind
    grid: tuple[int, ...]
    channels: int
    prefix: int = 0
    reason: str = field(default="", compare=False)

    @property
    def shape(self) -> tuple[int, ...]:
        """The layer output's shape without the batch axis."""
        if self.kind == "tokens":
            return (self.prefix + math.prod(self.grid), self.channels)
        if self.kind == "channels_last":
            return (*self.grid, self.channels)
        return (self.channels, *self.grid)

    def to_grid(self, t: Tensor) -> Tensor:
        """``(B, *self.shape) -> (B, C, h, w)`` (or ``(B, C, d, h, w)`` for volumes); a view when
        possible. Raises :class:`LayoutError` when ``t`` does not have this layout."""
        if not isinstance(t, Tensor) or tuple(t.shape[1:]) != self.shape:
            got = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
            raise LayoutError(
                f"expected a layer output of shape (B, {_dims(self.shape)}), got {got}"
            )
        if self.kind == "tokens":
            patches = t[:, self.prefix :]
            return patches.unflatten(1, self.grid).movedim(-1, 1)
        if self.kind == "channels_last":
            return t.movedim(-1, 1)
        return t

    __call__ = to_grid

    def __str__(self) -> str:
        grid = "x".join(map(str, self.grid))
        out = f"(B, {self.channels}, {', '.join(map(str, self.grid))})"
        if self.kind == "tokens":
            what = f"tokens (B, {_dims(self.shape)}): {self.prefix} prefix token(s) dropped, "
            what += f"{grid} patch grid -> {out}"
        elif self.kind == "channels_last":
            what = f"channels-last (B, {_dims(self.shape)}) -> {out}"
        else:
            what = f"{self.kind} {out}"
        return f"{what} [{self.reason}]" if self.reason else what


def _dims(shape: Sequence[int]) -> str:
    return ", ".join(map(str, shape))


def _size(input_size: int | Sequence[int]) -> tuple[int, ...]:
    size = (input_size, input_size) if isinstance(input_size, int) else tuple(input_size)
    if len(size) not in (2, 3) or not all(isinstance(n, int) and n > 0 for n in size):
        raise ArgumentError(
            f"input_size must be H, (H, W) or (D, H, W) positive ints, got {input_size!r}"
        )
    return size


def _pair(value: object) -> tuple[int, int] | None:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value, value
    if isinstance(value, Sequence) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return int(value[0]), int(value[1])
    return None


# ----------------------------------------------------------------------------- model facts


def prefix_tokens(model: nn.Module | None) -> tuple[int, str] | None:
    """``(count, source)`` of the tokens a transformer prepends to its patch tokens, or None.

    timm's ``num_prefix_tokens``; else the first module holding ``cls_token`` / ``class_token``
    (torchvision) / ``dist_token`` / ``distillation_token`` / ``reg_token`` / ``register_tokens``
    parameters, each counting its token axis (``(1, n, C)``: ``n``).
    """
    if model is None:
        return None
    for name, module in model.named_modules():
        count = getattr(module, "num_prefix_tokens", None)
        if isinstance(count, int) and not isinstance(count, bool):
            where = f"{name}.num_prefix_tokens" if name else "num_prefix_tokens"
            return count, where
    for name, module in model.named_modules():
        found = []
        for attr in _PREFIX_ATTRIBUTES:
            token = getattr(module, attr, None)
            if isinstance(token, Tensor) and token.ndim >= 2:
                found.append((attr, token.shape[-2] if token.ndim == 3 else 1))
        if found:
            where = ", ".join(f"{attr} x{n}" for attr, n in found)
            return sum(n for _, n in found), f"{name or 'model'}: {where}"
    return None


def patch_size(model: nn.Module | None) -> tuple[int, int] | None:
    """The patch size ``(ph, pw)``: timm ``patch_embed.patch_size``, torchvision ``patch_size``,
    HuggingFace ``config.patch_size`` (or any submodule's ``patch_size``), else None."""
    if model is None:
        return None
    config = getattr(model, "config", None)
    for module in (getattr(model, "patch_embed", None), model, config):
        found = _pair(getattr(module, "patch_size", None)) if module is not None else None
        if found:
            return found
    for module in model.modules():
        found = _pair(getattr(module, "patch_size", None))
        if found:
            return found
    return None


def patch_grid(model: nn.Module | None, size: tuple[int, int]) -> tuple[int, int] | None:
    """The patch grid for an input ``(H, W)``: timm's ``patch_embed.dynamic_feat_size`` (which
    knows about dynamic padding), else ``(H // ph, W // pw)``; None without a patch size."""
    embed = getattr(model, "patch_embed", None)
    feat_size = getattr(embed, "dynamic_feat_size", None)
    if callable(feat_size):
        try:
            grid = _pair(tuple(feat_size(size)))
        except Exception:  # noqa: BLE001 -- an unexpected signature: use the plain rule
            grid = None
        if grid:
            return grid
    patch = patch_size(model)
    if patch is None:
        return None
    return size[0] // patch[0], size[1] // patch[1]


def channel_counts(model: nn.Module | None) -> tuple[set[int], set[int]]:
    """``(channels-first counts, channels-last counts)`` of the model's modules.

    Channels-first: convolutions (in/out), batch/group/instance norms, and normalisations whose
    class name ends in ``2d`` (timm ``LayerNorm2d``). Channels-last: ``nn.LayerNorm`` over the
    last axis and ``nn.Linear`` (in/out features).
    """
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


def _has_last_axis_norm(model: nn.Module | None) -> bool:
    return model is not None and any(
        isinstance(m, nn.LayerNorm) and not type(m).__name__.lower().endswith("2d")
        for m in model.modules()
    )


# ----------------------------------------------------------------------------- inference


def fits_input(spatial: Sequence[int], size: Sequence[int]) -> bool:
    """Whether a spatial shape can be the input ``size`` divided by one common stride.

    Each axis within one unit of ``size / stride`` for a common real stride >= 1 (padding,
    valid convolutions and odd sizes round either way), and equal input axes give equal axes.
    For a volume ``(D, H, W)`` the depth only has to be in ``1..D`` (video and 3-D networks
    often stride time differently); ``(h, w)`` follow the rule above.
    """
    if len(spatial) != len(size) or any(s < 1 or s > n for s, n in zip(spatial, size, strict=True)):
        return False
    if len(size) == 3:
        return fits_input(spatial[1:], size[1:])
    for i in range(len(size)):
        for j in range(len(size)):
            if size[i] == size[j] and spatial[i] != spatial[j]:
                return False
    # stride interval per axis: size / stride in (s - 1, s + 1)
    low = max(n / (s + 1) for s, n in zip(spatial, size, strict=True))
    high = min(n / (s - 1) if s > 1 else math.inf for s, n in zip(spatial, size, strict=True))
    return max(low, 1.0) < high


def _dense_layout(shape: tuple[int, ...], model: nn.Module | None, size: tuple[int, ...]) -> Layout:
    """A ``(B, C, *spatial)`` output or its channels-last reading ``(B, *spatial, C)``."""
    volume = len(size) == 3
    first = Layout("volume" if volume else "grid", shape[2:], shape[1])
    last = Layout("channels_last", shape[1:-1], shape[-1])
    fit_first, fit_last = fits_input(first.grid, size), fits_input(last.grid, size)
    dims = "x".join(map(str, size))
    if fit_first != fit_last:
        chosen = first if fit_first else last
        return _with_reason(chosen, f"spatial axes {_dims(chosen.grid)} fit the {dims} input")
    known_first, known_last = channel_counts(model)
    first_known = first.channels in known_first
    last_known = last.channels in known_last
    evidence = "both fit" if fit_first else "neither fits"
    if first_known != last_known:
        chosen = first if first_known else last
        side = "channels-first" if first_known else "channels-last"
        return _with_reason(
            chosen,
            f"{evidence} the {dims} input; {chosen.channels} is a {side} channel count",
        )
    if fit_first and not _has_last_axis_norm(model):
        return _with_reason(first, "channels-first: the model has no channels-last normalisation")
    raise LayoutError(
        f"cannot tell how to read the layer output {shape} for a {dims} input: it could be "
        f"{first} or {last} ({evidence} the input's size; channel counts do not decide); pass "
        "reshape= a function returning (B, C, h, w), e.g. lambda t: t.permute(0, 3, 1, 2), or "
        "reshape=None to use it as (B, C, h, w)"
    )


def _with_reason(layout: Layout, reason: str) -> Layout:
    return Layout(layout.kind, layout.grid, layout.channels, layout.prefix, reason)


def _grids(count: int, size: tuple[int, int]) -> list[tuple[int, int, int]]:
    """``(h, w, stride)`` with ``h * w == count >= 2`` and ``(h, w) = size / stride`` exactly
    (a guess without the patch size: no rounding allowed)."""
    found = []
    for h in range(1, math.isqrt(count) + 1):
        if count % h or count < 2:
            continue
        for gh, gw in {(h, count // h), (count // h, h)}:
            stride, rest = divmod(size[0], gh)
            if not rest and stride >= 1 and size[1] == stride * gw:
                found.append((gh, gw, stride))
    return found


def _token_layout(shape: tuple[int, ...], model: nn.Module | None, size: tuple[int, ...]) -> Layout:
    """A ``(B, N, C)`` token sequence: prefix tokens and the patch grid."""
    _, count, channels = shape
    if len(size) != 2:
        raise LayoutError(
            f"a token sequence {shape} needs a 2-D input size to lay out its patches, got {size}; "
            "pass reshape= a function returning (B, C, d, h, w)"
        )
    prefix = prefix_tokens(model)
    grid = patch_grid(model, size)
    dims = "x".join(map(str, size))
    if grid is not None:
        patches = grid[0] * grid[1]
        if prefix is not None and count == prefix[0] + patches:
            return Layout(
                "tokens",
                grid,
                channels,
                prefix[0],
                f"prefix from {prefix[1]}; grid {dims} input / patch {patch_size(model) or grid}",
            )
        if 0 <= count - patches <= MAX_GUESSED_PREFIX:
            return Layout(
                "tokens",
                grid,
                channels,
                count - patches,
                f"grid {dims} input / patch size; prefix = {count} tokens - {patches} patches",
            )
    counts = [prefix[0]] if prefix is not None else range(min(count - 1, MAX_GUESSED_PREFIX) + 1)
    candidates = []
    for p in counts:
        for gh, gw, stride in _grids(count - p, size):
            reason = f"{dims} input / stride {stride}"
            reason += f"; prefix from {prefix[1]}" if prefix is not None else ""
            candidates.append(Layout("tokens", (gh, gw), channels, p, reason))
    if len(candidates) == 1:
        return candidates[0]
    if not candidates:
        known = f" with {prefix[0]} prefix token(s) ({prefix[1]})" if prefix else ""
        raise LayoutError(
            f"cannot lay out {count} tokens{known} on a patch grid for a {dims} input "
            "(no patch size found on the model and no grid fits); pass reshape= a function "
            "returning (B, C, h, w)"
        )
    listed = "; ".join(str(c) for c in candidates)
    raise LayoutError(
        f"the {count} tokens of {shape} for a {dims} input can be read in several ways: "
        f"{listed}; pass reshape= a function returning (B, C, h, w)"
    )


def infer_layout(
    shape: Sequence[int], model: nn.Module | None, input_size: int | Sequence[int]
) -> Layout:
    """Decide how a layer output of ``shape`` (batch axis included) is read as a grid.

    ``input_size``: the input's spatial size ``(H, W)`` (or ``(D, H, W)``). ``model`` gives the
    prefix tokens, the patch size and the channel counts (may be None: geometry only). See the
    module docstring for the rules; raises :class:`LayoutError` naming the candidate readings
    when the layout is ambiguous or cannot be read.
    """
    shape = tuple(int(n) for n in shape)
    size = _size(input_size)
    if len(shape) == 3:
        if shape[1] < 2:
            raise LayoutError(
                f"the layer output {shape} holds a single token: it has no spatial grid "
                "(choose a layer before the pooling / class-token readout)"
            )
        return _token_layout(shape, model, size)
    if len(shape) == 2 + len(size):
        return _dense_layout(shape, model, size)
    expected = "(B, C, h, w), (B, h, w, C) or tokens (B, N, C)"
    if len(size) == 3:
        expected = "(B, C, d, h, w), (B, d, h, w, C) or tokens (B, N, C)"
    raise LayoutError(
        f"cannot read a layer output of shape {shape} as a spatial map for a "
        f"{'x'.join(map(str, size))} input: expected {expected}; pass reshape= a function "
        "returning (B, C, h, w)"
    )


def resolve_reshape(
    reshape: Reshape | str | None,
    model: nn.Module | None,
    input_size: int | Sequence[int],
    shape: Sequence[int],
) -> Reshape | None:
    """The function a CAM applies to a layer output of ``shape`` (batch included).

    ``"auto"`` (the default): the :class:`Layout` from :func:`infer_layout` (callable; its
    ``str`` tells the choice); a callable: itself (the user's reshape wins); None: no reshape
    (the output must already be ``(B, C, h, w)``).
    """
    check_reshape(reshape)
    if reshape == "auto":
        return infer_layout(shape, model, input_size)
    return reshape


def check_reshape(reshape: object) -> None:
    """Raise :class:`~camkit.errors.ArgumentError` unless ``reshape`` is ``"auto"``, None or a
    callable."""
    if not (reshape is None or reshape == "auto" or callable(reshape)) or (
        isinstance(reshape, str) and reshape != "auto"
    ):
        raise ArgumentError(
            f'reshape must be "auto", None or a callable (B, ...) -> (B, C, h, w), got {reshape!r}'
        )


def default_token_layer(model: nn.Module) -> str | None:
    """The layer to explain in a transformer: the first normalisation of its last block.

    Per family: timm ViT / DeiT / DINOv2 ``blocks.{-1}.norm1``; timm Swin
    ``layers.{-1}.blocks.{-1}.norm1``; torchvision ``vit_b_16``
    ``encoder.layers.encoder_layer_{-1}.ln_1``; torchvision ``swin_t`` ``features.7.{-1}.norm1``;
    HuggingFace ViT ``...layer.{-1}.layernorm_before``; CLIP ``...layers.{-1}.layer_norm1``. Its
    output feeds the last attention, so every patch token reaches the score (the layer
    pytorch-grad-cam recommends). None for a model without such blocks (CNNs, ConvNeXt: use the
    last spatial map).
    """
    found = None
    for name, module in model.named_modules():
        if isinstance(module, nn.LayerNorm) and name.rsplit(".", 1)[-1] in _BLOCK_NORM_NAMES:
            found = name
    return found


__all__ = [
    "Layout",
    "LayoutError",
    "channel_counts",
    "check_reshape",
    "default_token_layer",
    "fits_input",
    "infer_layout",
    "patch_grid",
    "patch_size",
    "prefix_tokens",
    "resolve_reshape",
]

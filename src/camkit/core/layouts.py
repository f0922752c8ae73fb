"""Reading a layer's output as a spatial grid: CNN maps, 3-D volumes, ViT tokens, channels-last.

A CAM needs activations ``(B, C, h, w)`` (or ``(B, C, d, h, w)`` for volumes). Transformers give
other layouts, and pytorch-grad-cam / torchcam make the user write the conversion by hand
(``reshape_transform`` with a hard-coded 14x14 grid). :func:`infer_layout` decides it from the
layer's output shape, the model's attributes and the input size:

* ``"grid"`` ``(B, C, h, w)`` and ``"volume"`` ``(B, C, d, h, w)``: used as they are;
* ``"tokens"`` ``(B, N, C)`` with ``N = prefix + h * w + suffix`` (ViT, DeiT, DINOv2 with
  registers, HuggingFace hidden states; YOLOS appends its detection tokens after the patches,
  Fang et al., NeurIPS 2021): the tokens that are not patches (class, distillation, register,
  detection) are dropped and the patch tokens laid out row-major on the ``(h, w)`` patch grid,
  as the patch embedding flattens them (Dosovitskiy et al., ICLR 2021). How many tokens come
  before and after the patches is read from the model (its token parameters, timm's
  ``num_prefix_tokens``, its config), never inferred from the count: a count that does not
  match is refused. Only without a model (geometry alone) are prefix counts tried;
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

from camkit.core.architecture import (
    channel_counts,
    has_last_axis_norm,
    patch_grid,
    prefix_tokens,
    suffix_tokens,
)
from camkit.errors import ArgumentError, LayoutError

Kind = Literal["grid", "volume", "tokens", "channels_last"]
Reshape = Callable[[Tensor], Tensor]

#: token counts tried as "prefix" when neither the model nor the patch size tells it
MAX_GUESSED_PREFIX = 16


@dataclass(frozen=True)
class Layout:
    """How to read a layer output as a grid; ``to_grid`` (or calling it) does the conversion.

    Attributes:
        kind: ``"grid"`` ``(B, C, h, w)``, ``"volume"`` ``(B, C, d, h, w)``, ``"tokens"``
            ``(B, prefix + h*w, C)`` or ``"channels_last"`` ``(B, h, w, C)`` / ``(B, d, h, w, C)``.
        grid: the spatial size ``(h, w)`` or ``(d, h, w)``.
        channels: ``C``.
        prefix: tokens before the patch tokens (class, distillation, registers), dropped.
        suffix: tokens after the patch tokens (YOLOS detection tokens), dropped.
        reason: how the layout was decided (for ``str``; not part of equality).
    """

    kind: Kind
    grid: tuple[int, ...]
    channels: int
    prefix: int = 0
    reason: str = field(default="", compare=False)
    suffix: int = 0

    @property
    def channel_axis(self) -> int:
        """The axis of the layer output that holds the channels: 1, or -1 for tokens and
        channels-last outputs."""
        return -1 if self.kind in ("tokens", "channels_last") else 1

    @property
    def shape(self) -> tuple[int, ...]:
        """The layer output's shape without the batch axis."""
        if self.kind == "tokens":
            return (self.prefix + math.prod(self.grid) + self.suffix, self.channels)
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
            patches = t[:, self.prefix : self.prefix + math.prod(self.grid)]
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
            if self.suffix:
                what += f"{self.suffix} token(s) after the patches dropped, "
            what += f"{grid} patch grid -> {out}"
        elif self.kind == "channels_last":
            what = f"channels-last (B, {_dims(self.shape)}) -> {out}"
        else:
            what = f"{self.kind} {out}"
        return f"{what} [{self.reason}]" if self.reason else what


def channels_first(
    t: Tensor, layout: Layout | None, dims: int = 1, *, back: bool = False
) -> Tensor:
    """``t`` (``dims`` leading axes, then a layer output's axes as ``layout`` reads them) with
    the channel axis moved to position ``dims`` (``back``: moved back to the layer's
    :attr:`Layout.channel_axis`); tokens keep their prefix and suffix tokens. For None (the
    output taken as it is, :func:`layer_layout`) or channels on axis 1: ``t`` as it is."""
    if layout is None or layout.channel_axis == 1:
        return t
    return t.movedim(dims, -1) if back else t.movedim(-1, dims)


def layer_layout(
    shape: Sequence[int],
    model: nn.Module | None,
    input_size: int | Sequence[int],
    reshape: str | None = "auto",
) -> Layout | None:
    """How a layer output of ``shape`` (batch axis included) is read for its channels: None
    where it is taken as it is, channels on axis 1 (``reshape=None``, or a linear layer's
    ``(B, C)``: neurons, no positions), else :func:`infer_layout`."""
    if reshape is None or len(shape) == 2:
        return None
    return infer_layout(shape, model, input_size)


def _dims(shape: Sequence[int]) -> str:
    return ", ".join(map(str, shape))


def _size(input_size: int | Sequence[int]) -> tuple[int, ...]:
    size = (input_size, input_size) if isinstance(input_size, int) else tuple(input_size)
    if len(size) not in (2, 3) or not all(isinstance(n, int) and n > 0 for n in size):
        raise ArgumentError(
            f"input_size must be H, (H, W) or (D, H, W) positive ints, got {input_size!r}"
        )
    return size


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
    if fit_first and not has_last_axis_norm(model):
        return _with_reason(first, "channels-first: the model has no channels-last normalisation")
    raise LayoutError(
        f"cannot tell how to read the layer output {shape} for a {dims} input: it could be "
        f"{first} or {last} ({evidence} the input's size; channel counts do not decide); pass "
        "reshape= a function returning (B, C, h, w), e.g. lambda t: t.permute(0, 3, 1, 2), or "
        "reshape=None to use it as (B, C, h, w)"
    )


def _with_reason(layout: Layout, reason: str) -> Layout:
    return Layout(layout.kind, layout.grid, layout.channels, layout.prefix, reason, layout.suffix)


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
    """A ``(B, N, C)`` token sequence: the tokens before and after the patches, and the grid."""
    _, count, channels = shape
    if len(size) != 2:
        raise LayoutError(
            f"a token sequence {shape} needs a 2-D input size to lay out its patches, got {size}; "
            "pass reshape= a function returning (B, C, d, h, w)"
        )
    if model is None:
        return _geometric_tokens(shape, size)
    prefix, suffix = prefix_tokens(model), suffix_tokens(model)
    front, back = (prefix[0] if prefix else 0), (suffix[0] if suffix else 0)
    declared = [f"{prefix[0]} before the patches ({prefix[1]})"] if prefix else []
    declared += [f"{suffix[0]} after the patches ({suffix[1]})"] if suffix else []
    told = "; ".join(declared) or "no prefix or other non-patch tokens"
    grid = patch_grid(model, size)
    dims = "x".join(map(str, size))
    if grid is not None and count in (front + grid[0] * grid[1] + back, grid[0] * grid[1]):
        every = count == grid[0] * grid[1]
        ends = (0, 0) if every else (front, back)
        sh, sw = size[0] // grid[0], size[1] // grid[1]
        stride = str(sh) if sh == sw else f"{sh}x{sw}"
        reason = f"grid {dims} input / stride {stride} (the patch embedding's); "
        reason += "every token is a patch" if every else f"non-patch tokens: {told}"
        return Layout("tokens", grid, channels, ends[0], reason, ends[1])
    candidates = [
        Layout("tokens", (gh, gw), channels, front, f"{dims} input / stride {stride}; {told}", back)
        for gh, gw, stride in _grids(count - front - back, size)
    ]
    patches = f"; its patch grid {grid[0]}x{grid[1]} gives {grid[0] * grid[1]}" if grid else ""
    return _one_reading(
        candidates,
        shape,
        dims,
        f"cannot lay out the {count} tokens of {shape} for a {dims} input: the model "
        f"declares {told}{patches}, and no patch grid fits the rest. camkit reads which "
        "tokens are patches from the model and never guesses their positions from a count; "
        "pass reshape= a function returning (B, C, h, w), e.g. "
        "lambda t: t[:, first:last].unflatten(1, (h, w)).movedim(-1, 1)",
    )


def _geometric_tokens(shape: tuple[int, ...], size: tuple[int, ...]) -> Layout:
    """Without a model: every prefix count up to :data:`MAX_GUESSED_PREFIX` whose remainder is
    a grid that fits the input exactly; one reading, or an error listing them."""
    _, count, channels = shape
    dims = "x".join(map(str, size))
    candidates = [
        Layout("tokens", (gh, gw), channels, p, f"{dims} input / stride {stride}; no model")
        for p in range(min(count - 1, MAX_GUESSED_PREFIX) + 1)
        for gh, gw, stride in _grids(count - p, size)
    ]
    return _one_reading(
        candidates,
        shape,
        dims,
        f"cannot lay out {count} tokens on a patch grid for a {dims} input (no model to "
        "read a patch size from and no grid fits); pass reshape= a function returning "
        "(B, C, h, w)",
    )


def _one_reading(
    candidates: list[Layout], shape: tuple[int, ...], dims: str, no_reading: str
) -> Layout:
    """The only reading of the tokens of ``shape``; none (``no_reading`` says why) or several
    are a :class:`LayoutError`."""
    if len(candidates) == 1:
        return candidates[0]
    if not candidates:
        raise LayoutError(no_reading)
    listed = "; ".join(str(c) for c in candidates)
    raise LayoutError(
        f"the {shape[1]} tokens of {shape} for a {dims} input can be read in several ways: "
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


__all__ = [
    "Layout",
    "LayoutError",
    "channels_first",
    "check_reshape",
    "fits_input",
    "infer_layout",
    "layer_layout",
    "resolve_reshape",
]

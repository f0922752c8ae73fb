"""Reading a layer's output as a spatial grid, decided by :func:`infer_layout` from the output
shape, the model and the input size (instead of pytorch-grad-cam's hand-written
``reshape_transform``):

* ``"grid"`` ``(B, C, h, w)`` and ``"volume"`` ``(B, C, d, h, w)``: as they are;
* ``"tokens"`` ``(B, prefix + h * w + suffix, C)`` (ViT, DeiT, DINOv2; YOLOS's detection
  tokens after the patches, Fang et al., NeurIPS 2021): the patches row-major on the patch grid
  (Dosovitskiy et al., ICLR 2021), the non-patch tokens, counted by the model (without one:
  tried), dropped;
* space-time tokens of a video transformer: grid and order read from the model
  (:mod:`camkit.core.spacetime`), laid out as a volume; a frame-wise model's ``B * T`` rows are
  read frame by frame and stacked as ``(B, C, T, h, w)``;
* ``"channels_last"`` ``(B, h, w, C)`` (Swin, Liu et al., ICCV 2021; ConvNeXt, Liu et al.,
  CVPR 2022): channels moved to axis 1.

A dense output and its channels-last reading: the right one's spatial axes are the input's
divided by one common stride; when both or neither fit, the model's channel counts decide;
a model without a last-axis ``nn.LayerNorm`` is channels-first (nothing in it could make
channels-last activations); else :class:`LayoutError` names every candidate.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from torch import nn

from camkit.core.architecture import (
    PatchRows,
    channel_counts,
    has_last_axis_norm,
    image_tiles,
    patch_grid,
    patch_rows,
    prefix_tokens,
    suffix_tokens,
)
from camkit.core.grid_layout import Kind, Layout, Reshape, channels_first, shape_text
from camkit.core.spacetime import folded_frames, message_tokens, token_grids
from camkit.errors import ArgumentError, LayoutError

#: token counts tried as "prefix" when neither the model nor the patch size tells it
MAX_GUESSED_PREFIX = 16


def layer_layout(
    shape: Sequence[int],
    model: nn.Module | None,
    input_size: int | Sequence[int],
    reshape: str | None = "auto",
    *,
    batch: int | None = None,
) -> Layout | None:
    """How a layer output of ``shape`` is read for its channels: None (as it is) for
    ``reshape=None`` or a linear layer's ``(B, C)``, else :func:`infer_layout`."""
    if reshape is None or len(shape) == 2:
        return None
    return infer_layout(shape, model, input_size, batch=batch)


def fits_input(spatial: Sequence[int], size: Sequence[int]) -> bool:
    """Whether a spatial shape can be the input ``size`` divided by one common stride: each
    axis within one unit of ``size / stride`` for a real stride >= 1 (padding rounds either
    way), equal input axes giving equal axes. A volume's depth only has to be in ``1..D``
    (video and 3-D networks often stride time differently)."""
    if len(spatial) != len(size) or any(s < 1 or s > n for s, n in zip(spatial, size, strict=True)):
        return False
    if len(size) == 3:
        return fits_input(spatial[1:], size[1:])
    if len(set(zip(size, spatial, strict=True))) != len(set(size)):
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
        return replace(
            chosen, reason=f"spatial axes {shape_text(chosen.grid)} fit the {dims} input"
        )
    known_first, known_last = channel_counts(model)
    first_known, last_known = first.channels in known_first, last.channels in known_last
    evidence = "both fit" if fit_first else "neither fits"
    if first_known != last_known:
        chosen = first if first_known else last
        side = "channels-first" if first_known else "channels-last"
        reason = f"{evidence} the {dims} input; {chosen.channels} is a {side} channel count"
        return replace(chosen, reason=reason)
    if fit_first and not has_last_axis_norm(model):
        return replace(first, reason="channels-first: the model has no channels-last normalisation")
    raise LayoutError(
        f"cannot tell how to read the layer output {shape} for a {dims} input: it could be "
        f"{first} or {last} ({evidence} the input's size; channel counts do not decide); pass "
        "reshape= a function returning (B, C, h, w), e.g. lambda t: t.permute(0, 3, 1, 2), or "
        "reshape=None to use it as (B, C, h, w)"
    )


def _grids(count: int, size: tuple[int, int]) -> list[tuple[int, int, int]]:
    """``(h, w, stride)`` with ``h * w == count >= 2`` and ``(h, w) = size / stride`` exactly."""
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
    if model is None and len(size) == 2:
        return _geometric_tokens(shape, size)
    prefix, suffix = prefix_tokens(model), suffix_tokens(model)
    front, back = (prefix[0] if prefix else 0), (suffix[0] if suffix else 0)
    declared = [f"{prefix[0]} before the patches ({prefix[1]})"] if prefix else []
    declared += [f"{suffix[0]} after the patches ({suffix[1]})"] if suffix else []
    told = "; ".join(declared) or "no prefix or other non-patch tokens"
    dims = "x".join(map(str, size))
    if len(size) == 3:
        return _spacetime_tokens(shape, model, size, (front, back), told)
    grid = patch_grid(model, size)
    patches = grid[0] * grid[1] if grid is not None else 0
    readings = {front + patches + back: ((front, back), f"non-patch tokens: {told}")}
    readings[patches] = ((0, 0), "every token is a patch")
    message = message_tokens(model)  # appended inside a block only (X-CLIP)
    if message is not None:
        inside = f"non-patch tokens: {told}; {message[0]} after them ({message[1]})"
        with_message = front + patches + back + message[0]
        readings.setdefault(with_message, ((front, back + message[0]), inside))
    if grid is not None and count in readings:
        ends, which = readings[count]
        sh, sw = size[0] // grid[0], size[1] // grid[1]
        stride = str(sh) if sh == sw else f"{sh}x{sw}"
        reason = f"grid {dims} input / stride {stride} (the patch embedding's); {which}"
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


def _spacetime_tokens(
    shape: tuple[int, ...],
    model: nn.Module | None,
    size: tuple[int, ...],
    ends: tuple[int, int],
    told: str,
) -> Layout:
    """Video tokens: the model's space-time grid that fits the count (with or without the
    non-patch tokens)."""
    count, dims = shape[1], "x".join(map(str, size))
    grids = token_grids(model, size)  # type: ignore[arg-type]
    for found in grids:
        patches = math.prod(found.grid)
        if count in (sum(ends) + patches, patches):
            front, back = (0, 0) if count == patches else ends
            grid = "x".join(map(str, found.grid))
            reason = f"{dims} clip -> {grid} tokens ({found.source}); non-patch tokens: "
            reason += "none here" if count == patches else told
            return Layout("tokens", found.grid, shape[2], front, reason, back, found.frames_last)
    listed = ", ".join(f"{'x'.join(map(str, g.grid))} ({g.source})" for g in grids)
    raise LayoutError(
        f"cannot lay out the {count} tokens of {shape} for a {dims} clip: the model declares "
        f"{told} and {'the space-time grids ' + listed if grids else 'no space-time token grid'}"
        " (camkit reads them from a tubelet embedding nn.Conv3d, MViT's pool_q or "
        "TimeSformer's config, and never guesses positions from a count); pass reshape= a "
        "function returning (B, C, t, h, w)"
    )


def _patch_rows(shape: tuple[int, ...], layout: PatchRows, size: tuple[int, ...]) -> Layout:
    """A flattened-patch model's ``(N * rows, C)`` output: ``rows`` patch tokens per image."""
    dims = "x".join(map(str, size))
    grid = layout.grid(size)
    count = math.prod(grid)
    if count == 0 or shape[0] % count or any(n % layout.merge for n in grid):
        raise LayoutError(
            f"the {shape[0]} rows of {shape} are not {grid[0]}x{grid[1]} patches per {dims} "
            f"image in {layout.merge}x{layout.merge} merge windows (patch_size {layout.patch}, "
            "spatial_merge_size from the model's vision config): give images whose sides are "
            f"multiples of {layout.patch * layout.merge} (camkit.ImageInput lays them out)"
        )
    reason = f"{dims} image / patch {layout.patch}, {layout.merge}x{layout.merge} merge windows"
    reason += " (the model's vision config)"
    return Layout("tokens", grid, shape[1], reason=reason, rows=count, merge=layout.merge)


def _geometric_tokens(shape: tuple[int, ...], size: tuple[int, ...]) -> Layout:
    """Without a model: the one prefix count whose remainder is a grid fitting the input."""
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
    """The only reading of the tokens of ``shape``; none (``no_reading``) or several raise."""
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
    shape: Sequence[int],
    model: nn.Module | None,
    input_size: int | Sequence[int],
    *,
    batch: int | None = None,
) -> Layout:
    """Decide how a layer output of ``shape`` (batch axis included) is read as a grid.

    ``input_size``: ``(H, W)``, ``(D, H, W)`` or a clip's ``(T, H, W)``. ``model``: what the
    architecture declares (None: geometry only). ``batch``: the input's rows, for frame-wise
    and tiling models. Rules in the module docstring; raises :class:`LayoutError` naming the
    candidates when ambiguous or unreadable.
    """
    shape = tuple(int(n) for n in shape)
    size = (input_size, input_size) if isinstance(input_size, int) else tuple(input_size)
    if len(size) not in (2, 3) or not all(isinstance(n, int) and n > 0 for n in size):
        raise ArgumentError(
            f"input_size must be H, (H, W) or (D, H, W) positive ints, got {input_size!r}"
        )
    tiles = image_tiles(model) if len(size) == 2 and batch is not None else None
    grid = tiles.grid(size) if tiles is not None else None
    if grid is not None and shape[0] == batch * (1 + math.prod(grid)):
        view = infer_layout(shape, model, (tiles.side, tiles.side))
        reason = f"{size[0]}x{size[1]} image: whole and {grid[0]}x{grid[1]} tiles of {tiles.side}"
        return replace(
            view, frames=1 + math.prod(grid), tiles=grid, reason=f"{reason}; {view.reason}"
        )
    frames = folded_frames(model, (batch or 0, 0, *size))
    if frames and batch is not None and shape[0] == batch * frames != batch:
        frame = infer_layout(shape, model, size[1:])
        return replace(frame, frames=frames, reason=f"frame-wise model; {frame.reason}")
    rows = patch_rows(model)
    if len(shape) == 2 and len(size) == 2 and rows is not None:
        return _patch_rows(shape, rows, size)
    if len(shape) == 3:
        if shape[1] < 2:
            raise LayoutError(
                f"the layer output {shape} holds a single token: it has no spatial grid "
                "(choose a layer before the pooling / class-token readout)"
            )
        return _token_layout(shape, model, size)
    if len(shape) == 2 + len(size):
        return _dense_layout(shape, model, size)
    axes = "d, h, w" if len(size) == 3 else "h, w"
    expected = f"(B, C, {axes}), (B, {axes}, C) or tokens (B, N, C)"
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
    batch: int | None = None,
) -> Reshape | None:
    """The function a CAM applies to a layer output of ``shape``: for ``"auto"`` the
    :class:`Layout` of :func:`infer_layout`, else ``reshape`` itself (a callable, or None)."""
    check_reshape(reshape)
    if reshape == "auto":
        return infer_layout(shape, model, input_size, batch=batch)
    return reshape


def check_reshape(reshape: object) -> None:
    """Raise :class:`~camkit.errors.ArgumentError` unless ``reshape`` is ``"auto"``, None or a
    callable."""
    if not (reshape is None or reshape == "auto" or callable(reshape)):
        raise ArgumentError(
            f'reshape must be "auto", None or a callable (B, ...) -> (B, C, h, w), got {reshape!r}'
        )


__all__ = [
    "Kind",
    "Layout",
    "Reshape",
    "LayoutError",
    "channels_first",
    "check_reshape",
    "fits_input",
    "infer_layout",
    "layer_layout",
    "resolve_reshape",
]

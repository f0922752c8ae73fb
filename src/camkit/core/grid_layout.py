"""How a layer output is read as a grid: :class:`Layout` (decided by
:func:`camkit.core.layouts.infer_layout`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from torch import Tensor

from camkit.errors import LayoutError

Kind = Literal["grid", "volume", "tokens", "channels_last"]
Reshape = Callable[[Tensor], Tensor]


@dataclass(frozen=True)
class Layout:
    """How to read a layer output as a grid; ``to_grid`` (or calling it) does the conversion.

    Attributes:
        kind: ``"grid"`` ``(B, C, h, w)``, ``"volume"`` ``(B, C, d, h, w)``, ``"tokens"``
            ``(B, N, C)`` or ``"channels_last"`` ``(B, h, w, C)`` / ``(B, d, h, w, C)``.
        grid, channels: ``(h, w)`` or ``(d, h, w)`` (a clip's ``(t, h, w)``), and ``C``.
        prefix, suffix: non-patch tokens before / after the patch tokens, dropped.
        reason: how the layout was decided (for ``str``; not part of equality).
        frames_last: space-time tokens in ``(h, w, t)`` order (TimeSformer).
        frames: a frame-wise layer's ``N * frames`` rows, stacked to ``(N, C, frames, h, w)``.
        rows, merge: patch tokens folded into ``(N * rows, C)``, in ``merge`` x ``merge``
            windows (Qwen2-VL); 0 and 1: not.
        tiles: ``(rows, columns)`` of a tiled image's views, the whole image first
            (LLaVA-NeXt, :meth:`place`).
    """

    kind: Kind
    grid: tuple[int, ...]
    channels: int
    prefix: int = 0
    reason: str = field(default="", compare=False)
    suffix: int = 0
    frames_last: bool = False
    frames: int = 0
    rows: int = 0
    merge: int = 1
    tiles: tuple[int, int] | None = None

    @property
    def channel_axis(self) -> int:
        """The layer output's channel axis: 1, or -1 for tokens and channels-last outputs."""
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
        """``(B, *self.shape) -> (B, C, h, w)`` (``(B, C, d, h, w)`` for volumes, space-time
        tokens and frame-wise layers), a view when possible; LayoutError for another shape."""
        if self.rows and isinstance(t, Tensor) and t.ndim == 2 and t.shape[0] % self.rows == 0:
            t = t.unflatten(0, (-1, self.rows))  # (N * rows, C) -> (N, rows, C)
        rows = t.shape[0] if isinstance(t, Tensor) and t.ndim else 0
        if tuple(getattr(t, "shape", ())[1:]) != self.shape or rows % max(self.frames, 1):
            got = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
            lead = f"B * {self.frames}" if self.frames else "B"
            raise LayoutError(
                f"expected a layer output of shape ({lead}, {shape_text(self.shape)}), got {got}"
            )
        if self.frames:
            frame = replace(self, frames=0).to_grid(t)
            return frame.unflatten(0, (-1, self.frames)).movedim(1, 2)
        if self.kind == "tokens":
            patches = t[:, self.prefix : self.prefix + math.prod(self.grid)]
            if self.frames_last:  # (h, w, t) order -> (B, C, t, h, w)
                t_, h, w = self.grid
                return patches.unflatten(1, (h, w, t_)).permute(0, 4, 3, 1, 2)
            if self.merge > 1:  # windows (h/m, w/m) of m x m patches -> (h, w)
                h, w, m = *self.grid, self.merge
                windows = patches.unflatten(1, (h // m, w // m, m, m)).permute(0, 5, 1, 3, 2, 4)
                return windows.reshape(*windows.shape[:2], h, w)
            return patches.unflatten(1, self.grid).movedim(-1, 1)
        if self.kind == "channels_last":
            return t.movedim(-1, 1)
        return t

    __call__ = to_grid

    def place(self, cam: Tensor) -> Tensor:
        """A map over a tiled image's views ``(B, K, 1 + r * c, h, w)`` as a map over the image
        ``(B, K, r * h, c * w)``: the sum of the views covering each position (the whole
        image's nearest-upsampled); other layouts: ``cam``."""
        if self.tiles is None:
            return cam
        (r, c), (h, w) = self.tiles, cam.shape[-2:]
        whole, parts = cam[:, :, 0], cam[:, :, 1:].unflatten(2, (r, c))
        tiled = parts.permute(0, 1, 2, 4, 3, 5).reshape(*cam.shape[:2], r * h, c * w)
        return tiled + whole.repeat_interleave(r, dim=2).repeat_interleave(c, dim=3)

    def __str__(self) -> str:
        grid = "x".join(map(str, self.grid))
        out = f"(B, {self.channels}, {', '.join(map(str, self.grid))})"
        if self.kind == "tokens":
            what = f"tokens (B, {shape_text(self.shape)}): {self.prefix} prefix token(s) dropped, "
            if self.suffix:
                what += f"{self.suffix} token(s) after the patches dropped, "
            what += f"{grid} patch grid -> {out}"
        elif self.kind == "channels_last":
            what = f"channels-last (B, {shape_text(self.shape)}) -> {out}"
        else:
            what = f"{self.kind} {out}"
        if self.tiles:
            tiles = "x".join(map(str, self.tiles))
            what = f"{self.frames} views per image (whole, {tiles} tiles): {what}"
        elif self.frames:
            what = f"frame-wise, {self.frames} frames per sample: {what}"
        if self.rows:
            order = f"{self.merge}x{self.merge} merge windows" if self.merge > 1 else "row-major"
            what = f"{self.rows} patch rows per image ({order}): {what}"
        return f"{what} [{self.reason}]" if self.reason else what


def channels_first(
    t: Tensor, layout: Layout | None, dims: int = 1, *, back: bool = False
) -> Tensor:
    """``t`` (``dims`` leading axes, then a layer output's axes) with ``layout``'s channel axis
    moved to position ``dims`` (``back``: moved back); ``t`` for None or channels on axis 1."""
    if layout is None or layout.channel_axis == 1:
        return t
    return t.movedim(dims, -1) if back else t.movedim(-1, dims)


def shape_text(shape: Sequence[int]) -> str:
    """``(3, 4) -> "3, 4"``: a shape in messages."""
    return ", ".join(map(str, shape))

"""Pictures: heatmap overlays, feature-map grids and figures (files: :mod:`camkit.io`), of
images :func:`camkit.io.to_rgb_uint8` takes (PIL, numpy, torch; uint8 or float)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

import cv2
import numpy as np
import torch

from camkit.errors import ArgumentError
from camkit.io import FLOAT_TOLERANCE, describe, to_rgb_uint8
from camkit.viz.colour import (
    DIVERGING_COLORMAP,
    OPENCV_COLORMAPS,
    SIGNED_CLIP_PERCENTILE,
    checked_alpha,
    colorize,
    colormap_lut,
    finite_values,
    float_array,
    heatmap_2d,
    signed_scale,
)
from camkit.viz.concepts import concept_colors, concept_image, plot_concepts

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "concept_colors",
    "concept_image",
    "plot_concepts",
    "OPENCV_COLORMAPS",
    "feature_grid",
    "overlay",
    "overlay_on_photo",
    "picture_grid",
    "plot",
]


def overlay(
    image: object,
    heatmap: np.ndarray | torch.Tensor,
    alpha: float = 0.5,
    colormap: str = "jet",
    *,
    depth: int | None = None,
) -> np.ndarray:
    """Blend a colored heatmap onto an image -> ``HxWx3`` uint8 RGB at the image's own size.

    The heatmap (``(h, w)``, leading size-1 axes dropped) is used as is when in [0, 1], else
    min-max rescaled (a constant map -> 0), resized to the image (bilinear), rounded to 0..255
    and coloured by ``colormap`` (OpenCV names first, case-insensitive, then matplotlib's);
    ``out = round((1 - alpha) * image + alpha * colored)`` (``cv2.addWeighted``: a level may
    differ by 1 from float64). The heatmap must cover the image: for a centre-cropping
    preprocess, overlay on ``preprocess.resize_crop(image)``. ``depth``: slice ``depth`` of a
    ``(D, H, W)`` heatmap (and of a ``(D, H, W)`` or ``(C, D, H, W)`` image).
    """
    alpha = checked_alpha(alpha)
    if depth is not None:
        heatmap, image = _slice(heatmap, depth, 3), _slice(image, depth, 3)
    rgb = to_rgb_uint8(image)
    colored = colorize(heatmap_2d(heatmap), rgb.shape[:2], colormap)
    return cv2.addWeighted(rgb, 1.0 - alpha, colored, alpha, 0.0)


def overlay_on_photo(
    photo: object,
    heatmap: np.ndarray | torch.Tensor,
    region: tuple[float, float, float, float],
    alpha: float = 0.5,
    colormap: str = "jet",
) -> np.ndarray:
    """A map of the model's input drawn on the full photo -> ``HxWx3`` uint8 RGB. ``region``:
    where the input lies on the photo, ``(top, left, bottom, right)`` in its pixels
    (:meth:`camkit.models.Preprocess.photo_region`); the map is resampled onto it (bilinear,
    pixel centres aligned as in :func:`overlay`) and the rest of the photo shown dimmed. The
    whole photo as ``region`` gives exactly :func:`overlay`."""
    rgb = to_rgb_uint8(photo)
    height, width = rgb.shape[:2]
    if tuple(region) == (0.0, 0.0, float(height), float(width)):
        return overlay(rgb, heatmap, alpha, colormap)
    alpha = checked_alpha(alpha)
    heat = heatmap_2d(heatmap)
    top, left, bottom, right = region
    scale_y, scale_x = (bottom - top) / heat.shape[0], (right - left) / heat.shape[1]
    warp = np.array(
        [[scale_x, 0, left + 0.5 * scale_x - 0.5], [0, scale_y, top + 0.5 * scale_y - 0.5]]
    )
    placed = cv2.warpAffine(
        heat, warp, (width, height), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE
    )
    colored = colorize(placed, (height, width), colormap)
    blended = cv2.addWeighted(rgb, 1.0 - alpha, colored, alpha, 0.0)
    # the pixels whose centres lie in the region: top <= row + 0.5 < bottom, likewise columns
    first_row, stop_row = (min(max(math.ceil(v - 0.5), 0), height) for v in (top, bottom))
    first_column, stop_column = (min(max(math.ceil(v - 0.5), 0), width) for v in (left, right))
    seen = slice(first_row, stop_row), slice(first_column, stop_column)
    drawn = rgb // 2  # what the model did not see: half brightness
    drawn[seen] = blended[seen]
    return drawn


def _slice(volume: object, depth: int, spatial: int) -> object:
    """Slice ``depth`` of the ``spatial``-th last axis of a volume; a 2-D picture as it is."""
    if not isinstance(volume, np.ndarray | torch.Tensor) or volume.ndim < spatial:
        return volume
    axis = volume.ndim - spatial
    if not -volume.shape[axis] <= depth < volume.shape[axis]:
        raise ArgumentError(f"depth {depth} is outside the volume's {volume.shape[axis]} slices")
    return volume[(slice(None),) * axis + (depth,)]


def feature_grid(
    maps: np.ndarray | torch.Tensor,
    ncols: int | None = None,
    padding: int = 1,
    normalize: Literal["tile", "all", "none"] = "tile",
    max_tiles: int | None = None,
    pad_value: float = 1.0,
    *,
    depth: int | None = None,
) -> np.ndarray:
    """Tile many small maps into one picture (the classic ``vis_square``) -> float in [0, 1].

    ``maps``: ``(C, H, W)``, ``(1, C, H, W)``, one map ``(H, W)``, or conv weights ``(out, in,
    kh, kw)`` (an RGB tile per filter when ``in == 3``, else its mean over input channels).
    Tiles go row by row, ``ncols`` per row (default ``ceil(sqrt(n))``), ``padding`` pixels of
    ``pad_value`` between them and in unused cells; the first ``max_tiles`` maps only.
    ``normalize``: ``"tile"`` min-max scales each tile (a constant one -> 0), ``"all"`` all
    together, ``"none"`` expects [0, 1]. Returns ``(rows*H + (rows-1)*padding, ncols*W +
    (ncols-1)*padding[, 3])``. ``depth``: the slice of 3-D feature maps ``(C, D, H, W)``.
    """
    if depth is not None:
        maps = _slice(maps, depth, 3)
    tiles = float_array(maps, "maps", np.float64)
    if tiles.ndim == 4 and tiles.shape[0] == 1:
        tiles = tiles[0]
    elif tiles.ndim == 4:  # conv weights (out, in, kh, kw): RGB tiles, else the in-channel mean
        tiles = np.moveaxis(tiles, 1, 3) if tiles.shape[1] == 3 else tiles.mean(axis=1)
    elif tiles.ndim == 2:
        tiles = tiles[None]
    elif tiles.ndim != 3:
        raise ArgumentError(
            "expected maps (C, H, W), (1, C, H, W), conv weights (out, in, kh, kw) or one map "
            f"(H, W), got {describe(maps)}"
        )
    tiles = finite_values(tiles, maps, "maps")
    if max_tiles is not None and max_tiles < 1:
        raise ArgumentError(f"expected max_tiles >= 1 or None, got {max_tiles}")
    tiles = tiles[:max_tiles]
    if padding < 0:
        raise ArgumentError(f"expected padding >= 0, got {padding}")
    if not 0.0 <= pad_value <= 1.0:
        raise ArgumentError(f"expected pad_value in [0, 1], got {pad_value}")
    count = tiles.shape[0]
    if normalize in ("tile", "all"):
        axes = tuple(range(1, tiles.ndim)) if normalize == "tile" else None
        low = tiles.min(axis=axes, keepdims=True)
        span = tiles.max(axis=axes, keepdims=True) - low
        tiles = np.divide(tiles - low, span, out=np.zeros_like(tiles), where=span > 0)
    elif normalize == "none":
        low, high = float(tiles.min()), float(tiles.max())
        if low < 0.0 or high > 1.0:
            raise ArgumentError(
                f"normalize='none' expects values in [0, 1], got values in [{low:.4g}, {high:.4g}]"
            )
    else:
        raise ArgumentError(f"expected normalize 'tile', 'all' or 'none', got {normalize!r}")

    ncols = math.ceil(math.sqrt(count)) if ncols is None else ncols
    if ncols < 1:
        raise ArgumentError(f"expected ncols >= 1 or None, got {ncols}")
    nrows = math.ceil(count / ncols)
    height, width = tiles.shape[1:3]
    grid_shape = (nrows * height + (nrows - 1) * padding, ncols * width + (ncols - 1) * padding)
    grid = np.full(grid_shape + tiles.shape[3:], pad_value, dtype=np.float32)
    for index, tile in enumerate(tiles):
        top, left = (index // ncols) * (height + padding), (index % ncols) * (width + padding)
        grid[top : top + height, left : left + width] = tile
    return grid


def plot(
    image: object,
    heatmap_or_attr: np.ndarray | torch.Tensor,
    *,
    title: str | None = None,
    alpha: float = 0.5,
    colormap: str = "jet",
    signed: bool | None = None,
    clip_percentile: float = SIGNED_CLIP_PERCENTILE,
) -> Figure:
    """Three panels, image | map | overlay -> a ``matplotlib.figure.Figure`` (no pyplot).

    ``heatmap_or_attr``: a map ``(H, W)`` or a per-channel attribution ``(3, H, W)`` (summed
    over channels); ``signed=None``: signed when any value is negative. Unsigned: as in
    :func:`overlay`, drawn with ``colormap`` on 0..1. Signed: ``"bwr"`` centred at 0, limits
    ``±L`` with ``L`` the ``clip_percentile`` percentile of ``|values|``, the overlay blending
    ``(clip(v, -L, L) / L + 1) / 2`` (:func:`camkit.viz.colour.signed_scale`). The middle
    panel shows the map at its own resolution (nearest neighbour), the overlay is
    :func:`overlay`'s; each has a colorbar.
    """
    alpha = checked_alpha(alpha)
    if not 0.0 < clip_percentile <= 100.0:
        raise ArgumentError(f"expected clip_percentile in (0, 100], got {clip_percentile}")
    from matplotlib.colors import ListedColormap
    from matplotlib.figure import Figure

    rgb = to_rgb_uint8(image)
    values = float_array(heatmap_or_attr, "a heatmap/attribution")
    while values.ndim > 3 and values.shape[0] == 1:
        values = values[0]
    if values.ndim == 3 and values.shape[0] in (1, 3):
        values = values.sum(axis=0)
    if values.ndim != 2:
        raise ArgumentError(
            f"expected a 2-D map (H, W) or a per-channel attribution (3, H, W), "
            f"got {describe(heatmap_or_attr)}"
        )
    values = finite_values(values, heatmap_or_attr, "map")
    is_signed = bool((values < 0).any()) if signed is None else signed
    if is_signed:
        unit, limit = signed_scale(values, clip_percentile)
        limit = limit or 1.0  # a map of zeros: drawn on ±1
        shown = np.clip(values, -limit, limit)
        low, high, cmap_name = -limit, limit, DIVERGING_COLORMAP
        map_title = f"signed attribution (clipped at ±{limit:.3g})"
        bar_label = f"0-centred; ±{limit:.3g} = p{clip_percentile:g} of |values|"
    else:
        unit = shown = heatmap_2d(values)
        low, high, cmap_name = 0.0, 1.0, colormap
        map_title, bar_label = "heatmap", "heatmap (0..1)"
        if values.min() < -FLOAT_TOLERANCE or values.max() > 1 + FLOAT_TOLERANCE:
            map_title = "heatmap (min-max rescaled)"
            bar_label = f"min-max rescaled from [{values.min():.3g}, {values.max():.3g}]"
    cmap = ListedColormap(colormap_lut(cmap_name) / 255.0, name=cmap_name)
    height, width = rgb.shape[:2]

    figure = Figure(figsize=(13.5, 4.5), layout="constrained")
    image_axes, map_axes, overlay_axes = figure.subplots(1, 3)
    image_axes.imshow(rgb)
    image_axes.set_title(f"image {width}x{height}")
    drawn = map_axes.imshow(
        shown,
        cmap=cmap,
        vmin=low,
        vmax=high,
        extent=(0, width, height, 0),
        interpolation="nearest",
    )
    map_axes.set_title(f"{map_title}, {values.shape[1]}x{values.shape[0]}")
    figure.colorbar(drawn, ax=map_axes, shrink=0.8, label=bar_label)
    overlay_axes.imshow(overlay(rgb, unit, alpha=alpha, colormap=cmap_name))
    overlay_axes.set_title(f"overlay (alpha={alpha:g}, {cmap_name})")
    for axes in (image_axes, map_axes, overlay_axes):
        axes.set_axis_off()
    if title is not None:
        figure.suptitle(title)
    return figure


def picture_grid(
    rows: Sequence[tuple[str, Sequence[np.ndarray]]],
    columns: Sequence[str],
    *,
    colormap: str | None = None,
    legend: str | None = None,
) -> np.ndarray:
    """Pictures in a titled grid, one row per ``(title, [picture, ...])``, one picture per
    named column -> ``HxWx3`` uint8 RGB. ``colormap``: a colour bar of the overlays' colormap
    at the right; ``legend``: a line of text under the grid.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import ListedColormap
    from matplotlib.figure import Figure

    width = 2.4 * len(columns) + (0.9 if colormap else 0.0)
    figure = Figure(
        figsize=(width, 1.8 * len(rows) + (0.4 if legend else 0.0)), layout="constrained"
    )
    axes = figure.subplots(len(rows), len(columns), squeeze=False)
    for row_axes, (title, pictures) in zip(axes, rows, strict=True):
        row_axes[0].set_ylabel(title, fontsize=9)
        for ax, picture in zip(row_axes, pictures, strict=True):
            ax.imshow(picture)
            ax.set(xticks=[], yticks=[])
    for ax, name in zip(axes[0], columns, strict=True):
        ax.set_title(name, fontsize=10)
    if colormap is not None:
        ramp = ListedColormap(colormap_lut(colormap) / 255.0, name=colormap)
        bar = figure.colorbar(ScalarMappable(cmap=ramp), ax=axes, shrink=0.6, aspect=30)
        bar.set_ticks([0.0, 0.5, 1.0], labels=["0 (none)", "0.5", "1 (most)"])
        bar.set_label("map value: evidence for the class", fontsize=9)
    if legend is not None:
        figure.supxlabel(legend, fontsize=9)
    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[:, :, :3]

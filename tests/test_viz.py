"""camkit.viz: overlays, feature grids, three-panel figures, atomic PNG writes."""

from __future__ import annotations

import os

import cv2
import matplotlib
import numpy as np
import pytest
import torch
from matplotlib.figure import Figure
from PIL import Image

from camkit import io as camkit_io
from camkit import viz
from camkit.errors import ArgumentError

RNG = np.random.default_rng(0)
IMAGE = RNG.integers(0, 256, size=(30, 40, 3), dtype=np.uint8)
HEAT = RNG.random((7, 7)).astype(np.float32)


def _colored_by_hand(heat: np.ndarray, size_hw: tuple[int, int], code: int) -> np.ndarray:
    resized = cv2.resize(heat, (size_hw[1], size_hw[0]), interpolation=cv2.INTER_LINEAR)
    levels = np.round(resized * 255).astype(np.uint8)
    return cv2.applyColorMap(levels, code)[:, :, ::-1]


@pytest.mark.parametrize(
    "image",
    [
        IMAGE,
        torch.from_numpy(IMAGE).permute(2, 0, 1).float() / 255,
        IMAGE[:, :, 0],
        IMAGE[:, :, :1],
        np.dstack([IMAGE, np.full((30, 40), 255, np.uint8)]),
        Image.fromarray(IMAGE),
        IMAGE.astype(np.float32) / 255,
    ],
    ids=["uint8-hwc", "float-chw-tensor", "gray", "gray-hwc1", "rgba", "pil", "float-hwc"],
)
def test_overlay_keeps_the_image_size(image: object) -> None:
    out = viz.overlay(image, HEAT)
    assert out.shape == (30, 40, 3) and out.dtype == np.uint8


def test_overlay_alpha_zero_is_the_image() -> None:
    assert np.array_equal(viz.overlay(IMAGE, HEAT, alpha=0.0), IMAGE)
    rgba = np.dstack([IMAGE, np.zeros((30, 40), np.uint8)])
    assert np.array_equal(viz.overlay(rgba, HEAT, alpha=0.0), IMAGE)  # alpha channel dropped
    gray = viz.overlay(IMAGE[:, :, 0], HEAT, alpha=0.0)
    assert np.array_equal(gray, np.repeat(IMAGE[:, :, :1], 3, axis=2))


def test_overlay_alpha_one_is_the_colormap_of_the_resized_heatmap() -> None:
    out = viz.overlay(IMAGE, torch.from_numpy(HEAT), alpha=1.0, colormap="jet")
    assert np.array_equal(out, _colored_by_hand(HEAT, (30, 40), cv2.COLORMAP_JET))
    hot = viz.overlay(IMAGE, np.ones((3, 3)), alpha=1.0, colormap="JET")
    assert tuple(hot[5, 5]) == (128, 0, 0)  # jet at 255 is dark red: BGR (0, 0, 128)


def test_overlay_blends_linearly() -> None:
    out = viz.overlay(IMAGE, HEAT, alpha=0.25, colormap="turbo")
    colored = _colored_by_hand(HEAT, (30, 40), cv2.COLORMAP_TURBO).astype(np.float32)
    expected = 0.75 * IMAGE.astype(np.float64) + 0.25 * colored
    assert np.abs(out - expected).max() <= 0.5 + 1e-3  # rounded to the nearest level


def test_overlay_matplotlib_colormap() -> None:
    out = viz.overlay(IMAGE, np.full((4, 4), 0.5), alpha=1.0, colormap="coolwarm")
    expected = np.round(np.array(matplotlib.colormaps["coolwarm"](128 / 255)[:3]) * 255)
    assert np.array_equal(out[0, 0], expected.astype(np.uint8))


def test_overlay_rescales_maps_outside_unit_range() -> None:
    heat = HEAT.copy()
    heat[0, 0], heat[0, 1] = 0.0, 1.0
    assert np.array_equal(viz.overlay(IMAGE, heat * 40 - 3), viz.overlay(IMAGE, heat))
    flat = viz.overlay(IMAGE, np.full((5, 5), 7.0), alpha=1.0)
    assert np.array_equal(flat, viz.overlay(IMAGE, np.zeros((5, 5)), alpha=1.0))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"colormap": "not-a-map"}, "unknown colormap 'not-a-map'.*jet"),
        ({"alpha": 1.5}, r"alpha in \[0, 1\], got 1.5"),
        (
            {"heatmap": np.zeros((2, 3, 3))},
            r"2-D heatmap \(H, W\), got ndarray of shape \(2, 3, 3\)",
        ),
        ({"heatmap": np.full((3, 3), np.nan)}, "NaN"),
        ({"image": IMAGE.astype(np.float32)}, r"values in \[0, 1\], got values in"),
        ({"image": np.zeros((2, 30, 40, 3))}, "2-D .* or 3-D"),
        ({"image": np.zeros((30, 40, 5))}, "1, 3 or 4 channels"),
    ],
)
def test_overlay_rejects_bad_input(kwargs: dict, message: str) -> None:
    arguments = {"image": IMAGE, "heatmap": HEAT, **kwargs}
    with pytest.raises(ValueError, match=message):
        viz.overlay(**arguments)


def test_to_rgb_uint8_conversions() -> None:
    assert np.array_equal(camkit_io.to_rgb_uint8(torch.from_numpy(IMAGE).permute(2, 0, 1)), IMAGE)
    assert np.array_equal(camkit_io.to_rgb_uint8(IMAGE.astype(np.float64) / 255), IMAGE)
    assert np.array_equal(camkit_io.to_rgb_uint8(IMAGE.astype(np.uint16) * 257), IMAGE)
    assert camkit_io.to_rgb_uint8(np.ones((2, 2), bool)).max() == 255
    with pytest.raises(ArgumentError, match="PIL image, numpy array or torch tensor"):
        camkit_io.to_rgb_uint8([[0, 1]])


def test_feature_grid_shape_and_padding() -> None:
    maps = torch.arange(10 * 16, dtype=torch.float32).reshape(10, 4, 4)
    grid = viz.feature_grid(maps, padding=1)
    assert grid.shape == (3 * 4 + 2, 4 * 4 + 3)  # 4 columns, 3 rows of 4x4 tiles
    assert grid[4, :].tolist() == [1.0] * 19  # padding row
    assert np.all(grid[10:14, 10:19] == 1.0)  # the two unused cells of the last row
    assert viz.feature_grid(maps, ncols=5, padding=0).shape == (8, 20)
    assert viz.feature_grid(maps[None], max_tiles=4, padding=2).shape == (10, 10)


def test_feature_grid_normalises_each_tile() -> None:
    maps = np.stack(
        [np.arange(9.0).reshape(3, 3) * 100, np.arange(9.0).reshape(3, 3), np.ones((3, 3))]
    )
    grid = viz.feature_grid(maps, ncols=3, padding=1)
    first, second, constant = grid[:, 0:3], grid[:, 4:7], grid[:, 8:11]
    assert first.min() == 0.0 and first.max() == 1.0
    assert np.allclose(first, second)
    assert np.array_equal(constant, np.zeros((3, 3)))
    together = viz.feature_grid(maps, ncols=3, padding=1, normalize="all")
    assert together[:, 0:3].max() == 1.0 and together[:, 4:7].max() < 0.02


def test_feature_grid_conv_weights() -> None:
    torch.manual_seed(0)
    rgb_filters = torch.randn(8, 3, 5, 5, requires_grad=True)
    grid = viz.feature_grid(rgb_filters)
    assert grid.shape == (3 * 5 + 2, 3 * 5 + 2, 3)
    assert grid.min() >= 0.0 and grid.max() <= 1.0
    deep = torch.randn(6, 16, 3, 3)
    assert viz.feature_grid(deep, padding=0).shape == (6, 9)
    expected = viz.feature_grid(deep.double().mean(dim=1), padding=0)  # the grid's float64
    assert np.allclose(viz.feature_grid(deep, padding=0), expected)


def test_feature_grid_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="NaN"):
        viz.feature_grid(np.full((2, 3, 3), np.nan))
    with pytest.raises(ValueError, match="got ndarray of shape"):
        viz.feature_grid(np.zeros((1, 1, 2, 3, 3)))
    with pytest.raises(ValueError, match="normalize"):
        viz.feature_grid(np.zeros((2, 3, 3)), normalize="per-tile")


def test_plot_unsigned_heatmap(tmp_path) -> None:
    figure = viz.plot(IMAGE, HEAT, title="cat")
    assert isinstance(figure, Figure)
    panels = figure.axes[:3]
    assert [axes.get_title().split(" ")[0] for axes in panels] == ["image", "heatmap,", "overlay"]
    assert figure.get_suptitle() == "cat"
    figure.savefig(tmp_path / "plot.png")
    figure.savefig(tmp_path / "plot.pdf")
    assert cv2.imread(str(tmp_path / "plot.png")) is not None
    assert (tmp_path / "plot.pdf").stat().st_size > 0


def test_plot_signed_attribution_is_centred_and_clipped() -> None:
    attribution = RNG.normal(size=(3, 30, 40)).astype(np.float32)
    attribution[0, 0, 0] = 1000.0  # an outlier that must not set the scale
    figure = viz.plot(torch.from_numpy(IMAGE).permute(2, 0, 1), torch.from_numpy(attribution))
    drawn = figure.axes[1].images[0]
    low, high = drawn.get_clim()
    limit = np.percentile(np.abs(attribution.sum(axis=0)), 99.5)
    assert low == -high and high == pytest.approx(limit)
    assert "signed" in figure.axes[1].get_title()
    forced = viz.plot(IMAGE, np.abs(HEAT), signed=True, clip_percentile=100)
    assert forced.axes[1].images[0].get_clim() == pytest.approx((-HEAT.max(), HEAT.max()))


def test_save_png_is_atomic_and_readable(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "out.png"
    assert camkit_io.save_png(target, IMAGE) == target
    assert np.array_equal(cv2.imread(str(target))[:, :, ::-1], IMAGE)
    assert os.listdir(tmp_path) == ["out.png"]

    def interrupted(source: object, destination: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        camkit_io.save_png(target, np.zeros((5, 5, 3), np.uint8))
    monkeypatch.undo()
    assert os.listdir(tmp_path) == ["out.png"]  # no temporary file left behind
    assert np.array_equal(cv2.imread(str(target))[:, :, ::-1], IMAGE)  # old picture intact

    camkit_io.save_png(target, viz.feature_grid(np.ones((2, 3, 3))))  # float gray grids work too
    assert cv2.imread(str(target)).shape == (3, 7, 3)
    with pytest.raises(ValueError, match=r"\.png"):
        camkit_io.save_png(tmp_path / "out.jpg", IMAGE)


def test_overlay_and_feature_grid_take_a_slice_of_a_volume():
    volume = torch.rand(4, 6, 5)  # (D, H, W)
    image = torch.rand(1, 4, 6, 5)  # (C, D, H, W), gray
    np.testing.assert_array_equal(
        viz.overlay(image, volume, depth=2), viz.overlay(image[:, 2], volume[2])
    )
    maps = torch.rand(3, 4, 6, 5)  # (C, D, H, W) feature maps
    np.testing.assert_array_equal(viz.feature_grid(maps, depth=1), viz.feature_grid(maps[:, 1]))
    with pytest.raises(ValueError, match="outside the volume's 4 slices"):
        viz.overlay(image, volume, depth=4)

"""camkit.io: every odd image kind read right, limits before decoding, atomic writes, DataLoader."""

from __future__ import annotations

import dataclasses
import json
import os
import struct
import zlib
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from PIL import Image, ImageFile
from torch.utils.data import DataLoader

from camkit import io as cio
from camkit.cli.dataset import ImageFiles, collate
from camkit.errors import ArgumentError
from camkit.models import Preprocess

RNG = np.random.default_rng(0)
RGB = RNG.integers(0, 256, (5, 7, 3), dtype=np.uint8)  # H=5, W=7


def smooth_rgb(height: int = 24, width: int = 40) -> np.ndarray:
    """A gradient (JPEG keeps it within a level or two)."""
    rows, cols = np.meshgrid(np.linspace(0, 255, height), np.linspace(0, 255, width), indexing="ij")
    return np.stack([rows, cols, np.full_like(rows, 128)], axis=-1).round().astype(np.uint8)


# ----------------------------------------------------------------------------- odd image kinds


def test_rgb_png_is_read_exactly(tmp_path: Path) -> None:
    Image.fromarray(RGB).save(tmp_path / "rgb.png")
    out = cio.read_image(tmp_path / "rgb.png")
    assert out.dtype == np.uint8 and out.flags.c_contiguous
    assert np.array_equal(out, RGB)


def test_grayscale_is_repeated_to_rgb(tmp_path: Path) -> None:
    gray = RGB[:, :, 0]
    Image.fromarray(gray).save(tmp_path / "gray.png")
    assert Image.open(tmp_path / "gray.png").mode == "L"
    assert np.array_equal(cio.read_image(tmp_path / "gray.png"), np.repeat(gray[:, :, None], 3, 2))


def test_one_bit_and_palette_images(tmp_path: Path) -> None:
    bits = np.array([[0, 1, 1], [1, 0, 0]], bool)
    Image.fromarray(bits).save(tmp_path / "bits.png")
    assert np.array_equal(cio.read_image(tmp_path / "bits.png")[:, :, 1], bits * 255)
    palette = Image.new("P", (2, 1))
    palette.putpalette([10, 20, 30, 200, 100, 50] + [0] * 762)
    palette.putpixel((1, 0), 1)
    palette.save(tmp_path / "palette.png", transparency=0)
    assert cio.read_image(tmp_path / "palette.png").tolist() == [[[10, 20, 30], [200, 100, 50]]]


def test_rgba_drops_alpha_without_compositing(tmp_path: Path) -> None:
    alpha = np.array([0, 255, 128, 7, 0, 1, 2], np.uint8)[None, :].repeat(5, 0)[:, :, None]
    Image.fromarray(np.concatenate([RGB, alpha], axis=2)).save(tmp_path / "rgba.png")
    assert Image.open(tmp_path / "rgba.png").mode == "RGBA"
    assert np.array_equal(cio.read_image(tmp_path / "rgba.png"), RGB)  # as torchvision's loader


def test_sixteen_bit_png_is_divided_by_257(tmp_path: Path) -> None:
    deep = np.array([[0, 128, 129, 385], [65535, 65406, 32896, 1000]], np.uint16)
    Image.fromarray(deep).save(tmp_path / "deep.png")
    assert Image.open(tmp_path / "deep.png").mode == "I;16"
    # by hand: round(v / 257): 128/257=0.498 -> 0, 129 -> 1, 385 -> 1.498 -> 1, 65406 -> 254.498
    # -> 254, 32896 -> 128, 1000 -> 3.89 -> 4
    expected = np.array([[0, 0, 1, 1], [255, 254, 128, 4]], np.uint8)
    assert np.array_equal(
        cio.read_image(tmp_path / "deep.png"), np.repeat(expected[..., None], 3, 2)
    )


def test_sixteen_bit_rgb_and_rgba_png_keep_the_high_byte(tmp_path: Path) -> None:
    # Pillow reduces 48/64-bit PNG to 8 bits per channel by keeping the high byte (v >> 8):
    # at most one level below round(v / 257) (256 -> 1, 383 -> 1, 32896 -> 128 either way)
    deep = np.array([[[0, 255, 256], [65535, 32896, 383]]], np.uint16)
    cv2.imwrite(str(tmp_path / "rgb16.png"), deep[:, :, ::-1].copy())
    rgba = np.concatenate([deep, np.full((1, 2, 1), 40000, np.uint16)], axis=2)
    cv2.imwrite(str(tmp_path / "rgba16.png"), rgba[:, :, [2, 1, 0, 3]].copy())
    expected = [[[0, 0, 1], [255, 128, 1]]]
    assert cio.read_image(tmp_path / "rgb16.png").tolist() == expected
    assert cio.read_image(tmp_path / "rgba16.png").tolist() == expected


def test_cmyk_jpeg_is_converted_to_rgb(tmp_path: Path) -> None:
    # flat CMYK patches: R = (255 - C)(255 - K) / 255 by hand; (50, 0, 0, 100) -> (125, 155, 155)
    cmyk = np.zeros((16, 16, 4), np.uint8)
    cmyk[..., 0], cmyk[..., 3] = 50, 100
    Image.fromarray(cmyk, "CMYK").save(tmp_path / "flat.jpg", quality=100)
    with Image.open(tmp_path / "flat.jpg") as stored:
        assert stored.mode == "CMYK" and "adobe" in stored.info
    assert (cio.read_image(tmp_path / "flat.jpg") == [125, 155, 155]).all()
    # a photo-like gradient saved as CMYK comes back as its RGB, within JPEG's loss
    rgb = smooth_rgb()
    Image.fromarray(rgb).convert("CMYK").save(tmp_path / "gradient.jpg", quality=95)
    back = cio.read_image(tmp_path / "gradient.jpg").astype(int)
    assert back.shape == rgb.shape
    assert np.abs(back - rgb).mean() < 1.0 and np.abs(back - rgb).max() <= 4


@pytest.mark.parametrize("suffix", [".png", ".jpg"])
def test_exif_orientation_six_is_rotated_upright(tmp_path: Path, suffix: str) -> None:
    # orientation 6: the stored pixels must be turned 90 degrees clockwise to be seen upright
    stored = smooth_rgb(24, 40) if suffix == ".jpg" else RGB
    exif = Image.Exif()
    exif[0x0112] = 6
    path = tmp_path / f"rotated{suffix}"
    Image.fromarray(stored).save(path, exif=exif, **({"quality": 95} if suffix == ".jpg" else {}))
    out = cio.read_image(path)
    upright = np.rot90(stored, k=-1)  # clockwise
    assert out.shape == upright.shape == (stored.shape[1], stored.shape[0], 3)
    if suffix == ".png":
        assert np.array_equal(out, upright)
        assert out[0, -1].tolist() == stored[0, 0].tolist()  # top-left goes to top-right
    else:
        assert np.abs(out.astype(int) - upright).mean() < 1.0


def test_mixed_sizes_keep_their_own_size(tmp_path: Path) -> None:
    for height, width in [(3, 9), (40, 2), (17, 17)]:
        Image.fromarray(smooth_rgb(height, width)).save(tmp_path / f"{height}x{width}.png")
        assert cio.read_image(tmp_path / f"{height}x{width}.png").shape == (height, width, 3)


# ----------------------------------------------------------------------------- refusals


def png_header_only(path: Path, width: int, height: int) -> Path:
    """A PNG that declares ``width x height`` RGB but holds one compressed row: a forged header."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    row = zlib.compress(b"\x00" * (1 + 3 * min(width, 1000)))
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", row) + chunk(b"IEND", b"")
    )
    return path


def test_huge_header_is_refused_before_allocating(tmp_path: Path) -> None:
    path = png_header_only(tmp_path / "huge.png", 100_000, 100_000)  # 30 GB if decoded
    assert path.stat().st_size < 200
    with pytest.raises(cio.ImageTooLargeError, match="refused before decoding") as caught:
        cio.read_image(path)
    assert "10000000000" in str(caught.value)  # Pillow's own bomb check names the size
    assert isinstance(caught.value, cio.READ_ERRORS)


def test_pixel_limit_is_checked_before_any_pixel_is_decoded(tmp_path, monkeypatch) -> None:
    # 12000 x 8000 = 96 MP: above camkit's default 89.5 MP, below Pillow's bomb error (179 MP)
    path = png_header_only(tmp_path / "big.png", 12_000, 8_000)

    def no_decoding(self):
        raise AssertionError("pixels were decoded")

    monkeypatch.setattr(ImageFile.ImageFile, "load", no_decoding)
    with pytest.raises(cio.ImageTooLargeError) as caught:
        cio.read_image(path)
    message = str(caught.value)
    assert "12000x8000 (96,000,000 pixels)" in message and "89,478,485" in message
    Image.fromarray(RGB).save(tmp_path / "small.png")
    with pytest.raises(cio.ImageTooLargeError, match=r"5x7|7x5"):
        cio.read_image(tmp_path / "small.png", max_pixels=34)  # 35 pixels


def test_pixel_limit_lets_an_image_at_the_limit_through(tmp_path: Path) -> None:
    Image.fromarray(RGB).save(tmp_path / "small.png")
    assert cio.read_image(tmp_path / "small.png", max_pixels=35).shape == (5, 7, 3)
    assert cio.read_image(tmp_path / "small.png", max_pixels=None).shape == (5, 7, 3)


def test_unreadable_files_give_clear_reasons(tmp_path: Path) -> None:
    (tmp_path / "text.jpg").write_text("not an image")
    Image.fromarray(smooth_rgb(64, 64)).save(tmp_path / "whole.jpg")
    data = (tmp_path / "whole.jpg").read_bytes()
    (tmp_path / "cut.jpg").write_bytes(data[: len(data) // 2])
    reasons = {}
    for name in ["text.jpg", "cut.jpg", "missing.png"]:
        with pytest.raises(cio.READ_ERRORS) as caught:
            cio.read_image(tmp_path / name)
        reasons[name] = cio.read_failure(caught.value)
    assert reasons["text.jpg"] == "not an image file that Pillow can decode"
    assert reasons["cut.jpg"].startswith("the file is truncated or corrupt")
    assert reasons["missing.png"] == "no such file"


# ----------------------------------------------------------------------------- writing


def test_save_png_round_trips_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "out.png"
    assert cio.save_png(target, RGB) == target
    assert np.array_equal(cio.read_image(target), RGB)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.png"]
    cio.save_png(target, RGB[::-1], durable=False)  # no fsync: still atomic (a rename)
    assert np.array_equal(cio.read_image(target), RGB[::-1])
    with pytest.raises(ValueError, match=r"ending in \.png"):
        cio.save_png(tmp_path / "out.jpg", RGB)


def test_write_atomic_keeps_the_old_file_when_writing_fails(tmp_path, monkeypatch) -> None:
    target = tmp_path / "manifest.json"
    cio.save_json(target, {"old": 1})

    def broken_replace(source, destination):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        cio.save_json(target, {"new": 2})
    assert json.loads(target.read_text()) == {"old": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["manifest.json"]  # no temporary left


def test_leftover_temporaries_are_those_write_atomic_writes(tmp_path, monkeypatch) -> None:
    """A writer killed by signal 9 between writing and renaming leaves its temporary file; the
    finder lists exactly such files (in subfolders too), never the user's own dotfiles."""
    monkeypatch.setattr(os, "replace", lambda source, destination: None)  # killed: no rename
    cio.save_json(tmp_path / "a.json", [1])
    (tmp_path / "thumbs").mkdir()
    cio.save_png(tmp_path / "thumbs" / "b.png", RGB)
    (tmp_path / ".notes.tmp").write_text("mine")
    (tmp_path / ".x.0123.tmp").write_text("mine")
    found = sorted(p.relative_to(tmp_path).parts[0] for p in cio.leftover_temporaries(tmp_path))
    assert len(found) == 2 and found[1] == "thumbs" and found[0].startswith(".a.json.")


def test_save_npy_json_and_jpeg(tmp_path: Path) -> None:
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert np.array_equal(np.load(cio.save_npy(tmp_path / "a.npy", array)), array)
    assert json.loads(cio.save_json(tmp_path / "a.json", [1, "é"]).read_text("utf-8")) == [1, "é"]
    rgb = smooth_rgb()
    back = cio.read_image(cio.save_jpeg(tmp_path / "a.jpg", rgb, quality=95)).astype(int)
    assert np.abs(back - rgb).mean() < 1.0
    with pytest.raises(ValueError, match="quality"):
        cio.save_jpeg(tmp_path / "b.jpg", rgb, quality=0)
    with pytest.raises(ValueError, match=r"\.jpg or \.jpeg"):
        cio.save_jpeg(tmp_path / "b.png", rgb)


def test_thumbnail_averages_areas_and_keeps_the_aspect_ratio() -> None:
    image = np.zeros((4, 4, 3), np.uint8)
    image[:2, :2] = [0, 100, 200]
    image[:2, 2:] = [[10, 20, 30], [30, 40, 50]]  # one row of each: the block's mean is 20, 30, 40
    small = cio.thumbnail(image, max_side=2)
    assert small.shape == (2, 2, 3)
    assert small[0, 0].tolist() == [0, 100, 200] and small[0, 1].tolist() == [20, 30, 40]
    assert cio.thumbnail(np.zeros((300, 900, 3), np.uint8), 256).shape == (85, 256, 3)
    assert cio.thumbnail(np.zeros((1, 900), np.uint8), 256).shape == (1, 256, 3)
    assert np.array_equal(cio.thumbnail(RGB, 256), RGB)
    with pytest.raises(ValueError, match="max_side"):
        cio.thumbnail(RGB, 0)


# ----------------------------------------------------------------------------- DataLoader


PREPROCESS = dataclasses.replace(Preprocess(size=(16, 16)), crop_mode="squash")


def mixed_folder(folder: Path) -> list[Path]:
    """Eight files of mixed kinds and sizes, the fourth one corrupt."""
    paths = []
    Image.fromarray(smooth_rgb(30, 50)).save(paths_append(paths, folder / "a.png"))
    Image.fromarray(RGB[:, :, 0]).save(paths_append(paths, folder / "gray.png"))
    Image.fromarray(np.full((9, 4, 4), 200, np.uint8)).save(paths_append(paths, folder / "c.png"))
    paths_append(paths, folder / "broken.jpg").write_bytes(b"\xff\xd8\xff garbage")
    deep = (np.arange(60, dtype=np.uint16).reshape(6, 10) * 1000).astype(np.uint16)
    Image.fromarray(deep).save(paths_append(paths, folder / "deep.png"))
    Image.fromarray(smooth_rgb()).convert("CMYK").save(paths_append(paths, folder / "cmyk.jpg"))
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(smooth_rgb(12, 20)).save(paths_append(paths, folder / "rot.jpg"), exif=exif)
    Image.fromarray(smooth_rgb(70, 33)).save(paths_append(paths, folder / "tall.png"))
    return paths


def paths_append(paths: list[Path], path: Path) -> Path:
    paths.append(path)
    return path


def test_image_files_item_and_error_item(tmp_path: Path) -> None:
    paths = mixed_folder(tmp_path)
    dataset = ImageFiles(paths, PREPROCESS)
    assert len(dataset) == 8
    item = dataset[6]
    assert item["index"] == 6 and item["path"] == str(paths[6]) and item["error"] is None
    assert item["image"].dtype == torch.uint8 and tuple(item["image"].shape) == (20, 12, 3)
    assert torch.equal(item["input"], PREPROCESS(cio.read_image(paths[6])))
    broken = dataset[3]
    assert broken["input"] is None and broken["image"] is None
    assert broken["error"] == "not an image file that Pillow can decode"
    assert ImageFiles(paths, PREPROCESS, keep_original=False)[0]["image"] is None


def test_image_files_reports_preprocess_failures(tmp_path: Path) -> None:
    Image.fromarray(RGB).save(tmp_path / "a.png")

    def failing(image):
        raise ValueError("too small")

    assert ImageFiles([tmp_path / "a.png"], failing)[0]["error"] == (
        "preprocessing failed: too small"
    )
    assert "(3, h, w) tensor" in ImageFiles([tmp_path / "a.png"], np.asarray)[0]["error"]
    with pytest.raises(ArgumentError, match="callable"):
        ImageFiles([tmp_path / "a.png"], "squash")


def test_dataloader_with_two_workers_over_mixed_files(tmp_path: Path) -> None:
    paths = mixed_folder(tmp_path)
    loader = DataLoader(
        ImageFiles(paths, PREPROCESS), batch_size=3, num_workers=2, collate_fn=collate
    )
    batches = list(loader)
    assert [len(batch) for batch in batches] == [3, 3, 2]
    indices = [i for batch in batches for i in batch.indices]
    failures = [f for batch in batches for f in batch.failures]
    assert indices == [0, 1, 2, 4, 5, 6, 7]  # order kept, the corrupt file set aside
    assert failures == [(3, str(paths[3]), "not an image file that Pillow can decode")]
    sizes = [tuple(image.shape) for batch in batches for image in batch.images]
    assert sizes == [(30, 50, 3), (5, 7, 3), (9, 4, 3), (6, 10, 3), (24, 40, 3), (20, 12, 3)] + [
        (70, 33, 3)
    ]
    for batch in batches:
        assert batch.inputs.shape == (len(batch.indices), 3, 16, 16)
        for row, path in enumerate(batch.paths):
            original = cio.read_image(path)
            assert np.array_equal(batch.images[row].numpy(), original)
            assert torch.equal(batch.inputs[row], PREPROCESS(original))


def test_collate_all_failed_and_mismatched_shapes() -> None:
    failed = {"index": 0, "path": "x.png", "input": None, "image": None, "error": "no such file"}
    batch = collate([failed])
    assert batch.inputs is None and batch.indices == [] and len(batch) == 1
    good = [
        {"index": i, "path": f"{i}.png", "input": torch.zeros(3, 8, 8 + i), "image": None}
        | {"error": None}
        for i in range(2)
    ]
    with pytest.raises(ValueError, match="differ in shape"):
        collate(good)


@pytest.mark.parametrize(
    ("suffix", "kind"), [(".png", "PNG"), (".jpeg", "JPEG"), (".webp", "WEBP")]
)
def test_save_image_writes_the_format_its_suffix_names(tmp_path: Path, suffix: str, kind: str):
    """PNG is exact; JPEG and WebP at quality 90 stay within a few levels on a smooth image."""
    ramp = np.linspace(0, 255, 64 * 48 * 3).reshape(48, 64, 3).round().astype(np.uint8)
    path = cio.save_image(tmp_path / f"overlay{suffix}", ramp, 90)
    with Image.open(path) as written:
        assert written.format == kind and written.size == (64, 48)
        pixels = np.asarray(written.convert("RGB")).astype(int)
    error = np.abs(pixels - ramp).max()
    assert error == 0 if kind == "PNG" else 0 < error <= 12
    with pytest.raises(ArgumentError, match=r"\.png, \.jpg, \.webp or \.jpeg, got"):
        cio.save_image(tmp_path / "overlay.gif", ramp)
    with pytest.raises(ArgumentError, match="quality in 1..100"):
        cio.save_image(tmp_path / "overlay.webp", ramp, 0)

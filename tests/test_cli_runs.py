"""The CLI around a day's runs: progress inside an evaluate batch, a resumed manifest that keeps
every run's times and counts, what a folder scan skipped and why, ``--max-pixels``."""

from __future__ import annotations

import io as pyio
import json
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision
from PIL import Image

from camkit import cli
from camkit.cli import files
from camkit.core.progress import LogProgress, counting_rows

MODEL = ["--model", "torchvision:squeezenet1_1"]


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("weights") / "squeeze.pt"
    torch.save(torchvision.models.squeezenet1_1(num_classes=4).state_dict(), path)
    return path


def picture(path: Path, seed: int, size: tuple[int, int] = (48, 40)) -> Path:
    rng = np.random.default_rng(seed)
    Image.fromarray((rng.random((size[1], size[0], 3)) * 255).astype(np.uint8)).save(path)
    return path


def test_a_folder_scan_says_what_it_skipped_and_why(tmp_path: Path, capsys) -> None:
    folder = tmp_path / "photos"
    folder.mkdir()
    picture(folder / "a.png", 0)
    picture(folder / ".hidden.png", 1)
    (folder / "notes.txt").write_text("hi")
    (folder / "sub").mkdir()
    (folder / "gone.png").symlink_to(folder / "missing.png")
    (folder / "loop.png").symlink_to(folder / "loop.png")
    frames = [Image.new("RGB", (8, 8), colour) for colour in ("red", "green", "blue")]
    frames[0].save(folder / "animated.gif", save_all=True, append_images=frames[1:])
    found = files.find_images([str(folder)])
    assert [p.name for p in found.paths] == ["a.png", "animated.gif"]
    assert {p.name: why for p, why in found.skipped} == {
        ".hidden.png": "hidden file",
        "gone.png": "a dangling symlink",
        "loop.png": "a symlink loop",
        "notes.txt": "not an image file name (.txt)",
        "sub": "a folder: subfolders are not searched",
    }
    assert found.notes == [
        (folder / "animated.gif", "an animated GIF of 3 frames: only its first frame is explained")
    ]
    found.report()
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("camkit: skipped 5 file(s): .hidden.png (hidden file), gone.png")
    assert err[1].endswith(
        "animated.gif: an animated GIF of 3 frames: only its first frame is explained"
    )


def test_max_pixels_refuses_a_large_image_and_lets_a_smaller_limit_be_raised(
    tmp_path: Path, weights: Path, capsys
) -> None:
    big = picture(tmp_path / "big.png", 2, (64, 64))
    small = picture(tmp_path / "small.png", 3, (20, 20))
    run = [*MODEL, "--weights", str(weights), "--method", "saliency", "--quiet", "--workers", "0"]
    out = tmp_path / "out"
    assert (
        cli.main(["explain", str(big), str(small), *run, "--out", str(out), "--max-pixels", "1000"])
        == 1
    )
    err = capsys.readouterr().err
    assert (
        "big.png" in err and "more than the limit of 1,000 pixels" in err and "--max-pixels" in err
    )
    assert (
        cli.main(["explain", str(big), *run, "--out", str(tmp_path / "two"), "--max-pixels", "0"])
        == 0
    )
    with pytest.raises(SystemExit):
        cli.main(["explain", str(big), *run, "--max-pixels", "-1"])
    assert "expected a number of pixels" in capsys.readouterr().err


def test_a_resumed_manifest_keeps_every_runs_times_and_counts(
    tmp_path: Path, weights: Path, capsys
) -> None:
    folder = tmp_path / "photos"
    folder.mkdir()
    for k in range(3):
        picture(folder / f"p{k}.png", 10 + k)
    (folder / "zz-broken.png").write_bytes(b"not an image")
    out = tmp_path / "out"
    run = [*MODEL, "--weights", str(weights), "--method", "saliency", "--quiet", "--workers", "0"]
    run += ["--out", str(out), "--images-per-batch", "2"]
    assert cli.main(["explain", str(folder / "p0.png"), str(folder / "zz-broken.png"), *run]) == 1
    first = json.loads((out / "manifest.json").read_text())
    assert (first["explained"], first["unreadable"]) == (1, 1)
    assert cli.main(["explain", str(folder), *run, "--resume"]) == 1
    capsys.readouterr()
    merged = json.loads((out / "manifest.json").read_text())
    assert (merged["explained"], merged["unreadable"]) == (3, 1)  # the whole manifest
    assert len([r for r in merged["records"] if "error" in r]) == 1
    one, two = merged["runs"]
    assert one == first["runs"][0]  # the first run's start, end, counts and throughput kept
    assert (one["explained"], one["unreadable"], one["throughput"]["images"]) == (1, 1, 2)
    assert (two["explained"], two["unreadable"], two["throughput"]["images"]) == (2, 0, 2)
    assert merged["started"] == first["started"] and merged["finished"] == two["finished"]
    assert merged["throughput"]["images"] == 4
    seconds = one["throughput"]["seconds"] + two["throughput"]["seconds"]
    assert merged["throughput"]["seconds"] == pytest.approx(seconds)


def test_evaluate_shows_the_work_inside_a_batch(tmp_path: Path, weights: Path, capsys) -> None:
    photo = picture(tmp_path / "p.png", 5)
    out = tmp_path / "metrics"
    arguments = ["evaluate", str(photo), *MODEL, "--weights", str(weights), "--workers", "0"]
    arguments += ["--methods", "saliency,gradcam", "--metrics", "deletion", "--steps", "4"]
    assert cli.main([*arguments, "--out", str(out), "--device", "cpu"]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("evaluate:")]
    # 1 image x 2 methods; forward rows: 1 clean pass, then per method the map's pass(es) and
    # the deletion curve's 4 + 1 steps
    assert lines[-1].startswith("evaluate: 2/2 maps (100%)") and "copies scored]" in lines[-1]


def test_counting_rows_reports_each_pass_and_leaves_no_hook() -> None:
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 2))
    seen: list[int] = []
    with counting_rows(model, seen.append):
        model(torch.zeros(5, 3, 2, 2))
        model(torch.zeros(2, 3, 2, 2))
    model(torch.zeros(1, 3, 2, 2))
    assert seen == [5, 2] and not model._forward_pre_hooks
    with pytest.raises(RuntimeError, match="stop"), counting_rows(model, _stop):
        model(torch.zeros(1, 3, 2, 2))
    assert not model._forward_pre_hooks
    seen.clear()
    with counting_rows(model, seen.append):  # another thread's pass through the model: not counted
        other = threading.Thread(target=model, args=(torch.zeros(3, 3, 2, 2),))
        other.start()
        other.join()
        model(torch.zeros(4, 3, 2, 2))
    assert seen == [4]
    ticks = iter(range(100))
    buffer = pyio.StringIO()
    shown = LogProgress(4, "evaluate", "map", interval=5, file=buffer, clock=lambda: next(ticks))
    shown.set_postfix_str("10 copies scored")  # t=1 since the start: no line yet
    for _ in range(4):
        shown.set_postfix_str("20 copies scored")
    shown.close()
    lines = buffer.getvalue().splitlines()
    assert lines[0] == "evaluate: 0/4 maps (0%) [20 copies scored]"
    assert len(lines) == 1  # closing: the last line was already shown


def _stop(rows: int) -> None:
    raise RuntimeError("stop")

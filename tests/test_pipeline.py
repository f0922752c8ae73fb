"""``camkit explain`` as a pipeline: torchrun ranks, resume after SIGKILL, the manifest."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision
from PIL import Image

from camkit.runs import manifest
from camkit.strategies import load_maps

MODEL = ["--model", "torchvision:resnet18"]


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("weights") / "resnet18.pt"
    torch.save(torchvision.models.resnet18(num_classes=10).state_dict(), path)
    return path


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    """40 small photos of mixed sizes and kinds (RGB, gray, RGBA) and one broken file."""
    folder = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    for i in range(40):
        size = (int(rng.integers(40, 90)), int(rng.integers(40, 90)))
        pixels = rng.integers(0, 256, (*size[::-1], 3), dtype=np.uint8)
        image = Image.fromarray(pixels)
        image = [image, image.convert("L"), image.convert("RGBA")][i % 3]
        image.save(folder / f"img{i:02d}.png")
    (folder / "broken.png").write_bytes(b"not a png")
    return folder


def explain(*args, env: dict | None = None, launcher: list[str] | None = None, **kw):
    command = [*(launcher or [sys.executable]), "-m", "camkit", "explain", *map(str, args)]
    environment = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run(
        command, capture_output=True, text=True, timeout=600, env=environment, **kw
    )


def records_by_image(manifest: dict) -> dict[str, list[dict]]:
    found: dict[str, list[dict]] = {}
    for record in manifest["records"]:
        found.setdefault(record["image"], []).append(record)
    return found


@pytest.mark.slow
def test_two_torchrun_ranks_equal_one_process(tmp_path, images, weights):
    common = [images, *MODEL, "--weights", weights, "--save-raw", "--save-maps", "--workers", "0"]
    single = explain(*common, "--out", tmp_path / "one")
    assert single.returncode == 1, single.stderr  # the broken file
    assert "Traceback" not in single.stderr  # exit status 1 is also Python's for a crash
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    double = explain(*common, "--out", tmp_path / "two", launcher=torchrun)
    assert double.returncode == 1, double.stderr
    assert "broken.png" in double.stderr
    one = json.loads((tmp_path / "one" / "manifest.json").read_text())
    two = json.loads((tmp_path / "two" / "manifest.json").read_text())
    assert not list((tmp_path / "two").glob("manifest.rank*.jsonl"))  # merged and removed
    by_image = records_by_image(two)
    assert len(by_image) == 41 and all(len(rows) == 1 for rows in by_image.values())
    assert {row["rank"] for rows in by_image.values() for row in rows} == {0, 1}
    assert [r["image"] for r in one["records"]] == [r["image"] for r in two["records"]]
    assert len(two["throughput"]["ranks"]) == 2
    assert sum(rank["images"] for rank in two["throughput"]["ranks"]) == 41
    for a, b in zip(one["records"], two["records"], strict=True):
        if "error" in a:
            assert "error" in b
            continue
        assert (a["output"], a["target"]) == (b["output"], b["target"])
        assert (tmp_path / "two" / b["output"]).is_file()
        map_one = np.load(tmp_path / "one" / a["raw"])
        map_two = np.load(tmp_path / "two" / b["raw"])
        np.testing.assert_allclose(map_one, map_two, atol=1e-4)
    for key in ("camkit", "torch", "torchvision", "timm", "arguments", "weights_sha256"):
        assert two[key], key
    # --save-maps: one maps.npz per run, rows in the manifest's order, the same from both
    assert not list((tmp_path / "two").glob("maps.rank*"))
    maps_one, maps_two = load_maps(tmp_path / "one"), load_maps(tmp_path / "two")
    rows = [r for r in two["records"] if "map" in r]
    assert [r["map"] for r in rows] == list(range(40)) and len(maps_two) == 40
    assert maps_two.image.tolist() == [r["image"] for r in rows]
    np.testing.assert_allclose(maps_one.maps, maps_two.maps, atol=2e-3)
    raw = np.load(tmp_path / "two" / rows[7]["raw"])
    np.testing.assert_allclose(maps_two.maps[7], raw.squeeze(), atol=1e-3)


@pytest.mark.slow
def test_a_killed_run_resumes_to_one_consistent_manifest(tmp_path, images, weights):
    out = tmp_path / "out"
    common = [images, *MODEL, "--weights", weights, "--out", out, "--workers", "0"]
    common += ["--images-per-batch", "2", "--method", "gradcam,layercam", "--quiet", "--save-maps"]
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "camkit", "explain", *map(str, common)]
    process = subprocess.Popen(command, env=environment, stderr=subprocess.DEVNULL)
    part = out / "manifest.rank0.jsonl"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if part.is_file() and len(manifest.read(part)["records"]) >= 6:
            break
        time.sleep(0.2)
    process.send_signal(signal.SIGKILL)
    process.wait()
    done_before = {r["image"] for r in manifest.read(part)["records"]}
    assert 0 < len(done_before) < 41

    changed = explain(*["gradcam" if a == "gradcam,layercam" else a for a in common], "--resume")
    assert changed.returncode == 2 and "methods: was ['gradcam', 'layercam']" in changed.stderr

    resumed = explain(*common, "--resume")
    assert resumed.returncode == 1, resumed.stderr
    merged = json.loads((out / "manifest.json").read_text())
    broken_left = not any("broken" in image for image in done_before)
    assert merged["unreadable"] == 1 and merged["explained"] == 40  # the whole manifest
    first, last = merged["runs"]  # each run's own counts and times, the killed one's too
    assert last["unreadable"] == int(broken_left)  # counted apart from the explained
    assert last["explained"] == 41 - len(done_before) - int(broken_left)
    assert merged["started"] == first["started"] <= last["started"]
    assert first["throughput"]["images"] == len(done_before)
    images = first["throughput"]["images"] + last["throughput"]["images"]
    assert merged["throughput"]["images"] == images == 41
    by_image = records_by_image(merged)
    assert len(by_image) == 41
    for image, rows in by_image.items():
        outputs = [row.get("output") for row in rows]
        assert len(outputs) == len(set(outputs)) == (1 if "broken" in image else 2), image
    assert not list(out.glob("manifest.rank*.jsonl")) and not list(out.glob("*.tmp"))
    # every overlay's map in maps.npz, once, at the row its record names
    saved = load_maps(out)
    rows = [r for r in merged["records"] if "output" in r]
    assert sorted(r["map"] for r in rows) == list(range(80)) and len(saved) == 80
    for r in rows:
        assert (saved.image[r["map"]], saved.method[r["map"]]) == (r["image"], r["method"])
    assert not list(out.glob("maps.rank*"))


def test_a_batch_cut_short_by_a_kill_counts_for_none_of_its_images(tmp_path):
    part = tmp_path / "manifest.rank0.jsonl"
    records = [{"image": f"{name}.png", "method": m} for name in "ab" for m in ("gc", "lc")]
    manifest.append(part, [{"settings": {}, "rank": 0}])
    manifest.append(part, [{"record": r} for r in records[:2]] + [{"throughput": {"images": 1}}])
    # the next batch: image b's first record written, its second and the throughput not (yet)
    manifest.append(part, [{"record": records[2]}])
    read = manifest.read(part)
    assert read["records"] == records[:2] and read["throughput"] == {"images": 1}
    with open(part, "a") as file:  # a line the kill cut in half
        file.write('{"record": {"ima')
    assert manifest.read(part)["records"] == records[:2]

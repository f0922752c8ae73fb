"""``camkit concepts``: reference images per channel of the packaged model over scikit-image
photos (concepts.json, PNG patches inside their photo, progress in the log), usage errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from PIL import Image
from skimage import data

from camkit import cli
from camkit.cli.common import EXIT_UNREADABLE_IMAGES, EXIT_USAGE
from camkit.runs.concepts import read_concepts


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("photos")
    for name in ("chelsea", "coffee", "astronaut"):
        Image.fromarray(getattr(data, name)()).save(folder / f"{name}.png")
    (folder / "broken.png").write_text("not an image")
    return folder


def test_concepts_writes_reference_patches(photos, tmp_path, capsys):
    out = tmp_path / "run"
    status = cli.main(
        [
            "concepts",
            str(photos),
            "--layer",
            "blocks.2",
            "--top",
            "2",
            "--channels",
            "3,0-1",
            "--out",
            str(out),
            "--workers",
            "0",
        ]  # fmt: skip
    )
    assert status == EXIT_UNREADABLE_IMAGES  # the broken file; the others are done
    err = capsys.readouterr().err
    assert "cannot read" in err and "concepts: 4/4 images" in err
    summary = json.loads((out / "concepts.json").read_text())
    assert summary["layer"] == "blocks.2" and summary["images"] == 3
    assert list(summary["channels"]) == ["3", "0", "1"]
    record = read_concepts(out)  # what the report and the explorer read
    assert record.version == 1 and list(record.channels) == [3, 0, 1]
    assert (
        record.channels[3]["relevance"][0].patch
        == summary["channels"]["3"]["relevance"][0]["patch"]
    )
    run = summary["run"]  # what reproduces it, as a manifest says
    assert run["settings"]["crop"] == "center" and run["settings"]["layer"] == "blocks.2"
    assert run["channels"] == [3, 0, 1] and torch.__version__.startswith(run["torch"])
    assert run["arguments"][:2] == ["concepts", str(photos)] and run["finished"] >= run["started"]
    sizes = {p.name: Image.open(p).size for p in photos.glob("*.png") if p.stem != "broken"}
    for entries in summary["channels"].values():
        for mode in ("activation", "relevance"):
            rows = entries[mode]
            assert [row["rank"] for row in rows] == [0, 1]
            assert rows[0]["score"] >= rows[1]["score"]
            for row in rows:
                width, height = sizes[Path(row["image"]).name]
                top, left, bottom, right = row["box"]
                assert 0 <= top < bottom <= height and 0 <= left < right <= width
                patch = Image.open(out / row["patch"])
                assert patch.size == (right - left, bottom - top)
    # a middle layer's receptive field is a part of the photo, not all of it
    boxes = [row["box"] for e in summary["channels"].values() for row in e["activation"]]
    assert any(bottom - top < 300 for top, _, bottom, _ in boxes)
    assert not sorted(out.glob("concepts.part-*.pt"))  # the finished run's resume files are gone


def test_concepts_usage_errors(photos, tmp_path, capsys):
    common = [str(photos / "chelsea.png"), "--out", str(tmp_path / "x"), "--workers", "0"]
    assert cli.main(["concepts", *common, "--layer", "blocks.99"]) == EXIT_USAGE
    assert "did you mean" in capsys.readouterr().err
    assert cli.main(["concepts", *common, "--layer", "blocks.2", "--channels", "40"]) == EXIT_USAGE
    assert "channels 0..39" in capsys.readouterr().err
    assert cli.main(["concepts", *common, "--layer", "blocks.2", "--channels", "a"]) == EXIT_USAGE
    assert not (tmp_path / "x" / "concepts.json").exists()


def test_an_interrupted_run_resumes_to_the_same_result(photos, tmp_path, monkeypatch):
    from camkit.methods.concepts.reference import ReferenceCollector

    common = ["concepts", str(photos), "--layer", "blocks.2", "--top", "2", "--channels", "0-1"]
    common += ["--images-per-batch", "1", "--workers", "0", "--quiet"]
    assert cli.main([*common, "--out", str(tmp_path / "whole")]) == EXIT_UNREADABLE_IMAGES
    update = ReferenceCollector.update
    calls = []

    def stop_at_the_third_image(self, images, indices):
        calls.append(indices)
        if len(calls) == 3:
            raise KeyboardInterrupt
        update(self, images, indices)

    monkeypatch.setattr(ReferenceCollector, "update", stop_at_the_third_image)
    out = tmp_path / "stopped"
    assert cli.main([*common, "--out", str(out)]) == 130
    monkeypatch.setattr(ReferenceCollector, "update", update)
    assert not (out / "concepts.json").exists()
    assert sorted(out.glob("concepts.part-*.pt"))  # what the resume reads
    # another run's parts are not resumed
    other = ["concepts", str(photos / "chelsea.png"), *common[2:], "--out", str(out), "--resume"]
    assert cli.main(other) == EXIT_USAGE
    assert cli.main([*common, "--out", str(out), "--resume"]) == EXIT_UNREADABLE_IMAGES
    assert not sorted(out.glob("concepts.part-*.pt"))  # a finished run leaves no resume files
    whole = json.loads((tmp_path / "whole" / "concepts.json").read_text())
    resumed = json.loads((out / "concepts.json").read_text())
    assert resumed["images"] == whole["images"] == 3
    for channel, entries in whole["channels"].items():
        for mode, rows in entries.items():
            again = resumed["channels"][channel][mode]
            assert [r["image"] for r in rows] == [r["image"] for r in again]
            assert [r["score"] for r in rows] == pytest.approx([r["score"] for r in again])


def test_concepts_with_lrp_rules(photos, tmp_path):
    out = tmp_path / "lrp"
    args = ["concepts", str(photos / "chelsea.png"), "--layer", "blocks.2", "--top", "1"]
    args += ["--channels", "0", "--rules", "lrp", "--out", str(out), "--workers", "0", "--quiet"]
    assert cli.main(args) == 0
    summary = json.loads((out / "concepts.json").read_text())
    assert summary["rules"] == "lrp epsilon-plus-flat"
    assert summary["channels"]["0"]["relevance"][0]["image"].endswith("chelsea.png")

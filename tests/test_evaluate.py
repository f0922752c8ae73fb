"""``camkit evaluate``: metrics.csv, metrics.json with bootstrap intervals, plots, summary, and
unreadable images reported and skipped; driven in-process through :func:`camkit.cli.main`."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
import torch
from PIL import Image
from skimage import data

from camkit import cli
from camkit.cli import results, scoring
from camkit.runs.metrics import read_metrics


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """chelsea.png and coffee.jpg, a broken file, and a mask for chelsea only (the cat's head
    box); coffee has no mask, so its pointing scores are NaN."""
    folder = tmp_path_factory.mktemp("photos")
    Image.fromarray(data.chelsea()).save(folder / "chelsea.png")
    Image.fromarray(data.coffee()).save(folder / "coffee.jpg", quality=95)
    (folder / "zz-broken.jpg").write_bytes(b"not an image")
    masks = tmp_path_factory.mktemp("masks")
    mask = np.zeros(data.chelsea().shape[:2], np.uint8)
    mask[30:250, 120:330] = 255
    Image.fromarray(mask).save(masks / "chelsea.png")
    return folder, masks


@pytest.mark.slow
def test_evaluate_writes_rows_intervals_plots_and_skips_a_broken_file(photos, tmp_path, capsys):
    folder, masks = photos
    out = tmp_path / "metrics"
    status = cli.main(
        [
            "evaluate", str(folder), "--methods", "gradcam,random", "--metrics",
            "deletion,insertion,drop,increase,pointing,energy,sanity", "--masks", str(masks),
            "--steps", "5", "--out", str(out), "--quiet", "--device", "cpu", "--workers", "0",
        ]
    )  # fmt: skip
    captured = capsys.readouterr()
    assert status == 1  # the broken file is reported, the others are scored
    assert "zz-broken.jpg" in captured.err

    with open(out / "metrics.csv") as file:
        rows = list(csv.DictReader(file))
    assert [(r["image"].rsplit("/", 1)[1], r["method"]) for r in rows] == [
        ("chelsea.png", "gradcam"),
        ("chelsea.png", "random"),
        ("coffee.jpg", "gradcam"),
        ("coffee.jpg", "random"),
    ]
    for row in rows:
        for column in ("deletion", "insertion", "average_drop"):
            assert 0.0 <= float(row[column]) <= 1.0
        assert float(row["increase_in_confidence"]) in (0.0, 1.0)
    coffee = [row for row in rows if row["image"].endswith("coffee.jpg")]
    assert all(math.isnan(float(row["pointing_game"])) for row in coffee)  # no mask: not a miss

    result = read_metrics(out)  # metrics.json, through its one reader
    assert result.version == 1 and json.loads((out / "metrics.json").read_text())["version"] == 1
    assert result.images == 2 and result.unreadable == [str(folder / "zz-broken.jpg")]
    for method in ("gradcam", "random"):
        deletion = result.methods[method]["deletion"]
        low, high = deletion["ci95"]
        assert deletion["n"] == 2 and low <= deletion["mean"] <= high
        assert result.methods[method]["pointing_game"]["n"] == 1  # chelsea only
    cascade = result.sanity["gradcam"]
    assert cascade and all(np.isfinite(entry["spearman"]) for entry in cascade)
    assert (out / "deletion.png").stat().st_size and (out / "insertion.png").stat().st_size
    assert "gradcam" in captured.out and "[" in captured.out  # the summary table


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--metrics", "pointing"], "--masks"),
        (["--metrics", "deletion,nonsense"], "nonsense"),
        (["--target", "281,285"], "one class"),
        (["--methods", "gradcamm"], "gradcam"),
    ],
)
def test_evaluate_usage_errors(photos, tmp_path, capsys, arguments, message):
    folder, _ = photos
    status = cli.main(["evaluate", str(folder / "chelsea.png"), "--out", str(tmp_path), *arguments])
    assert status == 2
    assert message in capsys.readouterr().err


def test_bootstrap_interval_excludes_nan_and_is_reproducible():
    constant = results.bootstrap([0.25, 0.25, float("nan"), 0.25])
    assert constant == {"mean": 0.25, "ci95": [0.25, 0.25], "n": 3}
    values = list(np.linspace(0, 1, 20))
    first, again = results.bootstrap(values), results.bootstrap(values)
    assert first == again
    low, high = first["ci95"]
    assert low < 0.5 < high and high - low < 0.5
    assert results.bootstrap([float("nan")])["mean"] is None


@pytest.mark.slow
def test_evaluate_into_an_explained_folder_puts_the_metrics_on_the_report(photos, tmp_path):
    folder, _ = photos
    out = tmp_path / "audit"
    image = str(folder / "chelsea.png")
    common = ["--out", str(out), "--quiet", "--device", "cpu", "--workers", "0"]
    assert cli.main(["explain", image, "--method", "gradcam", "--report", *common]) == 0
    assert cli.main(["evaluate", image, "--metrics", "deletion", "--steps", "3", *common]) == 0
    (row,) = results.read_rows(out)
    records = json.loads((out / "manifest.json").read_text())["records"]
    assert results.overlay_metrics(records, [row]) == {
        records[0]["output"]: {"deletion": float(row["deletion"])}
    }
    page = (out / "index.html").read_text()
    assert '"deletion"' in page  # the page's data carries the metric (a sort key and a caption)


def test_score_batch_gives_every_column_per_image():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3, padding=1),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(4, 5),
    )
    x, maps = torch.randn(2, 3, 16, 16), torch.rand(2, 16, 16)
    masks = torch.zeros(2, 16, 16, dtype=torch.bool)
    masks[0, 4:8, 4:8] = True  # image 1 has no object: NaN for the pointing metrics
    settings = scoring.Settings(tuple(scoring.COLUMNS), 4, "blur", 3, 2)
    values, curves = scoring.score_batch(model, x, maps, [1, 3], masks, settings)
    columns = [column for name in scoring.COLUMNS for column, _ in scoring.COLUMNS[name]]
    assert sorted(values) == sorted(columns)
    assert all(value.shape == (2,) for value in values.values())
    assert values["pointing_game"][1].isnan() and values["energy_pointing_game"][1].isnan()
    assert curves["deletion"].shape == curves["insertion"].shape == (2, 5)
    again, _ = scoring.score_batch(model, x, maps, [1, 3], masks, settings)
    torch.testing.assert_close(again["road_morf"], values["road_morf"])  # seeded: reruns agree

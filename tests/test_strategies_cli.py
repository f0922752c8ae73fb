"""``camkit explain --save-maps`` (the map parts folded into maps.npz), ``camkit strategies``,
the report's strategies view in headless Chromium, and the planted Clever-Hans model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.metrics import adjusted_rand_score
from test_report import ALL_IMAGES_LOADED, Browser, needs_browser, page_data

import camkit
from camkit import io as cio
from camkit import viz
from camkit.cli import main
from camkit.cli.commands import strategies as strategies_command
from camkit.cli.common import UsageError
from camkit.runs import manifest
from camkit.runs import maps as mapstore
from camkit.runs.strategies import read_strategies
from camkit.strategies import find_strategies, load_maps
from camkit.strategies.planted import planted_images, planted_model

SIDE = 32


def planted_maps(tagged: int, objects: int, seed: int = 0):
    model = planted_model()
    images, truth = planted_images(tagged, objects, side=SIDE, seed=seed)
    maps = camkit.GradCAM(model, model[1])(images, target=0)
    with torch.no_grad():
        probabilities = model(images).softmax(-1)
    return images, truth, maps, probabilities


def test_planted_model_strategies_are_found():
    _, truth, maps, probabilities = planted_maps(20, 40)
    assert (probabilities.argmax(-1) == 0).all()  # every image is class 0, by tag or object
    found = find_strategies(maps, np.zeros(60, int), confidences=probabilities[:, 0]).classes[0]
    assert found.suggested_k == 2
    assert adjusted_rand_score(truth, found.labels) >= 0.8
    tag_cluster = found.by_suspiciousness()[0]
    assert truth[tag_cluster.members].all() and tag_cluster.size == 20
    # the tag prototype's mass is in the bottom-right corner of the 32x32 grid
    corner = tag_cluster.prototype[-8:, -8:].sum() / tag_cluster.prototype.sum()
    assert corner > 0.95


def make_run(tmp_path: Path, tagged: int = 8, objects: int = 16) -> tuple[Path, np.ndarray]:
    """A run folder as ``camkit explain --save-maps`` leaves it: photos, overlays, a manifest
    whose records name their rows in two ranks' map parts, before the merge."""
    images, truth, maps, probabilities = planted_maps(tagged, objects)
    photos, out = tmp_path / "photos", tmp_path / "run"
    photos.mkdir()
    out.mkdir()
    settings = {"methods": ["gradcam"], "input_size": [SIDE, SIDE], "save_maps": True}
    head = {"settings": settings, "camkit": camkit.__version__, "model": "planted"}
    parts = [mapstore.MapPart(out, rank) for rank in (0, 1)]
    records = []
    for k in range(len(images)):
        picture = (images[k].permute(1, 2, 0).numpy() * 255).astype(np.uint8)
        cio.save_png(photos / f"p{k:02d}.png", picture)
        output = f"p{k:02d}_gradcam_0.png"
        cio.save_png(out / output, viz.overlay(picture, maps[k].numpy()))
        p = probabilities[k].tolist()
        record = {
            "image": str(photos / f"p{k:02d}.png"),
            "output": output,
            "method": "gradcam",
            "layer": "1",
            "target": 0,
            "label": "horse",
            "probability": p[0],
            "top5": [
                {"index": 0, "label": "horse", "probability": p[0]},
                {"index": 1, "label": "car", "probability": p[1]},
            ],
            "model": "planted",
            "size": [SIDE, SIDE],
            "rank": k % 2,
        }
        record["map_part"] = parts[k % 2].append([mapstore.as_map(maps[k])])[0]
        records.append(record)
    mapstore.fold(out, records, head)
    cio.save_json(out / manifest.MANIFEST, head | {"records": records})
    return out, truth


def test_save_maps_fold_orders_rows_like_the_manifest(tmp_path):
    out, truth = make_run(tmp_path)
    records = manifest.read(out / manifest.MANIFEST)["records"]
    assert [r["map"] for r in records] == list(range(24))
    assert not list(out.glob(mapstore.PARTS))
    saved = load_maps(out)
    _, _, maps, probabilities = planted_maps(8, 16)
    np.testing.assert_array_equal(saved.maps, maps.numpy().astype(np.float16))
    assert saved.image.tolist() == [r["image"] for r in records]
    np.testing.assert_allclose(saved.confidence, probabilities[:, 0], rtol=1e-6)
    assert (saved.truth == -1).all() and saved.metadata["classes"] == {"0": "horse", "1": "car"}
    # a resumed run: the earlier file's rows and a new part's rows, folded again
    more = mapstore.MapPart(out, 0).append([np.full((SIDE, SIDE), 0.5, np.float16)])[0]
    extra = records[0] | {"image": "new.png", "map_part": more}
    extra.pop("map")
    both = records[::-1] + [extra]
    mapstore.fold(out, both, {"settings": {"input_size": [SIDE, SIDE]}})
    again = load_maps(out)
    np.testing.assert_array_equal(again.maps[:24], saved.maps[::-1])
    assert (again.maps[24] == 0.5).all() and [r["map"] for r in both] == list(range(25))


def test_strategies_command_writes_files(tmp_path, capsys):
    out, truth = make_run(tmp_path)
    truth_file = tmp_path / "truth.csv"
    rows = [f"p{k:02d}.png,{0 if k < 20 else 1}" for k in range(24)]  # 4 predictions wrong
    truth_file.write_text("image,class\n" + "\n".join(rows) + "\n")
    status = main(
        [
            "strategies",
            str(out),
            "--neighbors",
            "5",
            "--embedding",
            "spectral",
            "--truth",
            str(truth_file),
        ]
    )
    assert status == 0
    written = json.loads((out / "strategies" / "strategies.json").read_text())
    record = read_strategies(out / "strategies")  # what the report and the explorer read
    assert record.version == 1 and record.groups == written["groups"]
    (group,) = written["groups"]
    assert group["suggested_k"] == 2 and group["label"] == "horse"
    sizes = sorted(cluster["size"] for cluster in group["clusters"])
    assert sizes == [8, 16]
    tag = max(group["clusters"], key=lambda c: c["suspiciousness"])
    assert tag["size"] == 8 and all(truth[row] for row in tag["members"])
    wrong = {row for cluster in group["clusters"] for row in cluster["members"]} & {20, 21, 22, 23}
    assert len(wrong) == 4
    for cluster in group["clusters"]:
        members = cluster["members"]
        assert cluster["accuracy"] == pytest.approx(np.mean([row < 20 for row in members]))
    for cluster in group["clusters"]:
        for key in ("prototype", "typical_montage", "atypical_montage"):
            assert (out / "strategies" / cluster[key]).is_file()
    assert (out / "strategies" / group["eigengap_plot"]).is_file()
    assert len(group["points"]) == 24
    assert "eigengap suggests 2" in capsys.readouterr().out
    assert main(["strategies", str(tmp_path / "photos")]) == 2  # no maps.npz: a usage error
    assert "--save-maps" in capsys.readouterr().err
    assert main(["strategies", str(out), "--method", "saliency"]) == 2
    names = tmp_path / "names.txt"
    names.write_text("mare\nzebra\n")
    assert main(["strategies", str(out), "--labels", str(names), "--out", str(tmp_path / "n")]) == 0
    (named,) = json.loads((tmp_path / "n" / "strategies.json").read_text())["groups"]
    assert named["label"] == "mare"  # class 0, by the file's names
    names.write_text("[0, 1]")
    assert main(["strategies", str(out), "--labels", str(names)]) == 2
    assert "--labels: labels file" in capsys.readouterr().err
    names.write_text("mare\nzebra\n")
    with pytest.raises(UsageError, match="2 class names, but the maps include class 3"):
        strategies_command.named_classes(str(names), [0, 3])


@needs_browser
@pytest.mark.slow
def test_strategies_view_in_headless_chromium(tmp_path):
    out, truth = make_run(tmp_path)
    assert main(["strategies", str(out), "--neighbors", "5", "--quiet"]) == 0
    data = page_data(out / "index.html")["strategies"]
    assert len(data["groups"]) == 1 and len(data["groups"][0]["points"]) == 24
    browser = Browser(tmp_path / "profile")
    try:
        browser.open((out / "index.html").as_uri())
        assert browser.js("document.body.dataset.ready") == "1"
        assert browser.js("document.getElementById('strategies').hidden") is True
        browser.js("document.getElementById('view-strategies').click()")
        assert browser.js("document.getElementById('gallery').offsetParent") is None
        sizes = browser.js("[...document.querySelectorAll('.cluster')].map((c) => c.innerText)")
        assert len(sizes) == 2 and "16 maps" in sizes[0] and "8 maps" in sizes[1]
        assert "eigengap suggests 2" in browser.js(
            "document.getElementById('strategies').innerText"
        )
        # the most suspicious cluster is the tag one, outlined, and first when sorted by it
        browser.js("""(() => { const s = document.getElementById('strategy-order');
            s.value = 'score'; s.dispatchEvent(new Event('change')); })()""")
        first = browser.js("document.querySelector('.cluster').className")
        assert "flagged" in first and "8 maps" in browser.js(
            "document.querySelector('.cluster').innerText"
        )
        loaded = browser.js(ALL_IMAGES_LOADED.replace("ROOT", "'#strategies'"))
        assert len(loaded) >= 4 and all(width > 0 for _, width in loaded), loaded
        assert browser.js("document.querySelectorAll('svg.scatter circle').length") == 24
        # hovering a point shows its overlay; clicking a member opens its card
        browser.js("""document.querySelector('svg.scatter circle')
            .dispatchEvent(new MouseEvent('mouseenter', {clientX: 50, clientY: 50}))""")
        assert browser.js("document.getElementById('hover').hidden") is False
        assert browser.js("document.querySelectorAll('#hover img').length") == 1
        images = page_data(out / "index.html")["images"]
        index = browser.js("+document.querySelector('.cluster .members img').dataset.index")
        browser.js("document.querySelector('.cluster .members img').click()")
        assert browser.js("document.getElementById('detail').hidden") is False
        assert (
            browser.js("document.querySelector('#detail h2').textContent") == images[index]["path"]
        )
        # the flagged cluster's members are the tagged photos (p<k>.png, row k of the maps)
        flagged = browser.js("document.querySelector('.cluster').dataset.cluster")
        (cluster,) = [c for c in data["groups"][0]["clusters"] if str(c["id"]) == flagged]
        assert all(truth[int(Path(images[i]["path"]).stem[1:])] for i in cluster["members"])
    finally:
        browser.close()

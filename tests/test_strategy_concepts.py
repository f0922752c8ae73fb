"""A shortcut cluster names its channels: ``camkit strategies`` on a run with ``camkit
concepts`` results adds each cluster's dominant concepts (the planted model of
tests/test_concepts_planted.py, whose channel 2 reads a magenta tag), the report shows them,
and the explorer's cluster view finds the same channels on demand."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from test_concepts_planted import TAG_CHANNEL, planted_concepts, planted_images
from test_report import Browser, needs_browser, page_data

import camkit
from camkit import io as cio
from camkit import models, viz
from camkit.cli import main, strategy_concepts
from camkit.methods.concepts import ConceptAttribution
from camkit.runs import manifest
from camkit.runs import maps as mapstore

SIDE = 24


def loaded_planted() -> models.LoadedModel:
    return models.LoadedModel(
        name="planted",
        model=planted_concepts(),
        preprocess=models.Preprocess(SIDE, crop_mode="squash", mean=(0, 0, 0), std=(1, 1, 1)),
        labels=["horse", "car"],
        default_layer="1",
        input_size=(SIDE, SIDE),
    )


def load_planted(name, weights, labels=None, *, crop=None) -> models.LoadedModel:
    """``load_model``'s stand-in: the planted model, its crop replaced by ``crop`` as
    ``--crop`` does."""
    loaded = loaded_planted()
    if crop is not None:
        loaded.preprocess = dataclasses.replace(loaded.preprocess, crop_mode=crop)
    return loaded


def planted_run(tmp_path: Path, count: int = 24) -> tuple[Path, np.ndarray]:
    """``camkit explain --save-maps`` of the planted model (Grad-CAM at layer "1", class 0)
    over ``count`` photos, a third of them tagged, and ``camkit concepts`` results."""
    model = planted_concepts()
    images, tagged = planted_images(count)
    photos, out = tmp_path / "photos", tmp_path / "run"
    photos.mkdir()
    out.mkdir()
    pictures = (images.permute(0, 2, 3, 1).numpy() * 255).round().astype(np.uint8)
    for k, picture in enumerate(pictures):
        cio.save_png(photos / f"p{k:02d}.png", picture)
    inputs = torch.stack([loaded_planted().preprocess(p) for p in pictures])
    maps = camkit.GradCAM(model, "1")(inputs, target=0)
    with torch.no_grad():
        probabilities = model(inputs).softmax(-1)
    settings = {"methods": ["gradcam"], "input_size": [SIDE, SIDE], "save_maps": True}
    settings |= {"model": "planted", "layer": "1", "weights_sha256": None, "crop": "squash"}
    head = {"settings": settings, "camkit": camkit.__version__, "model": "planted"}
    part = mapstore.MapPart(out, 0)
    records = []
    for k in range(count):
        output = f"p{k:02d}_gradcam_0.png"
        cio.save_png(out / output, viz.overlay(pictures[k], maps[k].numpy()))
        p = probabilities[k].tolist()
        record = {"image": str(photos / f"p{k:02d}.png"), "output": output, "method": "gradcam"}
        record |= {"layer": "1", "target": 0, "label": "horse", "probability": p[0]}
        record |= {"top5": [{"index": 0, "label": "horse", "probability": p[0]}]}
        record |= {"model": "planted", "size": [SIDE, SIDE]}
        record["map_part"] = part.append([mapstore.as_map(maps[k])])[0]
        records.append(record)
    mapstore.fold(out, records, head)
    cio.save_json(out / manifest.MANIFEST, head | {"records": records})
    row = {"rank": 0, "image": records[1]["image"], "score": 1.0, "class": 0, "label": "horse"}
    row |= {"box": [18, 18, 23, 23], "patch": "patches/1/c2_relevance_0.png"}
    (out / "patches" / "1").mkdir(parents=True)
    cio.save_png(out / row["patch"], pictures[1][18:23, 18:23])
    concepts = {"model": "planted", "layer": "1", "top": 1, "images": count, "rules": "gradient"}
    concepts |= {"channels": {str(TAG_CHANNEL): {"activation": [row], "relevance": [row]}}}
    cio.save_json(out / "concepts.json", concepts)
    return out, tagged


def test_cluster_concepts_of_a_run_from_before_crop_squash_its_photos(
    tmp_path: Path, monkeypatch
) -> None:
    """A run whose manifest records no crop was made before ``--crop``, when every photo was
    squashed (the explorer reads such a run so): its cluster concepts squash the photos too,
    not with the model's own crop (centre here)."""
    out, _ = planted_run(tmp_path)
    head = json.loads((out / manifest.MANIFEST).read_text())
    del head["settings"]["crop"]
    cio.save_json(out / manifest.MANIFEST, head)

    def load_centred(name, weights, labels=None, *, crop=None) -> models.LoadedModel:
        return load_planted(name, weights, labels, crop=crop or "center")  # its own: centre

    crops = []
    preprocess = models.Preprocess.__call__

    def spy(self, *args, **kwargs):
        crops.append(self.crop_mode)
        return preprocess(self, *args, **kwargs)

    monkeypatch.setattr(strategy_concepts, "load_model", load_centred)
    monkeypatch.setattr(models.Preprocess, "__call__", spy)
    assert main(["strategies", str(out), "--neighbors", "5", "--embedding", "none", "--quiet"]) == 0
    written = json.loads((out / "strategies" / "strategies.json").read_text())
    assert all("concepts" in c for c in written["groups"][0]["clusters"])
    assert crops and set(crops) == {"squash"}


def test_the_tag_cluster_names_the_tag_channel_in_strategies_and_report(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    out, tagged = planted_run(tmp_path)
    monkeypatch.setattr(strategy_concepts, "load_model", load_planted)
    assert main(["strategies", str(out), "--neighbors", "5", "--embedding", "none"]) == 0
    said = capsys.readouterr()
    assert "dominant concepts of each cluster at 1" in said.out
    # the progress names its stages (off a terminal: one line each at the end)
    assert "clusters: 1/1 methods (100%)" in said.err
    assert "cluster concepts: 24/24 images (100%)" in said.err
    (group,) = json.loads((out / "strategies" / "strategies.json").read_text())["groups"]
    assert len(group["clusters"]) == 2
    model = planted_concepts()
    for cluster in group["clusters"]:
        members = cluster["members"]
        found = cluster["concepts"]
        assert found["layer"] == "1" and len(found["channels"]) == 3
        top = found["channels"][0]["channel"]
        if all(tagged[members]):  # the tag cluster reads the tag channel, the other one red
            assert top == TAG_CHANNEL
        elif not any(tagged[members]):
            assert top == 0
        # the numbers: the library's dominant() over the cluster's (PNG-quantised) images
        inputs = torch.stack([loaded_planted().preprocess(cio.read_image(
            tmp_path / "photos" / f"p{row:02d}.png")) for row in members])  # fmt: skip
        expected = ConceptAttribution(model, "1").dominant(inputs, k=3, target=0)
        shares = torch.tensor([c["share"] for c in found["channels"]])
        assert torch.allclose(shares, expected.share, atol=1e-6)
    assert {tuple(sorted(tagged[c["members"]])) for c in group["clusters"]} == {
        (True,) * 8,
        (False,) * 16,
    }
    page = page_data(out / "index.html")
    clusters = page["strategies"]["groups"][0]["clusters"]
    assert {c["concepts"]["channels"][0]["channel"] for c in clusters} == {0, TAG_CHANNEL}
    assert page["concepts"]["channels"][0]["channel"] == TAG_CHANNEL


def test_each_photo_is_measured_once_per_class_and_clusters_equal_dominant_bit_for_bit(
    tmp_path: Path, monkeypatch
) -> None:
    """Map rows are photo x method: the clusters of two methods hold the same photos, grouped
    otherwise. Each photo is read (and its relevances measured) once for the class, and each
    cluster's numbers are dominant()'s over its members' images, bit for bit."""
    out, _ = planted_run(tmp_path, count=12)
    head = json.loads((out / manifest.MANIFEST).read_text())
    photos = [str(tmp_path / "photos" / f"p{k:02d}.png") for k in range(12)]
    by_method = (
        [[1, 4, 7, 10], [0, 2, 3, 5, 6, 8, 9, 11]],
        [[10, 1, 0], [11, 9, 8, 7, 6, 5, 4, 3, 2]],
    )
    groups = [
        {"class": 0, "clusters": [{"members": [12 * m + r for r in c]} for c in clusters]}
        for m, clusters in enumerate(by_method)
    ]
    reads = []
    read_image = cio.read_image
    monkeypatch.setattr(cio, "read_image", lambda path: reads.append(path) or read_image(path))
    monkeypatch.setattr(strategy_concepts, "load_model", load_planted)
    assert strategy_concepts.add_cluster_concepts(out, head, groups, photos * 2, None)
    assert sorted(reads) == photos
    concepts = ConceptAttribution(planted_concepts(), "1")
    preprocess = loaded_planted().preprocess
    for group in groups:
        for cluster in group["clusters"]:
            inputs = [preprocess(read_image(photos[row % 12])) for row in cluster["members"]]
            expected = concepts.dominant(torch.stack(inputs), k=3, target=0)
            found = cluster["concepts"]["channels"]
            assert [c["channel"] for c in found] == expected.channels.tolist()
            for key in ("share", "relevance"):
                numbers = torch.tensor([c[key] for c in found], dtype=torch.float32)
                assert torch.equal(numbers, getattr(expected, key)), key


def test_runs_without_concepts_or_with_unknown_weights_skip_cluster_concepts(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    out, _ = planted_run(tmp_path)
    calls = []
    monkeypatch.setattr(strategy_concepts, "load_model", lambda *a: calls.append(a))
    (out / "concepts.json").unlink()
    assert main(["strategies", str(out), "--neighbors", "5", "--embedding", "none"]) == 0
    written = json.loads((out / "strategies" / "strategies.json").read_text())
    assert calls == [] and all("concepts" not in c for c in written["groups"][0]["clusters"])
    settings = {"model": "planted", "layer": "1", "weights_sha256": "ab" * 32}
    note = strategy_concepts.add_cluster_concepts(
        tmp_path / "nothing", {"settings": settings}, [], [], None
    )
    assert note is None
    (tmp_path / "c").mkdir()
    cio.save_json(tmp_path / "c" / "concepts.json", {"layer": "1", "channels": {}})
    note = strategy_concepts.add_cluster_concepts(
        tmp_path / "c", {"settings": settings}, [], [], None
    )
    assert "pass --weights" in note and calls == []
    with pytest.raises(Exception, match="not the weights the run was made with"):
        weights = tmp_path / "w.pt"
        weights.write_bytes(b"x")
        strategy_concepts.add_cluster_concepts(
            tmp_path / "c", {"settings": settings}, [], [], str(weights)
        )


def test_the_explorer_names_the_tag_channel_of_the_tag_cluster_and_under_the_tag(
    tmp_path: Path, monkeypatch
) -> None:
    pytest.importorskip("starlette", reason="camkit serve's web stack")
    pytest.importorskip("httpx", reason="the ASGI test client")
    from starlette.testclient import TestClient

    from camkit.runs.concepts import read_concepts
    from camkit.serve.app import create_app
    from camkit.serve.explorer import Explorer
    from camkit.serve.gallery import RunViews, read_run, read_strategies

    out, tagged = planted_run(tmp_path)
    monkeypatch.setattr(strategy_concepts, "load_model", load_planted)
    assert main(["strategies", str(out), "--neighbors", "5", "--embedding", "none", "--quiet"]) == 0
    entries, _, predictions = read_run(out)
    explorer = Explorer({"a": loaded_planted()}, entries, predictions=predictions)
    app = create_app(
        explorer,
        token=None,
        run=RunViews(out, strategies=read_strategies(out, entries), concepts=read_concepts(out)),
    )
    with TestClient(app) as client:
        (group,) = client.get("/api/strategies").json()["groups"]
        for cluster in group["clusters"]:
            params = {"method": "gradcam", "class": 0, "cluster": cluster["id"], "k": 1}
            found = client.get("/api/cluster-concepts", params=params).json()
            assert found["layer"] == "1" and found["images"] == cluster["size"]
            is_tag = all(tagged[i] for i in cluster["members"])  # ids = rows here
            assert found["concepts"][0]["channel"] == (TAG_CHANNEL if is_tag else 0)
        # a tagged image: a box over the tag names the tag channel, with all of the share
        image = int(np.flatnonzero(tagged)[0])
        box = {"box": f"{18 / SIDE},{18 / SIDE},{23 / SIDE},{23 / SIDE}"}
        answer = client.get("/api/concepts", params={"image": image, "class": 0, "k": 3} | box)
        first = answer.json()["concepts"][0]
        assert first["channel"] == TAG_CHANNEL and first["share"] == pytest.approx(1.0, abs=1e-6)
        assert first["references"]["relevance"][0]["patch"] == "patches/1/c2_relevance_0.png"
        heat = client.get(
            "/api/concept-map",
            params={"image": image, "class": 0, "layer": "1", "channel": TAG_CHANNEL},
        )
        assert heat.status_code == 200 and heat.headers["content-type"] == "image/png"


@needs_browser
def test_the_reports_clusters_name_their_channels_in_headless_chromium(
    tmp_path: Path, monkeypatch
) -> None:
    out, _ = planted_run(tmp_path)
    monkeypatch.setattr(strategy_concepts, "load_model", load_planted)
    assert main(["strategies", str(out), "--neighbors", "5", "--embedding", "none", "--quiet"]) == 0
    browser = Browser(tmp_path / "profile")
    try:
        browser.open((out / "index.html").as_uri())
        assert browser.js("document.body.dataset.ready") == "1"
        browser.js("document.getElementById('view-strategies').click()")
        firsts = browser.js(
            "[...document.querySelectorAll('.cluster')].map((c) => "
            "+c.querySelector('.dominant [data-channel]').dataset.channel)"
        )
        assert sorted(firsts) == [0, TAG_CHANNEL]
        # the tag channel shows its atlas patch; channel 0 has none in the atlas
        patches = browser.js(
            "[...document.querySelectorAll('.dominant [data-channel]')].map((d) => "
            "[+d.dataset.channel, d.querySelectorAll('img').length])"
        )
        assert all(count == (1 if channel == TAG_CHANNEL else 0) for channel, count in patches)
        browser.js("document.getElementById('view-concepts').click()")
        assert browser.js("document.querySelectorAll('.atlas-channel').length") == 1
    finally:
        browser.close()

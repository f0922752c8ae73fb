"""camkit serve: the API through the ASGI test client, the batcher, the security checks, a
real-browser test in headless Chromium and a bounded load test against a real uvicorn."""

from __future__ import annotations

import asyncio
import io as pyio
import json
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

import camkit
from camkit import io as cio
from camkit import metrics, models, viz
from camkit.cli import main

pytest.importorskip("starlette", reason="camkit serve's web stack: pip install 'camkit[serve]'")
pytest.importorskip("httpx", reason="the ASGI test client needs httpx (the dev extra)")
from starlette.testclient import TestClient  # noqa: E402

from camkit.serve import security  # noqa: E402
from camkit.serve.app import create_app, running  # noqa: E402
from camkit.serve.explorer import Explorer, MapKey, stages  # noqa: E402
from camkit.serve.gallery import RunViews, scan  # noqa: E402
from tests.conftest import assert_untouched, model_state  # noqa: E402

LABELS = ["tabby", "espresso", "rocket", "astronaut"]
SIZE = 32
TOKEN = "secret-token-for-tests"


class SmallNet(nn.Module):
    """Two stages (32x32 -> 16x16 -> 8x8) and a linear head over 4 classes; counts its calls."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.stem = nn.Conv2d(3, 6, 3, stride=2, padding=1)
        self.act1 = nn.ReLU()
        self.stage2 = nn.Conv2d(6, 8, 3, stride=2, padding=1)
        self.act2 = nn.ReLU()
        self.head = nn.Linear(8, 4)
        with torch.no_grad():
            for parameter in self.parameters():
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)
        self.calls = 0
        self.eval()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        features = self.act2(self.stage2(self.act1(self.stem(x))))
        return self.head(features.mean(dim=(-2, -1)))


def loaded(seed: int = 0) -> models.LoadedModel:
    return models.LoadedModel(
        name="small",
        model=SmallNet(seed),
        preprocess=models.Preprocess(SIZE, crop_mode="squash"),
        labels=list(LABELS),
        default_layer="act2",
        input_size=(SIZE, SIZE),
    )


def photo(seed: int, height: int = 40, width: int = 48) -> np.ndarray:
    rng = np.random.default_rng(seed)
    rows, cols = np.mgrid[0:height, 0:width] / max(height, width)
    base = rng.uniform(0.1, 0.9, (3, 3))
    channels = [
        base[c, 0] + base[c, 1] * rows + base[c, 2] * np.sin(6 * cols + c) for c in range(3)
    ]
    return (np.clip(np.stack(channels, -1), 0, 1) * 255).astype(np.uint8)


def photo_folder(root: Path) -> Path:
    """``root/photos``: two images of its own, ImageFolder classes ``tabby`` (3) and
    ``rocket`` (2), one unreadable file."""
    folder = root / "photos"
    for name, count in (("tabby", 3), ("rocket", 2)):
        (folder / name).mkdir(parents=True)
        for k in range(count):
            cio.save_png(folder / name / f"{name}{k}.png", photo(10 * len(name) + k))
    cio.save_png(folder / "loose0.png", photo(100))
    cio.save_png(folder / "loose1.png", photo(101, 50, 30))
    (folder / "broken.jpg").write_bytes(b"not a jpeg at all")
    return folder


def explorer_for(folder: Path, **checkpoints: models.LoadedModel) -> Explorer:
    entries, _ = scan([folder])
    return Explorer(checkpoints or {"a": loaded()}, entries)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[TestClient, Explorer]]:
    explorer = explorer_for(photo_folder(tmp_path))
    with TestClient(create_app(explorer, token=TOKEN)) as client:
        client.headers[security.TOKEN_HEADER] = TOKEN
        yield client, explorer


def model_input(explorer: Explorer, image: int) -> torch.Tensor:
    return explorer.preprocess(cio.read_image(explorer.entries[image].path))


def npy(response) -> np.ndarray:
    assert response.status_code == 200, response.text
    return np.load(pyio.BytesIO(response.content))


def png(response) -> np.ndarray:
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "image/png"
    return np.asarray(Image.open(pyio.BytesIO(response.content)).convert("RGB"))


# ----------------------------------------------------------------------------- the API


def test_info_offers_the_methods_that_fit_and_the_layers(served) -> None:
    client, explorer = served
    info = client.get("/api/info").json()
    names = [m["name"] for m in info["methods"]]
    assert "gradcam" in names and "saliency" in names and "scorecam" in names
    # a CNN: the attention methods are not offered, with the reason
    assert "rollout" not in names and "legrad" not in names
    assert "vision transformers" in info["unavailable"]["rollout"]
    assert next(m for m in info["methods"] if m["name"] == "scorecam")["slow"] is True
    layers = {layer["name"]: layer["shape"] for layer in info["layers"]}
    assert layers["stem"] == [1, 6, 16, 16] and layers["act2"] == [1, 8, 8, 8]
    assert "head" not in layers  # (B, 4): no map to explain
    assert info["default_layer"] == "act2" and info["labels"] == LABELS
    assert info["stages"] == ["act1", "act2"]  # the last layer at each resolution
    assert info["truths"] == ["rocket", "tabby"] and info["images"] == 8


def test_stages_pick_the_end_of_each_resolution_and_the_default() -> None:
    layers = [
        ("a", "Conv2d", (1, 4, 16, 16)),
        ("b", "ReLU", (1, 4, 16, 16)),
        ("c", "Conv2d", (1, 8, 8, 8)),
        ("d", "BatchNorm2d", (1, 8, 8, 8)),
        ("e", "Conv2d", (1, 8, 4, 4)),
        ("f", "ReLU", (1, 8, 4, 4)),
    ]
    assert stages(layers, "e") == ["b", "d", "e"]
    assert stages(layers, "f", count=2) == ["d", "f"]
    nested = [  # the shallowest layers at each resolution: stage outputs, not layers in blocks
        ("stem", "Conv2d", (1, 4, 16, 16)),
        ("blocks.0", "Sequential", (1, 4, 16, 16)),
        ("blocks.1.0.conv", "Conv2d", (1, 8, 16, 16)),
        ("blocks.1.0.dw", "Conv2d", (1, 8, 8, 8)),
        ("blocks.1", "Sequential", (1, 8, 8, 8)),
        ("head.bn", "BatchNorm2d", (1, 8, 8, 8)),
        ("pool.inner.avg", "AvgPool2d", (1, 8, 4, 4)),
    ]
    assert stages(nested, "stem") == ["stem", "head.bn", "pool.inner.avg"]
    assert stages(nested, "blocks.1.0.dw", count=2) == ["blocks.1.0.dw", "pool.inner.avg"]
    tokens = [(f"blocks.{k}", "Block", (1, 197, 64)) for k in range(12)]
    assert stages(tokens, "blocks.11", count=4) == ["blocks.0", "blocks.4", "blocks.7", "blocks.11"]


def test_gallery_pages_filters_and_sorts_by_hand_computed_predictions(served) -> None:
    client, explorer = served
    page = client.get("/api/gallery", params={"limit": 3}).json()
    assert page["total"] == 8 and [i["name"] for i in page["items"]] == [
        "broken.jpg",
        "loose0.png",
        "loose1.png",
    ]
    assert page["items"][0]["error"] == "not an image file that Pillow can decode"
    assert page["predicted"] == 3  # only the page shown was predicted
    rest = client.get("/api/gallery", params={"offset": 3, "limit": 50}).json()
    assert [i["name"] for i in rest["items"]][:2] == ["rocket/rocket0.png", "rocket/rocket1.png"]
    # the predictions are the model's softmax, computed here by hand
    model = explorer.checkpoints["a"].model
    expected = {}
    for index in range(1, 8):
        probabilities = model(model_input(explorer, index)[None]).softmax(-1)[0]
        expected[index] = (int(probabilities.argmax()), float(probabilities.max().detach()))
    for item in page["items"][1:] + rest["items"]:
        top = item["top"][0]
        assert top["index"] == expected[item["id"]][0]
        assert top["probability"] == pytest.approx(expected[item["id"]][1], abs=1e-6)
        assert top["label"] == LABELS[top["index"]]
    low_first = client.get("/api/gallery", params={"order": "confidence"}).json()["items"]
    confidences = [i["top"][0]["probability"] for i in low_first if i["top"]]
    assert confidences == sorted(confidences) and low_first[-1]["name"] == "broken.jpg"
    tabby = client.get("/api/gallery", params={"truth": "tabby"}).json()
    assert [i["name"] for i in tabby["items"]] == [f"tabby/tabby{k}.png" for k in range(3)]
    wrong = client.get("/api/gallery", params={"wrong": 1}).json()["items"]
    truths = {e: explorer.entries[e].truth for e in expected}
    assert sorted(i["id"] for i in wrong) == sorted(
        i for i, (c, _) in expected.items() if truths[i] and LABELS[c] != truths[i]
    )
    label = LABELS[expected[1][0]]
    predicted = client.get("/api/gallery", params={"predicted": label}).json()["items"]
    assert sorted(i["id"] for i in predicted) == sorted(
        i for i, (c, _) in expected.items() if LABELS[c] == label
    )
    thumb = client.get("/api/thumb/1")
    assert thumb.headers["content-type"] == "image/jpeg"
    assert Image.open(pyio.BytesIO(thumb.content)).size == (48, 40)  # small: kept as is


def test_map_equals_the_library_and_the_overlay_is_viz_overlay(served) -> None:
    client, explorer = served
    model = explorer.checkpoints["a"].model
    x = model_input(explorer, 4)
    for target in (0, 3):
        raw = npy(client.get("/api/map", params={"image": 4, "class": target, "format": "npy"}))
        expected = camkit.GradCAM(model, "act2")(x, target=target).numpy()
        assert raw.shape == (SIZE, SIZE) and np.abs(raw - expected).max() < 1e-5
    stem = npy(
        client.get(
            "/api/map",
            params={"image": 4, "class": 3, "layer": "stem", "method": "layercam", "format": "npy"},
        )
    )
    assert np.abs(stem - camkit.LayerCAM(model, "stem")(x, target=3).numpy()).max() < 1e-5
    picture = png(
        client.get("/api/map", params={"image": 4, "class": 3, "alpha": 0.7, "colormap": "inferno"})
    )
    view = explorer.preprocess.resize_crop(cio.read_image(explorer.entries[4].path))
    heat = camkit.GradCAM(model, "act2")(x, target=3).numpy()
    assert np.abs(picture.astype(int) - viz.overlay(view, heat, 0.7, "inferno")).max() <= 1
    info = client.get("/api/image/4", params={"k": 2}).json()
    probabilities = model(x[None]).softmax(-1)[0]
    assert [row["index"] for row in info["top"]] == probabilities.topk(2).indices.tolist()
    assert info["probabilities"] == pytest.approx(probabilities.tolist(), abs=1e-6)
    assert info["size"] == [48, 40] and info["truth"] == "rocket"


def test_concurrent_requests_become_one_engine_call(tmp_path: Path) -> None:
    explorer = explorer_for(photo_folder(tmp_path))
    app = create_app(explorer, token=None, window=0.05)
    batcher = app.state.batcher
    model = explorer.checkpoints["a"].model
    pairs = [(image, target) for image in (1, 2, 5) for target in (0, 2)] + [(6, 1)]

    async def ask_all():
        return await asyncio.gather(
            *(batcher.maps("a", "gradcam", ("act2",), i, t) for i, t in pairs)
        )

    model.calls = 0
    answers = asyncio.run(ask_all())
    assert explorer.engine_calls == 1 and model.calls == 1  # 4 images x up to 2 classes: 1 pass
    for (image, target), answer in zip(pairs, answers, strict=True):
        expected = camkit.GradCAM(model, "act2")(model_input(explorer, image), target=target)
        assert np.abs(answer["act2"] - expected.numpy()).max() < 1e-5
    asyncio.run(ask_all())  # all cached now
    assert explorer.engine_calls == 1
    batcher.close()


def test_a_map_queued_twice_is_computed_once(tmp_path: Path) -> None:
    # the job route and the difference view may both queue a map before either computed it
    explorer = explorer_for(photo_folder(tmp_path))
    model = explorer.checkpoints["a"].model
    explorer.compute("a", "gradcam", ("act1", "act2"), [(1, 0)])
    model.calls = 0
    explorer.compute("a", "gradcam", ("act2",), [(1, 0)])  # cached at its one layer
    explorer.compute("a", "saliency", ("act2",), [(2, 3)])
    explorer.compute("a", "saliency", ("act1",), [(2, 3)])  # no layer: the same map
    assert explorer.engine_calls == 2 and model.calls == 1
    explorer.compute("a", "gradcam", ("act2",), [(1, 0), (2, 1)])  # only the new pair
    assert explorer.engine_calls == 3
    heat = explorer.maps.get_item(MapKey("a", "gradcam", "act2", 2, 1))
    expected = camkit.GradCAM(model, "act2")(model_input(explorer, 2), target=1)
    assert np.abs(heat - expected.numpy()).max() < 1e-5


def test_a_lone_request_waits_for_no_window(tmp_path: Path, monkeypatch) -> None:
    from camkit.serve import batcher as batching

    explorer = explorer_for(photo_folder(tmp_path))
    app = create_app(explorer, token=None, window=0.05)
    waits: list[float] = []
    sleep = asyncio.sleep

    async def recorded(delay: float, *args: object) -> object:
        waits.append(delay)
        return await sleep(delay, *args)

    monkeypatch.setattr(batching.asyncio, "sleep", recorded)

    async def ask(pairs: list[tuple[int, int]]) -> None:
        await asyncio.gather(
            *(app.state.batcher.maps("a", "gradcam", ("act2",), i, t) for i, t in pairs)
        )

    asyncio.run(ask([(1, 0)]))  # a click: straight to the model
    assert 0.05 not in waits and explorer.engine_calls == 1
    asyncio.run(ask([(2, 0), (5, 1)]))  # sent together: the window lets them gather
    assert waits.count(0.05) == 1 and explorer.engine_calls == 2
    app.state.batcher.close()


def test_depth_strip_is_one_pass_and_equals_each_layer_alone(served) -> None:
    client, explorer = served
    model = explorer.checkpoints["a"].model
    before, model.calls = explorer.engine_calls, 0
    reply = client.get("/api/depth", params={"image": 2, "class": 1, "method": "gradcam++"})
    assert reply.json() == {"layers": ["act1", "act2"]}
    assert explorer.engine_calls == before + 1 and model.calls == 1
    x = model_input(explorer, 2)
    for layer in ("act1", "act2"):
        params = {"image": 2, "class": 1, "method": "gradcam++", "layer": layer, "format": "npy"}
        raw = npy(client.get("/api/map", params=params))  # from the cache
        expected = camkit.GradCAMPlusPlus(model, layer)(x, target=1).numpy()
        assert np.abs(raw - expected).max() < 1e-5
    assert explorer.engine_calls == before + 1
    reply = client.get("/api/depth", params={"image": 2, "class": 1, "method": "saliency"})
    assert reply.status_code == 422 and "no layer" in reply.json()["error"]


def test_pixel_method_and_deletion_insertion_curves(served) -> None:
    client, explorer = served
    model = explorer.checkpoints["a"].model
    x = model_input(explorer, 6)
    params = {"image": 6, "class": 2, "method": "saliency"}
    raw = npy(client.get("/api/map", params=params | {"format": "npy"}))
    # the method's one display policy, as the CLI and the report colour it
    saliency = camkit.Saliency(model)
    heat = saliency.display_heat(saliency.explain_batch(x[None], 2).maps)
    expected = heat[0, 0].numpy()
    assert np.abs(raw - expected).max() < 1e-6
    curves = client.get("/api/curve", params=params).json()
    heat = torch.from_numpy(expected)[None]
    auc, points = metrics.deletion(model, x[None], heat, [2], steps=20, return_curves=True)
    assert curves["deletion"]["auc"] == pytest.approx(float(auc[0]), abs=1e-6)
    assert curves["deletion"]["curve"] == pytest.approx(points[0].tolist(), abs=1e-6)
    assert len(curves["insertion"]["curve"]) == 21


def test_failures_answer_clearly_keep_serving_and_leave_the_model_untouched(served) -> None:
    client, explorer = served
    model = explorer.checkpoints["a"].model
    before = model_state(model)
    cases = [
        ({"image": 1, "class": 0, "layer": "nope"}, 422, "nope"),
        ({"image": 1, "class": 0, "layer": "head"}, 422, "no (B, C, h, w) map"),
        ({"image": 1, "class": 0, "method": "rollout"}, 422, "does not fit this model"),
        ({"image": 1, "class": 0, "method": "gradcamm"}, 422, "did you mean"),
        ({"image": 1, "class": 9}, 422, "0..3"),
        ({"image": 99, "class": 0}, 404, "no image"),
        ({"image": "x", "class": 0}, 422, "must be an integer"),
        ({"image": 1}, 422, "missing query parameter 'class'"),
        ({"image": 0, "class": 0}, 422, "broken.jpg cannot be read: not an image file"),
    ]
    for params, status, words in cases:
        reply = client.get("/api/map", params=params)
        assert reply.status_code == status, (params, reply.text)
        assert words in reply.json()["error"], (params, reply.json())
    assert_untouched(model, before)
    assert client.get("/api/map", params={"image": 1, "class": 0}).status_code == 200
    assert_untouched(model, before)


def test_two_checkpoints_side_by_side(tmp_path: Path) -> None:
    explorer = explorer_for(photo_folder(tmp_path), a=loaded(0), b=loaded(1))
    with TestClient(create_app(explorer, token=None)) as client:
        assert client.get("/api/info").json()["checkpoints"] == ["a", "b"]
        params = {"image": 3, "class": 1, "format": "npy"}
        first = npy(client.get("/api/map", params=params))
        second = npy(client.get("/api/map", params=params | {"checkpoint": "b"}))
        x = model_input(explorer, 3)
        expected = camkit.GradCAM(explorer.checkpoints["b"].model, "act2")(x, target=1).numpy()
        assert np.abs(second - expected).max() < 1e-5 and np.abs(first - second).max() > 0.1
        reply = client.get("/api/map", params=params | {"checkpoint": "c"})
        assert reply.status_code == 422 and "unknown checkpoint" in reply.json()["error"]


def write_run(tmp_path: Path) -> Path:
    """A ``camkit explain`` folder: manifest with made-up predictions, one overlay file."""
    folder = photo_folder(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    image = folder / "loose0.png"
    cio.save_png(run / "loose0_gradcam_1.png", photo(7))
    top5 = [{"index": 1, "label": "espresso", "probability": 0.75}]
    top5 += [{"index": 0, "label": "tabby", "probability": 0.25}]
    record = {"image": str(image), "output": "loose0_gradcam_1.png", "method": "gradcam"}
    record |= {"layer": "act2", "target": 1, "label": "espresso", "top5": top5}
    cio.save_json(run / "manifest.json", {"model": "small", "records": [record]})
    return run


def test_a_run_folder_reuses_its_predictions_and_serves_its_maps(tmp_path: Path) -> None:
    from camkit.serve.gallery import read_run

    run = write_run(tmp_path)
    entries, header, predictions = read_run(run)
    explorer = Explorer({"a": loaded()}, entries, predictions=predictions)
    with TestClient(create_app(explorer, token=None, run=RunViews(run, header))) as client:
        model = explorer.checkpoints["a"].model
        model.calls = 0
        item = client.get("/api/gallery").json()["items"][0]
        assert item["top"][0] == {"index": 1, "label": "espresso", "probability": 0.75}
        assert model.calls == 0  # the manifest's predictions: no forward pass
        maps = client.get("/api/image/0").json()["run_maps"]
        assert maps[0]["output"] == "loose0_gradcam_1.png" and maps[0]["method"] == "gradcam"
        served = client.get(f"/api/run/{maps[0]['output']}")
        assert served.status_code == 200
        assert np.array_equal(png(served), photo(7))


def test_the_strategies_of_a_run_link_into_the_image_view(tmp_path: Path) -> None:
    from camkit.serve.gallery import read_run, read_strategies

    run = write_run(tmp_path)
    photos = tmp_path / "photos"
    extra = [str(photos / "tabby" / "tabby0.png"), str(photos / "loose0.png")]
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["records"].append({"image": extra[0], "top5": manifest["records"][0]["top5"]})
    cio.save_json(run / "manifest.json", manifest)
    (run / "strategies").mkdir()
    cio.save_png(run / "strategies" / "prototype_gradcam_1_0.png", photo(3, 8, 8))
    cluster = {"id": 0, "size": 2, "members": [0, 1], "typical": [1, 0], "atypical": [7]}
    cluster |= {"confidence": 0.6, "accuracy": None, "suspiciousness": 0.25}
    cluster |= {"prototype": "prototype_gradcam_1_0.png"}
    group = {"method": "gradcam", "class": 1, "label": "espresso", "samples": 2}
    group |= {"suggested_k": 1, "clusters": [cluster], "eigengap_plot": "eigengap_gradcam_1.png"}
    skipped = [{"method": "gradcam", "class": 2, "reason": "1 map"}]
    data = {"images": extra, "groups": [group], "skipped": skipped}
    cio.save_json(run / "strategies" / "strategies.json", data)
    entries, header, predictions = read_run(run)
    strategies = read_strategies(run, entries)
    explorer = Explorer({"a": loaded()}, entries, predictions=predictions)
    app = create_app(explorer, token=None, run=RunViews(run, strategies=strategies))
    with TestClient(app) as client:
        assert client.get("/api/info").json()["strategies"] is True
        view = client.get("/api/strategies").json()
        first = view["groups"][0]["clusters"][0]
        # rows of the map file -> gallery ids: row 1 is loose0.png (id 0), row 0 tabby0 (id 1)
        assert first["typical"] == [0, 1] and first["atypical"] == []  # row 7: no such row
        assert first["prototype"] == "strategies/prototype_gradcam_1_0.png"
        assert view["groups"][0]["eigengap_plot"] == "strategies/eigengap_gradcam_1.png"
        assert view["skipped"] == skipped
        assert client.get(f"/api/run/{first['prototype']}").status_code == 200
    assert read_strategies(tmp_path, entries) is None
    explorer = Explorer({"a": loaded()}, entries)
    with TestClient(create_app(explorer, token=None, run=RunViews(run))) as client:
        reply = client.get("/api/strategies")
        assert reply.status_code == 404 and "camkit strategies" in reply.json()["error"]


# ----------------------------------------------------------------------------- security


def test_every_api_route_needs_the_token(served) -> None:
    client, _ = served
    client.headers.pop(security.TOKEN_HEADER)
    routes = ["/api/info", "/api/gallery", "/api/thumb/1", "/api/photo/1", "/api/image/1"]
    routes += ["/api/map?image=1&class=0", "/api/depth?image=1&class=0", "/api/run/x"]
    for route in routes:
        missing = client.get(route)
        assert missing.status_code == 401 and "missing token" in missing.json()["error"], route
        wrong = client.get(route, params={"token": TOKEN[:-1] + "X"})
        assert wrong.status_code == 401 and "wrong token" in wrong.json()["error"], route
    assert client.post("/api/upload", content=b"x").status_code == 401
    assert client.get("/api/info", params={"token": TOKEN}).status_code == 200
    assert client.get("/api/info", headers={security.TOKEN_HEADER: TOKEN}).status_code == 200
    page = client.get("/")  # the page holds no data; it reads the token from its own URL
    assert page.status_code == 200 and "app.js" in page.text
    assert "http://" not in page.text and "https://" not in page.text
    for name in ("app.js", "style.css"):  # the SVG namespace is a name, never fetched
        text = client.get(f"/static/{name}").text.replace('"http://www.w3.org/2000/svg"', "")
        assert "http://" not in text and "https://" not in text


def test_only_files_under_the_run_folder_are_served(tmp_path: Path) -> None:
    run = write_run(tmp_path)
    (tmp_path / "secret.txt").write_text("top secret")
    (run / "inside.txt").write_text("fine")
    (run / "out-link.txt").symlink_to(tmp_path / "secret.txt")
    (run / "in-link.txt").symlink_to(run / "inside.txt")
    (run / "sub").mkdir()
    entries, header, predictions = scan([tmp_path / "photos"])[0], None, {}
    explorer = Explorer({"a": loaded()}, entries, predictions=predictions)
    app = create_app(explorer, token=TOKEN, run=RunViews(run, header))
    with TestClient(app) as client:
        ok = client.get("/api/run/inside.txt", params={"token": TOKEN})
        assert ok.status_code == 200 and ok.text == "fine"
        assert client.get("/api/run/in-link.txt", params={"token": TOKEN}).text == "fine"
        attempts = [
            "/api/run/../secret.txt",
            "/api/run/sub/../../secret.txt",
            "/api/run/%2e%2e/secret.txt",
            "/api/run/%2E%2E%2Fsecret.txt",
            "/api/run/%252e%252e%252fsecret.txt",
            "/api/run/..%5csecret.txt",
            f"/api/run/{tmp_path}/secret.txt",
            f"/api/run/%2F{str(tmp_path).lstrip('/')}/secret.txt",
            "/api/run/out-link.txt",
            "/api/run/sub",
            "/api/run/inside.txt%00.png",
            "/static/../pyproject.toml",
            "/static/%2e%2e%2fapp.py",
        ]
        for attempt in attempts:
            reply = client.get(attempt, params={"token": TOKEN})
            assert reply.status_code == 404, (attempt, reply.status_code)
            assert "top secret" not in reply.text
    assert security.resolve_under(run, "inside.txt") == (run / "inside.txt").resolve()
    for bad in ("", "/etc/passwd", "../secret.txt", "a/../../secret.txt", "out-link.txt", "sub"):
        assert security.resolve_under(run, bad) is None, bad


def png_bytes(image: np.ndarray) -> bytes:
    buffer = pyio.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG")
    return buffer.getvalue()


def test_uploads_are_limited_and_a_bad_one_does_not_stop_the_server(served, monkeypatch) -> None:
    client, explorer = served
    good = png_bytes(photo(5))
    monkeypatch.setattr(security, "MAX_UPLOAD_BYTES", len(good) + 10)
    too_big = client.post("/api/upload", content=good + b"\0" * 64)
    assert too_big.status_code == 413 and "more than" in too_big.json()["error"]
    corrupt = client.post("/api/upload", content=good[: len(good) // 2])
    assert corrupt.status_code == 400 and "not a readable image" in corrupt.json()["error"]
    garbage = client.post("/api/upload", content=b"<script>alert(1)</script>")
    assert garbage.status_code == 400 and "Pillow" in garbage.json()["error"]
    empty = client.post("/api/upload", content=b"")
    assert empty.status_code == 400 and "empty" in empty.json()["error"]
    bomb = bytearray(png_bytes(np.zeros((8, 8, 3), np.uint8)))  # header says 40000 x 40000
    bomb[16:24] = (40000).to_bytes(4, "big") * 2
    import zlib

    bomb[29:33] = zlib.crc32(bytes(bomb[12:29])).to_bytes(4, "big")
    refused = client.post("/api/upload", content=bytes(bomb))
    assert refused.status_code == 413 and "refused before decoding" in refused.json()["error"]
    accepted = client.post("/api/upload", content=good, params={"name": "cat<1>.png"})
    assert accepted.status_code == 200
    image = accepted.json()["id"]
    assert explorer.entries[image].name == "upload: cat_1_.png"
    raw = npy(client.get("/api/map", params={"image": image, "class": 2, "format": "npy"}))
    model = explorer.checkpoints["a"].model
    expected = camkit.GradCAM(model, "act2")(explorer.preprocess(photo(5)), target=2).numpy()
    assert np.abs(raw - expected).max() < 1e-5
    monkeypatch.setattr(security, "MAX_UPLOADS", 2)
    assert client.post("/api/upload", content=good).status_code == 200
    full = client.post("/api/upload", content=good)
    assert full.status_code == 429 and "already holds 2 uploads" in full.json()["error"]


def test_serve_takes_max_pixels_for_its_files_and_uploads(tmp_path: Path, monkeypatch) -> None:
    import camkit.cli.commands.serve as serve_command
    from camkit.cli import build_parser

    folder = tmp_path / "photos"
    folder.mkdir()
    cio.save_png(folder / "big.png", photo(3, 40, 48))  # 1920 pixels
    cio.save_png(folder / "small.png", photo(4, 20, 30))  # 600 pixels
    monkeypatch.setattr(serve_command, "load_model", lambda *args, **kwargs: loaded())
    parse = build_parser().parse_args
    assert parse(["serve", str(folder)]).max_pixels == cio.MAX_PIXELS  # explain's default
    assert parse(["serve", str(folder), "--max-pixels", "0"]).max_pixels is None  # no limit
    args = parse(["serve", str(folder), "--max-pixels", "1000", "--device", "cpu"])
    prepared = serve_command.build(args)
    with TestClient(prepared.app, base_url="http://127.0.0.1:8000") as client:
        client.headers[security.TOKEN_HEADER] = prepared.token
        items = client.get("/api/gallery").json()["items"]
        big, small = (next(i for i in items if i["name"] == n) for n in ("big.png", "small.png"))
        assert "1,920 pixels" in big["error"] and "--max-pixels" in big["error"]
        assert small["error"] is None and small["top"]
        refused = client.post("/api/upload", content=png_bytes(photo(5, 40, 40)))
        assert refused.status_code == 413, refused.text
        reason = refused.json()["error"]
        assert "1,600 pixels" in reason and "--max-pixels" in reason
        assert client.post("/api/upload", content=png_bytes(photo(5, 25, 40))).status_code == 200


def test_host_header_is_checked_on_loopback(tmp_path: Path) -> None:
    explorer = explorer_for(photo_folder(tmp_path))
    app = create_app(explorer, token=TOKEN, hosts=security.allowed_hosts("127.0.0.1"))
    with TestClient(app, base_url="http://127.0.0.1:8000") as client:
        assert client.get("/api/info", params={"token": TOKEN}).status_code == 200
        rebound = client.get("/api/info", params={"token": TOKEN}, headers={"host": "evil.test"})
        assert rebound.status_code == 400
    assert security.allowed_hosts("0.0.0.0") == ["*"]


def test_cli_refuses_a_public_address_without_a_token_and_a_missing_stack(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    folder = photo_folder(tmp_path)
    assert main(["serve", str(folder), "--host", "0.0.0.0", "--token", ""]) == 2
    assert "refusing to serve on 0.0.0.0 without a token" in capsys.readouterr().err
    assert main(["serve", str(tmp_path / "nothing")]) == 2
    assert "no such file or directory" in capsys.readouterr().err
    import camkit.serve

    monkeypatch.setattr(camkit.serve, "web_stack_missing", lambda: camkit.serve.MISSING_STACK)
    assert main(["serve", str(folder)]) == 2
    assert "pip install 'camkit[serve]'" in capsys.readouterr().err


@pytest.mark.slow
def test_cli_builds_the_demo_with_the_default_model() -> None:
    from camkit.cli import build_parser
    from camkit.cli.commands.serve import build

    args = build_parser().parse_args(["serve", "--demo", "--device", "cpu"])
    prepared = build(args)
    app, token = prepared.app, prepared.token
    assert prepared.count == 5 and len(token) == 32
    with TestClient(app, base_url="http://127.0.0.1:8000") as client:
        info = client.get("/api/info", params={"token": token}).json()
        assert info["default_layer"] == "bn2" and len(info["stages"]) == 5
        names = {e.name: i for i, e in enumerate(app.state.explorer.entries)}
        cat = client.get(f"/api/image/{names['chelsea.png']}", params={"token": token}).json()
        assert "cat" in cat["top"][0]["label"]


# ----------------------------------------------------------------------------- real server


def resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="needs /proc for the memory")
def test_load_against_a_real_uvicorn(tmp_path: Path) -> None:
    explorer = explorer_for(photo_folder(tmp_path))
    clients, requests_each = 6, 12
    methods = ("gradcam", "layercam", "saliency")

    def url(base: str, k: int, client: int) -> str:
        image, target = 1 + (k + client) % 7, (k * 3 + client) % 4
        method = methods[(k + client) % 3]
        return f"{base}/api/map?image={image}&class={target}&method={method}&token={TOKEN}"

    def one_client(base: str, client: int, latencies: list, errors: list) -> None:
        for k in range(requests_each):
            started = time.perf_counter()
            try:
                with urllib.request.urlopen(url(base, k, client), timeout=30) as reply:
                    reply.read()
            except (urllib.error.URLError, OSError) as error:
                errors.append(repr(error))
            latencies.append(time.perf_counter() - started)

    def round_of_load(base: str) -> tuple[list, list]:
        latencies: list[float] = []
        errors: list[str] = []
        threads = [
            threading.Thread(target=one_client, args=(base, c, latencies, errors))
            for c in range(clients)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert not any(t.is_alive() for t in threads), "the load test did not stop"
        return latencies, errors

    with running(create_app(explorer, token=TOKEN)) as base:
        round_of_load(base)  # warm-up: every map once, caches filled
        explorer.maps.clear()
        warm = resident_bytes()
        latencies, errors = round_of_load(base)
        after = resident_bytes()
    assert errors == []
    assert len(latencies) == clients * requests_each
    p95 = float(np.percentile(latencies, 95))
    print(f"\nload: {clients} clients x {requests_each} maps, p95 {p95 * 1000:.0f} ms")
    assert after <= 1.10 * warm, f"memory grew from {warm / 1e6:.0f} MB to {after / 1e6:.0f} MB"


# ----------------------------------------------------------------------------- the browser

from tests.test_report import Browser, needs_browser  # noqa: E402

MAP_PIXELS = """
(async () => {
  const img = document.querySelector('#maps img.map');
  if (!img.complete || !img.naturalWidth) await new Promise((done) => { img.onload = done; });
  const canvas = document.createElement('canvas');
  canvas.width = img.naturalWidth; canvas.height = img.naturalHeight;
  const context = canvas.getContext('2d');
  context.drawImage(img, 0, 0);
  return Array.from(context.getImageData(0, 0, canvas.width, canvas.height).data);
})()
"""


def open_explorer(browser: Browser, url: str) -> None:
    """Open the explorer's page (with the browser's console logged) and wait until it is
    ready."""
    browser.call("Log.enable", session=True)
    browser.open(url)
    browser.js(
        """new Promise((done) => { (function poll() {
        if (document.body.dataset.ready === '1') done();
        else setTimeout(poll, 20); })(); })"""
    )


def settle(browser: Browser) -> None:
    """Wait until the page has no map request in flight."""
    browser.js(
        """new Promise((done) => { const t0 = Date.now(); (function poll() {
        if (document.body.dataset.busy === '0' || Date.now() - t0 > 20000) setTimeout(done, 50);
        else setTimeout(poll, 20); })(); })"""
    )


def change(browser: Browser, element: str, value: str) -> None:
    browser.js(
        f"""(() => {{ const e = document.getElementById({json.dumps(element)});
        e.value = {json.dumps(value)}; e.dispatchEvent(new Event('change')); }})()"""
    )
    browser.js("new Promise((done) => setTimeout(done, 30))")
    settle(browser)


@needs_browser
@pytest.mark.slow
def test_explorer_in_headless_chromium(tmp_path: Path) -> None:
    explorer = explorer_for(photo_folder(tmp_path))
    with running(create_app(explorer, token=TOKEN)) as base:
        browser = Browser(tmp_path / "profile")
        try:
            open_explorer(browser, f"{base}/?token={TOKEN}")
            assert browser.js("document.querySelectorAll('#gallery .card').length") == 8
            assert browser.js("document.getElementById('count').textContent").startswith("1–8 of 8")
            # open an image
            browser.js("document.querySelector('.card[data-id=\"4\"]').click()")
            browser.js("new Promise((done) => setTimeout(done, 100))")
            settle(browser)
            assert browser.js("document.getElementById('image-view').hidden") is False
            methods = browser.js(
                "[...document.querySelectorAll('#method option')].map(o => o.value)"
            )
            assert "gradcam" in methods and "rollout" not in methods
            first = browser.js(MAP_PIXELS)
            assert len(first) == SIZE * SIZE * 4
            seen = [first]
            top = int(explorer.checkpoints["a"].model(model_input(explorer, 4)[None]).argmax())
            other = (top + 1) % 4
            for element, value in (
                ("class", f"{LABELS[other]} ({other})"),
                ("method", "layercam"),
                ("layer", "stem"),
            ):
                change(browser, element, value)
                pixels = browser.js(MAP_PIXELS)
                assert all(pixels != earlier for earlier in seen), f"{element}: map unchanged"
                seen.append(pixels)
            # the map shown is the server's map for these settings
            expected = explorer.maps.get_item(MapKey("a", "layercam", "stem", 4, other))
            assert expected is not None
            browser.js("document.getElementById('depth-button').click()")
            browser.js("new Promise((done) => setTimeout(done, 100))")
            settle(browser)
            assert browser.js("document.querySelectorAll('#depth img').length") == 2
            assert browser.js("document.getElementById('message').hidden") is True
            assert browser.problems() == []
            schemes = browser.js(
                "performance.getEntriesByType('resource')"
                ".map((e) => e.name.split('/')[2] || e.name)"
            )
            assert all(s.startswith("127.0.0.1") for s in schemes if not s.startswith("blob")), (
                schemes
            )
        finally:
            browser.close()

"""One photo, four front ends: the library, ``camkit explain``, its report and the explorer's
API give the same top-1, probability and map (on the same colour scale), for a CAM and a pixel
method, with the model's own preprocessing (a centre crop) and with ``--crop squash``."""

from __future__ import annotations

import dataclasses
import json
import re
from io import BytesIO
from pathlib import Path

import numpy as np
import pytest
import torch
from skimage import data

import camkit
from camkit import io, models
from camkit.cli import build_parser, main

pytest.importorskip("starlette", reason="the explorer's web stack: pip install 'camkit[serve]'")
pytest.importorskip("httpx", reason="the ASGI test client needs httpx (the dev extra)")
from starlette.testclient import TestClient  # noqa: E402

from camkit.cli.commands.serve import build  # noqa: E402
from camkit.serve import security  # noqa: E402

pytestmark = pytest.mark.slow
TOKEN = "one-policy-token"
METHODS = ("gradcam", "saliency", "lrp")


def library(photo: np.ndarray, crop: str | None) -> tuple[int, float, dict[str, np.ndarray]]:
    """Top-1, its probability and each method's displayed heat, straight from the library."""
    loaded = models.load("efficientnet_lite0")
    if crop is not None:
        loaded.preprocess = dataclasses.replace(loaded.preprocess, crop_mode=crop)
    x = loaded.preprocess(photo)[None]
    with torch.no_grad():
        probabilities = loaded.model(x).softmax(-1)[0]
    top1 = int(probabilities.argmax())
    heat = {}
    for method in METHODS:
        explainer = camkit.METHODS[method].build(loaded.model, None)
        maps = explainer.explain_batch(x, top1, **explainer.display_options).maps
        heat[method] = explainer.display_heat(maps)[0, 0].numpy()
    return top1, float(probabilities[top1]), heat


@pytest.mark.parametrize("crop", [None, "squash"])
def test_one_photo_gives_one_answer_everywhere(tmp_path: Path, crop: str | None) -> None:
    photo = data.chelsea()  # 300 x 451: the centre crop and the squash differ
    path = tmp_path / "chelsea.png"
    io.save_png(path, photo)
    top1, probability, heat = library(photo, crop)

    out = tmp_path / "run"
    crop_args = [] if crop is None else ["--crop", crop]
    argv = ["explain", str(path), "--method", ",".join(METHODS), "--save-raw", "--report"]
    assert main([*argv, "--out", str(out), "--quiet", *crop_args]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["settings"]["crop"] == (crop or "center")
    for record in manifest["records"]:
        assert record["target"] == top1
        assert record["probability"] == pytest.approx(probability, abs=1e-5)
        raw = torch.from_numpy(np.load(out / record["raw"]))
        explainer = camkit.METHODS[record["method"]].build(torch.nn.Identity(), None)
        shown = explainer.display_heat(raw[None, None])[0, 0].numpy()
        np.testing.assert_allclose(shown, heat[record["method"]], atol=1e-4)

    page = (out / "index.html").read_text()
    found = re.search(
        r'<script type="application/json" id="camkit-data">(.*?)</script>', page, re.S
    )
    shown_probabilities = [float(p) for p in re.findall(r'"p":([0-9.e-]+)', found.group(1))]
    assert any(abs(p - probability) <= 1e-5 for p in shown_probabilities)

    args = build_parser().parse_args(["serve", str(out), "--token", TOKEN, *crop_args])
    prepared = build(args)
    with TestClient(prepared.app, base_url="http://127.0.0.1:8765") as client:
        client.headers[security.TOKEN_HEADER] = TOKEN
        response = client.get("/api/image/0", params={"k": 1})
        assert response.status_code == 200, response.text
        info = response.json()
        assert info["top"][0]["index"] == top1
        assert info["top"][0]["probability"] == pytest.approx(probability, abs=1e-5)
        for method in METHODS:
            params = {"image": 0, "class": top1, "method": method, "format": "npy"}
            response = client.get("/api/map", params=params)
            assert response.status_code == 200, response.text
            shown = np.load(BytesIO(response.content))
            np.testing.assert_allclose(shown, heat[method], atol=1e-4)


def test_where_the_input_lies_on_the_photo_by_hand() -> None:
    """A 300 x 400 photo, 224 input, crop ratio 0.875: the centre crop resizes to 256 x 341
    (shorter side 256 = floor(224 / 0.875)) and cuts rows 16..240, columns 58..282 (torchvision
    rounds the offsets), i.e. rows 18.75..281.25 and columns 68.0..330.8 of the photo; the pad
    resizes to 168 x 224 and centres it, 28 rows of letterbox above."""
    center = models.Preprocess(224, crop_mode="center")
    assert center.resized_size(300, 400) == (256, 341)
    top, left, bottom, right = center.photo_region(300, 400)
    expected = (16 * 300 / 256, 58 * 400 / 341, 240 * 300 / 256, 282 * 400 / 341)
    assert (top, left, bottom, right) == pytest.approx(expected, rel=1e-12)
    assert center.box_on_photo((0, 0, 224, 224), 300, 400) == (18, 68, 281, 331)
    assert models.Preprocess(224, crop_mode="squash").photo_region(300, 400) == (0, 0, 300, 400)
    pad = models.Preprocess(224, crop_mode="pad")
    assert pad.photo_region(300, 400) == pytest.approx((-50, 0, 350, 400), rel=1e-12)
    assert pad.box_on_photo((28, 0, 196, 224), 300, 400) == (0, 0, 300, 400)
    letterboxed = pad.resize_crop(np.full((300, 400, 3), 255, np.uint8), fill=(0.0, 0.0, 0.0))
    rows = np.flatnonzero(letterboxed.max(axis=(1, 2)) > 0)
    assert (rows.min(), rows.max()) == (28, 195)


def test_a_map_on_the_full_photo_dims_what_the_model_did_not_see() -> None:
    photo = np.full((300, 400, 3), 200, np.uint8)
    heat = np.ones((7, 7), np.float32)
    center = models.Preprocess(224, crop_mode="center")
    drawn = camkit.viz.overlay_on_photo(photo, heat, center.photo_region(300, 400), alpha=0.5)
    assert (drawn[:18] == 100).all() and (drawn[:, :68] == 100).all()  # cut: half brightness
    assert (drawn[150, 200] != 100).any()  # seen: the heat's colour blended in
    whole = models.Preprocess(224, crop_mode="squash").photo_region(300, 400)
    np.testing.assert_array_equal(
        camkit.viz.overlay_on_photo(photo, heat, whole), camkit.viz.overlay(photo, heat)
    )

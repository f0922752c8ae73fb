"""camkit serve's concept views: the top concepts where the user clicks or drags, their
conditional heatmaps, reference patches and feature visualisations, and the concepts that
dominate a strategies cluster; numbers computed by hand on the small two-stage model of
tests/test_serve.py (its head is linear over the channel means, so ``dS/dA = W[y, c] / 64``)."""

from __future__ import annotations

import dataclasses
import io as pyio
import json
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from camkit import io as cio
from camkit.methods.concepts import ConceptAttribution
from camkit.viz.colour import signed_scale

pytest.importorskip("starlette", reason="camkit serve's web stack: pip install 'camkit[serve]'")
pytest.importorskip("httpx", reason="the ASGI test client needs httpx (the dev extra)")
from starlette.testclient import TestClient  # noqa: E402

from camkit.runs.concepts import read_concepts  # noqa: E402
from camkit.serve import security  # noqa: E402
from camkit.serve.app import create_app, running  # noqa: E402
from camkit.serve.concepts import (  # noqa: E402
    WHOLE,
    ConceptViews,
    Region,
    concept_png,
    layer_grid,
    region_of,
)
from camkit.serve.explorer import Explorer  # noqa: E402
from camkit.serve.gallery import RunViews, read_run, read_strategies  # noqa: E402
from tests.conftest import assert_untouched, model_state  # noqa: E402
from tests.test_serve import (  # noqa: E402
    TOKEN,
    explorer_for,
    loaded,
    model_input,
    photo,
    photo_folder,
    png,
    write_run,
)


def by_hand(explorer, image: int, target: int) -> tuple[torch.Tensor, torch.Tensor]:
    """act2 is 8 channels on an 8 x 8 grid (4 x 4 input pixels per cell): its ``(8, 8, 8)``
    relevance ``A * dS/dA`` and the input, without autograd at act2:
    the head averages the 64 positions, so ``dS/dA[c] = W[target, c] / 64``."""
    model = explorer.checkpoints["a"].model
    x = model_input(explorer, image)[None]
    with torch.no_grad():
        act = model.act2(model.stage2(model.act1(model.stem(x))))[0]
        return act * (model.head.weight[target] / 64).view(-1, 1, 1), x


def conditional_by_hand(
    explorer, image: int, target: int, channel: int, cells: torch.Tensor | None = None
) -> np.ndarray:
    """``x * d/dx sum_ij A[c, i, j] W[y, c] / 64``: channel ``c``'s conditional heatmap; with
    ``cells`` (an ``(8, 8)`` mask of act2's grid), of its relevance in those cells only."""
    model = explorer.checkpoints["a"].model
    x = model_input(explorer, image)[None].requires_grad_(True)
    act = model.act2(model.stage2(model.act1(model.stem(x))))
    there = act[0, channel] if cells is None else act[0, channel] * cells
    score = there.sum() * model.head.weight[target, channel].detach() / 64
    (grad,) = torch.autograd.grad(score, x)
    return (x * grad).sum(dim=1)[0].detach().numpy()


def cached_heat(client: TestClient, key: tuple, region: Region = WHOLE) -> np.ndarray:
    """A conditional heatmap as the server computes it for ``/api/concept-map`` (the list of
    concepts answers first; each heatmap is computed when asked, then cached)."""
    heat = client.app.state.views.heatmap(*key, region)
    assert client.app.state.views.heatmaps.get_item((*key, region)) is heat
    return heat


@pytest.fixture
def served(tmp_path: Path):
    explorer = explorer_for(photo_folder(tmp_path))
    with TestClient(create_app(explorer, token=TOKEN)) as client:
        client.headers[security.TOKEN_HEADER] = TOKEN
        yield client, explorer


def test_top_concepts_of_the_image_a_click_and_a_box_match_the_hand_numbers(served) -> None:
    client, explorer = served
    model = explorer.checkpoints["a"].model
    before = model_state(model)
    image, target = 4, 2
    relevance, _ = by_hand(explorer, image, target)
    regions = {
        "image": ({}, relevance.sum(dim=(1, 2))),
        # x = 0.55 of 32 px -> column 4, y = 0.2 -> row 1: that one cell of the 8 x 8 grid
        "cell": ({"x": 0.55, "y": 0.2}, relevance[:, 1, 4]),
        # x 0.25..0.75, y 0..0.5 -> pixels 8..24 x 0..16 -> cells columns 2..5, rows 0..3
        "box": ({"box": "0.75,0,0.25,0.5"}, relevance[:, 0:4, 2:6].sum(dim=(1, 2))),
    }
    for kind, (where, per_channel) in regions.items():
        reply = client.get(
            "/api/concepts", params={"image": image, "class": target, "k": 3} | where
        )
        assert reply.status_code == 200, reply.text
        answer = reply.json()
        assert answer["region"]["kind"] == kind and answer["layer"] == "act2"
        values, channels = per_channel.topk(3)
        shares = values / per_channel.abs().sum()
        assert [c["channel"] for c in answer["concepts"]] == channels.tolist(), kind
        got = torch.tensor([c["relevance"] for c in answer["concepts"]])
        scale = float(per_channel.abs().max())
        assert torch.allclose(got, values, atol=1e-5 * scale), kind
        share = torch.tensor([c["share"] for c in answer["concepts"]])
        assert torch.allclose(share, shares, atol=1e-5), kind
        assert all(c["references"] is None for c in answer["concepts"])
    assert client.get(
        "/api/concepts", params={"image": image, "class": target, "x": 0.55, "y": 0.2}
    ).json()["region"]["box"] == [4, 16, 8, 20]
    assert_untouched(model, before)


def test_conditional_heatmaps_are_the_hand_ones_and_sum_to_the_unconditional(served) -> None:
    client, explorer = served
    image, target = 1, 0
    answer = client.get("/api/concepts", params={"image": image, "class": target, "k": 8}).json()
    channels = [c["channel"] for c in answer["concepts"]]
    assert sorted(channels) == list(range(8))
    cached = {c: cached_heat(client, ("a", "act2", image, target, c)) for c in channels}
    total = np.zeros((32, 32))
    for channel in channels:
        expected = conditional_by_hand(explorer, image, target, channel)
        scale = max(float(np.abs(expected).max()), 1e-12)
        assert np.allclose(cached[channel], expected, atol=1e-5 * scale), channel
        total += cached[channel]
    model = explorer.checkpoints["a"].model
    x = model_input(explorer, image)[None].requires_grad_(True)
    (grad,) = torch.autograd.grad(model(x)[0, target], x)
    unconditional = (x * grad).sum(dim=1)[0].detach().numpy()
    assert np.allclose(total, unconditional, atol=1e-5 * float(np.abs(unconditional).max()))
    # the PNG: the hand heatmap, signed, over the model's view (red +, blue -, white 0)
    channel = channels[0]
    shown = png(
        client.get("/api/concept-map", params={"image": image, "class": target, "channel": channel})
    )
    view = explorer.model_view(image)
    expected = conditional_by_hand(explorer, image, target, channel)
    reference = np.asarray(
        Image.open(pyio.BytesIO(concept_png(view, expected, 0.5))).convert("RGB")
    )
    assert np.abs(shown.astype(int) - reference.astype(int)).max() <= 1
    # not cached (another class): one conditional backward, the same numbers
    other = client.get("/api/concept-map", params={"image": image, "class": 3, "channel": 5})
    assert other.status_code == 200
    expected = conditional_by_hand(explorer, image, 3, 5)
    heat = cached_heat(client, ("a", "act2", image, 3, 5))
    assert np.allclose(heat, expected, atol=1e-5 * max(float(np.abs(expected).max()), 1e-12))


def test_a_channels_heatmap_in_a_box_or_cell_is_its_relevance_there_by_hand(served) -> None:
    client, explorer = served
    image, target, channel = 2, 1, 3
    # the box x 0.25..0.75, y 0..0.5 of the 32 x 32 input: rows 0..16, columns 8..24, which are
    # act2's cells (4 x 4 pixels each) rows 0..4, columns 2..6, whole
    box = region_of(None, (0.25, 0.0, 0.75, 0.5), (32, 32), (8, 8))
    assert box == Region("box", (0, 8, 16, 24))
    cells = torch.zeros(8, 8)
    cells[0:4, 2:6] = 1
    expected = conditional_by_hand(explorer, image, target, channel, cells)
    heat = cached_heat(client, ("a", "act2", image, target, channel), box)
    scale = max(float(np.abs(expected).max()), 1e-12)
    assert np.allclose(heat, expected, atol=1e-5 * scale)
    whole = conditional_by_hand(explorer, image, target, channel)
    assert not np.allclose(heat, whole, atol=1e-3 * scale)  # the box changes the heatmap
    # the box and the rest of the image partition the relevance: their heatmaps sum to all
    rest = conditional_by_hand(explorer, image, target, channel, 1 - cells)
    assert np.allclose(heat + rest, whole, atol=1e-5 * scale)
    # a box over half of a cell weighs that cell by half (as the channel list counts it)
    half = region_of(None, (0.0, 0.0, 2 / 32, 4 / 32), (32, 32), (8, 8))
    cells = torch.zeros(8, 8)
    cells[0, 0] = 0.5
    expected = conditional_by_hand(explorer, image, target, channel, cells)
    heat = cached_heat(client, ("a", "act2", image, target, channel), half)
    assert np.allclose(heat, expected, atol=1e-5 * max(float(np.abs(expected).max()), 1e-12))
    # the route: the PNG of the box's heatmap, and a click's cell
    params = {"image": image, "class": target, "channel": channel, "box": "0.25,0,0.75,0.5"}
    shown = png(client.get("/api/concept-map", params=params))
    view = explorer.model_view(image)
    boxed = client.app.state.views.heatmap("a", "act2", image, target, channel, box)
    reference = np.asarray(Image.open(pyio.BytesIO(concept_png(view, boxed, 0.5))).convert("RGB"))
    assert np.abs(shown.astype(int) - reference.astype(int)).max() <= 1
    click = {"image": image, "class": target, "channel": channel, "x": 0.3, "y": 0.1}
    assert client.get("/api/concept-map", params=click).status_code == 200
    cell = region_of((0.3, 0.1), None, (32, 32), (8, 8))  # act2's cell at row 0, column 2
    cells = torch.zeros(8, 8)
    cells[0, 2] = 1
    expected = conditional_by_hand(explorer, image, target, channel, cells)
    heat = client.app.state.views.heatmaps.get_item(("a", "act2", image, target, channel, cell))
    assert np.allclose(heat, expected, atol=1e-5 * max(float(np.abs(expected).max()), 1e-12))


def test_in_region_weighs_the_concepts_gradient_on_a_grid_and_on_tokens() -> None:
    from camkit.errors import ArgumentError
    from camkit.methods.concepts import Channels, InRegion

    grad = torch.arange(2 * 3 * 2 * 2, dtype=torch.float32).view(2, 3, 2, 2)
    weights = torch.tensor([[1.0, 0.0], [0.5, 0.0]])
    projected = InRegion(1, weights).project(grad)
    expected = torch.zeros_like(grad)
    expected[:, 1] = grad[:, 1] * weights
    assert torch.equal(projected, expected)
    assert torch.equal(
        InRegion(Channels([0, 2]), torch.ones(2, 2)).project(grad)[:, 1], 0 * grad[:, 1]
    )
    tokens = torch.ones(1, 3, 1 + 4)  # a class token, then a 2 x 2 grid of patches
    projected = InRegion(0, weights).project(tokens)
    assert (
        projected[0, 0].tolist() == [0.0, 1.0, 0.0, 0.5, 0.0] and projected[0, 1:].abs().sum() == 0
    )
    with pytest.raises(ArgumentError, match="weights must lie in"):
        InRegion(0, torch.full((2, 2), 2.0))
    with pytest.raises(ArgumentError, match="for a \\(2, 2\\) grid"):
        InRegion(0, weights).project(torch.ones(1, 3, 4, 4))


def test_signed_display_is_symmetric_and_a_click_picks_the_cell() -> None:
    heat = np.array([[-2.0, 0.0], [1.0, 2.0]])
    assert np.allclose(signed_scale(heat, 100.0)[0], [[0.0, 0.5], [0.75, 1.0]])
    # the 50th percentile of |heat| = 1.5: -2 and 2 clipped to it
    assert np.allclose(signed_scale(heat, 50.0)[0], [[0.0, 0.5], [5 / 6, 1.0]])
    spiky = np.zeros((10, 10))
    spiky[0, 0] = 4.0  # the 99.5th percentile of |heat| is 2.02: the spike is clipped to it
    assert signed_scale(spiky)[0][0, 0] == 1.0 and signed_scale(spiky)[0][5, 5] == 0.5
    assert np.allclose(signed_scale(np.zeros((2, 2)))[0], 0.5)
    assert layer_grid((1, 8, 8, 8)) == (8, 8) and layer_grid((1, 96, 14, 14)) == (14, 14)
    assert layer_grid((1, 7, 7, 768)) == (7, 7) and layer_grid((1, 197, 768)) == (14, 14)
    assert region_of((0.0, 0.0), None, (32, 32), (8, 8)).box == (0, 0, 4, 4)
    assert region_of((1.0, 1.0), None, (32, 32), (8, 8)).box == (28, 28, 32, 32)
    assert region_of(None, (0.5, 0.5, 0.5, 0.5), (32, 32), (8, 8)).box == (16, 16, 17, 17)


def test_bad_concept_requests_answer_clearly(served) -> None:
    client, _ = served
    base = {"image": 1, "class": 0}
    cases = [
        ("/api/concepts", base | {"colour": 1}, "unknown query parameter"),
        ("/api/concepts", base | {"x": 0.5}, "give x and y together"),
        ("/api/concepts", base | {"x": 2, "y": 0.5}, "fractions"),
        ("/api/concepts", base | {"box": "0,1"}, "x0,y0,x1,y1"),
        ("/api/concepts", base | {"x": 0.1, "y": 0.1, "box": "0,0,1,1"}, "not both"),
        ("/api/concepts", base | {"k": 0}, "k must be between"),
        ("/api/concepts", base | {"k": 9}, "has 8 channels"),
        ("/api/concepts", base | {"layer": "head"}, "layer 'head'"),
        ("/api/concept-map", base | {"channel": 8}, "out of range"),
        ("/api/concept-map", base, "missing query parameter 'channel'"),
        ("/api/feature", {"channel": 99}, "out of range"),
        ("/api/feature", {"channel": 1, "steps": 9}, "unknown query parameter"),
        ("/api/cluster-concepts", {"method": "gradcam", "class": 0, "cluster": 0}, "strategies"),
    ]
    for path, params, words in cases:
        reply = client.get(path, params=params)
        assert reply.status_code == 422, (path, params, reply.text)
        assert words in reply.json()["error"], (path, reply.json())
    assert client.get("/api/concepts", params={"image": 99, "class": 0}).status_code == 404
    client.headers.pop(security.TOKEN_HEADER)
    for path in ("/api/concepts", "/api/concept-map", "/api/feature", "/api/cluster-concepts"):
        assert client.get(path, params=base | {"channel": 1}).status_code == 401, path


def test_feature_visualisation_is_seeded_cached_and_says_it_was_computed(served) -> None:
    client, explorer = served
    model = explorer.checkpoints["a"].model
    before = model_state(model)
    first = client.get("/api/feature", params={"layer": "stage2", "channel": 3})
    assert first.status_code == 200 and "seed 0" in first.headers["x-camkit-computed"]
    assert "did not move" not in first.headers["x-camkit-computed"]
    pixels = png(first)
    assert pixels.shape == (32, 32, 3) and pixels.std() > 0

    def channel_mean(picture: np.ndarray) -> float:
        with torch.no_grad():
            x = explorer.preprocess(picture)[None]
            return float(model.stage2(model.act1(model.stem(x)))[0, 3].mean())

    grey = np.full_like(pixels, 128)  # about where the optimisation starts
    assert channel_mean(pixels) > channel_mean(grey) + 0.5
    model.calls = 0
    again = client.get("/api/feature", params={"layer": "stage2", "channel": 3})
    assert np.array_equal(png(again), pixels) and model.calls == 0  # cached
    explorer_views = client.app.state.views
    explorer_views.features.clear()
    assert np.array_equal(
        png(client.get("/api/feature", params={"layer": "stage2", "channel": 3})), pixels
    )
    assert_untouched(model, before)


def test_a_closed_channel_says_its_visualisation_did_not_move(tmp_path: Path) -> None:
    closed = loaded()
    with torch.no_grad():
        closed.model.stage2.bias[0] = -100.0  # act2's channel 0 is zero on every image
    explorer = explorer_for(photo_folder(tmp_path), a=closed)
    with TestClient(create_app(explorer, token=None)) as client:
        reply = client.get("/api/feature", params={"layer": "act2", "channel": 0})
        assert reply.status_code == 200
        assert "did not move from its grey start" in reply.headers["x-camkit-computed"]
        assert png(reply).std() < 0.01 * 255


def write_concepts(run: Path, images: list[str]) -> None:
    """A ``camkit concepts --out run`` result for layer act2, channel 5, with one patch."""
    (run / "patches" / "act2").mkdir(parents=True)
    cio.save_png(run / "patches" / "act2" / "c5_relevance_0.png", photo(5, 6, 6))
    row = {"rank": 0, "image": images[0], "score": 0.5, "class": 1, "label": "espresso"}
    row |= {"box": [0, 0, 6, 6], "patch": "patches/act2/c5_relevance_0.png"}
    data = {"model": "small", "layer": "act2", "top": 1, "images": 2, "rules": "gradient"}
    data |= {"channels": {"5": {"activation": [row | {"score": 3.0}], "relevance": [row]}}}
    cio.save_json(run / "concepts.json", data)


def run_app(tmp_path: Path, token: str | None = None):
    """A ``camkit explain`` run with strategies (one gradcam cluster of class 1, both images)
    and ``camkit concepts`` results for act2 -> the explorer and its app."""
    run = write_run(tmp_path)
    photos = tmp_path / "photos"
    extra = [str(photos / "tabby" / "tabby0.png"), str(photos / "loose0.png")]
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["records"].append({"image": extra[0], "top5": manifest["records"][0]["top5"]})
    cio.save_json(run / "manifest.json", manifest)
    (run / "strategies").mkdir()
    cluster = {"id": 0, "size": 2, "members": [0, 1], "typical": [1], "atypical": [0]}
    group = {"method": "gradcam", "class": 1, "label": "espresso", "samples": 2}
    group |= {"clusters": [cluster]}
    cio.save_json(run / "strategies" / "strategies.json", {"images": extra, "groups": [group]})
    write_concepts(run, extra)
    entries, _, predictions = read_run(run)
    explorer = Explorer({"a": loaded()}, entries, predictions=predictions)
    strategies, concepts = read_strategies(run, entries), read_concepts(run)
    app = create_app(
        explorer, token=token, run=RunViews(run, strategies=strategies, concepts=concepts)
    )
    return explorer, app


def test_a_run_with_concepts_and_strategies_names_a_clusters_channels(tmp_path: Path) -> None:
    explorer, app = run_app(tmp_path)
    concepts = read_concepts(tmp_path / "run")
    assert concepts.layer == "act2" and list(concepts.channels) == [5]
    with TestClient(app) as client:
        assert client.get("/api/info").json()["concepts"] == "act2"
        answer = client.get("/api/concepts", params={"image": 0, "class": 1, "k": 8}).json()
        assert answer["references"] is True
        found = {c["channel"]: c["references"] for c in answer["concepts"]}
        assert found[5]["relevance"][0]["patch"] == "patches/act2/c5_relevance_0.png"
        assert all(found[c] is None for c in found if c != 5)
        patch = client.get(f"/api/run/{found[5]['relevance'][0]['patch']}")
        assert np.array_equal(png(patch), photo(5, 6, 6))
        reply = client.get(
            "/api/cluster-concepts", params={"method": "gradcam", "class": 1, "cluster": 0, "k": 3}
        )
        assert reply.status_code == 200, reply.text
        view = reply.json()
        assert view["layer"] == "act2" and view["images"] == 2  # the run's layer for gradcam
        x = torch.stack([model_input(explorer, i) for i in (0, 1)])
        expected = ConceptAttribution(explorer.checkpoints["a"].model, "act2").dominant(x, 3, 1)
        assert [c["channel"] for c in view["concepts"]] == expected.channels.tolist()
        shares = torch.tensor([c["share"] for c in view["concepts"]])
        assert torch.allclose(shares, expected.share, atol=1e-6)
        reasons = {c["channel"]: c["no_references"] for c in answer["concepts"]}
        assert reasons[5] is None and reasons[3] == (
            "channel 3 has no reference patches: camkit concepts wrote them for 1 channel(s) of "
            "act2 only, the most relevant ones over 2 images (5); its --channels option picks "
            "others"
        )
        told = ConceptViews(
            explorer, dataclasses.replace(concepts, run={"arguments": ["--channels", "5"]})
        )
        assert "only, the channels its --channels named (5);" in told.why_no_references("act2", 3)
        assert told.why_no_references("act1", 3) is None  # the page says it once for the layer
        missing = client.get(
            "/api/cluster-concepts", params={"method": "gradcam", "class": 1, "cluster": 4}
        )
        assert missing.status_code == 422 and "its clusters are [0]" in missing.json()["error"]


# ----------------------------------------------------------------------------- the browser

from tests.test_report import Browser, needs_browser  # noqa: E402
from tests.test_serve import settle  # noqa: E402

PRESS = """
(() => {{
  const img = document.querySelector('#maps img.map'); const r = img.getBoundingClientRect();
  const at = (fx, fy) => ({{ clientX: r.left + fx * r.width, clientY: r.top + fy * r.height,
    bubbles: true, button: 0 }});
  img.dispatchEvent(new MouseEvent('mousedown', at({x0}, {y0})));
  window.dispatchEvent(new MouseEvent('mousemove', at({x1}, {y1})));
  window.dispatchEvent(new MouseEvent('mouseup', at({x1}, {y1})));
}})()
"""
WAIT_CARDS = """new Promise((done) => { const t0 = Date.now(); (function poll() {
  const cards = document.querySelectorAll('#concepts .concept');
  const ready = cards.length && [...document.querySelectorAll('#concepts img')].every(
    (i) => i.complete && i.naturalWidth > 0);
  if ((ready && document.body.dataset.busy === '0') || Date.now() - t0 > 20000) done();
  else setTimeout(poll, 20); })(); })"""


def api_json(base: str, path: str, **params: object) -> dict:
    query = urllib.parse.urlencode(params | {"token": TOKEN})
    with urllib.request.urlopen(f"{base}{path}?{query}", timeout=30) as reply:
        return json.loads(reply.read())


def shown_channels(browser: Browser) -> list[int]:
    return browser.js(
        "[...document.querySelectorAll('#concepts .concept')].map((c) => +c.dataset.channel)"
    )


@needs_browser
@pytest.mark.slow
def test_concept_views_in_headless_chromium(tmp_path: Path) -> None:
    explorer, app = run_app(tmp_path, token=TOKEN)
    with running(app) as base:
        browser = Browser(tmp_path / "profile")
        try:
            browser.call("Log.enable", session=True)
            browser.open(f"{base}/?token={TOKEN}#image=0&class=1")
            browser.js(
                """new Promise((done) => { (function poll() {
                if (document.body.dataset.ready === '1') done();
                else setTimeout(poll, 20); })(); })"""
            )
            settle(browser)
            browser.js("document.getElementById('concept-k').value = '8'")
            # a click: the concepts of the layer cell under it, as the API answers them
            browser.js(PRESS.format(x0=0.55, y0=0.2, x1=0.55, y1=0.2))
            browser.js(WAIT_CARDS)
            cell = api_json(base, "/api/concepts", image=0, **{"class": 1}, k=8, x=0.55, y=0.2)
            assert shown_channels(browser) == [c["channel"] for c in cell["concepts"]]
            assert browser.js("document.querySelectorAll('#maps .mark').length") == 1
            assert browser.js("document.querySelectorAll('#concepts img.heat').length") == 8
            # channel 5 has the run's reference patch; the others none
            refs = browser.js(
                "[...document.querySelectorAll('#concepts .concept')].map((c) => "
                "c.querySelectorAll('.refs img').length)"
            )
            assert refs == [2 if c == 5 else 0 for c in shown_channels(browser)]
            # a drag: the concepts in the box
            browser.js(PRESS.format(x0=0.75, y0=0.0, x1=0.25, y1=0.5))
            browser.js("new Promise((done) => setTimeout(done, 50))")
            browser.js(WAIT_CARDS)
            box = api_json(
                base, "/api/concepts", image=0, **{"class": 1}, k=8, box="0.75,0,0.25,0.5"
            )
            assert box["region"]["box"] == [0, 8, 16, 24]
            assert shown_channels(browser) == [c["channel"] for c in box["concepts"]]
            assert "in the box" in browser.js("document.querySelector('#concepts p').textContent")
            # a feature visualisation, computed when asked and said so
            browser.js("document.querySelector('#concepts button.feature').click()")
            browser.js(
                """new Promise((done) => { const t0 = Date.now(); (function poll() {
                const i = document.querySelector('#concepts img.feature');
                if ((i && i.complete && i.naturalWidth) || Date.now() - t0 > 30000) done();
                else setTimeout(poll, 20); })(); })"""
            )
            caption = browser.js(
                "document.querySelector('#concepts img.feature + .caption').textContent"
            )
            assert caption.startswith("computed: feature visualisation") and "seed 0" in caption
            # the strategies view: the cluster names its channels, computed when asked
            browser.js("location.hash = '#strategies'")
            browser.js("new Promise((done) => setTimeout(done, 200))")
            settle(browser)
            browser.js("document.querySelector('.cluster-concepts button').click()")
            browser.js(
                """new Promise((done) => { const t0 = Date.now(); (function poll() {
                const found = document.querySelector('.cluster-concepts .dominant');
                if (found || Date.now() - t0 > 20000) done(); else setTimeout(poll, 20);
                })(); })"""
            )
            dominant = api_json(
                base, "/api/cluster-concepts", method="gradcam", cluster=0, **{"class": 1}
            )
            listed = browser.js(
                "[...document.querySelectorAll('.cluster-concepts .dominant')]"
                ".map((d) => +d.dataset.channel)"
            )
            assert listed == [c["channel"] for c in dominant["concepts"]]
            assert browser.js("document.getElementById('message').hidden") is True
            assert browser.problems() == []
        finally:
            browser.close()


def test_the_concept_view_on_the_packaged_model_is_the_librarys(tmp_path: Path) -> None:
    from skimage import data

    from camkit import models
    from camkit.serve.gallery import Entry

    loaded_model = models.load("efficientnet_lite0")
    explorer = Explorer({"a": loaded_model}, [Entry("chelsea.png", None, None, data.chelsea())])
    with TestClient(create_app(explorer, token=None)) as client:
        reply = client.get(
            "/api/concepts", params={"image": 0, "class": 282, "box": "0.25,0,0.75,0.5"}
        )
        assert reply.status_code == 200, reply.text
        answer = reply.json()
        assert answer["layer"] == loaded_model.default_layer and answer["size"] == [224, 224]
        mask = torch.zeros(224, 224, dtype=torch.bool)
        mask[0:112, 56:168] = True
        x = loaded_model.preprocess(data.chelsea())[None]
        attribution = ConceptAttribution(loaded_model.model, loaded_model.default_layer)
        expected = attribution.top(x, k=5, target=282, region=mask)
        assert [c["channel"] for c in answer["concepts"]] == expected.channels[0].tolist()
        shares = torch.tensor([c["share"] for c in answer["concepts"]])
        assert torch.allclose(shares, expected.share[0], atol=1e-5)
        heat = cached_heat(
            client, ("a", loaded_model.default_layer, 0, 282, answer["concepts"][0]["channel"])
        )
        reference = expected.heatmaps[0, 0].numpy()
        assert np.allclose(heat, reference, atol=1e-5 * float(np.abs(reference).max()))


def test_explain_then_concepts_then_serve_on_the_packaged_model(tmp_path: Path) -> None:
    """The CLI and the explorer together: ``camkit explain`` and ``camkit concepts`` into one
    run folder, then the explorer on it shows each listed channel's reference patches."""
    from skimage import data

    from camkit import models
    from camkit.cli import main
    from camkit.serve.launch import open_gallery

    photos = tmp_path / "photos"
    photos.mkdir()
    for name in ("chelsea", "coffee"):
        cio.save_png(photos / f"{name}.png", getattr(data, name)())
    run = tmp_path / "run"
    assert main(["explain", str(photos), "--out", str(run), "--workers", "0", "--quiet"]) == 0
    loaded_model = models.load("efficientnet_lite0")

    def serve() -> TestClient:
        gallery = open_gallery([run], loaded_model.name, None, loaded_model.preprocess.crop_mode)
        explorer = Explorer({"a": loaded_model}, gallery.entries, predictions=gallery.predictions)
        app = create_app(explorer, token=None, run=RunViews(run, concepts=gallery.run.concepts))
        return TestClient(app)

    where = {"image": 0, "class": 282, "layer": "blocks.5", "k": 2}
    with serve() as client:
        before = client.get("/api/concepts", params=where).json()
        assert before["references"] is False
    channels = [c["channel"] for c in before["concepts"]]
    spec = ",".join(map(str, channels))
    status = main(
        ["concepts", str(photos), "--layer", "blocks.5", "--top", "1", "--channels", spec]
        + ["--out", str(run), "--workers", "0", "--quiet"]
    )
    assert status == 0
    with serve() as client:
        after = client.get("/api/concepts", params=where).json()
        assert after["references"] is True
        assert [c["channel"] for c in after["concepts"]] == channels
        for concept in after["concepts"]:
            (row,) = concept["references"]["relevance"]
            assert Path(row["image"]).name in ("chelsea.png", "coffee.png")
            assert client.get(f"/api/run/{row['patch']}").status_code == 200
        assert client.get("/api/info").json()["concepts"] == "blocks.5"


def test_a_click_on_a_vit_counts_the_token_under_it(tmp_path: Path) -> None:
    timm = pytest.importorskip("timm")
    from camkit import models

    torch.manual_seed(0)
    vit = timm.create_model(
        "vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=2,
        num_classes=4,
    ).eval()  # fmt: skip
    loaded_vit = models.LoadedModel(
        name="vit",
        model=vit,
        preprocess=models.Preprocess(32, crop_mode="squash"),
        labels=list("abcd"),
        default_layer="blocks.1",
        input_size=(32, 32),
    )
    explorer = explorer_for(photo_folder(tmp_path), a=loaded_vit)
    before = model_state(vit)
    # blocks.0: the last block's patch tokens do not reach the class token the head reads
    with TestClient(create_app(explorer, token=None)) as client:
        where = {"image": 2, "class": 1, "k": 4, "x": 0.6, "y": 0.3, "layer": "blocks.0"}
        answer = client.get("/api/concepts", params=where).json()  # the token of cell (1, 2)
        assert answer["region"] == {"kind": "cell", "box": [8, 16, 16, 24]}
    x = model_input(explorer, 2)[None]
    mask = torch.zeros(32, 32, dtype=torch.bool)
    mask[8:16, 16:24] = True
    expected = ConceptAttribution(vit, "blocks.0").top(x, k=4, target=1, region=mask)
    assert [c["channel"] for c in answer["concepts"]] == expected.channels[0].tolist()
    shares = torch.tensor([c["share"] for c in answer["concepts"]])
    assert torch.allclose(shares, expected.share[0], atol=1e-5)
    # the token's own relevance, by hand: sum over that token of A * dS/dA
    tokens = {}
    handle = vit.blocks[0].register_forward_hook(lambda m, i, o: tokens.setdefault("A", o))
    try:
        leaf = x.clone().requires_grad_(True)
        score = vit(leaf)[0, 1]
        (grad,) = torch.autograd.grad(score, tokens["A"], retain_graph=True)
        token = 1 + 1 * 4 + 2  # the class token first, then row-major 4 x 4 patches
        by_hand = (tokens["A"][0, token] * grad[0, token]).detach()
        # the clicked token's heatmap of the top channel: x * d/dx of its A[c] * dS/dA[c] alone
        channel = int(expected.channels[0, 0])
        there = tokens["A"][0, token, channel] * grad[0, token, channel].detach()
        (input_grad,) = torch.autograd.grad(there, leaf)
    finally:
        handle.remove()
    values = torch.tensor([c["relevance"] for c in answer["concepts"]])
    scale = float(by_hand.abs().max())
    assert scale > 0 and torch.allclose(values, by_hand[expected.channels[0]], atol=1e-5 * scale)
    expected_heat = (leaf * input_grad).sum(dim=1)[0].detach().numpy()
    cell = Region("cell", (8, 16, 16, 24))
    heat = client.app.state.views.heatmap("a", "blocks.0", 2, 1, channel, cell)
    heat_scale = float(np.abs(expected_heat).max())
    assert heat_scale > 0 and np.allclose(heat, expected_heat, atol=1e-5 * heat_scale)
    assert_untouched(vit, before)

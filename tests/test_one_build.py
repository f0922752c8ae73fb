"""One way to build a method (:func:`camkit.registry.build` from one
:class:`~camkit.registry.Settings`): each method gets exactly the options it takes, and the
explorer's map equals ``camkit explain``'s for every seeded method and every LRP composite."""

from __future__ import annotations

import io as pyio
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from skimage import data

from camkit import io as cio
from camkit import registry
from camkit.cli import main
from camkit.cli.pipeline import Job
from camkit.relevance.composites import COMPOSITES

pytest.importorskip("starlette", reason="camkit serve's web stack: pip install 'camkit[serve]'")
pytest.importorskip("httpx", reason="the ASGI test client needs httpx (the dev extra)")
from starlette.testclient import TestClient  # noqa: E402

from camkit.serve import security  # noqa: E402
from camkit.serve.app import create_app, running  # noqa: E402
from camkit.serve.explorer import SETTINGS, Explorer  # noqa: E402
from camkit.serve.gallery import scan  # noqa: E402
from tests.test_report import Browser, needs_browser  # noqa: E402
from tests.test_serve import (  # noqa: E402
    MAP_PIXELS,
    TOKEN,
    SmallNet,
    change,
    explorer_for,
    loaded,
    open_explorer,
    photo_folder,
    settle,
)

TARGET = 2  # a class that is not the tiny model's top-1 on the photo, so a target is honoured
LAYER = "act1"  # not the tiny model's default: --layer and the explorer's layer= are honoured
# (Random-CAM's seed-0 weights cut every pixel of the default layer act2: an empty map there)
# the seeded methods, asked of the registry (and IS-CAM, which the issue names: it draws
# nothing, so any two builds agree; it is checked all the same)
SEEDED = [name for name, entry in registry.METHODS.items() if entry.seeded]


def test_the_seeded_methods_are_found() -> None:
    assert {"smoothgrad", "sscam", "smoothgradcam++"} <= set(SEEDED)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """chelsea, the real photo, alone in a folder."""
    root = tmp_path_factory.mktemp("one-photo")
    cio.save_png(root / "chelsea.png", data.chelsea())
    return root


@pytest.fixture(scope="module")
def client(folder: Path) -> Iterator[TestClient]:
    entries, _ = scan([folder])
    explorer = Explorer({"a": loaded()}, entries)
    with TestClient(create_app(explorer, token=TOKEN)) as client:
        client.headers[security.TOKEN_HEADER] = TOKEN
        yield client


def explained(folder: Path, out: Path, monkeypatch, methods: list[str], *options: str) -> dict:
    """``camkit explain chelsea.png --save-raw`` with the tiny model, in this process ->
    ``{method: raw map}``."""
    monkeypatch.setattr("camkit.cli.common.load_model", lambda *args, **kwargs: loaded())
    argv = ["explain", str(folder / "chelsea.png"), "--method", ",".join(methods)]
    argv += ["--layer", LAYER, "--target", str(TARGET), "--device", "cpu", "--save-raw", "--quiet"]
    assert main([*argv, "--out", str(out), *options]) == 0
    records = json.loads((out / "manifest.json").read_text())["records"]
    assert {record["method"] for record in records} == set(methods)
    assert all(record["layer"] in (LAYER, None) for record in records)
    return {record["method"]: np.load(out / record["raw"]) for record in records}


def explorer_map(client: TestClient, method: str, **options: str) -> np.ndarray:
    """The explorer's map (``/api/map?format=npy``) of chelsea for class ``TARGET``."""
    params = {"image": 0, "class": TARGET, "method": method, "layer": LAYER, "format": "npy"}
    response = client.get("/api/map", params=params | options)
    assert response.status_code == 200, response.text
    return np.load(pyio.BytesIO(response.content))


def shown(method: str, raw: np.ndarray, **options: str) -> np.ndarray:
    """The CLI's raw map as every front end shows it (the method's one display policy)."""
    explainer = registry.build(method, SmallNet(), LAYER, registry.Settings(**options))
    return explainer.display_heat(torch.from_numpy(raw)[None, None])[0, 0].numpy()


def test_explorer_equals_the_cli_for_every_seeded_method(client, folder, tmp_path, monkeypatch):
    methods = [*SEEDED, "iscam"]
    raws = explained(folder, tmp_path / "run", monkeypatch, methods)
    for method in methods:
        heat = explorer_map(client, method)
        np.testing.assert_allclose(heat, shown(method, raws[method]), atol=1e-5, err_msg=method)
        assert heat.max() > 0.5, method  # a map, not a flat zero


def test_another_seed_gives_another_map(folder: Path) -> None:
    """What the equality above rules out: built without the CLI's seed, the maps differ."""
    entries, _ = scan([folder])
    maps = {}
    for seed in (0, 1):
        explorer = Explorer({"a": loaded()}, entries, settings=registry.Settings(seed=seed))
        explorer.compute("a", "smoothgrad", (LAYER,), [(0, TARGET)])
        (key,) = explorer.keys("a", "smoothgrad", (LAYER,), 0, TARGET)
        maps[seed] = explorer.maps.get_item(key)
    assert np.abs(maps[0] - maps[1]).max() > 0.05


def test_explorer_equals_the_cli_for_every_composite(client, folder, tmp_path, monkeypatch):
    heats = {}
    for composite in COMPOSITES:
        out = tmp_path / composite
        raw = explained(folder, out, monkeypatch, ["lrp"], "--composite", composite)["lrp"]
        heats[composite] = explorer_map(client, "lrp", composite=composite)
        expected = shown("lrp", raw, composite=composite)
        np.testing.assert_allclose(heats[composite], expected, atol=1e-5, err_msg=composite)
    # the composite reaches the method: the composites with a flat first layer differ from
    # those without, and the default is the CLI's default
    assert np.abs(heats["epsilon-plus"] - heats["epsilon-plus-flat"]).max() > 0.05
    np.testing.assert_array_equal(explorer_map(client, "lrp"), heats[SETTINGS.composite])


def test_an_unknown_composite_is_a_422_that_lists_them(client) -> None:
    params = {"image": 0, "class": TARGET, "method": "lrp", "composite": "epsilon-nonsense"}
    response = client.get("/api/map", params=params)
    assert response.status_code == 422
    message = response.json()["error"]
    assert "epsilon-nonsense" in message and all(name in message for name in COMPOSITES)


def test_the_curves_are_those_of_the_composite_asked_for(client) -> None:
    params = {"image": 0, "class": TARGET, "method": "lrp"}
    curves = {}
    for composite in ("epsilon-plus", "epsilon-plus-flat"):
        response = client.get("/api/curve", params=params | {"composite": composite})
        assert response.status_code == 200, response.text
        curves[composite] = response.json()["deletion"]["curve"]
    assert curves["epsilon-plus"] != curves["epsilon-plus-flat"]


def test_a_composite_is_ignored_by_a_method_that_takes_none(client) -> None:
    plain = explorer_map(client, "gradcam")
    np.testing.assert_array_equal(explorer_map(client, "gradcam", composite="epsilon-plus"), plain)


def test_the_page_learns_which_methods_take_a_composite(client) -> None:
    info = client.get("/api/info").json()
    assert info["composites"] == list(COMPOSITES) and info["composite"] in COMPOSITES
    takes = {method["name"] for method in info["methods"] if method["takes_composite"]}
    assert takes == {"lrp"}


def test_the_cli_and_the_explorer_build_with_the_same_settings() -> None:
    job = Job(methods=("lrp",), layer=LAYER, classes=None, out=Path("."), device="cpu")
    assert job.build_settings == SETTINGS
    assert SETTINGS.seed == 0


def test_each_method_gets_exactly_the_options_it_takes() -> None:
    """Built from one record, every method gets the seed if it draws at random, the batch
    size unless it shares the one plain pass, the composite if it takes one; a method that
    takes none of them would refuse it (a seed) or fail (an unknown keyword)."""
    settings = registry.Settings(seed=7, batch_size=5, composite="epsilon-gamma-box")
    torch.manual_seed(0)
    vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, depth=1)
    checked = set()
    for name, entry in registry.METHODS.items():
        model = SmallNet() if entry.cls.fits(SmallNet()) is None else vit
        layer = (["act1", "act2"] if name == "refinecam" else LAYER) if model is not vit else None
        explainer = registry.build(name, model, layer if entry.needs_layer else None, settings)
        assert explainer.seed == (7 if entry.seeded else None), name
        assert explainer.batch_size == (None if entry.shares_pass else 5), name
        composite = getattr(explainer, "composite", None)
        assert (composite.name if composite else None) == (
            "epsilon-gamma-box" if entry.takes_composite else None
        ), name
        checked.add(name)
    assert checked == set(registry.METHODS)
    assert registry.get("smoothgrad").options(settings) == {"batch_size": 5, "seed": 7}
    assert registry.get("gradcam").options(settings) == {}
    lrp = registry.get("lrp").options(settings)
    assert lrp == {"batch_size": 5, "composite": "epsilon-gamma-box"}
    assert "composite" not in registry.get("lrp").options(registry.Settings())  # its default


@needs_browser
@pytest.mark.slow
def test_the_composite_menu_in_headless_chromium(tmp_path: Path) -> None:
    """The page shows the composite menu for LRP only, and the map it shows is the server's
    map for the composite chosen."""
    explorer = explorer_for(photo_folder(tmp_path))
    with running(create_app(explorer, token=TOKEN)) as base:
        browser = Browser(tmp_path / "profile")
        try:
            open_explorer(browser, f"{base}/?token={TOKEN}")
            browser.js("document.querySelector('.card[data-id=\"4\"]').click()")
            browser.js("new Promise((done) => setTimeout(done, 100))")
            settle(browser)
            hidden = "document.getElementById('composite-box').hidden"
            assert browser.js(hidden) is True  # gradcam takes no composite
            options = "[...document.querySelectorAll('#composite option')].map(o => o.value)"
            assert browser.js(options) == list(COMPOSITES)
            change(browser, "method", "lrp")
            assert browser.js(hidden) is False
            assert browser.js("document.getElementById('composite').value") == SETTINGS.composite
            before = browser.js(MAP_PIXELS)
            change(browser, "composite", "epsilon-plus")
            assert browser.js(MAP_PIXELS) != before
            target = int(browser.js("document.querySelector('#maps figure').dataset.class"))
            (key,) = explorer.keys("a", "lrp", ("act2",), 4, target, "epsilon-plus")
            assert explorer.maps.get_item(key) is not None
            assert browser.js("document.getElementById('message').hidden") is True
            assert browser.problems() == []
        finally:
            browser.close()

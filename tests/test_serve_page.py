"""camkit serve's page shows what its menus say, in headless Chromium: the latest request of a
view wins over a slower earlier one, the downloads of compare mode, and what is offered only
where it applies."""

from __future__ import annotations

import asyncio
import contextlib
import io as pyio
import json
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import camkit

pytest.importorskip("starlette", reason="camkit serve's web stack: pip install 'camkit[serve]'")

from camkit.serve.app import create_app, running  # noqa: E402
from camkit.serve.gallery import RunViews  # noqa: E402
from tests.test_report import Browser, needs_browser  # noqa: E402
from tests.test_serve import (  # noqa: E402
    LABELS,
    MAP_PIXELS,
    TOKEN,
    explorer_for,
    loaded,
    model_input,
    photo_folder,
    settle,
)
from tests.test_serve_concepts import PRESS  # noqa: E402
from tests.test_serve_trust import READY, wait  # noqa: E402

CARDS = "[...document.querySelectorAll('#gallery .card')].map((c) => +c.dataset.id)"


class HeldBack:
    """An ASGI app in front of another that holds the first request whose path is ``path`` and
    whose query holds ``part`` until :meth:`release`: a request made slow on purpose, without
    any timing (``arrived``: it is held; ``done``: the app below answered it)."""

    def __init__(self, app: object, path: str, part: str) -> None:
        self.app, self.path, self.part = app, path, part.encode()
        self.arrived, self.done = threading.Event(), threading.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.gate: asyncio.Event | None = None

    async def __call__(self, scope: dict, receive: object, send: object) -> None:
        held = (
            scope["type"] == "http"
            and scope["path"] == self.path
            and self.part in scope["query_string"]
            and not self.arrived.is_set()
        )
        if not held:
            await self.app(scope, receive, send)
            return
        self.loop, self.gate = asyncio.get_running_loop(), asyncio.Event()
        self.arrived.set()
        await self.gate.wait()
        try:
            await self.app(scope, receive, send)
        finally:
            self.done.set()

    def release(self) -> None:
        if self.loop is not None and self.gate is not None:
            self.loop.call_soon_threadsafe(self.gate.set)

    def __enter__(self) -> HeldBack:
        return self

    def __exit__(self, *failed: object) -> None:
        self.release()  # before the server stops: it waits for the held request


@contextlib.contextmanager
def opened(app: object, tmp_path: Path, where: str = "") -> Iterator[tuple[str, Browser]]:
    """``app`` served on 127.0.0.1 and its page open at ``where`` in headless Chromium, ready
    and settled -> the server's base URL and the browser."""
    with running(app) as base:
        browser = Browser(tmp_path / "profile")
        try:
            browser.open(f"{base}/?token={TOKEN}{where}")
            browser.js(READY)
            settle(browser)
            yield base, browser
        finally:
            browser.close()


def choose(browser: Browser, element: str, value: str) -> None:
    """Set a menu and send its change event, without waiting for the page to settle."""
    browser.js(
        f"""(() => {{ const e = document.getElementById({json.dumps(element)});
        e.value = {json.dumps(value)}; e.dispatchEvent(new Event('change')); }})()"""
    )


def api(base: str, path: str) -> dict:
    with urllib.request.urlopen(f"{base}/api/{path}&token={TOKEN}", timeout=60) as reply:
        return json.loads(reply.read())


@needs_browser
@pytest.mark.slow
def test_the_latest_gallery_order_wins_over_a_slower_earlier_one(tmp_path: Path) -> None:
    explorer = explorer_for(photo_folder(tmp_path))
    app = HeldBack(create_app(explorer, token=TOKEN), "/api/gallery", "order=confidence")
    with opened(app, tmp_path) as (base, browser), app:
        high_first = [item["id"] for item in api(base, "gallery?order=-confidence")["items"]]
        assert len(browser.js(CARDS)) == 8 and browser.js(CARDS) != high_first
        assert browser.js("document.getElementById('f-wrong').disabled") is False  # truths
        choose(browser, "f-order", "confidence")  # held on the server: the slow request
        assert app.arrived.wait(60)
        choose(browser, "f-order", "-confidence")  # the latest, answered at once
        shown = browser.js(  # until the latest answer is shown (bounded, no timing)
            f"""new Promise((done) => {{ const t0 = Date.now(); (function poll() {{
            const cards = {CARDS};
            if (JSON.stringify(cards) === {json.dumps(json.dumps(high_first))}
                || Date.now() - t0 > 15000) done(cards);
            else setTimeout(poll, 20); }})(); }})"""
        )
        assert shown == high_first
        app.release()  # now the slow answer comes, after the latest one
        assert app.done.wait(60)
        wait(browser)
        low_first = [item["id"] for item in api(base, "gallery?order=confidence")["items"]]
        assert low_first != high_first  # the slow answer would show another order
        assert browser.js("document.getElementById('f-order').value") == "-confidence"
        assert browser.js(CARDS) == high_first
        assert browser.js("document.getElementById('count').textContent").startswith("1–8")
        assert browser.js("document.getElementById('message').hidden") is True


def npy_at(url: str) -> np.ndarray:
    with urllib.request.urlopen(url, timeout=60) as reply:
        return np.load(pyio.BytesIO(reply.read()))


@needs_browser
@pytest.mark.slow
def test_compare_mode_downloads_each_checkpoints_map_and_the_difference(tmp_path: Path) -> None:
    explorer = explorer_for(photo_folder(tmp_path), a=loaded(0), b=loaded(1))
    names = {"a": "epoch_10.pt", "b": "epoch_20.pt"}
    app = create_app(explorer, token=TOKEN, names=names)
    with opened(app, tmp_path, "#image=3") as (base, browser):
        single = browser.js(
            "[...document.querySelectorAll('#downloads a')].map((a) => a.dataset.what)"
        )
        assert single == ["a", "a"]  # one map shown: its PNG and .npy
        browser.js("document.getElementById('compare').click()")
        wait(browser, 200)
        links = browser.js(
            """[...document.querySelectorAll('#downloads a')].map((a) =>
            [a.dataset.what, a.href, a.download, a.textContent])"""
        )
        target = browser.js("+document.querySelector('#maps figure').dataset.class")
        assert [what for what, *_ in links] == ["a", "a", "b", "b", "difference", "difference"]
        stem = f"rocket0_gradcam_{target}"
        assert [file for _, _, file, _ in links] == [
            f"{stem}_epoch_10.png",
            f"{stem}_epoch_10.npy",
            f"{stem}_epoch_20.png",
            f"{stem}_epoch_20.npy",
            f"{stem}_epoch_10-minus-epoch_20.png",
            f"{stem}_epoch_10-minus-epoch_20.npy",
        ]
        assert links[2][3] == "epoch_20.pt: overlay (PNG)"
        x = model_input(explorer, 3)
        expected = {
            key: camkit.GradCAM(explorer.checkpoints[key].model, "act2")(x, target=target)
            for key in ("a", "b")
        }
        got = {what: npy_at(url) for what, url, file, _ in links if file.endswith(".npy")}
        for key in ("a", "b"):
            assert np.abs(got[key] - expected[key].numpy()).max() < 1e-5, key
        assert not np.allclose(got["a"], got["b"])
        assert np.abs(got["difference"] - (got["a"] - got["b"])).max() < 1e-5
        for _, url, file, _ in links:
            if file.endswith(".png"):
                with urllib.request.urlopen(url, timeout=60) as reply:
                    assert reply.headers["content-type"] == "image/png"


WAIT_FOR = """new Promise((done) => {{ const t0 = Date.now(); (function poll() {{
  if (({condition}) || Date.now() - t0 > 20000) done(); else setTimeout(poll, 20); }})(); }})"""


def wait_for(browser: Browser, condition: str) -> None:
    """Until the page's ``condition`` (a JavaScript expression) holds, at most 20 s."""
    browser.js(WAIT_FOR.format(condition=condition))
    settle(browser)


@needs_browser
@pytest.mark.slow
def test_concepts_say_why_a_channel_has_no_patches_and_where_patches_are(tmp_path: Path) -> None:
    from camkit.runs.concepts import read_concepts
    from camkit.serve.gallery import read_strategies
    from tests.test_serve_concepts import run_app

    explorer, _ = run_app(tmp_path, token=TOKEN)
    run = tmp_path / "run"  # its concepts results: patches of channel 5 of act1, not act2
    data = json.loads((run / "concepts.json").read_text())
    (run / "concepts.json").write_text(json.dumps(data | {"layer": "act1"}))
    strategies, concepts = read_strategies(run, explorer.entries), read_concepts(run)
    app = create_app(
        explorer, token=TOKEN, run=RunViews(run, strategies=strategies, concepts=concepts)
    )
    cards = "[...document.querySelectorAll('#concepts .concept')]"
    with opened(app, tmp_path, "#image=0&class=1") as (base, browser):
        choose(browser, "layer", "act1")
        settle(browser)
        browser.js("document.getElementById('concept-k').value = '6'")
        browser.js("document.getElementById('concept-image').click()")
        wait_for(browser, f"{cards}.length === 6")
        found = browser.js(
            f"""{cards}.map((c) => [+c.dataset.channel, c.querySelectorAll('.refs img').length,
            (c.querySelector('.no-refs') || {{}}).textContent || null])"""
        )
        assert sorted(channel for channel, _, _ in found) == list(range(6))
        for channel, patches, reason in found:
            if channel == 5:
                assert patches == 2 and reason is None
            else:
                assert patches == 0
                assert reason == (
                    f"channel {channel} has no reference patches: camkit concepts wrote "
                    "them for 1 channel(s) of act1 only, the most relevant ones over 2 "
                    "images (5); its --channels option picks others"
                )
        # a dragged box: the channel list and each channel's heatmap follow it
        browser.js(PRESS.format(x0=0.75, y0=0.0, x1=0.25, y1=0.5))
        wait_for(browser, f"{cards}.every((c) => c.textContent.includes('in the box'))")
        asked = browser.js(
            """performance.getEntriesByType('resource').map((e) => new URL(e.name))
            .filter((u) => u.searchParams.get('box'))
            .map((u) => [u.pathname.split('/').pop(), u.searchParams.get('box'),
              +u.searchParams.get('channel')])"""
        )
        (box,) = {box for route, box, _ in asked if route == "concepts"}
        boxed = [channel for route, where, channel in asked if route == "concept-map"]
        assert {where for route, where, _ in asked} == {box}
        shown = browser.js(f"{cards}.map((c) => +c.dataset.channel)")
        assert sorted(boxed) == sorted(shown) and len(shown) == 6

        # the layer that has patches
        browser.js("location.hash = '#strategies'")
        wait(browser, 200)
        browser.js("document.querySelector('.cluster-concepts button').click()")
        wait_for(browser, "document.querySelector('.cluster-concepts .hint')")
        label = browser.js("document.querySelector('.cluster-concepts .row-label').textContent")
        assert label.startswith("channels of act2 ")
        hint = browser.js("document.querySelector('.cluster-concepts .hint').textContent")
        assert hint == "reference patches exist for layer act1 (camkit concepts), not for act2"
        browser.js("document.querySelector('.cluster-concepts button').click()")
        wait_for(browser, "!document.querySelector('.cluster-concepts .hint')")
        label = browser.js("document.querySelector('.cluster-concepts .row-label').textContent")
        assert label.startswith("channels of act1 ")
        dominant = browser.js(
            """[...document.querySelectorAll('.cluster-concepts .dominant')].map((d) =>
            [+d.dataset.channel, d.querySelectorAll('.refs img').length])"""
        )
        assert dominant and all((n == 2) == (c == 5) for c, n in dominant), dominant
        assert browser.js("document.getElementById('message').hidden") is True


@needs_browser
@pytest.mark.slow
def test_the_latest_class_wins_over_a_slower_earlier_map(tmp_path: Path) -> None:
    explorer = explorer_for(photo_folder(tmp_path))
    top = int(explorer.checkpoints["a"].model(model_input(explorer, 4)[None]).argmax())
    slow, fast = (top + 1) % 4, (top + 2) % 4
    app = HeldBack(create_app(explorer, token=TOKEN), "/api/map", f"class={slow}&")
    figure = "document.querySelector('#maps figure')"
    with opened(app, tmp_path, "#image=4") as (base, browser), app:
        choose(browser, "class", f"{LABELS[slow]} ({slow})")  # held: the slow map
        assert app.arrived.wait(60)
        assert browser.js(f"{figure}.querySelector('.pending').textContent") == "computing..."
        choose(browser, "class", f"{LABELS[fast]} ({fast})")  # the latest
        wait_for(
            browser,
            f"{figure}.dataset.class === '{fast}' && !{figure}.querySelector('.pending')",
        )
        app.release()
        assert app.done.wait(60)
        wait(browser)
        assert browser.js(f"+{figure}.dataset.class") == fast
        assert browser.js(f"{figure}.querySelector('figcaption').textContent").startswith(
            f"{LABELS[fast]} ({fast})"
        )
        shown = browser.js(MAP_PIXELS)  # the picture is the fast class's map
        expected = urllib.request.urlopen(
            f"{base}/api/map?image=4&class={fast}&method=gradcam&layer=act2&alpha=0.5"
            f"&colormap=jet&token={TOKEN}",
            timeout=60,
        ).read()
        pixels = np.asarray(Image.open(pyio.BytesIO(expected)).convert("RGBA")).ravel()
        assert shown == pixels.tolist()
        assert browser.js("document.getElementById('message').hidden") is True

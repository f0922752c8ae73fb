"""camkit serve for a day's work: each checkpoint's own numbers and where two disagree, the
difference view, long maps (progress, cancel that stops the server's work), the request log,
binding before the URL, security headers, unknown parameters; numbers checked by hand."""

from __future__ import annotations

import ast
import io as pyio
import json
import logging
import socket
import threading
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch

import camkit
from camkit import metrics

pytest.importorskip("starlette", reason="camkit serve's web stack: pip install 'camkit[serve]'")
pytest.importorskip("httpx", reason="the ASGI test client needs httpx (the dev extra)")
from starlette.testclient import TestClient  # noqa: E402

from camkit import io as cio  # noqa: E402
from camkit.serve import launch, security  # noqa: E402
from camkit.serve.app import create_app, running  # noqa: E402
from camkit.serve.compare import Comparison  # noqa: E402
from camkit.serve.explorer import Explorer  # noqa: E402
from camkit.serve.gallery import RunViews, scan  # noqa: E402
from camkit.serve.progress import Jobs, copies_per_image  # noqa: E402
from camkit.serve.sockets import BindError  # noqa: E402
from tests.conftest import assert_untouched, model_state  # noqa: E402
from tests.test_serve import (  # noqa: E402
    LABELS,
    SIZE,
    TOKEN,
    SmallNet,
    explorer_for,
    loaded,
    model_input,
    npy,
    photo,
    photo_folder,
)

SRC = Path(__file__).resolve().parents[1] / "src" / "camkit"


def compared(tmp_path: Path) -> tuple[TestClient, object]:
    explorer = explorer_for(photo_folder(tmp_path), a=loaded(0), b=loaded(1))
    names = {"a": "epoch_10.pt", "b": "epoch_20.pt"}
    return TestClient(create_app(explorer, token=None, names=names)), explorer


def softmax(explorer, checkpoint: str, image: int) -> torch.Tensor:
    model = explorer.checkpoints[checkpoint].model
    with torch.no_grad():
        return model(model_input(explorer, image)[None]).softmax(-1)[0]


def test_each_checkpoint_has_its_own_numbers_and_name(tmp_path: Path) -> None:
    client, explorer = compared(tmp_path)
    with client:
        info = client.get("/api/info").json()
        assert info["checkpoints"] == ["a", "b"]
        assert info["names"] == {"a": "epoch_10.pt", "b": "epoch_20.pt"}
        for checkpoint in ("a", "b"):
            reply = client.get("/api/image/3", params={"checkpoint": checkpoint}).json()
            expected = softmax(explorer, checkpoint, 3)
            assert reply["checkpoint"] == checkpoint
            assert reply["probabilities"] == pytest.approx(expected.tolist(), abs=1e-6)
            assert [r["index"] for r in reply["top"]] == expected.topk(4).indices.tolist()
        page = client.get("/api/gallery", params={"checkpoint": "b"}).json()["items"]
        for item in page[1:]:  # item 0 is the unreadable file
            for checkpoint in ("a", "b"):
                expected = softmax(explorer, checkpoint, item["id"])
                (top,) = item["tops"][checkpoint]
                assert top["index"] == int(expected.argmax())
                assert top["probability"] == pytest.approx(float(expected.max()), abs=1e-6)
            assert item["top"][0] == item["tops"]["b"][0]


def test_gallery_filters_and_sorts_by_disagreement_computed_by_hand(tmp_path: Path) -> None:
    client, explorer = compared(tmp_path)
    readable = range(1, 8)
    expected = {}
    for image in readable:
        first, second = softmax(explorer, "a", image), softmax(explorer, "b", image)
        top = int(first.argmax())
        x = model_input(explorer, image)
        maps = [
            camkit.GradCAM(explorer.checkpoints[c].model, "act2")(x, target=top)[None]
            for c in ("a", "b")
        ]
        expected[image] = {
            "changed": int(second.argmax()) != top,
            "confidence_moved": abs(float(first[top] - second[top])),
            "map_moved": 1.0 - float(metrics.spearman(*maps)[0]),
        }
    with client:
        changed = client.get("/api/gallery", params={"changed": 1}).json()["items"]
        assert sorted(i["id"] for i in changed) == sorted(
            i for i in readable if expected[i]["changed"]
        )
        for order, field in (("confidence-moved", "confidence_moved"), ("map-moved", "map_moved")):
            items = client.get("/api/gallery", params={"order": order}).json()["items"]
            ids = [i["id"] for i in items if i["id"] in expected]
            assert ids == sorted(readable, key=lambda i, f=field: -expected[i][f]), order
            assert items[-1]["name"] == "broken.jpg"  # nothing to compare: last
            for item in items[:-1]:
                measured = item["disagreement"][field]
                assert measured == pytest.approx(expected[item["id"]][field], abs=1e-5)


def test_an_unreadable_image_is_read_once_for_the_comparison(tmp_path: Path, monkeypatch) -> None:
    explorer = explorer_for(photo_folder(tmp_path), a=loaded(0), b=loaded(1))
    broken = next(i for i, e in enumerate(explorer.entries) if e.name.endswith("broken.jpg"))
    reads = []
    read_image = cio.read_image
    monkeypatch.setattr(
        cio, "read_image", lambda path, **limits: reads.append(path) or read_image(path, **limits)
    )
    comparison = Comparison(explorer)
    for _ in range(2):  # each gallery page with its disagreements measures again
        assert broken not in comparison.measure(range(len(explorer.entries)))
    assert explorer.entries[broken].error is not None
    assert reads.count(explorer.entries[broken].path) == 1


def test_difference_view_is_the_first_map_minus_the_second(tmp_path: Path) -> None:
    client, explorer = compared(tmp_path)
    x = model_input(explorer, 5)
    heats = [
        camkit.GradCAM(explorer.checkpoints[c].model, "act2")(x, target=2).numpy()
        for c in ("a", "b")
    ]
    with client:
        params = {"image": 5, "class": 2, "format": "npy"}
        diff = npy(client.get("/api/difference", params=params))
        assert np.abs(diff - (heats[0] - heats[1])).max() < 1e-5
        named = client.get("/api/difference", params=params)
        stem = explorer.entries[5].name.split("/")[-1].removesuffix(".png")
        assert f'"{stem}_gradcam_2_difference.npy"' in named.headers["content-disposition"]
        assert client.get("/api/difference", params={"image": 5, "class": 2}).status_code == 200
    single = explorer_for(photo_folder(tmp_path / "one"))
    with TestClient(create_app(single, token=None)) as client:
        reply = client.get("/api/difference", params={"image": 1, "class": 0})
        assert reply.status_code == 422 and "--compare-weights" in reply.json()["error"]
        reply = client.get("/api/gallery", params={"changed": 1})
        assert reply.status_code == 422 and "--compare-weights" in reply.json()["error"]


def test_unknown_parameters_and_values_are_refused_and_headers_are_sent(served_one) -> None:
    client = served_one
    cases = [
        ("/api/map", {"image": 1, "class": 0, "format": "gif"}, "'format' must be one of png"),
        ("/api/map", {"image": 1, "class": 0, "colour": "red"}, "unknown query parameter"),
        ("/api/gallery", {"order": "random"}, "must be one of name"),
        ("/api/gallery", {"sort": "name"}, "'sort'"),
        ("/api/info", {"verbose": 1}, "unknown query parameter"),
        ("/api/thumb/1", {"size": 9}, "unknown query parameter"),
    ]
    for path, params, words in cases:
        reply = client.get(path, params=params)
        assert reply.status_code == 422, (path, params, reply.text)
        assert words in reply.json()["error"], (path, reply.json())
    for path in ("/", "/static/app.js", "/api/info", "/api/nothing"):
        headers = client.get(path).headers
        assert "frame-ancestors 'self'" in headers["content-security-policy"], path
        assert "script-src 'self'" in headers["content-security-policy"]
        assert headers["x-frame-options"] == "SAMEORIGIN" and headers["x-content-type-options"]
    client.headers.pop(security.TOKEN_HEADER)
    refused = client.get("/api/info")
    assert refused.status_code == 401 and "content-security-policy" in refused.headers
    page = client.get("/").text
    assert "onsubmit" not in page and "<script>" not in page  # nothing inline: CSP holds


@pytest.fixture
def served_one(tmp_path: Path):
    explorer = explorer_for(photo_folder(tmp_path))
    with TestClient(create_app(explorer, token=TOKEN)) as client:
        client.headers[security.TOKEN_HEADER] = TOKEN
        yield client


def test_each_request_is_logged_without_the_token_and_errors_with_a_traceback(
    tmp_path: Path, caplog
) -> None:
    explorer = explorer_for(photo_folder(tmp_path))
    with TestClient(create_app(explorer, token=TOKEN)) as client:
        with caplog.at_level(logging.INFO, logger="camkit.serve"):
            assert client.get("/api/info", params={"token": TOKEN}).status_code == 200
            assert client.get("/api/info").status_code == 401

            def broken(*args: object) -> None:
                raise RuntimeError("disk on fire")

            explorer.curves = broken
            params = {"image": 1, "class": 0, "token": TOKEN}
            failed = client.get("/api/curve", params=params)
        assert failed.status_code == 500 and "disk on fire" in failed.json()["error"]
        assert "Traceback" not in failed.text  # the traceback stays on the server
    lines = [r.getMessage() for r in caplog.records]
    assert any(line.startswith("GET /api/info 200 ") and line.endswith(" ms") for line in lines)
    assert any(line.startswith("GET /api/info 401 ") for line in lines)
    assert all(TOKEN not in line for line in lines)
    (error,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert error.exc_info is not None and "disk on fire" in str(error.exc_info[1])
    assert any(
        r.levelno == logging.WARNING and "/api/curve 500" in r.getMessage() for r in caplog.records
    )


def test_the_log_escapes_what_a_terminal_would_run(tmp_path: Path, caplog) -> None:
    from camkit.serve.logs import printable

    assert printable("/static/x\x1b[31mRED\x1b[0m") == "/static/x\\x1b[31mRED\\x1b[0m"
    assert printable("a\0b\nc\\d\u2028 é") == "a\\x00b\\nc\\\\d\\u2028 é"
    explorer = explorer_for(photo_folder(tmp_path))
    app = create_app(explorer, token=TOKEN)
    with TestClient(app) as client, caplog.at_level(logging.INFO, logger="camkit.serve"):
        # the path as a browser sends it, percent-encoded; the server decodes it
        assert client.get("/static/x%1B[31mRED%1B[0m%00").status_code == 404
    (line,) = [r.getMessage() for r in caplog.records if "RED" in r.getMessage()]
    assert line.startswith("GET /static/x\\x1b[31mRED\\x1b[0m\\x00 404 "), line
    assert line.isprintable()


def test_binding_fails_first_with_one_line_and_no_url(tmp_path: Path) -> None:
    explorer = explorer_for(photo_folder(tmp_path))
    prepared = launch.Prepared(create_app(explorer, token=TOKEN), TOKEN, 8)
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    said: list[str] = []
    try:
        port = busy.getsockname()[1]
        with pytest.raises(BindError, match=f"cannot listen on 127.0.0.1:{port}: .*--port"):
            launch.listen(prepared, "127.0.0.1", port, say=said.append)
        with pytest.raises(BindError, match="cannot listen on no.such.host.invalid"):
            launch.listen(prepared, "no.such.host.invalid", 0, say=said.append)
    finally:
        busy.close()
    assert said == []  # the URL (and its token) is printed only once the server listens
    assert launch.url_of("::1", 8000, "t") == "http://[::1]:8000/?token=t"


def test_checkpoint_names_are_their_files() -> None:
    assert launch.checkpoint_names("m", [None]) == {"a": "m (its own weights)"}
    assert launch.checkpoint_names("m", ["/r/e10.pt", "/r/e20.pt"]) == {
        "a": "e10.pt",
        "b": "e20.pt",
    }
    same = launch.checkpoint_names("m", ["/x/best.pt", "/y/best.pt"])
    assert same == {"a": "/x/best.pt", "b": "/y/best.pt"}


class GatedNet(SmallNet):
    """SmallNet whose forward pass, once armed, stops until the test releases it."""

    def __init__(self) -> None:
        super().__init__(0)
        self.armed = False
        self.reached, self.release = threading.Event(), threading.Event()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.armed:
            self.armed = False
            self.reached.set()
            assert self.release.wait(60), "the test never released the forward pass"
        return super().forward(x)


def fetch(url: str, method: str = "GET") -> tuple[int, dict | bytes]:
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            body, status, kind = reply.read(), reply.status, reply.headers["content-type"]
    except urllib.error.HTTPError as refused:
        body, status, kind = refused.read(), refused.code, refused.headers["content-type"]
    return status, json.loads(body) if kind == "application/json" else body


def test_a_long_map_reports_progress_and_cancel_stops_the_servers_work(tmp_path: Path) -> None:
    model = loaded()
    model.model = GatedNet()
    explorer = explorer_for(photo_folder(tmp_path), a=model)
    before = model_state(model.model)
    # Score-CAM at act2 (8 channels): the clean pass and one masked copy per channel
    assert copies_per_image(camkit.ScoreCAM(model.model, "act2"), (1, 8, 8, 8)) == 9
    query = "image=2&class=1&method=scorecam&format=npy"
    with running(create_app(explorer, token=None)) as base:
        status, body = fetch(f"{base}/api/map?{query}&job=first")
        assert status == 200
        status, progress = fetch(f"{base}/api/progress?job=first")
        assert progress["done"] == progress["expected"] == 9 and progress["finished"] is True
        answers: list = []
        model.model.armed = True
        asking = threading.Thread(
            target=lambda: answers.append(fetch(f"{base}/api/map?{query}&class=2&job=second"))
        )
        asking.start()
        assert model.model.reached.wait(60)  # the clean pass is running: one row counted
        status, progress = fetch(f"{base}/api/progress?job=second")
        assert progress["done"] == 1 and progress["expected"] == 9
        assert progress["finished"] is False
        status, cancelled = fetch(f"{base}/api/cancel?job=second", method="POST")
        assert status == 200 and cancelled["cancelled"] is True
        model.model.release.set()
        asking.join(60)
        ((status, body),) = answers
        assert status == 409 and "cancelled" in body["error"]
        status, progress = fetch(f"{base}/api/progress?job=second")
        assert progress["done"] == 1  # no masked copy was scored after the cancel
        assert_untouched(model.model, before)  # the counting hook is gone, no .grad left
        status, body = fetch(f"{base}/api/map?{query}&class=2")  # the same map, not cancelled
        assert status == 200
    expected = camkit.ScoreCAM(model.model, "act2")(model_input(explorer, 2), target=2)
    assert np.abs(np.load(pyio.BytesIO(body)) - expected.numpy()).max() < 1e-5


def test_jobs_forget_old_finished_ones_and_a_cancel_may_come_first() -> None:
    jobs = Jobs()
    early = jobs.cancel("x")
    assert jobs.start("x", 5) is early and early.cancelled  # still cancelled when it starts
    for k in range(300):
        jobs.start(f"j{k}", 1).finished = True
    assert len(jobs.jobs) == 256 and "x" in jobs.jobs  # the unfinished one is kept


def test_methods_say_roughly_how_long_they_take(tmp_path: Path) -> None:
    explorer = explorer_for(photo_folder(tmp_path))
    with TestClient(create_app(explorer, token=None)) as client:
        assert all(m["seconds"] is None for m in client.get("/api/info").json()["methods"])
        client.get("/api/gallery")  # predicting measures the seconds of one forward row
        assert explorer.row_seconds is not None and explorer.row_seconds > 0
        explorer.row_seconds = 0.01  # a known measure: the estimates below follow from it
        methods = {m["name"]: m["seconds"] for m in client.get("/api/info").json()["methods"]}
    # copies x row seconds x 3 for a forward and a backward pass (act2: 8 channels)
    assert methods["gradcam"] == pytest.approx((1 + 1) * 0.01 * 3)
    assert methods["scorecam"] == pytest.approx((8 + 1) * 0.01)
    assert methods["ig"] == pytest.approx((50 + 1 + 1) * 0.01 * 3)  # 51 path points + clean


def test_the_front_ends_do_not_import_each_other() -> None:
    def imported(path: Path, top_level_only: bool) -> set[str]:
        tree = ast.parse(path.read_text("utf-8"))
        nodes = tree.body if top_level_only else list(ast.walk(tree))
        found = set()
        for node in nodes:
            if isinstance(node, ast.ImportFrom) and node.module:
                found |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
            elif isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
        return found

    for path in (SRC / "serve").rglob("*.py"):
        assert not any(m.startswith("camkit.cli") for m in imported(path, False)), path
    for path in (SRC / "runs").rglob("*.py"):
        names = imported(path, False)
        assert not any(m.startswith(("camkit.cli", "camkit.serve")) for m in names), path
    for path in (SRC / "cli").rglob("*.py"):
        serve = {m for m in imported(path, False) if m.startswith("camkit.serve")}
        if path.name == "serve.py":  # the subcommand starts the server, lazily
            assert serve <= {
                "camkit.serve",
                "camkit.serve.web_stack_missing",
                "camkit.serve.launch",
                "camkit.serve.launch.check_start",
                "camkit.serve.launch.run_crop",
                "camkit.serve.launch.checkpoint_names",
                "camkit.serve.launch.prepare",
                "camkit.serve.launch.listen",
            }, serve
            assert not any(m.startswith("camkit.serve") for m in imported(path, True))
        else:
            assert not serve, path


def test_small_clusters_do_not_show_the_same_images_twice() -> None:
    from camkit.runs.strategies import cluster_view

    cluster = {"id": 0, "size": 3, "typical": [2, 0, 1], "atypical": [1, 0, 2], "members": [0]}
    view = cluster_view(cluster, lambda rows: [r + 10 for r in rows], lambda name: name)
    assert view["typical"] == [12, 10, 11] and view["atypical"] == []
    bigger = cluster | {"typical": [0, 1], "atypical": [3, 1]}
    assert cluster_view(bigger, list, lambda name: name)["atypical"] == [3]


# ----------------------------------------------------------------------------- the browser

from tests.test_report import Browser, needs_browser  # noqa: E402
from tests.test_serve import change, settle  # noqa: E402

READY = """new Promise((done) => { (function poll() {
  if (document.body.dataset.ready === '1') done(); else setTimeout(poll, 20); })(); })"""


BROKEN = """[...document.querySelectorAll('img')].filter((i) =>
  i.getClientRects().length && !(i.complete && i.naturalWidth)).length"""
"""How many images the page shows without a picture (a broken-image icon with its alt text)."""


def shown(browser: Browser, selector: str) -> bool:
    return browser.js(
        f"getComputedStyle(document.querySelector({json.dumps(selector)})).display !== 'none'"
    )


def texts(browser: Browser, selector: str) -> list[str]:
    return browser.js(
        f"[...document.querySelectorAll({json.dumps(selector)})].map((e) => e.textContent)"
    )


def wait(browser: Browser, milliseconds: int = 100) -> None:
    browser.js(f"new Promise((done) => setTimeout(done, {milliseconds}))")
    settle(browser)


@needs_browser
@pytest.mark.slow
def test_the_page_shows_each_checkpoint_its_own_way(tmp_path: Path) -> None:
    explorer = explorer_for(photo_folder(tmp_path), a=loaded(0), b=loaded(1))
    names = {"a": "epoch_10.pt", "b": "epoch_20.pt"}
    image = next(  # an image whose top-1 differs between the checkpoints, if there is one
        (
            i
            for i in range(1, 8)
            if softmax(explorer, "a", i).argmax() != softmax(explorer, "b", i).argmax()
        ),
        4,
    )
    with running(create_app(explorer, token=TOKEN, names=names)) as base:
        browser = Browser(tmp_path / "profile")
        try:
            browser.open(f"{base}/?token={TOKEN}")
            browser.js(READY)
            settle(browser)
            assert "epoch_10.pt and epoch_20.pt" in browser.js(
                "document.getElementById('model').textContent"
            )
            assert shown(browser, "#f-checkpoint-box") and shown(browser, "#f-changed-box")
            assert shown(browser, "#f-truth-box")  # the folder has class subfolders
            browser.js(f"document.querySelector('.card[data-id=\"{image}\"]').click()")
            wait(browser)
            assert shown(browser, "#compare-box")
            assert texts(browser, "#tops h4") == ["top-5 of epoch_10.pt", "top-5 of epoch_20.pt"]
            first, second = softmax(explorer, "a", image), softmax(explorer, "b", image)
            b_top = [f"{LABELS[i]} ({i})" for i in second.topk(4).indices.tolist()]
            assert texts(browser, "table[data-checkpoint='b'] td:first-child") == b_top
            top = int(first.argmax())
            browser.js("document.getElementById('compare').click()")
            wait(browser, 200)
            captions = texts(browser, "#maps figcaption")
            assert len(captions) == 3  # a, b and their difference
            a_caption, b_caption, difference = captions
            assert f"{100 * float(first[top]):.1f}%" in a_caption and "epoch_10.pt" in a_caption
            assert f"{100 * float(second[top]):.1f}%" in b_caption and "epoch_20.pt" in b_caption
            b_best = int(second.argmax())
            assert f"top-1 {LABELS[b_best]} {100 * float(second[b_best]):.1f}%" in b_caption
            assert "epoch_10.pt − epoch_20.pt" in difference
            loaded_images = browser.js(
                "[...document.querySelectorAll('#maps img')].map((i) => i.naturalWidth)"
            )
            assert loaded_images == [SIZE, SIZE, SIZE]
            assert browser.js("document.getElementById('message').hidden") is True
            # the gallery: filtered by where the checkpoints disagree
            browser.js("location.hash = ''")
            wait(browser)
            browser.js("document.getElementById('f-changed').click()")
            wait(browser, 200)
            cards = browser.js(
                "[...document.querySelectorAll('#gallery .card')].map((c) => +c.dataset.id)"
            )
            changed = [
                i
                for i in range(1, 8)
                if softmax(explorer, "a", i).argmax() != softmax(explorer, "b", i).argmax()
            ]
            assert cards == changed
        finally:
            browser.close()


@needs_browser
@pytest.mark.slow
def test_the_page_hides_what_does_not_apply_and_labels_what_it_shows(tmp_path: Path) -> None:
    folder = tmp_path / "flat"
    folder.mkdir()
    for k in range(3):
        cio.save_png(folder / f"shot{k}.png", photo(200 + k))
    explorer = Explorer({"a": loaded()}, scan([folder])[0])
    with running(create_app(explorer, token=TOKEN)) as base:
        browser = Browser(tmp_path / "profile")
        try:
            browser.open(f"{base}/?token={TOKEN}#image=1")
            browser.js(READY)
            settle(browser)
            for hidden in ("#f-truth-box", "#compare-box", "#f-checkpoint-box", "#f-changed-box"):
                assert not shown(browser, hidden), hidden
            # no true classes: "misclassified only" is off, and says why
            assert browser.js("document.getElementById('f-wrong').disabled") is True
            reason = browser.js("document.getElementById('f-wrong-box').title")
            assert reason.startswith("no true classes in this gallery"), reason
            top = int(softmax(explorer, "a", 1).argmax())
            download = browser.js("document.getElementById('download-png').download")
            assert download == f"shot1_gradcam_{top}.png"
            browser.js("document.getElementById('depth-button').click()")
            wait(browser)
            captions = texts(browser, "#depth figcaption")
            assert captions == [
                f"act1 · {LABELS[top]} ({top}) · gradcam",
                f"act2 (default) · {LABELS[top]} ({top}) · gradcam",
            ]
            browser.js("document.getElementById('curve-button').click()")
            wait(browser)
            assert texts(browser, "#curves .xtick") == ["0", "0.25", "0.5", "0.75", "1"]
            assert texts(browser, "#curves .ytick") == ["0", "0.25", "0.5", "0.75", "1"]
            assert "probability of the class" in texts(browser, "#curves .ylabel")[0]
            assert "deleted / inserted" in texts(browser, "#curves .xlabel")[0]
            assert texts(browser, "#curves .title")[0].startswith(f"{LABELS[top]} ({top})")
            other = (top + 1) % 4
            change(browser, "class", f"{LABELS[other]} ({other})")
            assert browser.js("document.querySelectorAll('#depth figure, #curves svg').length") == 0
            change(browser, "alpha", "0.8")  # the display alone: the strip would stay
            assert browser.js("document.getElementById('message').hidden") is True
        finally:
            browser.close()


@needs_browser
@pytest.mark.slow
def test_the_page_shows_progress_of_a_long_map_and_cancels_it(tmp_path: Path) -> None:
    model = loaded()
    model.model = GatedNet()
    explorer = explorer_for(photo_folder(tmp_path), a=model)
    with running(create_app(explorer, token=TOKEN)) as base:
        browser = Browser(tmp_path / "profile")
        try:
            browser.open(f"{base}/?token={TOKEN}#image=2")
            browser.js(READY)
            settle(browser)
            assert not shown(browser, "#progress")
            menu = texts(browser, "#method option")
            assert any(text.startswith("scorecam (") for text in menu), menu  # with its time
            model.model.armed = True
            browser.js(
                """(() => { const e = document.getElementById('method');
                e.value = 'scorecam'; e.dispatchEvent(new Event('change')); })()"""
            )
            assert model.model.reached.wait(60)
            browser.js(
                """new Promise((done) => { (function poll() {
                if (!document.getElementById('progress').hidden) done();
                else setTimeout(poll, 20); })(); })"""
            )
            text = browser.js("document.getElementById('progress-text').textContent")
            assert text.startswith("scorecam: 1 of ~9 copies scored"), text
            # while it computes: a placeholder with a spinner, no image without a picture
            assert browser.js(BROKEN) == 0
            assert texts(browser, "#maps .pending") == ["computing..."]
            (job,) = browser.js("[...window.camkitState.jobs]")
            browser.js("document.getElementById('cancel').click()")
            for _ in range(600):  # until the server has the cancel (not a timing: a condition)
                if fetch(f"{base}/api/progress?job={job}&token={TOKEN}")[1]["cancelled"]:
                    break
                threading.Event().wait(0.05)
            model.model.release.set()
            settle(browser)
            message = browser.js("document.getElementById('message').textContent")
            assert "cancelled" in message
            assert not shown(browser, "#progress")
            assert browser.js(BROKEN) == 0  # the placeholder says why, no broken-image icon
            (reason,) = texts(browser, "#maps .pending.failed")
            assert reason.startswith("no image:") and "cancelled" in reason
        finally:
            model.model.release.set()
            browser.close()


@needs_browser
@pytest.mark.slow
def test_the_strategies_rows_are_labelled_and_not_repeated(tmp_path: Path) -> None:
    from camkit.serve.gallery import read_run, read_strategies
    from tests.test_serve import write_run

    run = write_run(tmp_path)
    photos = tmp_path / "photos"
    images = [str(photos / "tabby" / f"tabby{k}.png") for k in range(3)]
    manifest = json.loads((run / "manifest.json").read_text())
    top5 = manifest["records"][0]["top5"]
    manifest["records"] += [{"image": image, "top5": top5} for image in images]
    cio.save_json(run / "manifest.json", manifest)
    (run / "strategies").mkdir()
    big = {"id": 0, "size": 3, "typical": [0, 1], "atypical": [2, 1], "suspiciousness": 0.5}
    small = {"id": 1, "size": 1, "typical": [1], "atypical": [1], "suspiciousness": 0.1}
    group = {"method": "gradcam", "class": 1, "label": "espresso", "samples": 4}
    group |= {"suggested_k": 2, "clusters": [big, small]}
    data = {"images": images, "groups": [group], "skipped": []}
    cio.save_json(run / "strategies" / "strategies.json", data)
    entries, header, predictions = read_run(run)
    explorer = Explorer({"a": loaded()}, entries, predictions=predictions)
    app = create_app(
        explorer, token=TOKEN, run=RunViews(run, strategies=read_strategies(run, entries))
    )
    with running(app) as base:
        browser = Browser(tmp_path / "profile")
        try:
            browser.open(f"{base}/?token={TOKEN}#strategies")
            browser.js(READY)
            settle(browser)
            rows = browser.js(
                """[...document.querySelectorAll('.cluster')].map((c) =>
                [...c.querySelectorAll('.members')].map((m) => [
                  m.querySelector('.row-label').textContent, m.querySelectorAll('a').length]))"""
            )
            typical = "typical (closest to the cluster's centre)"
            atypical = "atypical (farthest from it)"
            # the big cluster: 2 typical, and of its atypical only the one not already shown
            assert rows == [[[typical, 2], [atypical, 1]], [[typical, 1]]]
        finally:
            browser.close()

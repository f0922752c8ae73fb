"""The report of a video run (``camkit explain clip.mp4 --report``): each video's card shows its
animated overlay, the detail view the animation, a link to the MP4 and the per-frame importance
curve (an inline SVG drawn from the manifest's ``frame_importance``). A tiny 3-D CNN on a
16-frame MP4 written with cv2.VideoWriter."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from test_report import Browser, needs_browser, page_data
from test_video_cli import _tiny_loaded
from test_video_io import frames, write_cv2

from camkit.cli.commands.explain import explain
from camkit.cli.pipeline import Job


@pytest.fixture(scope="module")
def video_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    folder = tmp_path_factory.mktemp("videorun")
    clip = folder / "clip.mp4"
    assert write_cv2(clip, "mp4v", frames())
    job = Job(methods=("gradcam", "layercam"), layer="0", classes=None, out=folder / "out",
              device=torch.device("cpu"), quiet=True, report=True)  # fmt: skip
    manifest = explain(_tiny_loaded(), [clip], job)
    return folder / "out", manifest


def test_the_report_of_a_video_run_carries_its_animation_and_curve(video_run) -> None:
    out, manifest = video_run
    records = {r["method"]: r for r in manifest["records"]}
    (image,) = page_data(out / "index.html")["images"]
    assert image["thumb"] and (out / image["thumb"]).read_bytes().startswith(b"\xff\xd8")
    assert [o["method"] for o in image["overlays"]] == ["gradcam", "layercam"]
    for overlay in image["overlays"]:
        record, clip = records[overlay["method"]], overlay["video"]
        assert clip["gif"] == overlay["thumb"] == record["animation"]
        assert clip["mp4"] == record["output"] and clip["plot"] == record["frame_plot"]
        assert clip["importance"] == record["frame_importance"] and len(clip["importance"]) == 16
        assert clip["fps"] == pytest.approx(8.0)


@needs_browser
@pytest.mark.slow
def test_the_video_report_in_headless_chromium(video_run, tmp_path: Path) -> None:
    out, manifest = video_run
    browser = Browser(tmp_path / "profile")
    try:
        browser.open((out / "index.html").as_uri())
        assert browser.js("document.body.dataset.ready") == "1"
        # the card: the first frame and both animations, decoded
        loaded = browser.js(
            """(async () => { const images = [...document.querySelectorAll('#gallery img')];
            images.forEach((img) => { img.loading = 'eager'; });
            await Promise.all(images.map((img) => img.complete ? null
              : new Promise((done) => { img.onload = img.onerror = done; })));
            return images.map((img) => [img.getAttribute('src'), img.naturalWidth]); })()"""
        )
        assert [src.endswith(".gif") for src, _ in loaded] == [False, True, True], loaded
        assert all(width == 32 for _, width in loaded), loaded
        browser.js("document.querySelector('.card').click()")
        assert browser.js("document.getElementById('detail').hidden") is False
        animations = browser.js(
            "[...document.querySelectorAll('#detail img.clip')].map((i) => i.getAttribute('src'))"
        )
        assert animations == [r["animation"] for r in manifest["records"]]
        links = browser.js(
            "[...document.querySelectorAll('#detail a')].map((a) => a.getAttribute('href'))"
        )
        assert {r["output"] for r in manifest["records"]} <= set(links)
        curves = browser.js(
            """[...document.querySelectorAll('#detail svg.curve')].map((s) =>
            [s.dataset.frames, s.querySelector('.peak').textContent,
             s.querySelector('path').getBBox().width])"""
        )
        assert len(curves) == 2
        for (count, peak, width), record in zip(curves, manifest["records"], strict=True):
            top = int(np.argmax(record["frame_importance"]))
            assert count == "16" and peak.startswith(f"peak: frame {top} ") and width > 300
    finally:
        browser.close()

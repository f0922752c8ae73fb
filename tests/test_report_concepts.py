"""The report's concept atlas (``camkit concepts`` results in the run folder) and the dominant
concepts of a strategies cluster, in the page's data and in headless Chromium."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from camkit import io as cio
from camkit.cli import report
from camkit.errors import RunFileError
from camkit.runs.concepts import atlas_data, read_concepts
from tests.test_report import Browser, make_run, needs_browser, page_data


def write_concepts(out: Path, images: list[str], channels: tuple[int, ...] = (7, 2)) -> None:
    """``camkit concepts --out OUT`` results: per channel two references of each ranking."""
    folder = out / "patches" / "blocks.5"
    folder.mkdir(parents=True)
    found = {}
    for channel in channels:
        found[str(channel)] = {}
        for mode in ("activation", "relevance"):
            rows = []
            for rank in range(2):
                name = f"c{channel}_{mode}_{rank}.png"
                cio.save_png(folder / name, np.full((5, 5, 3), 40 * rank + channel, np.uint8))
                rows.append(
                    {"rank": rank, "image": images[rank + channel % 3], "score": 0.5 - rank / 10}
                    | {"class": 1, "label": "dog", "box": [0, 0, 5, 5]}
                    | {"patch": f"patches/blocks.5/{name}"}
                )
            found[str(channel)][mode] = rows
    summary = {"model": "m", "layer": "blocks.5", "top": 2, "images": 12, "rules": "gradient"}
    cio.save_json(out / "concepts.json", summary | {"channels": found})


def test_the_report_has_a_concept_atlas_only_when_the_run_has_concepts(tmp_path: Path) -> None:
    out, records = make_run(tmp_path, count=4)
    plain = page_data(report.write_report(out, records))
    assert plain["concepts"] is None
    write_concepts(out, [r["image"] for r in records[::2]])
    atlas = page_data(report.write_report(out, records))["concepts"]
    assert atlas["layer"] == "blocks.5" and atlas["images"] == 12
    assert [c["channel"] for c in atlas["channels"]] == [7, 2]  # the file's order
    first = atlas["channels"][0]["relevance"][0]
    assert first["src"] == "patches/blocks.5/c7_relevance_0.png" and first["score"] == 0.5
    assert first["image"] == Path(records[2 * (7 % 3)]["image"]).name
    assert (out / first["src"]).is_file()
    # a concepts folder elsewhere: URLs relative to the page
    moved = atlas_data(out / "page", read_concepts(out), out)
    assert moved["channels"][0]["activation"][1]["src"] == "../patches/blocks.5/c7_activation_1.png"
    (out / "concepts.json").write_text("{not json")  # broken: said, never a page without it
    with pytest.raises(RunFileError, match=r"concepts\.json.*not complete JSON.*camkit concepts"):
        report.write_report(out, records)


@needs_browser
def test_the_concept_atlas_in_headless_chromium(tmp_path: Path) -> None:
    out, records = make_run(tmp_path, count=4)
    write_concepts(out, [r["image"] for r in records[::2]])
    index = report.write_report(out, records)
    browser = Browser(tmp_path / "profile")
    try:
        browser.open(index.as_uri())
        assert browser.js("document.body.dataset.ready") == "1"
        assert browser.js("document.getElementById('view-strategies').hidden") is True
        browser.js("document.getElementById('view-concepts').click()")
        assert browser.js("document.getElementById('concepts').hidden") is False
        assert browser.js("document.getElementById('gallery').hidden") is True
        channels = browser.js(
            "[...document.querySelectorAll('.atlas-channel')].map((c) => +c.dataset.channel)"
        )
        assert channels == [7, 2]
        browser.js(
            """new Promise((done) => { const t0 = Date.now(); (function poll() {
            const all = [...document.querySelectorAll('.atlas img')];
            if (all.every((i) => i.complete) || Date.now() - t0 > 10000) done();
            else setTimeout(poll, 20); })(); })"""
        )
        sizes = browser.js(
            "[...document.querySelectorAll('.atlas img')].map((i) => i.naturalWidth)"
        )
        assert sizes == [5] * 8  # every patch found on disk
        heading = browser.js("document.querySelector('.atlas-channel h4').textContent")
        assert heading == "most relevant · scores 0.5, 0.4"
    finally:
        browser.close()

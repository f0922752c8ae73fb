"""The files of a run folder (:mod:`camkit.runs`): each record's writer and reader round trip,
the files camkit 0.2 wrote (``tests/data/run-v0``, written by main at a78c8bc: ``camkit explain``,
the planted run's ``maps.npz`` and ``camkit strategies``, ``camkit concepts`` with its part,
``camkit evaluate``) still open as version 0, and every kind of broken file (truncated, a key
missing, a wrong type, a newer version) is a RunFileError naming the file, its version and the
command to run again; the explorer shows such an error instead of the view."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from camkit import cli
from camkit import io as cio
from camkit.errors import InputError, RunFileError
from camkit.runs import concept_parts, concepts, manifest, maps, metrics, strategies
from camkit.runs.concept_parts import ConceptsPart
from camkit.runs.concepts import ConceptReference, ConceptsRecord
from camkit.runs.metrics import MetricsRecord
from camkit.runs.strategies import StrategiesRecord
from tests.test_report import Browser, needs_browser

OLD_RUN = Path(__file__).parent / "data" / "run-v0"


def old_run(tmp_path: Path) -> Path:
    """A copy of the camkit 0.2 run folder (tests may break its files)."""
    return Path(shutil.copytree(OLD_RUN, tmp_path / "run"))


def a_metrics_record() -> MetricsRecord:
    interval = {"mean": 0.25, "ci95": [0.125, 0.5], "n": 3}
    return MetricsRecord(
        model="m",
        layer="bn2",
        images=3,
        unreadable=["broken.png"],
        settings={"steps": 4, "baseline": "blur", "tolerance": 15},
        higher_is_better={"deletion": False},
        methods={"gradcam": {"deletion": interval}},
        sanity={"gradcam": [{"layer": "fc", "spearman": 0.5}]},
        sanity_images=2,
    )


def a_concepts_record() -> ConceptsRecord:
    def refs(mode: str) -> list[ConceptReference]:
        return [
            ConceptReference(k, f"im{k}.png", 1.0 - k / 4, 3, "cat", [0, 1, 5, 6], f"p/{mode}{k}")
            for k in range(2)
        ]

    channels = {7: {m: refs(m) for m in concepts.RANKINGS}, 2: {m: [] for m in concepts.RANKINGS}}
    return ConceptsRecord(
        layer="blocks.2",
        channels=channels,
        model="m",
        top=2,
        images=4,
        unreadable=[],
        rules="gradient",
        score="sum",
        run={"camkit": "0.3", "channels": [7, 2]},
    )


def a_strategies_record() -> StrategiesRecord:
    cluster = {"id": 0, "size": 2, "members": [0, 1], "typical": [1], "atypical": [0]}
    group = {"method": "gradcam", "class": 4, "label": "dog", "clusters": [cluster]}
    return StrategiesRecord(
        images=["a.png", "b.png"],
        groups=[group],
        skipped=[{"method": "gradcam", "class": 2, "reason": "1 map"}],
        run="run",
        parameters={"grid": 32},
    )


def a_manifest() -> dict:
    record = {"image": "a.png", "output": "a_gradcam_1.png", "method": "gradcam", "target": 1}
    return {"settings": {"crop": "center"}, "model": "m", "records": [record]}


def test_each_json_record_round_trips_with_its_version(tmp_path: Path) -> None:
    unchecked = MetricsRecord(**vars(a_metrics_record()) | {"sanity": None, "sanity_images": None})
    for record in (a_metrics_record(), unchecked):
        metrics.write_metrics(tmp_path, record)
        assert metrics.read_metrics(tmp_path) == record
    assert json.loads((tmp_path / metrics.METRICS_FILE).read_text())["version"] == 1
    concepts.write_concepts(tmp_path, a_concepts_record())
    assert concepts.read_concepts(tmp_path) == a_concepts_record()
    strategies.write_strategies(tmp_path, a_strategies_record())
    assert strategies.read_strategies(tmp_path) == a_strategies_record()
    manifest.write_manifest(tmp_path, a_manifest() | {"version": 0})  # the writer's version wins
    found = manifest.read_manifest(tmp_path)
    assert found.version == 1 and found.as_dict() == a_manifest() and found.crop == "center"
    for read in (metrics.read_metrics, concepts.read_concepts, strategies.read_strategies):
        assert read(tmp_path / "elsewhere") is None  # absent is None, never an error
    assert manifest.read_manifest(tmp_path / "elsewhere") is None


def test_the_maps_file_and_the_concepts_parts_round_trip(tmp_path: Path) -> None:
    rows = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    index = {name: [0, 1] for name in maps.INDEX_FIELDS} | {"image": ["a", "b"]}
    index |= {"method": ["gradcam"] * 2}
    maps.write_maps(tmp_path / maps.MAPS_FILE, [rows], 2, (3, 4), index, {"labels": ["x"]})
    loaded = maps.load_maps(tmp_path)
    assert loaded.version == 1 and loaded.labels() == ["x"]
    np.testing.assert_array_equal(loaded.maps, rows.astype(np.float16))
    state = {"layer": "blocks.2", "values": torch.arange(6.0).reshape(2, 3)}
    part = ConceptsPart({"layer": "blocks.2", "top": 2}, [0, 3], ["bad.png"], state)
    path = concept_parts.write_part(concept_parts.new_part_path(tmp_path, 1), part)
    assert path.name.startswith("concepts.part-1-")
    (back,) = concept_parts.read_parts(tmp_path)
    assert (back.run, back.done, back.unreadable, back.version) == (
        part.run,
        [0, 3],
        ["bad.png"],
        1,
    )
    assert torch.equal(back.state["values"], state["values"]) and back.path == path


def test_a_camkit_0_2_run_opens_as_version_0(tmp_path: Path) -> None:
    run = old_run(tmp_path)
    found = manifest.read_manifest(run)
    assert found.version == 0 and found.crop == "center"
    assert [r["method"] for r in found.records] == ["gradcam"]
    saved = maps.load_maps(run)
    assert saved.version == 0 and len(saved) == 24 and saved.metadata["classes"]["0"] == "horse"
    clusters = strategies.read_strategies(run / strategies.STRATEGIES_DIR)
    assert clusters.version == 0 and len(clusters.images) == 24
    assert [c["size"] for c in clusters.groups[0]["clusters"]] == [16, 8]
    references = concepts.read_concepts(run)
    assert references.version == 0 and references.layer == "blocks.2"
    assert list(references.channels) == [0, 3]
    first = references.channels[0]["relevance"][0]
    assert (first.class_index, first.label, first.box) == (925, "consomme", [35, 36, 46, 46])
    (part,) = concept_parts.read_parts(run)
    assert part.version == 0 and part.done == [0, 1] and part.run["layer"] == "blocks.2"
    scores = metrics.read_metrics(run)
    assert scores.version == 0 and scores.sanity is None
    assert scores.methods["gradcam"]["deletion"]["mean"] == pytest.approx(0.12663623690605164)
    # a camkit 0.1 manifest: a bare list of records
    cio.save_json(run / manifest.MANIFEST, [{"image": "a.png", "method": "gradcam"}])
    oldest = manifest.read_manifest(run)
    assert oldest.version == 0 and oldest.settings is None and oldest.crop == "squash"


def test_the_front_ends_open_a_camkit_0_2_run(tmp_path: Path) -> None:
    from camkit.cli import report
    from camkit.serve.gallery import Entry, read_strategies
    from tests.test_report import page_data

    run = old_run(tmp_path)
    images = strategies.read_strategies(run / "strategies").images
    entries = [Entry(Path(image).name, Path(image)) for image in images]
    view = read_strategies(run, entries)  # the explorer's clusters
    assert sorted(len(c["members"]) for c in view["groups"][0]["clusters"]) == [8, 16]
    records = [{"image": image} for image in images[:2]]
    data = page_data(report.write_report(run, records))  # the report's concept atlas
    assert data["concepts"]["layer"] == "blocks.2"
    assert [c["channel"] for c in data["concepts"]["channels"]] == [0, 3]


# ------------------------------------------------------------------------- broken files

JSON_FILES: dict[str, tuple[Callable[[Path], Path], Callable[[Path], object], str, str]] = {
    # kind: (write a good file in a folder -> its path, read the folder, a required key,
    # the command the error names)
    "manifest": (
        lambda out: manifest.write_manifest(out, a_manifest()),
        manifest.read_manifest,
        "records",
        "camkit explain",
    ),
    "strategies": (
        lambda out: strategies.write_strategies(out, a_strategies_record()),
        strategies.read_strategies,
        "groups",
        "camkit strategies",
    ),
    "concepts": (
        lambda out: concepts.write_concepts(out, a_concepts_record()),
        concepts.read_concepts,
        "channels",
        "camkit concepts",
    ),
    "metrics": (
        lambda out: metrics.write_metrics(out, a_metrics_record()),
        metrics.read_metrics,
        "methods",
        "camkit evaluate",
    ),
}


@pytest.mark.parametrize("kind", sorted(JSON_FILES))
def test_a_broken_json_file_says_which_file_its_version_and_what_to_do(
    kind: str, tmp_path: Path
) -> None:
    write, read, key, command = JSON_FILES[kind]
    path = write(tmp_path)
    good = json.loads(path.read_text())
    name = path.name.replace(".", r"\.")

    def broken(text: str, problem: str, version: str) -> None:
        path.write_text(text)
        pattern = rf"{name} \({name}, {version}\): {problem}.*run '{command}"
        with pytest.raises(RunFileError, match=pattern):
            read(tmp_path)

    full = json.dumps(good)
    broken(full[: len(full) // 2], "not complete JSON", "version unknown")
    broken(
        json.dumps({k: v for k, v in good.items() if k != key}),
        f"the key {key} is missing",
        "version 1",
    )
    broken(json.dumps(good | {key: 3}), f"{key} is int, expected", "version 1")
    without = {k: v for k, v in good.items() if k not in ("version", key)}
    broken(
        json.dumps(without),
        f"the key {key} is missing",
        "version 0: no version field, written by camkit 0.2 or earlier",
    )
    path.write_text(json.dumps(good | {"version": 2}))
    with pytest.raises(
        RunFileError,
        match=rf"{name} \({name}, version 2\): written by a newer camkit .*up to version 1",
    ):
        read(tmp_path)
    path.write_text(json.dumps(good | {"version": "1"}))
    with pytest.raises(RunFileError, match=r"version '1' is not a whole number"):
        read(tmp_path)


def test_nested_values_of_a_wrong_type_are_named_by_their_place(tmp_path: Path) -> None:
    path = concepts.write_concepts(tmp_path, a_concepts_record())
    data = json.loads(path.read_text())
    data["channels"]["7"]["relevance"][1]["box"] = [0, 1, 2]
    path.write_text(json.dumps(data))
    with pytest.raises(RunFileError, match=r"channels\.7\.relevance\[1\]\.box has 3 numbers"):
        concepts.read_concepts(tmp_path)
    data["channels"]["7"]["relevance"][1] |= {"box": [0, 1, 2, 3], "score": "high"}
    path.write_text(json.dumps(data))
    with pytest.raises(
        RunFileError, match=r"channels\.7\.relevance\[1\]\.score is str, expected float"
    ):
        concepts.read_concepts(tmp_path)
    path = strategies.write_strategies(tmp_path, a_strategies_record())
    data = json.loads(path.read_text())
    data["groups"][0]["clusters"][0]["members"] = [0, True]
    path.write_text(json.dumps(data))
    with pytest.raises(
        RunFileError, match=r"groups\[0\]\.clusters\[0\]\.members\[1\] is bool, expected int"
    ):
        strategies.read_strategies(tmp_path)


def test_a_broken_maps_file_or_concepts_part_says_what_to_do(tmp_path: Path) -> None:
    run = old_run(tmp_path)
    npz = run / maps.MAPS_FILE
    whole = npz.read_bytes()
    npz.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(
        RunFileError,
        match=r"maps\.npz \(maps\.npz, version unknown\): not a complete map file.*--save-maps",
    ):
        maps.load_maps(run)
    with np.load(OLD_RUN / maps.MAPS_FILE) as data:
        members = {name: data[name] for name in data.files}
    newer = json.loads(str(members["metadata"])) | {"version": 2}
    np.savez(npz, **(members | {"metadata": np.array(json.dumps(newer))}))
    with pytest.raises(RunFileError, match=r"version 2\): written by a newer camkit"):
        maps.load_maps(run)
    np.savez(npz, **{k: v for k, v in members.items() if k != "truth"})
    with pytest.raises(RunFileError, match=r"members \['truth'\] are missing"):
        maps.load_maps(run)
    with pytest.raises(InputError, match="--save-maps"):  # absent: not a broken file
        maps.load_maps(tmp_path / "nothing")
    (part,) = run.glob(concept_parts.PARTS)
    part.write_bytes(part.read_bytes()[:100])
    with pytest.raises(
        RunFileError,
        match=rf"{part.name} \(concepts\.part-\*\.pt, version unknown\): not a complete torch"
        r" file.*camkit concepts",
    ):
        concept_parts.read_parts(run)


def test_the_cli_says_a_run_file_is_broken_in_one_line(tmp_path: Path, capsys) -> None:
    run = old_run(tmp_path)
    (run / maps.MAPS_FILE).write_bytes(b"PK\x03\x04 cut")
    assert cli.main(["strategies", str(run), "--quiet"]) == 2
    error = capsys.readouterr().err
    assert "maps.npz" in error and "--save-maps" in error and "Traceback" not in error


def test_the_explorer_shows_a_broken_file_and_the_run_without_it(tmp_path: Path) -> None:
    from starlette.testclient import TestClient

    from camkit.serve.app import create_app
    from camkit.serve.explorer import Explorer
    from camkit.serve.gallery import RunViews
    from camkit.serve.launch import open_gallery
    from tests.test_serve import loaded

    run = old_run(tmp_path)
    (run / "strategies" / "strategies.json").write_text('{"images": [')
    gallery = open_gallery([run], None, None)
    assert gallery.run.strategies is None and gallery.run.concepts.layer == "blocks.2"
    (problem,) = gallery.run.problems.values()
    assert "strategies.json" in problem and "camkit strategies" in problem
    explorer = Explorer({"a": loaded()}, gallery.entries)
    app = create_app(explorer, token=None, run=RunViews(run, problems=gallery.run.problems))
    with TestClient(app) as client:
        assert client.get("/api/info").json()["run_problems"] == [problem]
        reply = client.get("/api/strategies")
        assert reply.status_code == 422 and reply.json()["error"] == problem


@needs_browser
@pytest.mark.slow
def test_the_explorer_page_says_which_run_file_is_broken_in_headless_chromium(
    tmp_path: Path,
) -> None:
    from camkit.serve.app import create_app, running
    from camkit.serve.explorer import Explorer
    from camkit.serve.gallery import RunViews
    from camkit.serve.launch import open_gallery
    from tests.test_serve import loaded

    run = old_run(tmp_path)
    (run / concepts.CONCEPTS_FILE).write_text('{"layer": 3, "channels": {}}')
    gallery = open_gallery([run], None, None)
    explorer = Explorer({"a": loaded()}, gallery.entries)
    app = create_app(explorer, token=None, run=RunViews(run, problems=gallery.run.problems))
    with running(app) as base:
        browser = Browser(tmp_path / "profile")
        try:
            browser.open(f"{base}/")
            browser.js(
                """new Promise((done) => { (function poll() {
                if (document.body.dataset.ready === '1') done();
                else setTimeout(poll, 20); })(); })"""
            )
            shown = browser.js("document.getElementById('run-problems').textContent")
            assert "concepts.json" in shown and "layer is int, expected str" in shown
            assert "camkit concepts" in shown
            assert browser.js("document.querySelectorAll('#gallery .card').length") == 1
        finally:
            browser.close()

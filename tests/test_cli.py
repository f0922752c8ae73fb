"""The ``camkit`` command, run as a user runs it, on scikit-image's sample photos.

Each subprocess imports torch (a few seconds), so the end-to-end checks share few runs; the
argument handling is also driven in-process through :func:`camkit.cli.main`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision
from conftest import small_cnn
from PIL import Image
from skimage import data
from test_report import page_data

from camkit import cli
from camkit import io as camkit_io
from camkit.cli import common, files, pipeline
from camkit.cli.commands import demo
from camkit.core.progress import LOG_INTERVAL, LogProgress, progress, progress_bar
from camkit.errors import ArgumentError
from camkit.registry import METHODS

CAT_CLASSES = range(281, 286)  # tabby, tiger cat, Persian, Siamese, Egyptian cat
LABELS = [f"class {i}" for i in range(4)] + ["tabby", "tiger cat", "Egyptian cat", "crane"]


def camkit(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess:
    """``python -m camkit ARGS`` in ``cwd``, as a user would type it."""
    return subprocess.run(
        [sys.executable, "-m", "camkit", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


def no_temporary_files(folder: Path) -> bool:
    return not [path for path in folder.rglob("*") if path.name.endswith(".tmp")]


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    """chelsea.png (451x300), coffee.jpg (600x400), notes.txt, and astronaut.png in a subfolder."""
    folder = tmp_path_factory.mktemp("photos")
    Image.fromarray(data.chelsea()).save(folder / "chelsea.png")
    Image.fromarray(data.coffee()).save(folder / "coffee.jpg", quality=95)
    (folder / "notes.txt").write_text("not an image")
    (folder / "more").mkdir()
    Image.fromarray(data.astronaut()).save(folder / "more" / "astronaut.png")
    return folder


@pytest.fixture(scope="module")
def resnet18_weights(tmp_path_factory) -> Path:
    """A randomly initialised ResNet-18 state dict (no download)."""
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("weights") / "resnet18.pth"
    torch.save(torchvision.models.resnet18().state_dict(), path)
    return path


# ----------------------------------------------------------------------------- end to end


def test_explain_default_model_with_a_corrupt_file(photos, tmp_path):
    out = tmp_path / "out"
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"not an image")
    inputs = [photos / "chelsea.png", broken, photos / "coffee.jpg"]
    run = camkit("explain", *inputs, "--out", out, "--save-raw", cwd=tmp_path)

    assert run.returncode == 1, run.stderr
    assert f"camkit: cannot read {broken}: " in run.stderr
    assert "(auto)" in run.stderr  # the automatically chosen layer is announced
    records = json.loads((out / "manifest.json").read_text())["records"]
    assert [record["image"] for record in records] == [str(path) for path in inputs]
    chelsea, broken, coffee = records

    assert "error" in broken and "output" not in broken
    for record, (width, height) in ((chelsea, (451, 300)), (coffee, (600, 400))):
        assert "error" not in record
        assert record["method"] == "gradcam" and record["layer"]
        with Image.open(out / record["output"]) as overlay:
            assert overlay.size == (width, height) and overlay.mode == "RGB"
        raw = np.load(out / record["raw"])
        assert raw.dtype == np.float32 and raw.shape == (224, 224)
        assert raw.min() >= 0 and raw.max() <= 1
        top5 = record["top5"]
        assert len(top5) == 5 and top5[0]["index"] == record["target"]
        probabilities = [entry["probability"] for entry in top5]
        assert probabilities == sorted(probabilities, reverse=True)
        assert sum(probabilities) <= 1 + 1e-6
    assert chelsea["target"] in CAT_CLASSES
    assert chelsea["label"] == chelsea["top5"][0]["label"] and "cat" in chelsea["label"]
    assert chelsea["output"] == f"chelsea_gradcam_{chelsea['target']}.jpg"  # the default format
    assert no_temporary_files(out)


def test_explain_a_folder_with_class_list_and_several_methods(photos, resnet18_weights, tmp_path):
    out = tmp_path / "out"
    methods = ["gradcam", "eigencam", "guided-gradcam"]
    run = camkit(
        "explain",
        photos,  # chelsea and coffee; not notes.txt, not the subfolder
        "--model",
        "torchvision:resnet18",
        "--weights",
        resnet18_weights,
        "--method",
        ",".join(methods),
        "--layer",
        "layer4",
        "--target",
        "281,285",
        "--images-per-batch",
        "1",
        "--colormap",
        "viridis",
        "--format",
        "png",
        "--max-size",
        "200",
        "--out",
        out,
        cwd=tmp_path,
    )

    assert run.returncode == 0, run.stderr
    assert "(auto)" not in run.stderr
    records = json.loads((out / "manifest.json").read_text())["records"]
    expected = {
        f"{stem}_{method}_{target}.png"
        for stem in ("chelsea", "coffee")
        for method in methods
        for target in (281, 285)
    }
    assert {record["output"] for record in records} == expected
    assert {path.name for path in out.glob("*.png")} == expected
    for record in records:  # 451x300 and 600x400 photos, longer side capped at 200
        with Image.open(out / record["output"]) as overlay:
            assert overlay.size == (200, 133) and overlay.format == "PNG"
    assert all(record["layer"] == "layer4" for record in records)
    assert {(record["target"], record["label"]) for record in records} == {
        (281, "tabby"),
        (285, "Egyptian cat"),
    }
    assert all(record["model"] == "torchvision:resnet18" for record in records)
    assert not list(out.glob("*.npy"))  # only with --save-raw


def test_usage_error_exit_status_in_a_real_process(tmp_path):
    run = camkit("explain", "missing.jpg", "--out", "out", cwd=tmp_path)
    assert run.returncode == 2
    assert run.stderr.strip() == "camkit explain: error: no such file or directory: missing.jpg"
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_demo_writes_overlays_and_a_summary(tmp_path):
    run = camkit("demo", "--out", "demo", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    out = tmp_path / "demo"
    assert sorted(path.name for path in (out / "inputs").glob("*.png")) == [
        "astronaut.png",
        "chelsea.png",
        "coffee.png",
        "motorcycle.png",
        "rocket.png",
    ]
    records = json.loads((out / "manifest.json").read_text())["records"]
    assert len(records) == 5 * len(demo.DEMO_METHODS)
    for record in records:
        with (
            Image.open(out / record["output"]) as overlay,
            Image.open(tmp_path / record["image"]) as photo,
        ):
            assert overlay.size == photo.size
    assert next(r for r in records if "chelsea" in r["image"])["target"] in CAT_CLASSES
    with Image.open(out / "summary.png") as summary:  # 6 rows, a colour bar at the right
        assert summary.width > 1000 and summary.height > 900
    assert str(Path("demo", "summary.png")) in run.stdout
    # the astronaut explained for the class --target picked, one overlay per method
    targeted = json.loads((out / "target" / "manifest.json").read_text())["records"]
    assert [(r["method"], r["target"], r["label"]) for r in targeted] == [
        (method, 812, "space shuttle") for method in demo.DEMO_METHODS
    ]
    # the report shows both runs, and the last line says where to look
    page = (out / "index.html").read_text()
    assert "target/astronaut_gradcam_812" in page and "chelsea_gradcam_" in page
    assert (
        run.stdout.strip().splitlines()[-1].startswith(f"look at:   {Path('demo', 'index.html')}")
    )
    # what the model sees there: reference patches of blocks.5, in the report's concept atlas
    found = json.loads((out / "concepts.json").read_text())
    assert found["layer"] == demo.CONCEPT_LAYER and found["images"] == 5
    assert len(found["channels"]) == 16
    for entries in found["channels"].values():
        assert len(entries["relevance"]) == demo.CONCEPT_TOP
        assert all((out / row["patch"]).is_file() for row in entries["relevance"])
    atlas = page_data(out / "index.html")["concepts"]
    assert atlas["layer"] == demo.CONCEPT_LAYER and len(atlas["channels"]) == 16
    # when, not only where: the clip's map of each class lies on that class's photo's frames
    clip = json.loads((out / "clip" / "manifest.json").read_text())["records"]
    assert [(r["method"], r["label"]) for r in clip] == [
        ("gradcam", "tabby"),
        ("gradcam", "espresso"),
    ]
    for record, frames in zip(clip, (slice(0, 8), slice(8, 16)), strict=True):
        assert np.array(record["frame_importance"])[frames].sum() > 0.8, record["frame_importance"]
    (video,) = [i for i in page_data(out / "index.html")["images"] if i["name"] == "clip.mp4"]
    assert [o["video"]["gif"] for o in video["overlays"]] == [
        f"clip/clip_gradcam_{r['target']}.gif" for r in clip
    ]


def test_demo_percentages_keep_small_probabilities_visible():
    assert [demo.percent(p) for p in (0.77, 0.01, 0.00045, 0.0)] == ["77%", "1%", "0.045%", "0%"]


# ----------------------------------------------------------------------------- in-process


def explain_resnet18(image: Path, weights: Path, out: Path, *options: str) -> int:
    """``camkit explain IMAGE`` with the random ResNet-18, in this process."""
    model = ["--model", "torchvision:resnet18", "--weights", str(weights)]
    return cli.main(["explain", str(image), *model, "--out", str(out), *options])


def test_target_by_label_through_main(photos, resnet18_weights, tmp_path, capsys):
    out = tmp_path / "out"
    options = ("--method", "saliency", "--target", "egyptian CAT")
    status = explain_resnet18(photos / "chelsea.png", resnet18_weights, out, *options)
    assert status == 0, capsys.readouterr().err
    (record,) = json.loads((out / "manifest.json").read_text())["records"]
    assert (record["target"], record["label"], record["layer"]) == (285, "Egyptian cat", None)
    assert (out / "chelsea_saliency_285.jpg").is_file()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--method", "gradcm"], "unknown method 'gradcm' (did you mean gradcam"),
        (["--target", "1000"], "--target class 1000 is out of range"),
        (["--target", "cat"], "--target 'cat' matches"),
        (["--target", "tigre cat"], "close: 'tiger cat' (282)"),
        (["--layer", "layer5"], "--layer layer5: no such layer"),
        (["--model", "torchvision:resnt18"], "did you mean 'torchvision:resnet18'"),
        (["--weights", "missing.pth"], "--weights missing.pth: no such file"),
        (["--colormap", "rainbowz"], "--colormap: unknown colormap 'rainbowz'"),
    ],
)
def test_usage_errors_exit_2_and_write_nothing(
    photos, resnet18_weights, tmp_path, capsys, extra, message
):
    out = tmp_path / "out"
    assert explain_resnet18(photos / "chelsea.png", resnet18_weights, out, *extra) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("camkit explain: error: ") and message in error
    assert not out.exists()


def test_argparse_errors_exit_2(tmp_path, capsys):
    for bad in (["--alpha", "1.5"], ["--batch-size", "0"], ["--device", "tpu"]):
        with pytest.raises(SystemExit) as exit_info:
            cli.main(["explain", str(tmp_path), *bad])
        assert exit_info.value.code == 2
        assert "camkit explain: error: argument" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_cuda_without_cuda_is_a_usage_error(photos, tmp_path, capsys):
    argv = ["explain", str(photos / "chelsea.png"), "--device", "cuda", "--out", str(tmp_path)]
    assert cli.main(argv) == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_layers_marks_the_default_layer(resnet18_weights, capsys):
    argv = ["layers", "--model", "torchvision:resnet18", "--weights", str(resnet18_weights)]
    assert cli.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("torchvision:resnet18, input 224x224: ")
    assert lines[1] == "* default CAM layer (used when --layer is not given): layer4"  # first
    marked = [line for line in lines[2:] if line.startswith("* ")]
    assert marked == [marked[0]]
    assert marked[0].split() == ["*", "layer4", "Sequential", "(1,", "512,", "7,", "7)"]
    assert any(line.split()[:2] == ["fc", "Linear"] for line in lines)


def test_layers_match_and_explainable_narrow_the_list(resnet18_weights, capsys):
    argv = ["layers", "--model", "torchvision:resnet18", "--weights", str(resnet18_weights)]
    assert cli.main([*argv, "--match", "LAYER4.?"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("layer calls, 2 shown") and lines[1].endswith(": layer4")
    assert [line[2:].split()[0] for line in lines[3:]] == ["layer4.0", "layer4.1"]
    assert cli.main([*argv, "--match", "downsample", "--explainable"]) == 0
    names = [line[2:].split()[0] for line in capsys.readouterr().out.splitlines()[3:]]
    assert names and all("downsample" in name for name in names)
    assert cli.main([*argv, "--explainable"]) == 0
    out = capsys.readouterr().out
    assert "not explainable" not in out and " fc " not in out
    assert " avgpool " not in out  # (1, 512, 1, 1): no map, as --layer avgpool is refused
    assert cli.main([*argv, "--match", "nothing-like-this"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # no header above nothing
    assert captured.err.strip() == (
        "camkit layers: error: no layer of 75 fits --match 'nothing-like-this'; "
        "'camkit layers' without it lists them all"
    )


def test_an_argparse_error_is_one_line_and_a_hint(capsys):
    """A bad value is not buried under the usage block (as camkit's own usage errors); a
    missing argument still shows the usage, which says what is needed."""
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["explain", "x.png", "--composite", "nope"])
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and "usage:" not in lines[0]
    assert lines[0].startswith(
        "camkit explain: error: argument --composite: invalid choice: 'nope'"
    )
    assert lines[1] == "('camkit explain --help' lists the options)"
    with pytest.raises(SystemExit):
        cli.main(["explain"])
    assert capsys.readouterr().err.startswith("usage: camkit explain")


def test_layers_at_another_input_size(resnet18_weights, capsys):
    argv = ["layers", "--model", "torchvision:resnet18", "--weights", str(resnet18_weights)]
    assert cli.main([*argv, "--input-size", "64"]) == 0
    assert "(1, 512, 2, 2)" in capsys.readouterr().out


def test_version_and_help(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith("camkit 0.")
    for command in ("explain", "layers", "demo"):
        with pytest.raises(SystemExit):
            cli.main([command, "--help"])
        assert f"usage: camkit {command}" in capsys.readouterr().out


# ----------------------------------------------------------------------------- helpers


# RefineCAM multiplies the maps of two layers or more: one --layer cannot feed it (its heatmaps
# are tested in test_methods_extra.py); SESS's default six scales of 224-pixel windows take ~12 s
# here (its heatmaps are tested in test_sess.py)
@pytest.mark.parametrize(
    "method",
    [n for n, m in METHODS.items() if m.family != "attention" and n not in ("refinecam", "sess")],
)
def test_every_method_gives_one_heatmap_per_class(method):
    explainer = METHODS[method].build(small_cnn(), "2")
    batch = torch.rand(2, 3, 12, 12)
    result = explainer.explain_batch(batch, [[1, 3], [4, 0]], **explainer.display_options)
    heat, raw = explainer.display_heat(result.maps), result.maps
    assert heat.shape == (2, 2, 12, 12) and heat.device.type == "cpu"
    assert heat.min() >= 0 and heat.max() <= 1
    pixel = METHODS[method].family == "pixel"
    assert raw.shape == ((2, 2, 3, 12, 12) if pixel else (2, 2, 12, 12))


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("top1", None),
        ("TOP1", None),
        ("4", [4]),
        ("5, 4,5", [5, 4]),
        ("Tabby", [4]),  # exact, case-insensitive
        ("egyptian", [6]),  # the one label that contains it
        ("crane", [7]),  # exact beats the substring matches
    ],
)
def test_parse_target(spec, expected):
    assert common.parse_target(spec, LABELS) == expected


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("8", "out of range: this model has 8 classes, 0..7"),
        ("-1", "out of range"),
        ("cat", "matches 2 classes: 'tiger cat' (5), 'Egyptian cat' (6)"),
        ("tabbby", "is not a class name of this model; close: 'tabby' (4)"),
        ("zebra", "is not a class name of this model"),
    ],
)
def test_parse_target_errors(spec, message):
    with pytest.raises(common.UsageError) as error:
        common.parse_target(spec, LABELS)
    assert message in str(error.value)


def test_find_images_in_a_folder_is_sorted_and_not_recursive(tmp_path):
    for name in ("b.PNG", "a.jpg", ".hidden.jpg", "c.txt", "sub/d.jpg"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).touch()
    found = files.find_images([str(tmp_path), str(tmp_path / "c.txt")])
    assert [path.name for path in found.paths] == ["a.jpg", "b.PNG", "c.txt"]


def test_find_images_rejects_an_empty_folder(tmp_path):
    (tmp_path / "notes.txt").touch()
    with pytest.raises(ArgumentError, match=f"no image files .* in directory {tmp_path}"):
        files.find_images([str(tmp_path)])


def test_unique_stems():
    paths = [Path("a/cat.jpg"), Path("b/cat.png"), Path("cat.jpg"), Path("dog.jpg")]
    assert pipeline.unique_stems(paths) == ["cat", "cat-2", "cat-3", "dog"]


def test_read_image_makes_upright_rgb(tmp_path):
    gray = np.arange(12, dtype=np.uint8).reshape(3, 4) * 20
    Image.fromarray(gray).save(tmp_path / "gray.png")
    assert camkit_io.read_image(tmp_path / "gray.png").shape == (3, 4, 3)

    rgba = np.zeros((2, 5, 4), np.uint8)
    Image.fromarray(rgba).save(tmp_path / "rgba.png")
    assert camkit_io.read_image(tmp_path / "rgba.png").shape == (2, 5, 3)

    deep = np.full((2, 2), 65535, np.uint16)
    Image.fromarray(deep).save(tmp_path / "deep.png")
    assert (camkit_io.read_image(tmp_path / "deep.png") == 255).all()

    rotated = Image.fromarray(np.zeros((2, 6, 3), np.uint8))  # stored 6 wide, 2 high
    exif = rotated.getexif()
    exif[0x0112] = 6  # orientation: rotate 90 degrees clockwise to display
    rotated.save(tmp_path / "rotated.jpg", exif=exif)
    assert camkit_io.read_image(tmp_path / "rotated.jpg").shape == (6, 2, 3)


def test_atomic_writes_leave_only_the_file(tmp_path):
    camkit_io.save_json(tmp_path / "m.json", [{"a": 1}])
    camkit_io.save_npy(tmp_path / "m.npy", np.ones((2, 2), np.float32))
    assert sorted(path.name for path in tmp_path.iterdir()) == ["m.json", "m.npy"]
    assert json.loads((tmp_path / "m.json").read_text()) == [{"a": 1}]


def test_progress_is_silent_when_quiet_or_a_library_bar_off_a_terminal(capsys):
    with progress_bar(4, "ROAD", "image") as bar:  # pytest's stderr is not a terminal
        bar.update(4)
    with progress(4, "explain", "image", enabled=False) as bar:  # --quiet
        bar.update(4)
    assert capsys.readouterr().err == ""


NOTEBOOK_WITHOUT_WIDGETS = """
import sys, types, warnings
warnings.simplefilter("always")
sys.modules["ipykernel.zmqshell"] = types.ModuleType("ipykernel.zmqshell")
shell = type("ZMQInteractiveShell", (), {})()
sys.modules["IPython"] = types.SimpleNamespace(get_ipython=lambda: shell)
sys.modules["ipywidgets"] = None  # not installed
from camkit.core.progress import progress_bar
with progress_bar(2, "explain", "image") as bar:
    bar.update(2)
print(type(bar).__module__)
"""


def test_progress_in_a_notebook_without_ipywidgets_falls_back_quietly():
    """A Jupyter kernel without ipywidgets: tqdm's text bar, no ``TqdmWarning: IProgress not
    found`` (every warning is shown in the child process)."""
    done = subprocess.run(
        [sys.executable, "-c", NOTEBOOK_WITHOUT_WIDGETS], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "Warning" not in done.stderr, done.stderr
    assert done.stdout.strip() in ("tqdm.std", "tqdm.asyncio")  # the text bar


def test_progress_in_a_log_is_a_line_at_a_steady_interval(capsys):
    """Off a terminal, explain/evaluate print done/total, rate and time left every ``interval``
    seconds (a fake clock: 2 images in 4 s is 0.5 image/s, 6 left take 12 s), and a last line."""
    now = [0.0]
    with progress(8, "explain", "image") as shown:  # pytest's stderr is not a terminal
        assert isinstance(shown, LogProgress) and shown.interval == LOG_INTERVAL
    capsys.readouterr()
    with LogProgress(8, "explain", "image", interval=10, clock=lambda: now[0]) as shown:
        now[0] = 4.0
        shown.update(2)  # 4 s after the start: no line yet
        now[0] = 10.0
        shown.update(2)
        now[0] = 15.0
        shown.update(1)  # 5 s after the last line: none
        shown.write("camkit: cannot read x.jpg")
        now[0] = 20.0
        shown.update(1)  # 10 s after the last line: 6 in 20 s, 2 left at 0.3/s
        now[0] = 22.0
        shown.update(2)  # the last line comes with the end
    assert capsys.readouterr().err.splitlines() == [
        "explain: 4/8 images (50%), 0.4 images/s, 10 s left",
        "camkit: cannot read x.jpg",
        "explain: 6/8 images (75%), 0.3 images/s, 7 s left",
        "explain: 8/8 images (100%), 0.364 images/s, 0 s left",
    ]

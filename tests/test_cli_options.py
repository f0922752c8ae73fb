"""The options ``camkit explain`` and ``camkit evaluate`` share: one set (same names, defaults,
meaning), every registered method in ``--help``, every option with its help and default shown,
and a method that cannot explain the model refused before any work (exit 2, one line)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch
import torchvision
from PIL import Image
from skimage import data

from camkit import cli, io
from camkit.cli import common, main
from camkit.cli.commands import explain
from camkit.registry import METHODS

SHARED = (
    "images", "model", "weights", "layer", "method", "target", "out", "images_per_batch",
    "batch_size", "device", "workers", "quiet",
)  # fmt: skip


def subparser(command: str) -> argparse.ArgumentParser:
    (commands,) = [
        action
        for action in cli.build_parser()._actions
        if isinstance(action, argparse._SubParsersAction)
    ]
    return commands.choices[command]


def actions(command: str) -> dict[str, argparse.Action]:
    return {action.dest: action for action in subparser(command)._actions if action.dest != "help"}


@pytest.fixture(scope="module")
def chelsea(tmp_path_factory):
    path = tmp_path_factory.mktemp("photo") / "chelsea.png"
    Image.fromarray(data.chelsea()[::4, ::4]).save(path)
    return path


@pytest.fixture(scope="module")
def resnet18(tmp_path_factory):
    """``--model torchvision:resnet18 --weights PATH``: random weights, nothing downloaded."""
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("weights") / "resnet18.pth"
    torch.save(torchvision.models.resnet18(num_classes=1000).state_dict(), path)
    return ["--model", "torchvision:resnet18", "--weights", str(path)]


def test_explain_and_evaluate_share_one_set_of_options():
    explain, evaluate = actions("explain"), actions("evaluate")
    for dest in SHARED:
        mine, theirs = explain[dest], evaluate[dest]
        assert mine.option_strings == theirs.option_strings, dest
        assert (mine.default, mine.type, mine.choices) == (
            theirs.default,
            theirs.type,
            theirs.choices,
        ), dest
    assert explain["batch_size"].default == common.BATCH_SIZE == 32
    assert explain["method"].option_strings == ["--method", "--methods"]


@pytest.mark.parametrize("command", ["explain", "evaluate"])
def test_method_takes_a_comma_list_under_either_spelling(command):
    parser = subparser(command)
    for spelling in ("--method", "--methods"):
        args = parser.parse_args(["x.png", spelling, "gradcam, layercam,gradcam"])
        assert common.parse_methods(args.method) == ["gradcam", "layercam"]


@pytest.mark.parametrize("command", ["explain", "evaluate"])
def test_help_lists_every_registered_method_and_shows_each_default(command, capsys):
    with pytest.raises(SystemExit):
        cli.main([command, "--help"])
    text = capsys.readouterr().out
    assert "%%" not in text and "95%" in text if command == "evaluate" else True
    listed = text.split("methods:", 1)[1].split("\n\n", 1)[0]
    names = {name.strip() for name in listed.replace("\n", ",").split(",") if name.strip()}
    assert set(METHODS) <= names, set(METHODS) - names  # rollout and legrad too
    parser = subparser(command)
    for action in parser._actions:
        if action.dest == "help":
            continue
        assert action.help, f"{command} {action.option_strings or action.dest} has no help"
        default = action.default
        if default not in (None, False) and isinstance(default, (str, int, float)):
            shown = parser._get_formatter()._expand_help(action)
            assert "default" in shown and str(default) in shown, (action.dest, shown)


@pytest.mark.parametrize("command", ["explain", "evaluate"])
def test_an_attention_method_on_a_cnn_is_a_one_line_usage_error(
    command, chelsea, resnet18, tmp_path, capsys
):
    out = tmp_path / "out"
    argv = [command, str(chelsea), *resnet18, "--method", "gradcam,rollout", "--out", str(out)]
    assert cli.main([*argv, "--workers", "0", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"camkit {command}: error: --method rollout: ResNet has no ")
    assert "Traceback" not in "\n".join(err)
    assert not out.exists()  # refused before any work


def test_random_weights_warning_speaks_of_the_flag(resnet18, capsys):
    common.load_model("torchvision:resnet18", None)
    err = capsys.readouterr().err
    assert "--weights PATH" in err and "weights='" not in err and "weights=None" not in err


def test_resume_with_other_settings_says_what_to_do():
    with pytest.raises(common.UsageError) as error:
        explain.check_resumable({"settings": {"methods": ["gradcam"]}}, {"methods": ["eigencam"]})
    message = str(error.value)
    assert "methods: was ['gradcam'], now ['eigencam']" in message
    assert "run again with its settings" in message and "a new --out" in message


def test_summary_counts_unreadable_images_apart(tmp_path, capsys):
    """42 readable images with 2 methods each and 1 unreadable: 84 overlays of 42 images, 42
    explained, 1 that could not be read (not 43 explained)."""
    records = [{"image": f"{i}.jpg", "output": f"{i}_{m}.png"} for i in range(42) for m in "ab"]
    records.append({"image": "broken.jpg", "error": "not an image"})
    throughput = {"images_per_second": 43 / 21.0, "seconds": 21.0, "ranks": [{}]}
    this_run = {"explained": 42, "unreadable": 1, "throughput": throughput}
    earlier = {"explained": 5, "unreadable": 0, "throughput": {"images_per_second": 9.0}}
    run = {"records": records, "explained": 47, "unreadable": 1, "throughput": throughput}
    run["runs"] = [earlier, this_run]  # a resumed run: the summary speaks of this run
    assert explain.summarize(run, tmp_path, 43) == 1
    line = capsys.readouterr().out.strip()
    assert line.startswith("wrote 84 overlay(s) of 42 image(s) to ")
    assert line.endswith(
        "this run explained 42 images at 2.0 images/s; 1 refused (could not be read)"
    )


def test_summary_when_the_only_image_was_refused(tmp_path, capsys):
    """Nothing explained: no speed (the refused image took the time), the refusal said, exit 1
    (``EXIT_UNREADABLE_IMAGES``, the status of a run with unreadable images)."""
    records = [{"image": "huge.png", "error": "144000000 pixels, over --max-pixels"}]
    throughput = {"images_per_second": 16.9, "seconds": 1 / 16.9, "ranks": [{}]}
    this_run = {"explained": 0, "unreadable": 1, "throughput": throughput}
    run = {"records": records, "explained": 0, "unreadable": 1, "throughput": throughput}
    run["runs"] = [this_run]
    assert explain.summarize(run, tmp_path, 1) == common.EXIT_UNREADABLE_IMAGES == 1
    line = capsys.readouterr().out.strip()
    assert line.startswith("wrote 0 overlay(s) of 0 image(s) to ")
    assert line.endswith("this run explained 0 images; 1 refused (could not be read)")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("layer", "reason"),
    [
        ("global_pool", "is not a spatial map"),
        ("classifier", "the model's output"),
        ("layer4", "no such layer"),
    ],
)
def test_a_layer_no_cam_can_read_is_a_usage_error_before_any_work(
    tmp_path: Path, capsys, layer: str, reason: str
) -> None:
    """Refused with exit 2 and the reason, the default named, nothing written (not even the
    manifest's part); suggestions name only layers a CAM can read."""
    photo = tmp_path / "cat.png"
    io.save_png(photo, data.chelsea())
    out = tmp_path / "out"
    assert main(["explain", str(photo), "--layer", layer, "--out", str(out), "--quiet"]) == 2
    error = capsys.readouterr().err
    assert reason in error and "the default is bn2" in error and "Traceback" not in error
    assert "classifier?" not in error
    assert not out.exists()


def test_equal_scores_rank_the_lowest_class_first_everywhere(tmp_path, capsys):
    """A zeroed 10-class head: every class scores alike. The manifest's target is its own
    top-5's first (class 0, then 1..4), as the library's top-1 target and top_classes say
    (``torch.topk`` alone put class 8 first)."""
    import json

    from camkit import models
    from camkit.targets.ranking import ranked, top1

    equal = torch.zeros(2, 10).softmax(dim=-1)
    assert top1(equal).tolist() == [0, 0]
    assert ranked(equal, 5)[1].tolist() == [[0, 1, 2, 3, 4]] * 2
    assert [c for c, _, _ in models.top_classes(equal[0], [f"c{i}" for i in range(10)])] == [
        0, 1, 2, 3, 4,
    ]  # fmt: skip
    scores = torch.tensor([1.0, 3.0, 3.0, 2.0, 3.0])
    assert ranked(scores, 4)[1].tolist() == [1, 2, 4, 3] and int(top1(scores)) == 1
    model = torchvision.models.resnet18(num_classes=10)
    torch.nn.init.zeros_(model.fc.weight)
    torch.nn.init.zeros_(model.fc.bias)
    torch.save(model.state_dict(), tmp_path / "zeroed.pt")
    (tmp_path / "labels.txt").write_text("".join(f"c{i}\n" for i in range(10)))
    photo = tmp_path / "cat.png"
    io.save_png(photo, data.chelsea()[::4, ::4])
    out = tmp_path / "out"
    argv = ["explain", str(photo), "--model", "torchvision:resnet18", "--weights"]
    argv += [str(tmp_path / "zeroed.pt"), "--labels", str(tmp_path / "labels.txt")]
    argv += ["--method", "gradcam", "--out", str(out), "--quiet", "--workers", "0"]
    assert main(argv) == 0
    assert "EmptyMapWarning" in capsys.readouterr().err  # the zeroed head's map is empty
    (record,) = json.loads((out / "manifest.json").read_text())["records"]
    assert (record["target"], record["label"]) == (0, "c0")
    assert [entry["label"] for entry in record["top5"]] == ["c0", "c1", "c2", "c3", "c4"]

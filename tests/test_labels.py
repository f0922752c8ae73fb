"""A fine-tuned model's own class names: ``--labels FILE`` for every command that loads a
model, the names a checkpoint carries (``labels``/``classes``, HuggingFace ``id2label``), and
warnings in the CLI as one readable line."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision
from PIL import Image
from safetensors.torch import save_file

from camkit import cli, models
from camkit.errors import ArgumentError, ZeroGradientWarning
from camkit.models.labels import read_labels

NAMES = ["cat", "dog", "fox"]


def test_a_labels_file_as_lines_or_json(tmp_path: Path) -> None:
    lines = tmp_path / "names.txt"
    lines.write_text("# my classes\ncat\n\n dog \nfox\n")
    assert read_labels(lines) == NAMES
    for content in (
        NAMES,
        {"0": "cat", "1": "dog", "2": "fox"},
        {"2": "fox", "0": "cat", "1": "dog"},
        {"id2label": {"0": "cat", "1": "dog", "2": "fox"}},
        {"classes": NAMES},
    ):
        path = tmp_path / "names.json"
        path.write_text(json.dumps(content))
        assert read_labels(path) == NAMES, content
    for bad, words in (
        ({"0": "cat", "2": "fox"}, "mapping of the indices 0..n-1"),
        ([1, 2], "list of strings"),
        ("[not json", "not valid JSON"),
        ("\n# only a comment\n", "no class names"),
    ):
        path = tmp_path / "bad.json"
        path.write_text(bad if isinstance(bad, str) else json.dumps(bad))
        with pytest.raises(ArgumentError, match=words):
            read_labels(path)


@pytest.fixture(scope="module")
def three_classes() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return torchvision.models.squeezenet1_1(num_classes=3).state_dict()


def test_a_checkpoint_carries_its_names(tmp_path: Path, three_classes) -> None:
    arch = "torchvision:squeezenet1_1"
    saved = tmp_path / "named.pt"
    torch.save({"arch": arch, "state_dict": three_classes, "classes": NAMES}, saved)
    assert models.load(saved).labels == NAMES
    hf = tmp_path / "hf.pt"
    torch.save(
        {"state_dict": three_classes, "config": {"id2label": {"1": "dog", "0": "cat", "2": "fox"}}},
        hf,
    )
    assert models.load(arch, weights=hf).labels == NAMES
    metadata = {"arch": arch, "labels": json.dumps(NAMES)}
    safe = tmp_path / "named.safetensors"
    save_file({k: v.contiguous() for k, v in three_classes.items()}, safe, metadata=metadata)
    assert models.load(safe).labels == NAMES
    beside = tmp_path / "hub"
    beside.mkdir()
    torch.save(three_classes, beside / "pytorch_model.bin")
    (beside / "config.json").write_text(
        json.dumps({"id2label": {"0": "cat", "1": "dog", "2": "fox"}})
    )
    assert models.load(arch, weights=beside / "pytorch_model.bin").labels == NAMES
    bare = tmp_path / "bare.pt"
    torch.save(three_classes, bare)
    assert models.load(arch, weights=bare).labels == ["class 0", "class 1", "class 2"]
    given = tmp_path / "names.txt"
    given.write_text("a\nb\nc\n")
    assert models.load(saved, labels=given).labels == ["a", "b", "c"]  # the file wins
    assert models.load(saved, labels=["x", "y", "z"]).labels == ["x", "y", "z"]
    with pytest.raises(ArgumentError, match="has 2 class names but the model has 3 classes"):
        models.load(arch, weights=bare, labels=["x", "y"])
    wrong = tmp_path / "wrong.pt"
    torch.save({"state_dict": three_classes, "labels": ["a", "b"]}, wrong)
    with pytest.raises(ArgumentError, match="the checkpoint .*wrong.pt has 2 class names"):
        models.load(arch, weights=wrong)


def test_the_plain_readers_do_not_read_the_names(tmp_path: Path, three_classes) -> None:
    """read_state_dict and read_checkpoint read the weights only: names that would not parse
    (or a config.json beside the file) are read_checkpoint_labels' business."""
    tensors = {k: v.contiguous() for k, v in three_classes.items()}
    safe = tmp_path / "named.safetensors"
    save_file(tensors, safe, metadata={"arch": "torchvision:squeezenet1_1", "labels": "[cat"})
    state, arch = models.read_checkpoint(safe)
    assert arch == "torchvision:squeezenet1_1" and state.keys() == three_classes.keys()
    assert models.read_state_dict(safe).keys() == three_classes.keys()
    with pytest.raises(ArgumentError, match="'labels' is not JSON text"):
        models.read_checkpoint_labels(safe)
    beside = tmp_path / "hub"
    beside.mkdir()
    torch.save(three_classes, beside / "pytorch_model.bin")
    (beside / "config.json").write_text(json.dumps({"id2label": {"0": "cat", "2": "fox"}}))
    assert models.read_state_dict(beside / "pytorch_model.bin").keys() == three_classes.keys()
    with pytest.raises(ArgumentError, match="mapping of the indices 0..n-1"):
        models.read_checkpoint_labels(beside / "pytorch_model.bin")


def test_the_cli_shows_the_names_of_labels_file_and_a_warning_in_one_line(
    tmp_path: Path, three_classes, capsys
) -> None:
    weights = tmp_path / "three.pt"
    torch.save(three_classes, weights)
    names = tmp_path / "names.txt"
    names.write_text("\n".join(NAMES))
    photo = tmp_path / "photo.png"
    Image.fromarray((np.random.default_rng(0).random((40, 50, 3)) * 255).astype(np.uint8)).save(
        photo
    )
    out = tmp_path / "out"
    model = ["--model", "torchvision:squeezenet1_1", "--weights", str(weights)]
    status = cli.main(
        [
            "explain",
            str(photo),
            *model,
            "--labels",
            str(names),
            "--out",
            str(out),
            "--target",
            "fox",
            "--method",
            "saliency",
        ]
    )
    assert status == 0, capsys.readouterr().err
    (record,) = json.loads((out / "manifest.json").read_text())["records"]
    assert (record["target"], record["label"]) == (2, "fox")
    assert {row["label"] for row in record["top5"]} == set(NAMES)
    assert cli.main(["layers", *model, "--labels", str(tmp_path / "nope.txt")]) == 2
    assert "--labels " in (err := capsys.readouterr().err) and "no such file" in err
    for command in ("explain", "evaluate", "layers", "serve"):
        with pytest.raises(SystemExit):
            cli.main([command, "--help"])
        assert "--labels FILE" in capsys.readouterr().out, command


def test_the_cli_prints_a_warning_as_one_readable_line(
    tmp_path: Path, three_classes, capsys
) -> None:
    zero_head = dict(three_classes)
    zero_head["classifier.1.weight"] = torch.zeros_like(zero_head["classifier.1.weight"])
    weights = tmp_path / "zero.pt"
    torch.save(zero_head, weights)
    photo = tmp_path / "photo.png"
    Image.fromarray(np.full((40, 50, 3), 120, np.uint8)).save(photo)
    model = ["--model", "torchvision:squeezenet1_1", "--weights", str(weights)]
    out = ["--out", str(tmp_path / "out"), "--method", "gradcam"]
    assert cli.main(["explain", str(photo), *model, *out]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if "Warning" in line]
    assert lines and all(line.startswith("camkit: warning: ") for line in lines), lines
    assert any("ZeroGradientWarning: " in line for line in lines), lines
    with warnings.catch_warnings():
        cli.one_line_warning(
            ZeroGradientWarning("the gradient of layer\n'features' is zero"),
            ZeroGradientWarning,
            "/venv/bin/camkit",
            8,
        )
    err = capsys.readouterr().err
    assert err == "camkit: warning: ZeroGradientWarning: the gradient of layer 'features' is zero\n"

"""The method registry: every method in one place, read by the classes' users alike."""

import json
from pathlib import Path

import pytest
import torch
from conftest import X
from PIL import Image

import camkit
from camkit import cli, registry
from camkit.errors import UnknownMethodError
from camkit.methods.cam.base import BaseCAM

README = Path(__file__).resolve().parents[1] / "README.md"


class ToyCAM(BaseCAM):
    """Every channel weighs 1: the map is the channel sum of the activations."""

    def channel_weights(self, act, grad):
        return torch.ones_like(grad)


@pytest.fixture
def toycam():
    registry.register("toycam", "A toy, 2026")(ToyCAM)
    yield ToyCAM
    del registry.METHODS["toycam"]


RAW = {"relu": False, "upsample": False, "normalize": False}


def test_a_method_added_through_the_registry_alone_works_everywhere(toycam, tiny, tmp_path):
    # the class: TinyNet's conv gives A_0 = x and A_1 = 2x, so the channel sum is 3x
    torch.testing.assert_close(toycam(tiny, "conv")(X, 1, **RAW), 3 * X[0])
    # cams(): the toy shares the one pass with Grad-CAM
    maps = camkit.cams(tiny, "conv", X, 1, methods=["toycam", "gradcam"], **RAW)
    torch.testing.assert_close(maps["toycam"], 3 * X[0])
    torch.testing.assert_close(maps["gradcam"], camkit.GradCAM(tiny, "conv")(X, 1, **RAW))
    # the command line
    Image.new("RGB", (40, 30), (200, 120, 40)).save(tmp_path / "photo.png")
    argv = ["explain", str(tmp_path / "photo.png"), "--method", "toycam,gradcam"]
    argv += ["--model", "torchvision:resnet18", "--layer", "layer4", "--out", str(tmp_path / "o")]
    assert cli.main(argv) == 0
    records = json.loads((tmp_path / "o" / "manifest.json").read_text())["records"]
    assert [record["method"] for record in records] == ["toycam", "gradcam"]
    assert all((tmp_path / "o" / record["output"]).is_file() for record in records)
    assert "toycam" in cli.build_parser()._subparsers._group_actions[0].choices["explain"].epilog


def test_the_registry_knows_each_method_from_its_class():
    gradcam, scorecam, guided = (registry.get(n) for n in ("gradcam", "scorecam", "guided"))
    assert gradcam.cls is camkit.GradCAM and gradcam.shares_pass and gradcam.needs_layer
    assert scorecam.family == "perturbation-cam" and not scorecam.shares_pass
    assert guided.family == "pixel" and not guided.needs_layer
    assert registry.names("perturbation-cam") == [
        "scorecam",
        "ablationcam",
        "sscam",
        "iscam",
        "reciprocam",
    ]
    with pytest.raises(UnknownMethodError, match="did you mean layercam"):
        registry.get("layercan")


def test_readme_methods_table_lists_every_registered_method_with_its_reference():
    table = README.read_text().split("## Methods", 1)[1].split("\n\n", 2)[1]
    rows = {}
    for line in table.splitlines()[2:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        for name in cells[1].replace("`", "").split(","):
            rows[name.strip()] = (cells[0], cells[2])
    assert set(rows) == set(registry.METHODS)
    for name, method in registry.METHODS.items():
        assert f"`{method.cls.__name__}`" in rows[name][0], name
        assert rows[name][1] == method.reference, name


# ----------------------------------------------------------------------------- typed questions

SRC = Path(camkit.__file__).parent


def test_front_ends_ask_methods_typed_questions_not_names() -> None:
    """The CLI and the explorer decide what a method can do by asking it (``fits``,
    ``shares_one_pass``, ``clean_batch_first``, ``forward_rows``, ``needs_gradients``,
    ``display_heat``), never by its family string or class name (the family only groups the
    menus)."""
    import re

    for path in [*(SRC / "serve").rglob("*.py"), *(SRC / "cli").rglob("*.py")]:
        text = path.read_text("utf-8")
        assert not re.search(r"\.family\s*(==|!=|in\b)|family\s*(==|!=)\s*\"", text), path
        assert not re.search(r"(method|name)\s*==\s*\"[a-z+-]+cam[a-z+]*\"", text), path
        assert 'endswith("Attention")' not in text, path


def test_each_method_answers_for_itself(tiny) -> None:
    from torch import nn

    cnn = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
    assert "attention" in camkit.AttentionRollout.fits(cnn)
    assert camkit.CAM.fits(cnn) is not None  # no linear classifier to read
    assert camkit.GradCAM.fits(cnn) is None
    assert camkit.GradCAM.shares_one_pass() and not camkit.ScoreCAM.shares_one_pass()
    assert camkit.ScoreCAM.clean_batch_first() and not camkit.Saliency.clean_batch_first()
    assert registry.get("gradcam").shares_pass and not registry.get("shapleycam").shares_pass
    shape = (1, 8, 5, 6)
    assert camkit.GradCAM(tiny, "conv").forward_rows(shape) == 1
    assert camkit.ScoreCAM(tiny, "conv").forward_rows(shape) == 8
    assert camkit.ScoreCAM(tiny, "conv", top_channels=3).forward_rows(shape) == 3
    assert camkit.SSCAM(tiny, "conv", samples=4).forward_rows(shape) == 32
    assert camkit.ReciproCAM(tiny, "conv").forward_rows(shape) == 30
    assert camkit.ReciproCAM(tiny, "conv").forward_rows((4, 8, 5, 6)) == 120  # 4 frames' rows
    assert camkit.IntegratedGradients(tiny, steps=16).forward_rows() == 17
    assert camkit.SmoothGrad(tiny, samples=5).forward_rows() == 5
    assert camkit.SmoothGrad(tiny, samples=5, noise_level=0).forward_rows() == 1


def test_a_methods_signature_shows_every_option_it_takes() -> None:
    """``inspect.signature`` (``help()``, a notebook) shows the options a method passes on to
    its bases, with the class's own defaults; options the method refuses are not shown."""
    import inspect

    score = inspect.signature(camkit.ScoreCAM).parameters
    assert list(score)[:2] == ["model", "layer"]
    assert {"top_channels", "batch_size", "output", "dtype", "reshape"} <= set(score)
    assert score["batch_size"].default == 32 and "seed" not in score
    smooth = inspect.signature(camkit.SmoothGrad).parameters
    assert {"samples", "noise_level", "seed", "batch_size"} <= set(smooth)
    assert "reshape" not in smooth and "layer" not in smooth
    camkit.ScoreCAM(torch.nn.Sequential(torch.nn.Conv2d(3, 2, 1)), "0", **{"top_channels": 1})

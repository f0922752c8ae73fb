"""camkit.models.preprocess_of: a bare module is fed as it says (timm's ``pretrained_cfg``, a
HuggingFace ``preprocessor_config.json``, the preset camkit.models.load attaches), else ImageNet's
defaults with one warning; the README quickstart's ``net.model`` and ``net`` predict alike."""

from __future__ import annotations

import importlib
import json
import tracemalloc
import warnings

import numpy as np
import pytest
import torch
from skimage import data
from torch import nn

from camkit import models
from camkit.core.wrappers import InputLayout, KeywordInput
from camkit.models import AssumedPreprocessWarning, Preprocess, preprocess_of


def _tiny() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 2, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten())


def test_a_module_that_says_nothing_gets_the_defaults_and_one_warning() -> None:
    model = _tiny()
    with pytest.warns(AssumedPreprocessWarning, match="ImageNet's mean") as caught:
        assert preprocess_of(model) == Preprocess()
    assert "224x224" in str(caught[0].message) and "bilinear" in str(caught[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per module
        assert preprocess_of(model, 32) == Preprocess(32)


def test_a_timm_style_config_is_read_through_wrappers() -> None:
    model = _tiny()
    model.pretrained_cfg = {
        "input_size": (3, 40, 48),
        "mean": (0.5, 0.5, 0.5),
        "std": (0.25, 0.5, 0.5),
        "interpolation": "bicubic",
        "crop_pct": 0.9,
        "crop_mode": "squash",
    }
    expected = Preprocess((40, 48), (0.5,) * 3, (0.25, 0.5, 0.5), 0.9, "bicubic", "squash")
    with warnings.catch_warnings():
        warnings.simplefilter("error", AssumedPreprocessWarning)
        for wrapped in (model, KeywordInput(model, "x"), nn.DataParallel(model)):
            assert preprocess_of(wrapped) == expected
        assert preprocess_of(InputLayout(model, "BTCHW"), 64).size == (64, 64)  # asked: wins


def test_torchvision_models_carry_their_preset() -> None:
    """load() attaches the weights' preset as a timm-style config: the bare module says it."""
    with pytest.warns(models.RandomWeightsWarning):
        loaded = models.load("torchvision:efficientnet_b0")
    assert loaded.model.pretrained_cfg["interpolation"] == "bicubic"
    with warnings.catch_warnings():
        warnings.simplefilter("error", AssumedPreprocessWarning)
        assert preprocess_of(loaded.model) == loaded.preprocess
    assert loaded.preprocess.interpolation == "bicubic" and loaded.preprocess.crop_pct == 224 / 256


def test_a_huggingface_model_saved_in_a_folder_says_its_processor(tmp_path) -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.ViTConfig(
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=16,
        image_size=32,
        patch_size=8,
        num_labels=3,
    )
    transformers.ViTForImageClassification(config).save_pretrained(tmp_path / "vit")
    model = transformers.ViTForImageClassification.from_pretrained(tmp_path / "vit")
    processor = {"image_mean": [0.1, 0.2, 0.3], "image_std": [0.4, 0.5, 0.6], "resample": 3}
    processor |= {"size": {"height": 32, "width": 32}, "do_normalize": True}
    (tmp_path / "vit" / "preprocessor_config.json").write_text(json.dumps(processor))
    with warnings.catch_warnings():
        warnings.simplefilter("error", AssumedPreprocessWarning)
        found = preprocess_of(KeywordInput(model, "pixel_values"))
    # ViTImageProcessor resizes straight to its size: no crop
    assert found == Preprocess(32, (0.1, 0.2, 0.3), (0.4, 0.5, 0.6), 0.875, "bicubic", "squash")
    # CLIP's: the shorter side to 40, then a 32x32 center crop
    processor |= {"size": {"shortest_edge": 40}, "crop_size": {"height": 32, "width": 32}}
    processor |= {"do_center_crop": True, "resample": 2}
    (tmp_path / "vit" / "preprocessor_config.json").write_text(json.dumps(processor))
    found = preprocess_of(model)
    assert (found.size, found.crop_pct, found.crop_mode) == ((32, 32), 32 / 40, "center")
    assert found.interpolation == "bilinear"


@pytest.mark.slow
def test_the_quickstart_module_and_loaded_model_give_the_same_explorer_predictions() -> None:
    """The README's ``net.model`` (a bare timm module) is fed 0.5/0.5 and bicubic resizing as
    ``net`` is: chelsea is a tiger cat at 39.9 % either way (ImageNet's defaults said Egyptian
    cat at 34.8 %)."""
    pytest.importorskip("starlette", reason="camkit serve's web stack")
    from camkit.serve.explorer import Explorer
    from camkit.serve.notebook import as_loaded, gallery_of

    net = models.load("efficientnet_lite0")
    entries = gallery_of([data.chelsea()]).entries
    answers = []
    for given in (net, net.model):
        with warnings.catch_warnings():
            warnings.simplefilter("error", AssumedPreprocessWarning)
            loaded = as_loaded(given, labels=None, input_size=None, layer=None)
        assert loaded.preprocess == net.preprocess and loaded.labels == net.labels
        explorer = Explorer({"a": loaded}, entries)
        explorer.predict([0], "a")
        answers.append(explorer.predictions["a"][0])
        torch.testing.assert_close(
            explorer.model_input(0), net.preprocess(data.chelsea()), rtol=0, atol=0
        )
    assert answers[0] == answers[1]
    index, label, probability = answers[1][0]
    assert (index, label) == (282, "tiger cat") and probability == pytest.approx(0.399, abs=1e-3)


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic", "nearest"])
def test_the_resize_in_strips_is_the_one_step_resize(interpolation, monkeypatch) -> None:
    """Rows made float and resized in strips, then the columns: within float32 rounding of a
    float64 one-step antialiased resize (down and up, on both axes)."""
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms.v2 import functional as TF

    module = importlib.import_module("camkit.models.preprocess")  # not the function

    monkeypatch.setattr(module, "STRIP_PIXELS", 1000)  # many strips, one a part of the last
    pixels = torch.randint(0, 256, (3, 301, 97), generator=torch.Generator().manual_seed(0))
    pixels = pixels.to(torch.uint8)
    for size in ([64, 150], [301, 40], [20, 97], [400, 400]):
        reference = TF.resize(
            pixels.double() / 255, size, interpolation=InterpolationMode(interpolation),
            antialias=True,
        )  # fmt: skip
        resized = module._resize(pixels, size, interpolation)
        assert resized.dtype == torch.float32
        torch.testing.assert_close(resized.double(), reference, rtol=0, atol=1e-4)


def test_a_big_gray_photo_costs_its_decoded_size_not_a_float_copy(tmp_path) -> None:
    """A 4000x4000 gray PNG (48 MB as RGB uint8) read and preprocessed as the CLI does: numpy
    holds the gray and RGB arrays at most (no full-size float copy: 192 MB each), and no torch
    op allocates more than a strip of rows (the old path made the whole photo float32)."""
    from PIL import Image
    from torch.profiler import ProfilerActivity, profile

    from camkit.cli.dataset import ImageFiles

    side = 4000
    gray = (np.add.outer(np.arange(side), np.arange(side)) % 256).astype(np.uint8)
    Image.fromarray(gray).save(tmp_path / "big.png", compress_level=1)
    transform = Preprocess(224, (0.5,) * 3, (0.5,) * 3, interpolation="bicubic")
    files = ImageFiles([tmp_path / "big.png"], transform, keep_original=False, max_pixels=None)
    decoded = side * side * 3
    tracemalloc.start()
    try:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiled:
            item = files[0]
        numpy_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert item["error"] is None and item["input"].shape == (3, 224, 224)
    assert numpy_peak < decoded * 1.75  # the RGB array and the gray one it repeats
    largest = max(event.cpu_memory_usage for event in profiled.events())
    assert largest < decoded / 3  # a strip (12.6 MB) or the (3, 4000, 256) pass, not 192 MB
    torch.testing.assert_close(
        item["input"], transform(np.repeat(gray[:, :, None], 3, axis=2)), rtol=0, atol=0
    )

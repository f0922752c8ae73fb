"""camkit.models: offline loading, safe checkpoints, labels, preprocessing, default layers."""

from __future__ import annotations

import os
import pickle
import socket

import numpy as np
import pytest
import torch
from conftest import assert_untouched, model_state
from PIL import Image
from safetensors.torch import save_file
from skimage import data as skdata
from torch import nn
from torchvision.models import resnet18

from camkit import models

CAT_CLASSES = range(281, 286)  # tabby, tiger cat, Persian, Siamese, Egyptian cat
CUP_CLASSES = {504, 967, 968}  # coffee mug, espresso, cup


def _tiny_cnn() -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(4, 6, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(6, 2),
    )


@pytest.fixture(scope="module")
def lite0() -> models.LoadedModel:
    return models.load()


@pytest.fixture
def random_resnet18() -> nn.Module:
    torch.manual_seed(0)
    return resnet18(weights=None).eval()


def _outputs_equal(first: nn.Module, second: nn.Module, size: int = 64) -> bool:
    x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return torch.equal(first(x), second(x))


@pytest.mark.slow
def test_default_model_recognises_cat_and_coffee(lite0: models.LoadedModel) -> None:
    cat = lite0.predict(skdata.chelsea())
    cup = lite0.predict(skdata.coffee())
    assert cat[0][0] in CAT_CLASSES, cat
    assert cup[0][0] in CUP_CLASSES, cup
    assert cat[0][2] + cat[1][2] + cat[2][2] > 0.8  # confident: the preprocessing is right
    assert cup[0][2] > 0.8


def test_default_model_description(lite0: models.LoadedModel) -> None:
    assert lite0.name == "efficientnet_lite0"
    assert not lite0.model.training
    assert lite0.default_layer == "bn2"
    assert lite0.input_size == (224, 224)
    assert lite0.preprocess.mean == (0.5, 0.5, 0.5) and lite0.preprocess.std == (0.5, 0.5, 0.5)
    assert lite0.preprocess.interpolation == "bicubic" and lite0.preprocess.crop_pct == 0.875
    assert len(lite0.labels) == 1000


def test_top_classes_in_order() -> None:
    probabilities = torch.tensor([0.1, 0.6, 0.05, 0.25])
    top = models.top_classes(probabilities, ["a", "b", "c", "d"], k=3)
    assert [(i, label) for i, label, _ in top] == [(1, "b"), (3, "d"), (0, "a")]
    assert [p for _, _, p in top] == pytest.approx([0.6, 0.25, 0.1])
    assert len(models.top_classes(probabilities, ["a", "b", "c", "d"], k=9)) == 4


def test_imagenet_labels() -> None:
    labels = models.imagenet_labels()
    assert len(labels) == 1000 and len(set(labels)) == 1000
    assert labels[281] == "tabby" and labels[285] == "Egyptian cat"
    assert labels[967] == "espresso" and labels[0] == "tench"
    labels[0] = "changed"
    assert models.imagenet_labels()[0] == "tench"


@pytest.mark.parametrize(
    "image",
    [
        np.full((60, 90, 3), 128, np.uint8),
        np.full((60, 90), 128, np.uint8),
        np.full((60, 90, 4), 128, np.uint8),
        torch.full((3, 60, 90), 128 / 255),
        Image.fromarray(np.full((60, 90, 3), 128, np.uint8)),
    ],
    ids=["uint8-hwc", "gray", "rgba", "float-chw-tensor", "pil"],
)
def test_preprocess_accepts_common_images(image: object) -> None:
    x = models.preprocess(image, 32, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
    assert x.shape == (3, 32, 32) and x.dtype == torch.float32
    assert torch.allclose(x, torch.full_like(x, 128 / 255 * 2 - 1), atol=1e-5)


def test_preprocess_crops_the_center_as_resize_crop_shows() -> None:
    image = np.zeros((100, 300, 3), np.uint8)
    image[:, 100:200] = 255  # a white square in the middle of a wide black image
    transform = models.Preprocess(size=(50, 50), crop_pct=1.0, interpolation="nearest")
    seen = transform.resize_crop(image)
    assert seen.shape == (50, 50, 3) and seen.min() == 255
    normalised = transform(image)
    expected = (torch.from_numpy(seen).permute(2, 0, 1) / 255 - 0.485) / 0.229
    assert torch.allclose(normalised[0], expected[0], atol=1e-5)
    wide = models.Preprocess(size=(20, 40), crop_pct=1.0)(image)
    assert wide.shape == (3, 20, 40)


def test_preprocess_refuses_a_normalised_tensor() -> None:
    with pytest.raises(ValueError, match=r"values in \[0, 1\]"):
        models.preprocess(torch.randn(3, 32, 32) * 3)
    with pytest.raises(ValueError, match="channels"):
        models.preprocess(np.zeros((32, 32, 5), np.uint8))


def test_default_layer_resnet18_leaves_the_model_alone(random_resnet18: nn.Module) -> None:
    random_resnet18.train()
    before = model_state(random_resnet18)
    stats = random_resnet18.bn1.running_mean.clone()
    assert models.default_layer(random_resnet18, (64, 64)) == "layer4"
    assert_untouched(random_resnet18, before)
    assert torch.equal(random_resnet18.bn1.running_mean, stats)


def test_default_layer_tiny_sequential() -> None:
    assert models.default_layer(_tiny_cnn(), (16, 16)) == "3"


def test_default_layer_without_a_spatial_map_raises() -> None:
    with pytest.raises(ValueError, match="4-D"):
        models.default_layer(nn.Sequential(nn.Flatten(), nn.LazyLinear(2)), (8, 8))


class _TinyViT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, 8, 4, stride=4)
        self.block = nn.Linear(8, 8)
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.patch(x).flatten(2).transpose(1, 2)
        return self.head(self.block(tokens).mean(dim=1))


def test_default_layer_warns_for_token_models() -> None:
    with pytest.warns(UserWarning, match="token sequences"):
        assert models.default_layer(_TinyViT(), 16) == "patch"


def test_layer_shapes_in_call_order() -> None:
    rows = models.layer_shapes(_tiny_cnn(), (16, 16))
    assert [name for name, _, _ in rows] == ["0", "1", "2", "3", "4", "5", "6"]
    assert rows[0] == ("0", "Conv2d", (1, 4, 16, 16))
    assert rows[3] == ("3", "ReLU", (1, 6, 8, 8))
    assert rows[-1] == ("6", "Linear", (1, 2))


def test_torchvision_state_dict_round_trip(tmp_path, random_resnet18: nn.Module) -> None:
    path = tmp_path / "resnet18.pt"
    torch.save(random_resnet18.state_dict(), path)
    loaded = models.load("torchvision:resnet18", weights=path)
    assert loaded.name == "torchvision:resnet18" and loaded.default_layer == "layer4"
    assert loaded.labels[281] == "tabby" and not loaded.model.training
    assert _outputs_equal(loaded.model, random_resnet18)
    # the layers' readability kept from load's trace is what a fresh trace answers
    assert loaded.layers == models.map_layers(loaded.model, loaded.input_size)
    assert list(loaded.layers) == list(models.map_layers(loaded.model, loaded.input_size))


def test_nested_and_dataparallel_state_dict(tmp_path, random_resnet18: nn.Module) -> None:
    prefixed = {f"module.{k}": v for k, v in random_resnet18.state_dict().items()}
    path = tmp_path / "checkpoint.pth"
    torch.save({"epoch": 3, "state_dict": prefixed, "best": 0.5}, path)
    loaded = models.load("torchvision:resnet18", weights=str(path))
    assert _outputs_equal(loaded.model, random_resnet18)


def test_safetensors_round_trip(tmp_path, random_resnet18: nn.Module) -> None:
    path = tmp_path / "resnet18.safetensors"
    save_file({k: v.contiguous() for k, v in random_resnet18.state_dict().items()}, path)
    loaded = models.load("torchvision:resnet18", weights=path)
    assert _outputs_equal(loaded.model, random_resnet18)


def test_classifier_size_is_read_from_the_checkpoint(tmp_path) -> None:
    fine_tuned = resnet18(weights=None, num_classes=10).eval()
    path = tmp_path / "ten.pt"
    torch.save(fine_tuned.state_dict(), path)
    loaded = models.load("torchvision:resnet18", weights=path)
    assert loaded.labels == [f"class {i}" for i in range(10)]
    assert _outputs_equal(loaded.model, fine_tuned)


@pytest.mark.slow
def test_timm_round_trip_and_suggestions(tmp_path) -> None:
    import timm

    torch.manual_seed(0)
    original = timm.create_model("test_convnext", pretrained=False).eval()
    pt_path, st_path = tmp_path / "convnext.pth", tmp_path / "convnext.safetensors"
    torch.save(original.state_dict(), pt_path)
    save_file({k: v.contiguous() for k, v in original.state_dict().items()}, st_path)
    for path in (pt_path, st_path):
        loaded = models.load("timm:test_convnext", weights=path)
        assert _outputs_equal(loaded.model, original, size=loaded.input_size[0])
    with pytest.raises(models.UnknownModelError, match="'timm:convnext_tiny'"):
        models.load("timm:convnext_tinny")
    with pytest.raises(models.UnknownModelError, match="'torchvision:resnet18'") as caught:
        models.load("resnet18")
    assert "'timm:resnet18'" in str(caught.value)


def test_random_weights_warn() -> None:
    with pytest.warns(models.RandomWeightsWarning, match="meaningless"):
        loaded = models.load("torchvision:resnet18")
    assert loaded.default_layer == "layer4"


def test_nothing_is_downloaded(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("camkit tried to reach the network")

    monkeypatch.setenv("TORCH_HOME", str(tmp_path))  # no cached weights to fall back on
    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    monkeypatch.setattr(socket.socket, "connect", no_network)
    with pytest.warns(models.RandomWeightsWarning):
        segmenter = models.load("torchvision:lraspp_mobilenet_v3_large")  # has a backbone
    assert segmenter.labels == []  # the output is a dict of maps, not class logits
    assert not any(tmp_path.iterdir())


def test_whole_pickled_model_is_refused(tmp_path) -> None:
    path = tmp_path / "whole.pt"
    torch.save(_tiny_cnn(), path)
    with pytest.raises(models.UnsafeCheckpointError, match="state_dict"):
        models.load("torchvision:resnet18", weights=path)
    with pytest.raises(models.UnsafeCheckpointError):
        models.load(str(path))


class _Payload:
    """Unpickling this creates a folder: harmless proof that pickled code ran."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


@pytest.mark.filterwarnings("ignore:Detected pickle protocol:UserWarning")
@pytest.mark.parametrize(
    ("writer", "error"),
    [
        ("torch.save", models.UnsafeCheckpointError),
        ("pickle protocol 2", models.UnsafeCheckpointError),
        ("pickle protocol 5", ValueError),  # opcodes the safe unpickler does not read at all
    ],
)
def test_malicious_pickle_is_refused_without_running(tmp_path, writer: str, error: type) -> None:
    proof = tmp_path / "payload-works"
    pickle.loads(pickle.dumps(_Payload(str(proof))))
    assert proof.is_dir()  # the payload is real

    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    if writer == "torch.save":
        torch.save({"weight": _Payload(str(marker))}, path)
    else:
        path.write_bytes(pickle.dumps(_Payload(str(marker)), protocol=int(writer[-1])))
    with pytest.raises(error, match="nothing in it was run"):
        models.read_state_dict(path)
    with pytest.raises(error):
        models.load("torchvision:resnet18", weights=path)
    assert not marker.exists()


def test_a_state_dict_alone_needs_an_architecture(tmp_path, random_resnet18: nn.Module) -> None:
    path = tmp_path / "weights.pt"
    torch.save(random_resnet18.state_dict(), path)
    with pytest.raises(ValueError, match="torchvision:<arch>"):
        models.load(path)


def test_a_checkpoint_that_names_its_architecture_loads_alone(
    tmp_path, random_resnet18: nn.Module
) -> None:
    state = random_resnet18.state_dict()
    saved = tmp_path / "named.pt"
    torch.save({"arch": "torchvision:resnet18", "state_dict": state, "epoch": 3}, saved)
    tagged = tmp_path / "named.safetensors"
    save_file(state, tagged, metadata={"arch": "torchvision:resnet18"})
    for path in (saved, str(tagged)):
        loaded = models.load(path)
        assert _outputs_equal(loaded.model, random_resnet18)
        assert loaded.name == str(path) and loaded.default_layer == "layer4"
    with pytest.raises(ValueError, match="architecture name with weights="):
        models.load(saved, weights=saved)


def test_not_a_checkpoint(tmp_path) -> None:
    path = tmp_path / "noise.pt"
    path.write_bytes(b"definitely not a checkpoint")
    with pytest.raises(ValueError, match="not a") as caught:
        models.read_state_dict(path)
    assert not isinstance(caught.value, models.UnsafeCheckpointError)
    with pytest.raises(FileNotFoundError):
        models.read_state_dict(tmp_path / "missing.pt")


def test_unknown_architecture_suggests_close_names() -> None:
    with pytest.raises(models.UnknownModelError, match="'torchvision:resnet18'"):
        models.load("torchvision:resnet1B")


def test_mismatched_checkpoint_lists_names(tmp_path, random_resnet18: nn.Module) -> None:
    path = tmp_path / "resnet18.pt"
    torch.save(random_resnet18.state_dict(), path)
    with pytest.raises(models.CheckpointMismatchError, match=r"missing from the file: layer1\.2"):
        models.load("torchvision:resnet34", weights=path)
    broken = random_resnet18.state_dict()
    broken["conv1.weight"] = torch.zeros(64, 3, 5, 5)
    torch.save(broken, path)
    with pytest.raises(
        models.CheckpointMismatchError, match=r"conv1\.weight: file \(64, 3, 5, 5\)"
    ):
        models.load("torchvision:resnet18", weights=path)

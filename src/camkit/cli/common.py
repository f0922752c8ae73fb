"""What the subcommands share: usage errors, exit codes, argument checks, loading the model."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from camkit import models, registry
from camkit.cli.files import find_images
from camkit.errors import CamkitError
from camkit.viz.colour import colormap_lut

EXIT_OK = 0
EXIT_UNREADABLE_IMAGES = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141

BATCH_SIZE = registry.BATCH_SIZE  # rows per forward pass, in every command and method that loops


class UsageError(Exception):
    """A command line that cannot run as given: one line on stderr, exit status 2."""


def exit_status(unreadable: Sequence[str]) -> int:
    """``EXIT_OK``, or ``EXIT_UNREADABLE_IMAGES`` after naming those images on stderr."""
    if not unreadable:
        return EXIT_OK
    count = len(unreadable)
    print(f"camkit: {count} image(s) could not be read: {', '.join(unreadable)}", file=sys.stderr)
    return EXIT_UNREADABLE_IMAGES


def parse_methods(spec: str) -> list[str]:
    """``"gradcam,layercam"`` -> ``["gradcam", "layercam"]``; unknown names are usage errors."""
    methods = list(dict.fromkeys(name.strip().lower() for name in spec.split(",")))
    for name in methods:
        try:
            registry.get(name)
        except CamkitError as error:
            raise UsageError(str(error)) from None
    return methods


def _labelled(indices: Sequence[int], labels: Sequence[str], limit: int = 8) -> str:
    shown = ", ".join(f"{labels[i]!r} ({i})" for i in indices[:limit])
    return shown + (f", ... ({len(indices)} in all)" if len(indices) > limit else "")


def match_label(name: str, labels: Sequence[str]) -> int:
    """Class index of a label: exact (case-insensitive), else the one label containing ``name``."""
    wanted = name.strip().lower()
    lowered = [label.lower() for label in labels]
    exact = [i for i, label in enumerate(lowered) if label == wanted]
    matches = exact or [i for i, label in enumerate(lowered) if wanted and wanted in label]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise UsageError(
            f"--target {name!r} matches {len(matches)} classes: {_labelled(matches, labels)}; "
            "give the full name or the class index"
        )
    close = difflib.get_close_matches(wanted, lowered, n=5, cutoff=0.6)
    hint = f"; close: {_labelled([lowered.index(c) for c in close], labels)}" if close else ""
    raise UsageError(f"--target {name!r} is not a class name of this model{hint}")


def parse_target(spec: str, labels: Sequence[str]) -> list[int] | None:
    """``top1`` -> None; ``"281,285"`` -> ``[281, 285]``; a label -> ``[its index]``."""
    if spec.strip().lower() == "top1":
        return None
    parts = [part.strip() for part in spec.split(",")]
    if all(part.lstrip("-").isdigit() for part in parts):
        classes = list(dict.fromkeys(int(part) for part in parts))
        bad = [c for c in classes if not 0 <= c < len(labels)]
        if bad:
            raise UsageError(
                f"--target class {bad[0]} is out of range: this model has {len(labels)} "
                f"classes, 0..{len(labels) - 1}"
            )
        return classes
    return [match_label(spec, labels)]


def check_colormap(name: str) -> None:
    """Fail early on a colormap name that :mod:`camkit.viz` does not know."""
    try:
        colormap_lut(name)
    except ValueError as error:
        raise UsageError(f"--colormap: {error}") from None


def pick_device(choice: str, local_rank: int = 0) -> torch.device:
    """``auto`` -> cuda when available, else cpu; ``cuda`` without CUDA is a usage error.
    Under torchrun each process on a machine takes its own GPU, ``cuda:LOCAL_RANK``."""
    if choice == "cuda" and not torch.cuda.is_available():
        raise UsageError(
            "--device cuda: no CUDA device is available to this PyTorch "
            f"({torch.__version__}); use --device cpu or auto"
        )
    if choice == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", local_rank % torch.cuda.device_count())


def load_model(
    name: str,
    weights: str | None,
    labels: str | None = None,
    *,
    crop: str | None = None,
    clip_length: int | None = None,
) -> models.LoadedModel:
    """:func:`camkit.models.load`, errors as usage errors and warnings as stderr lines; ``crop``
    replaces the model's own (None keeps it); ``clip_length``: a video model's frames per clip."""
    for option, path in (("--weights", weights), ("--labels", labels)):
        if path is not None and not Path(path).is_file():
            raise UsageError(f"{option} {path}: no such file")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", models.RandomWeightsWarning)
        try:
            loaded = models.load(name, weights=weights, labels=labels, clip_length=clip_length)
        except (CamkitError, FileNotFoundError) as error:
            raise UsageError(f"--model {name}: {error}") from None
    for warning in caught:
        message = str(warning.message)
        if issubclass(warning.category, models.RandomWeightsWarning):  # in the CLI's words
            message = (
                f"--model {name} has no weights: it is randomly initialised, so its predictions "
                "and maps are meaningless; pass --weights PATH (.pt, .pth or .safetensors)"
            )
        print(f"camkit: warning: {message}", file=sys.stderr)
    if crop is not None:
        loaded.preprocess = dataclasses.replace(loaded.preprocess, crop_mode=crop)
    return loaded


def pick_layer(loaded: models.LoadedModel, layer: str | None, methods: Sequence[str]) -> str:
    """The layer the methods explain: ``--layer`` checked against the model, or the default."""
    needs_layer = any(registry.get(method).needs_layer for method in methods)
    if layer is None:
        layer = loaded.default_layer
        if needs_layer:
            print(f"layer: {layer} (auto)", file=sys.stderr)
        return layer
    if not needs_layer:
        return layer
    readable = loaded.layers
    if readable is None:  # a model whose layers were not mapped when it was loaded
        readable = models.map_layers(loaded.model, loaded.input_size)
    why = readable.get(layer, "no such layer")
    if why is not None:  # refused before any work: the layers that would do instead
        names = [name for name, reason in readable.items() if reason is None]
        close = difflib.get_close_matches(layer, names, n=3, cutoff=0.4)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise UsageError(
            f"--layer {layer}: {why}; {hint}the default is {loaded.default_layer} "
            "('camkit layers' lists the layers a CAM can read)"
        )
    return layer


def check_out_dir(out: Path) -> None:
    """``--out`` is a folder or can be made, checked before anything is written."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} exists and is not a directory")
    full = out.absolute()
    existing = next(path for path in (full, *full.parents) if path.exists())
    if not existing.is_dir():
        raise UsageError(f"--out {out}: {existing} is a file, not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"--out {out}: {existing} is not writable")


def image_paths(images: Sequence[str], say_skipped: bool = True) -> list[Path]:
    """The image files of the command line's files and folders (:func:`find_images`), saying
    on stderr what a folder held besides (``say_skipped``: on one rank only)."""
    try:
        found = find_images(images)
    except CamkitError as error:
        raise UsageError(str(error)) from None
    if say_skipped:
        found.report()
    return found.paths


def check_run_inputs(
    args: argparse.Namespace,
    own_check: Callable[[list[Path], list[str]], Any] | None = None,
    *,
    local_rank: int = 0,
) -> tuple[list[Path], list[str], Path, torch.device, Any]:
    """The inputs of :func:`add_run_arguments` checked in the order a refused run reports them:
    the images, ``--method``, the command's ``own_check(paths, methods)``, ``--out`` (nothing
    written), ``--device`` (``local_rank``: see :func:`pick_device`) -> the paths, methods, out,
    device and what ``own_check`` returned."""
    paths = image_paths(args.images, local_rank == 0)
    methods = parse_methods(args.method)
    checked = None if own_check is None else own_check(paths, methods)
    out = Path(args.out)
    check_out_dir(out)
    return paths, methods, out, pick_device(args.device, local_rank), checked


def load_run_model(
    args: argparse.Namespace, methods: Sequence[str], *, one_class: bool = False
) -> tuple[models.LoadedModel, list[int] | None, str]:
    """The model, the ``--target`` classes (None: top1; ``one_class``: only one) and the layer
    of :func:`add_run_arguments`."""
    clip = getattr(args, "clip_length", None)  # camkit explain's, for video models
    loaded = load_model(args.model, args.weights, args.labels, crop=args.crop, clip_length=clip)
    classes = parse_target(args.target, loaded.labels)
    if one_class and classes is not None and len(classes) > 1:
        raise UsageError(f"--target: {args.command} scores one class per image (or top1)")
    return loaded, classes, pick_layer(loaded, args.layer, methods)


def wants_report(args: argparse.Namespace) -> bool:
    """``--report`` as given, else whether an input is a folder (the report's default)."""
    return args.report if args.report is not None else any(map(os.path.isdir, args.images))

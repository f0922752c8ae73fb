"""The ``camkit`` command: ``explain`` images, list a model's ``layers``, run the ``demo``.

This module parses arguments, finds and batches image files, names and writes the outputs and
the manifest, and chooses exit codes; every map, overlay and model comes from the library.

Exit status: 0 all written, 1 some images could not be read (the others are written),
2 a usage error (bad flag, unknown model/method/layer/class, missing path), 130 interrupted.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import io
import json
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TextIO

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError
from torch import Tensor, nn

import camkit
from camkit import models, viz
from camkit.cam import METHODS as CAM_METHODS
from camkit.capture import LayerNotFoundError, LayerOutputError, find_layer
from camkit.perturb import AblationCAM, ScoreCAM
from camkit.pixel import (
    GuidedBackprop,
    GuidedGradCAM,
    IntegratedGradients,
    Saliency,
    SmoothGrad,
    to_heatmap,
)

EXIT_OK = 0
EXIT_UNREADABLE_IMAGES = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141

IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp"})
PERTURBATION_METHODS = ("scorecam", "ablationcam")
PIXEL_METHODS = ("saliency", "smoothgrad", "ig", "guided", "guided-gradcam")
ALL_METHODS = (*CAM_METHODS, *PERTURBATION_METHODS, *PIXEL_METHODS)
LAYERLESS_METHODS = frozenset({"saliency", "smoothgrad", "ig", "guided"})
TOP_K = 5
PIXEL_HEATMAP_PERCENTILE = 99.0
FORWARD_ROWS = 32  # rows per forward pass inside SmoothGrad, IG, Score-CAM and Ablation-CAM

DEMO_METHODS = ("gradcam", "gradcam++", "layercam", "eigencam", "guided-gradcam")


class UsageError(Exception):
    """A command line that cannot run as given: one line on stderr, exit status 2."""


# ----------------------------------------------------------------------------- small helpers


def save_npy(path: Path, array: np.ndarray) -> None:
    """``np.save`` written atomically."""
    buffer = io.BytesIO()
    np.save(buffer, array)
    viz.write_atomic(path, buffer.getvalue())


def save_json(path: Path, value: object) -> None:
    """Indented JSON written atomically."""
    viz.write_atomic(path, (json.dumps(value, indent=2) + "\n").encode("utf-8"))


class ProgressBar:
    """``[#########...........] 12/40 images`` redrawn on a terminal; silent otherwise."""

    WIDTH = 30

    def __init__(self, total: int, stream: TextIO):
        self.total = total
        self.done = 0
        self.stream = stream
        self.enabled = stream.isatty() and total > 0
        self._draw()

    def advance(self, count: int) -> None:
        self.done += count
        self._draw()

    def message(self, text: str) -> None:
        """Print a line without tearing the bar."""
        if self.enabled:
            self.stream.write("\r\033[K")
        print(text, file=self.stream)
        self._draw()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()

    def _draw(self) -> None:
        if not self.enabled:
            return
        filled = self.WIDTH * self.done // self.total
        bar = "#" * filled + "." * (self.WIDTH - filled)
        self.stream.write(f"\r[{bar}] {self.done}/{self.total} images")
        self.stream.flush()


# ----------------------------------------------------------------------------- argument checks


def find_images(paths: Sequence[str]) -> list[Path]:
    """Files as given, and each directory's image files (not recursive, sorted, no dot-files)."""
    found: list[Path] = []
    for given in paths:
        path = Path(given)
        if path.is_dir():
            inside = sorted(
                entry
                for entry in path.iterdir()
                if entry.is_file()
                and entry.suffix.lower() in IMAGE_SUFFIXES
                and not entry.name.startswith(".")
            )
            if not inside:
                suffixes = ", ".join(sorted(s.lstrip(".") for s in IMAGE_SUFFIXES))
                raise UsageError(f"no image files ({suffixes}) in directory {given}")
            found.extend(inside)
        elif path.exists():
            found.append(path)
        else:
            raise UsageError(f"no such file or directory: {given}")
    return found


def parse_methods(spec: str) -> list[str]:
    """``"gradcam,layercam"`` -> ``["gradcam", "layercam"]``; unknown names are usage errors."""
    methods = list(dict.fromkeys(name.strip().lower() for name in spec.split(",")))
    for name in methods:
        if name not in ALL_METHODS:
            close = difflib.get_close_matches(name, ALL_METHODS, n=3, cutoff=0.5)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise UsageError(f"unknown method {name!r}{hint}; choose from {', '.join(ALL_METHODS)}")
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
    """Fail early on a colormap name that :func:`camkit.viz.overlay` does not know."""
    try:
        viz.overlay(np.zeros((1, 1, 3), np.uint8), np.zeros((1, 1), np.float32), colormap=name)
    except ValueError as error:
        raise UsageError(f"--colormap: {error}") from None


def pick_device(choice: str) -> torch.device:
    """``auto`` -> cuda when available, else cpu; ``cuda`` without CUDA is a usage error."""
    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if choice == "cuda" and not torch.cuda.is_available():
        raise UsageError(
            "--device cuda: no CUDA device is available to this PyTorch "
            f"({torch.__version__}); use --device cpu or auto"
        )
    return torch.device(choice)


def load_model(name: str, weights: str | None) -> models.LoadedModel:
    """:func:`camkit.models.load` with its errors as usage errors and warnings as stderr lines."""
    if weights is not None and not Path(weights).is_file():
        raise UsageError(f"--weights {weights}: no such file")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", models.RandomWeightsWarning)
        try:
            loaded = models.load(name, weights=weights)
        except (ValueError, FileNotFoundError) as error:
            raise UsageError(f"--model {name}: {error}") from None
    for warning in caught:
        print(f"camkit: warning: {warning.message}", file=sys.stderr)
    return loaded


def pick_layer(loaded: models.LoadedModel, layer: str | None, methods: Sequence[str]) -> str:
    """The layer the methods explain: ``--layer`` checked against the model, or the default."""
    if layer is None:
        layer = loaded.default_layer
        if any(method not in LAYERLESS_METHODS for method in methods):
            print(f"layer: {layer} (auto)", file=sys.stderr)
        return layer
    try:
        find_layer(loaded.model, layer)
    except LayerNotFoundError as error:
        raise UsageError(f"--layer: {error}") from None
    return layer


# ----------------------------------------------------------------------------- explaining


@dataclasses.dataclass(frozen=True)
class Job:
    """What to explain and how to write it, checked and resolved from the command line."""

    methods: tuple[str, ...]
    layer: str
    classes: tuple[int, ...] | None  # None: each image's top-1 class
    out: Path
    device: torch.device
    batch_size: int = 8
    alpha: float = 0.5
    colormap: str = "jet"
    save_raw: bool = False


Explainer = Callable[[Tensor, list[list[int]]], Tensor]


def build_explainer(method: str, model: nn.Module, layer: str) -> Explainer:
    """The library's explainer for ``method``: ``(batch (B, 3, H, W), B lists of K classes)``.

    The methods that loop (SmoothGrad, Integrated Gradients, Score-CAM, Ablation-CAM) run
    :data:`FORWARD_ROWS` rows per forward pass. SmoothGrad is seeded: reruns agree.
    """
    if method in CAM_METHODS:
        return CAM_METHODS[method](model, layer)
    perturbation = {"scorecam": ScoreCAM, "ablationcam": AblationCAM}
    if method in perturbation:
        return perturbation[method](model, layer, batch_size=FORWARD_ROWS)
    if method == "smoothgrad":
        return SmoothGrad(model, batch_size=FORWARD_ROWS, seed=0)
    if method == "ig":
        return IntegratedGradients(model, batch_size=FORWARD_ROWS)
    if method == "guided-gradcam":
        return GuidedGradCAM(model, layer)
    return {"saliency": Saliency, "guided": GuidedBackprop}[method](model)


def run_method(
    method: str, explainer: Explainer, batch: Tensor, classes: list[list[int]]
) -> tuple[Tensor, Tensor]:
    """``K`` classes per image -> ``(heatmaps (B, K, H, W) in [0, 1], raw maps)`` on the CPU.

    Raw maps are what the method gives: ``(B, K, H, W)`` CAMs in [0, 1], or ``(B, K, 3, H, W)``
    signed pixel attributions; a map that ignores the target (Eigen-CAM) is repeated ``K``
    times. The heatmap of a pixel attribution is ``max_c |attribution|`` divided by its 99th
    percentile and clipped at 1: gradients are spiky, and without the clipping a handful of
    pixels would take the whole colour range (Smilkov et al. 2017).
    """
    maps = explainer(batch, classes).detach().float()
    pixel = method in PIXEL_METHODS
    if maps.ndim == (4 if pixel else 3):
        maps = maps.unsqueeze(1).expand(-1, len(classes[0]), *maps.shape[1:])
    heat = to_heatmap(maps, "abs-max", percentile=PIXEL_HEATMAP_PERCENTILE) if pixel else maps
    return heat.cpu(), maps.cpu()


def read_image(path: Path) -> np.ndarray:
    """An image file -> ``HxWx3`` uint8 RGB, upright (EXIF orientation applied), first frame."""
    with Image.open(path) as image:
        upright = ImageOps.exif_transpose(image)
        if upright.mode.startswith("I;16"):
            return viz.to_rgb_uint8(np.asarray(upright).astype(np.uint16))
        return np.asarray(upright.convert("RGB"))


READ_ERRORS = (OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError)


def read_failure(error: BaseException) -> str:
    if isinstance(error, UnidentifiedImageError):
        return "not an image file that Pillow can decode"
    return str(error) or type(error).__name__


def unique_stems(paths: Sequence[Path]) -> list[str]:
    """File stems, with ``-2``, ``-3``... added where two inputs share a stem."""
    stems: list[str] = []
    used: set[str] = set()
    for path in paths:
        stem, count = path.stem, 1
        while stem in used:
            count += 1
            stem = f"{path.stem}-{count}"
        used.add(stem)
        stems.append(stem)
    return stems


def batches(items: Sequence, size: int) -> Iterator[Sequence]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def class_probabilities(model: nn.Module, batch: Tensor) -> Tensor:
    """The model's softmax ``(B, num_classes)`` for a batch, as float32 on the CPU."""
    with torch.no_grad():
        return model(batch).float().softmax(dim=-1).cpu()


def top_k(probabilities: Tensor, labels: Sequence[str], k: int = TOP_K) -> list[dict]:
    """``[{index, label, probability}]`` of the ``k`` most probable classes of one image."""
    return [
        {"index": index, "label": label, "probability": probability}
        for index, label, probability in models.top_classes(probabilities, labels, k)
    ]


def explain_files(
    loaded: models.LoadedModel, paths: Sequence[Path], job: Job, progress: ProgressBar
) -> list[dict]:
    """Explain every image, write overlays (and raw maps), keep ``manifest.json`` up to date.

    Images are resized to the model's input size without cropping, so each map covers the
    whole photo; :func:`camkit.viz.overlay` stretches it back onto the photo at its own size.
    The manifest is rewritten after every batch, so an interrupted run leaves a valid one.
    """
    job.out.mkdir(parents=True, exist_ok=True)
    manifest = job.out / "manifest.json"
    squash = dataclasses.replace(loaded.preprocess, crop_mode="squash")
    model = loaded.model.to(job.device)
    explainers = {method: build_explainer(method, model, job.layer) for method in job.methods}
    records: list[dict] = []
    for chunk in batches(list(zip(paths, unique_stems(paths), strict=True)), job.batch_size):
        by_image: dict[str, list[dict]] = {}
        readable = []
        for path, stem in chunk:
            try:
                readable.append((path, stem, read_image(path)))
            except READ_ERRORS as error:
                reason = read_failure(error)
                progress.message(f"camkit: cannot read {path}: {reason}")
                by_image[stem] = [{"image": str(path), "error": reason}]
        if readable:
            by_image |= explain_batch(loaded, explainers, squash, readable, job)
        records.extend(record for _, stem in chunk for record in by_image[stem])
        save_json(manifest, records)
        progress.advance(len(chunk))
    return records


def explain_batch(
    loaded: models.LoadedModel,
    explainers: dict[str, Explainer],
    squash: models.Preprocess,
    images: Sequence[tuple[Path, str, np.ndarray]],
    job: Job,
) -> dict[str, list[dict]]:
    """One batch through the model and each method: write the files; records by image stem."""
    batch = torch.stack([squash(image) for _, _, image in images]).to(job.device)
    probabilities = class_probabilities(loaded.model, batch)
    if job.classes is None:
        classes = [[top1] for top1 in probabilities.argmax(dim=-1).tolist()]
    else:
        classes = [list(job.classes) for _ in images]
    records: dict[str, list[dict]] = {stem: [] for _, stem, _ in images}
    for method, explainer in explainers.items():
        heat, raw = run_method(method, explainer, batch, classes)
        for row, (path, stem, image) in enumerate(images):
            for column, target in enumerate(classes[row]):
                name = f"{stem}_{method}_{target}"
                overlay = viz.overlay(image, heat[row, column], job.alpha, job.colormap)
                viz.save_png(job.out / f"{name}.png", overlay)
                record = {"image": str(path), "output": f"{name}.png"}
                if job.save_raw:
                    save_npy(job.out / f"{name}.npy", raw[row, column].numpy())
                    record["raw"] = f"{name}.npy"
                records[stem].append(
                    record
                    | {
                        "method": method,
                        "layer": None if method in LAYERLESS_METHODS else job.layer,
                        "target": target,
                        "label": loaded.labels[target],
                        "probability": probabilities[row, target].item(),
                        "top5": top_k(probabilities[row], loaded.labels),
                        "model": loaded.name,
                        "size": [image.shape[1], image.shape[0]],
                    }
                )
    return records


# ----------------------------------------------------------------------------- commands


def check_out_dir(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} exists and is not a directory")


def run_explain(args: argparse.Namespace) -> int:
    """``camkit explain``: check everything, then explain the images batch by batch."""
    paths = find_images(args.images)
    methods = parse_methods(args.method)
    check_colormap(args.colormap)
    check_out_dir(Path(args.out))
    device = pick_device(args.device)
    loaded = load_model(args.model, args.weights)
    classes = parse_target(args.target, loaded.labels)
    job = Job(
        methods=tuple(methods),
        layer=pick_layer(loaded, args.layer, methods),
        classes=None if classes is None else tuple(classes),
        out=Path(args.out),
        device=device,
        batch_size=args.batch_size,
        alpha=args.alpha,
        colormap=args.colormap,
        save_raw=args.save_raw,
    )
    records = explain_with_progress(loaded, paths, job)
    failed = sum("error" in record for record in records)
    print(
        f"wrote {len(records) - failed} overlay(s) of {len(paths) - failed} image(s) to "
        f"{job.out} (manifest: {job.out / 'manifest.json'})"
    )
    if failed:
        print(f"camkit: {failed} image(s) could not be read (see the manifest)", file=sys.stderr)
        return EXIT_UNREADABLE_IMAGES
    return EXIT_OK


def explain_with_progress(
    loaded: models.LoadedModel, paths: Sequence[Path], job: Job
) -> list[dict]:
    """:func:`explain_files` with a progress bar; an unusable layer is a usage error."""
    progress = ProgressBar(len(paths), sys.stderr)
    try:
        return explain_files(loaded, paths, job, progress)
    except LayerOutputError as error:
        raise UsageError(f"--layer {job.layer}: {error}") from None
    finally:
        progress.close()


def run_layers(args: argparse.Namespace) -> int:
    """``camkit layers``: every module call with its output shape; ``*`` marks the default layer."""
    loaded = load_model(args.model, args.weights)
    size = loaded.input_size if args.input_size is None else (args.input_size, args.input_size)
    try:
        rows = models.layer_shapes(loaded.model, size)
    except RuntimeError as error:
        raise UsageError(
            f"--input-size {size[0]}x{size[1]} does not fit the model: {error}"
        ) from None
    try:
        default = models.default_layer(loaded.model, size)
    except ValueError as error:
        default = None
        print(f"camkit: no default CAM layer: {error}", file=sys.stderr)
    name_width = max(len("layer"), *(len(name) for name, _, _ in rows))
    type_width = max(len("type"), *(len(kind) for _, kind, _ in rows))
    print(f"{loaded.name}, input {size[0]}x{size[1]}: {len(rows)} layer calls")
    print(f"  {'layer':<{name_width}}  {'type':<{type_width}}  output shape")
    for name, kind, shape in rows:
        mark = "*" if name == default else " "
        print(f"{mark} {name:<{name_width}}  {kind:<{type_width}}  {tuple(shape)}")
    if default is not None:
        print(f"* default CAM layer (used when --layer is not given): {default}")
    return EXIT_OK


def demo_photos() -> dict[str, np.ndarray]:
    """The sample photos shipped with scikit-image, by name."""
    from skimage import data

    return {
        "chelsea": data.chelsea(),
        "coffee": data.coffee(),
        "astronaut": data.astronaut(),
        "rocket": data.rocket(),
        "motorcycle": data.stereo_motorcycle()[0],
    }


def run_demo(args: argparse.Namespace) -> int:
    """``camkit demo``: the whole pipeline on scikit-image's sample photos, and a summary grid."""
    started = time.perf_counter()
    out = Path(args.out)
    check_out_dir(out)
    device = pick_device("auto")
    loaded = load_model(models.DEFAULT_MODEL, None)
    inputs = out / "inputs"
    inputs.mkdir(parents=True, exist_ok=True)
    paths = [viz.save_png(inputs / f"{name}.png", photo) for name, photo in demo_photos().items()]
    job = Job(
        methods=DEMO_METHODS,
        layer=pick_layer(loaded, None, DEMO_METHODS),
        classes=None,
        out=out,
        device=device,
    )
    records = explain_with_progress(loaded, paths, job)
    rows = []
    for path in paths:
        mine = [record for record in records if record["image"] == str(path)]
        best = mine[0]["top5"][0]
        title = f"{path.stem}\n{best['label']} ({best['probability']:.0%})"
        print(f"{path.stem:<12} top-1: {best['label']} ({best['probability']:.0%})")
        overlays = [read_image(out / record["output"]) for record in mine]
        rows.append((title, [read_image(path), *overlays]))
    summary = viz.save_png(out / "summary.png", viz.picture_grid(rows, ["photo", *DEMO_METHODS]))
    print(f"inputs:    {inputs}/")
    print(f"overlays:  {out}/<photo>_<method>_<class>.png ({len(records)} files)")
    print(f"manifest:  {out / 'manifest.json'}")
    print(f"summary:   {summary}")
    print(f"done in {time.perf_counter() - started:.1f} s on {device}")
    return EXIT_OK


# ----------------------------------------------------------------------------- parsing


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def unit_float(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text}")
    return value


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default=models.DEFAULT_MODEL,
        help=f"{models.DEFAULT_MODEL} (default; ImageNet weights installed with camkit), "
        "torchvision:NAME or timm:NAME (e.g. torchvision:resnet50, timm:convnext_tiny), or "
        "a checkpoint file that names its architecture ('arch'); nothing is downloaded",
    )
    parser.add_argument(
        "--weights",
        metavar="PATH",
        help="state dict for --model (.pt/.pth via torch.load(weights_only=True), or "
        ".safetensors); without it a torchvision/timm model has random weights",
    )


EXPLAIN_EPILOG = f"""\
methods:
  CAM family (one forward and backward pass):
    {", ".join(CAM_METHODS)}
  perturbation (slow: one forward pass per channel of the layer):
    {", ".join(PERTURBATION_METHODS)}
  pixel attributions (the overlay shows max |attribution| over RGB):
    {", ".join(PIXEL_METHODS)}

outputs in --out:
  <stem>_<method>_<class>.png   overlay at the image's original size
  <stem>_<method>_<class>.npy   with --save-raw: the method's map at the model's input size
  manifest.json                 one record per overlay (image, output, method, layer, target,
                                label, probability, top5) and per unreadable image (image, error)
Images are resized to the model's input size without cropping, so a map covers the whole photo.
exit status: 0 ok, 1 some images unreadable (the others written), 2 usage error

examples:
  camkit explain cat.jpg
  camkit explain photos/ --method gradcam,layercam --target "tiger cat" --out maps
  camkit explain x.png --model torchvision:resnet50 --weights resnet50.pth --target 281,285"""


def build_parser() -> argparse.ArgumentParser:
    """The ``camkit`` parser with its three subcommands."""
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog="camkit",
        description="Show where a PyTorch vision model looks: class activation maps and "
        "pixel attributions as heatmap overlays.",
        epilog="run 'camkit COMMAND --help' for a command's options; 'camkit demo' to try it",
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"camkit {camkit.__version__} (torch {torch.__version__})",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    explain = commands.add_parser(
        "explain",
        help="write heatmap overlays for images",
        description="Explain the model's prediction for each image with a heatmap overlay.",
        epilog=EXPLAIN_EPILOG,
        formatter_class=formatter,
    )
    explain.add_argument(
        "images",
        nargs="+",
        metavar="IMAGE_OR_DIR",
        help="image files, or directories whose image files (jpg, jpeg, png, bmp, tif, tiff, "
        "webp; not in subdirectories) are all explained",
    )
    add_model_arguments(explain)
    explain.add_argument(
        "--layer", help="layer to explain (dotted name, see 'camkit layers'); default: automatic"
    )
    explain.add_argument(
        "--method",
        default="gradcam",
        help="method, or several comma-separated (default gradcam); see the list below",
    )
    explain.add_argument(
        "--target",
        default="top1",
        help="top1 (default: each image's predicted class), class indices INT[,INT...] "
        "(one overlay per class), or a class name (e.g. 'tiger cat'; a unique part is enough)",
    )
    explain.add_argument(
        "--out", default="camkit-out", metavar="DIR", help="output folder (default camkit-out)"
    )
    explain.add_argument(
        "--batch-size",
        type=positive_int,
        default=8,
        metavar="N",
        help="images per batch (default 8)",
    )
    explain.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="auto (default): cuda when available, else cpu",
    )
    explain.add_argument(
        "--alpha", type=unit_float, default=0.5, help="heatmap opacity in [0, 1] (default 0.5)"
    )
    explain.add_argument(
        "--colormap",
        default="jet",
        help="OpenCV (jet, turbo, inferno...) or matplotlib colormap name (default jet)",
    )
    explain.add_argument(
        "--save-raw", action="store_true", help="also save each map as a float32 .npy file"
    )
    explain.set_defaults(run=run_explain)

    layers = commands.add_parser(
        "layers",
        help="list a model's layers and output shapes",
        description="List every layer call with its type and output shape; '*' marks the "
        "layer CAMs use by default.",
    )
    add_model_arguments(layers)
    layers.add_argument(
        "--input-size",
        type=positive_int,
        metavar="N",
        help="square input side (default: the model's input size)",
    )
    layers.set_defaults(run=run_layers)

    demo = commands.add_parser(
        "demo",
        help="run the whole pipeline on scikit-image's sample photos",
        description="Explain five sample photos with "
        f"{', '.join(DEMO_METHODS)} and draw a summary grid.",
    )
    demo.add_argument(
        "--out", default="camkit-demo", metavar="DIR", help="output folder (default camkit-demo)"
    )
    demo.set_defaults(run=run_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``camkit`` command; return its exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except UsageError as error:
        print(f"camkit {args.command}: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("camkit: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `camkit layers | head`: stop quietly, as other tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE

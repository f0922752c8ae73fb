"""``camkit explain``: overlays (and raw maps) for image files, and a manifest."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from camkit import io, models, registry, viz
from camkit.cli.common import (
    EXIT_OK,
    EXIT_UNREADABLE_IMAGES,
    UsageError,
    add_model_arguments,
    check_colormap,
    check_out_dir,
    find_images,
    load_model,
    parse_methods,
    parse_target,
    pick_device,
    pick_layer,
    positive_int,
    unit_float,
)
from camkit.core.progress import progress_bar
from camkit.errors import LayerOutputError

FAMILY_TITLES = {
    "gradient-cam": "CAM family (one forward and backward pass)",
    "perturbation-cam": "perturbation (slow: one forward pass per channel of the layer)",
    "pixel": "pixel attributions (the overlay shows max |attribution| over RGB)",
}


@dataclasses.dataclass(frozen=True)
class Job:
    """What to explain and how to write it, checked and resolved from the command line."""

    methods: tuple[str, ...]
    layer: str
    classes: tuple[int, ...] | None  # None: each image's top-1 class
    out: Path
    device: torch.device
    images_per_batch: int = 8
    batch_size: int = 32  # rows per forward pass inside the methods that loop
    alpha: float = 0.5
    colormap: str = "jet"
    save_raw: bool = False


def build_explainer(method: str, model: nn.Module, job: Job) -> Any:
    """The registry's explainer for ``method``; methods that draw random numbers get seed 0, so
    reruns agree."""
    entry = registry.get(method)
    options: dict[str, Any] = {"batch_size": job.batch_size}
    if "seed" in inspect.signature(entry.cls).parameters:
        options["seed"] = 0
    return entry.build(model, job.layer, **options)


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


def top5(probabilities: Tensor, labels: Sequence[str]) -> list[dict]:
    """``[{index, label, probability}]`` of the 5 most probable classes of one image."""
    return [
        {"index": index, "label": label, "probability": probability}
        for index, label, probability in models.top_classes(probabilities, labels, 5)
    ]


def explain_files(
    loaded: models.LoadedModel, paths: Sequence[Path], job: Job, progress: tqdm
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
    explainers = {method: build_explainer(method, model, job) for method in job.methods}
    records: list[dict] = []
    for chunk in batches(list(zip(paths, unique_stems(paths), strict=True)), job.images_per_batch):
        by_image: dict[str, list[dict]] = {}
        readable = []
        for path, stem in chunk:
            try:
                readable.append((path, stem, io.read_image(path)))
            except io.READ_ERRORS as error:
                reason = io.read_failure(error)
                progress.write(f"camkit: cannot read {path}: {reason}", file=sys.stderr)
                by_image[stem] = [{"image": str(path), "error": reason}]
        if readable:
            by_image |= explain_batch(loaded, explainers, squash, readable, job)
        records.extend(record for _, stem in chunk for record in by_image[stem])
        io.save_json(manifest, records)
        progress.update(len(chunk))
    return records


def explain_batch(
    loaded: models.LoadedModel,
    explainers: dict[str, Any],
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
        heat, raw = explainer.heatmaps(batch, classes)
        heat, raw = heat.cpu(), raw.cpu()
        for row, (path, stem, image) in enumerate(images):
            for column, target in enumerate(classes[row]):
                name = f"{stem}_{method}_{target}"
                overlay = viz.overlay(image, heat[row, column], job.alpha, job.colormap)
                io.save_png(job.out / f"{name}.png", overlay)
                record = {"image": str(path), "output": f"{name}.png"}
                if job.save_raw:
                    io.save_npy(job.out / f"{name}.npy", raw[row, column].numpy())
                    record["raw"] = f"{name}.npy"
                records[stem].append(
                    record
                    | {
                        "method": method,
                        "layer": job.layer if registry.get(method).needs_layer else None,
                        "target": target,
                        "label": loaded.labels[target],
                        "probability": probabilities[row, target].item(),
                        "top5": top5(probabilities[row], loaded.labels),
                        "model": loaded.name,
                        "size": [image.shape[1], image.shape[0]],
                    }
                )
    return records


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
        images_per_batch=args.images_per_batch,
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
    try:
        with progress_bar(len(paths), "explain", "image") as progress:
            return explain_files(loaded, paths, job, progress)
    except LayerOutputError as error:
        raise UsageError(f"--layer {job.layer}: {error}") from None


def epilog() -> str:
    """The methods of the registry, by family, and the outputs."""
    families = "\n".join(
        f"  {title}:\n    {', '.join(registry.names(family))}"
        for family, title in FAMILY_TITLES.items()
        if registry.names(family)
    )
    return f"""methods:
{families}

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


def add_parser(commands: argparse._SubParsersAction) -> None:
    """The ``explain`` subcommand."""
    explain = commands.add_parser(
        "explain",
        help="write heatmap overlays for images",
        description="Explain the model's prediction for each image with a heatmap overlay.",
        epilog=epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
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
        "--images-per-batch",
        type=positive_int,
        default=8,
        metavar="N",
        help="images decoded and explained together (default 8)",
    )
    explain.add_argument(
        "--batch-size",
        type=positive_int,
        default=32,
        metavar="N",
        help="rows per forward pass inside the methods that loop (Score-CAM, Ablation-CAM, "
        "SmoothGrad, IG; default 32): the memory knob, results do not depend on it",
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

"""Deletion / insertion (50 steps) on 8 photos: camkit against torchcam and quantus.

    python benchmarks/bench_metrics.py [--repeats 3] [--steps 50] [--threads N]
                                       [--batch-sizes 64,16] [--out benchmarks/METRICS.md]

The packaged pretrained EfficientNet-Lite0, 8 scikit-image photos resized to 224x224, Grad-CAM
maps of each photo's top-1 class (camkit's), scored on the same maps by:

* camkit: ``metrics.deletion`` + ``metrics.insertion`` (zero baseline, to match the peers);
* torchcam 0.5: ``DeletionInsertionMetric`` (both curves in one ``update``, zero baseline);
* quantus 0.6: ``PixelFlipping`` (Bach et al. 2015), the closest to RISE's deletion: it removes
  the most relevant features first and scores the softmax probability after each step. It has
  no insertion, it ranks channel values rather than pixels (a map broadcast over the 3
  channels), and its step must divide ``224 * 224``: 3136 values (about 1045 pixels) per step,
  48 forwards of the batch against camkit's 50. It is timed against camkit's deletion alone
  (at the last of ``--batch-sizes``). Its chunk is the 8 images of one step.

camkit and torchcam run at each of ``--batch-sizes`` (rows per forward): on a CPU a batch of 64
224x224 images falls out of the caches and runs about twice slower per image than 8-16.

Each round runs every implementation once in a rotating order (a busy machine slows all
alike); the table gives the median of ``--repeats`` rounds after one warm-up and the AUCs.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import torch

import camkit
from camkit import metrics
from camkit.models import load

QUANTUS_STEP = 3136  # must divide 224 * 224: 3 * 224 * 224 / 3136 = 48 forwards of the batch
PHOTOS = (
    "chelsea",
    "coffee",
    "astronaut",
    "rocket",
    "stereo_motorcycle",  # its left view
    "camera",
    "hubble_deep_field",
    "immunohistochemistry",
)


def photos() -> list[np.ndarray]:
    from skimage import data

    images = []
    for name in PHOTOS:
        image = getattr(data, name)()
        if name == "stereo_motorcycle":
            image = image[0]
        if image.ndim == 2:
            image = np.stack([image] * 3, axis=-1)
        images.append(image[..., :3])
    return images


class FixedCAM:
    """A torchcam extractor that hands out camkit's maps, so torchcam scores the same maps."""

    def __init__(self, model, maps):
        self.model, self.maps = model, maps

    def __call__(self, class_idx=None, scores=None, normalized=True, **kwargs):
        return [self.maps]

    def fuse_cams(self, cams):
        return cams[0]

    def _hooks_off(self):
        import contextlib

        return contextlib.nullcontext()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument(
        "--batch-sizes",
        type=lambda text: [int(v) for v in text.split(",")],
        default=[64, 16],
        help="comma-separated batch_size values for camkit and torchcam (default 64,16)",
    )
    parser.add_argument("--out", default=str(Path(__file__).with_name("METRICS.md")))
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    loaded = load()
    model = loaded.model.eval()
    x = torch.stack([loaded.preprocess(photo) for photo in photos()])
    with torch.no_grad():
        classes = model(x).argmax(dim=1)
    maps = camkit.GradCAM(model, loaded.default_layer)(x, target=classes)
    runs: dict[str, Callable[[], str]] = {}
    reference: dict[str, str] = {}
    aucs: dict[str, str] = {}
    notes = []

    def camkit_both(batch_size: int) -> str:
        options = {"steps": args.steps, "baseline": "zero", "batch_size": batch_size}
        d = metrics.deletion(model, x, maps, classes, **options)
        i = metrics.insertion(model, x, maps, classes, **options)
        return f"del {d.mean():.4f} / ins {i.mean():.4f}"

    def camkit_deletion(batch_size: int) -> str:
        options = {"steps": args.steps, "baseline": "zero", "batch_size": batch_size}
        return f"del {metrics.deletion(model, x, maps, classes, **options).mean():.4f}"

    try:
        from torchcam.metrics import DeletionInsertionMetric
    except ImportError:
        DeletionInsertionMetric = None
        notes.append("torchcam is not installed: skipped")

    def torchcam_both(batch_size: int) -> str:
        metric = DeletionInsertionMetric(
            FixedCAM(model, maps),
            partial(torch.softmax, dim=-1),
            steps=args.steps,
            batch_size=batch_size,
        )
        metric.update(x, class_idx=classes.tolist())
        s = metric.summary()
        return f"del {s['deletion_auc']:.4f} / ins {s['insertion_auc']:.4f}"

    for size in args.batch_sizes:
        both, alone = f"camkit deletion + insertion, batch {size}", f"camkit deletion, batch {size}"
        runs[both] = partial(camkit_both, size)
        reference[both] = both
        if DeletionInsertionMetric is not None:
            name = f"torchcam DeletionInsertionMetric, batch {size}"
            runs[name] = partial(torchcam_both, size)
            reference[name] = both
        runs[alone] = partial(camkit_deletion, size)
        reference[alone] = alone
    try:
        import warnings

        import quantus

        def quantus_deletion() -> str:
            metric = quantus.PixelFlipping(
                features_in_step=QUANTUS_STEP,
                perturb_baseline=0.0,
                return_auc_per_sample=False,  # its AUC calls np.trapz, gone in numpy 2
                disable_warnings=True,
            )
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                scores = metric(
                    model=model,
                    x_batch=x.numpy(),
                    y_batch=classes.numpy(),
                    a_batch=maps[:, None].numpy(),
                    device="cpu",
                    softmax=True,
                )
            curves = np.asarray(scores)  # (B, 48): after each step, no clean-image point
            # quantus's AUC is the trapezoid over the step index (dx = 1); here over [0, 1]
            auc = np.trapezoid(curves, dx=1 / (curves.shape[1] - 1), axis=1)
            return f"del {auc.mean():.4f} (trapezoid of its {curves.shape[1]} points)"

        name = f"quantus PixelFlipping (deletion), batch {x.shape[0]} per step"
        runs[name] = quantus_deletion
        reference[name] = f"camkit deletion, batch {args.batch_sizes[-1]}"
    except ImportError:
        notes.append("quantus is not installed: skipped")

    names = list(runs)
    for name in names:  # warm-up, and the scores
        start = time.perf_counter()
        aucs[name] = runs[name]()
        print(f"warm-up {name}: {time.perf_counter() - start:.1f} s", file=sys.stderr)
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(args.repeats):
        for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
            start = time.perf_counter()
            runs[name]()
            times[name].append(time.perf_counter() - start)
        print(f"round {round_ + 1}/{args.repeats} done", file=sys.stderr)

    median = {name: statistics.median(values) for name, values in times.items()}
    lines = [
        "# Deletion / insertion timings",
        "",
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
        f"`python benchmarks/bench_metrics.py --repeats {args.repeats} --steps {args.steps} "
        f"--threads {torch.get_num_threads()} --batch-sizes "
        f"{','.join(map(str, args.batch_sizes))}`: "
        f"EfficientNet-Lite0, {x.shape[0]} photos 224x224, Grad-CAM maps ({loaded.default_layer})"
        f", {args.steps} steps, zero baseline, batch_size {args.batch_sizes}; CPU "
        f"({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}). Median of {args.repeats} rounds after a warm-up.",
        "",
        "| implementation | median s | x camkit (same batch; quantus: vs the last) | mean AUC |",
        "| --- | ---: | ---: | --- |",
    ]
    for name in names:
        ratio = median[name] / median[reference[name]]
        lines.append(f"| {name} | {median[name]:.2f} | {ratio:.2f} | {aucs[name]} |")
    lines += ["", *notes, "See the docstring of benchmarks/bench_metrics.py for what is compared."]
    table = "\n".join(lines) + "\n"
    print(table)
    Path(args.out).write_text(table)


if __name__ == "__main__":
    main()

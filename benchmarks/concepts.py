"""Concepts (camkit.methods.concepts): speed of conditional relevance, throughput and memory of
reference images. Every time is CPU seconds on one thread (``torch.set_num_threads(1)``,
``OMP_NUM_THREADS=1`` for the commands): what the work costs, whatever else runs on the machine.

1. Top-10 concepts with their 10 conditional heatmaps for one image (LRP rules,
   epsilon-plus-flat) against one LRP call (camkit.LRP) and ten separate zennit-crp
   0.6.0 ``CondAttribution`` calls (one concept each) with zennit's EpsilonPlusFlat, side by
   side in one process on torchvision VGG-16 with random weights, for each ``--sizes``
   (targets: <= 3x one LRP call, <= 0.3x ten zennit-crp calls). Medians of ``--repeats``
   alternating runs.
2. ``camkit concepts PHOTOS`` (the default layer, 16 channels' patches) against ``camkit
   explain PHOTOS`` (Grad-CAM, the default), both end to end on the same ``--photos`` JPEGs
   of 300-900 px, DataLoader in the process (``--workers 0``), each command's CPU time with
   its start-up (target: >= 0.8x the throughput of ``camkit explain``).
3. The peak memory of a fresh process collecting reference images over 1,000 and 10,000
   random 32x32 images (a 2-conv CNN, batches of 64; target: within 10 %).

    python benchmarks/concepts.py [--sizes 64 224] [--repeats 3] [--photos 1000]

Writes ``benchmarks/CONCEPTS.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from pipeline import photos
from torch import nn

import camkit
from camkit import LRP
from camkit.methods.concepts import ConceptAttribution, LRPRules, ReferenceCollector

LAYER = "features.28"
ONE_THREAD = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")


def cpu_seconds(run) -> float:
    started = time.process_time()
    run()
    return time.process_time() - started


def crp_speed(size: int, repeats: int) -> dict[str, float]:
    from crp.attribution import CondAttribution
    from torchvision.models import vgg16
    from zennit.composites import EpsilonPlusFlat

    torch.manual_seed(0)
    model = vgg16().eval()
    x = torch.rand(1, 3, size, size)
    with torch.no_grad():
        cls = int(model(x).argmax())
    concepts = ConceptAttribution(model, LAYER, rules=LRPRules("epsilon-plus-flat"))
    lrp = LRP(model, composite="epsilon-plus-flat")
    channels = concepts.top(x[0], k=10, target=cls, heatmaps=False).channels.tolist()
    crp = CondAttribution(model, no_param_grad=False)

    def ten_crp_calls() -> None:
        for channel in channels:  # one concept per call
            crp(x.clone().requires_grad_(True), [{LAYER: [channel], "y": [cls]}], EpsilonPlusFlat())

    runs = {
        "one LRP call": lambda: lrp(x, target=cls),
        "top-10 concepts, no heatmaps": lambda: concepts.top(x, k=10, target=cls, heatmaps=False),
        "top-10 concepts + 10 heatmaps": lambda: concepts.top(x, k=10, target=cls),
        "10 zennit-crp calls": ten_crp_calls,
    }
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            times[name].append(cpu_seconds(run))
    return {name: statistics.median(values) for name, values in times.items()}


def command_cpu(args: list[str]) -> float:
    """CPU seconds of ``camkit ARGS`` (the process and any children), one thread."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(
        [sys.executable, "-m", "camkit", *args],
        check=True, env=ONE_THREAD, capture_output=True, text=True,
    )  # fmt: skip
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def cli_throughput(count: int, cache: Path) -> dict[str, float]:
    folder = photos(count, cache / f"photos{count}")[0].parent
    common = ["--workers", "0", "--quiet"]
    return {
        "explain": command_cpu(["explain", str(folder), "--out", str(cache / "explain"), *common]),
        "concepts": command_cpu(
            ["concepts", str(folder), "--out", str(cache / "concepts"), *common]
        ),
    }


def small_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10),
    ).eval()  # fmt: skip


def references(count: int, batch: int = 64) -> dict[str, float]:
    """In this (fresh) process: reference images over ``count`` random 32x32 images; the peak
    memory at the end."""
    collector = ReferenceCollector(small_model(), "3", top=8)
    generator = torch.Generator().manual_seed(0)
    for start in range(0, count, batch):
        images = torch.rand(min(batch, count - start), 3, 32, 32, generator=generator)
        collector.update(images, torch.arange(start, start + images.shape[0]))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"images": count, "peak_mb": peak}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 224])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--photos", type=int, default=1000)
    parser.add_argument("--images", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent)
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "camkit-bench")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.child:
        print(json.dumps(references(args.child)))
        return
    lines = [
        "# camkit.methods.concepts benchmark",
        "",
        f"`python benchmarks/concepts.py --sizes {' '.join(map(str, args.sizes))} --repeats "
        f"{args.repeats} --photos {args.photos}` on {platform.machine()}, {os.cpu_count()} CPU "
        f"core(s), torch {torch.__version__}, camkit {camkit.__version__}. CPU seconds on one "
        "thread.",
    ]
    for size in args.sizes:
        speed = crp_speed(size, args.repeats)
        lrp, crp = speed["one LRP call"], speed["10 zennit-crp calls"]
        top = speed["top-10 concepts + 10 heatmaps"]
        each = (top - speed["top-10 concepts, no heatmaps"]) / 10
        lines += [
            "",
            f"## One image, VGG-16 (random weights), {size}x{size}, layer {LAYER}",
            "",
            "| run | CPU s (median) | vs one LRP call | vs 10 zennit-crp calls |",
            "| --- | ---: | ---: | ---: |",
            *(
                f"| {name} | {value:.3f} | {value / lrp:.2f}x | {value / crp:.2f}x |"
                for name, value in speed.items()
            ),
            "",
            f"Targets: top-10 with heatmaps <= 3x one LRP call (here {top / lrp:.2f}x), <= 0.3x "
            f"ten zennit-crp calls (here {top / crp:.2f}x). Each conditional heatmap costs "
            f"{each:.3f} s ({each / lrp:.2f}x one LRP call): one backward pass from the layer to "
            "the input, through every convolution below it. One LRP call is one forward under the "
            "rules (two convolutions per layer: the layer's own and the z+ rule's) and one such "
            f"backward, so ten heatmaps alone cost {10 * each / lrp:.1f}x one LRP call here: "
            "the floor of an exact method on a CPU, where one batched backward costs as much as "
            "separate ones.",
        ]
    seconds = cli_throughput(args.photos, args.cache)
    ratio = seconds["explain"] / seconds["concepts"]
    lines += [
        "",
        f"## `camkit concepts` against `camkit explain`, {args.photos} photos (300-900 px JPEG)",
        "",
        "| command | CPU s | images per CPU s |",
        "| --- | ---: | ---: |",
        *(
            f"| `camkit {name}` | {value:.1f} | {args.photos / value:.1f} |"
            for name, value in seconds.items()
        ),
        "",
        f"Throughput of `camkit concepts`: {ratio:.2f}x `camkit explain`'s (target >= 0.8x).",
    ]
    rows = []
    for count in args.images:
        done = subprocess.run(
            [sys.executable, __file__, "--child", str(count)],
            capture_output=True, text=True, check=True, env=ONE_THREAD,
        )  # fmt: skip
        rows.append(json.loads(done.stdout))
    lines += [
        "",
        "## Peak memory of reference images (32x32 random images, a 2-conv CNN, fresh process)",
        "",
        "| images | peak MB |",
        "| ---: | ---: |",
        *(f"| {r['images']} | {r['peak_mb']:.0f} |" for r in rows),
    ]
    (args.out / "CONCEPTS.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

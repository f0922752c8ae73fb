"""Concepts (camkit.concepts): speed of conditional relevance and memory of reference images.

1. Top-10 concepts with their 10 conditional heatmaps for one image (LRP rules, epsilon-plus-
   flat) against one LRP call (camkit.relevance.LRP) and ten separate zennit-crp 0.6.0
   ``CondAttribution`` calls with zennit's EpsilonPlusFlat, side by side in one process on
   torchvision VGG-16 with random weights (targets: <= 3x one LRP call, <= 0.3x ten zennit-crp
   calls). Medians of ``--repeats`` alternating runs.
2. Reference images: ``ReferenceCollector`` over N random images against a Grad-CAM pass over
   the same batches (the work ``camkit explain`` does per image, without the files), and the
   peak memory of a fresh process for 1,000 and 10,000 images (target: within 10 %).

    python benchmarks/concepts.py [--size 224] [--repeats 3] [--images 1000 10000]

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
import time
from pathlib import Path

import torch
from torch import nn

import camkit
from camkit.concepts import ConceptAttribution, LRPRules, ReferenceCollector
from camkit.relevance import LRP

LAYER = "features.28"


def timed(run) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def crp_speed(size: int, repeats: int) -> dict[str, float]:
    from crp.attribution import CondAttribution
    from torchvision.models import vgg16
    from zennit.composites import EpsilonPlusFlat

    torch.manual_seed(0)
    model = vgg16().eval()
    x = torch.rand(1, 3, size, size)
    cls = int(model(x).argmax())
    concepts = ConceptAttribution(model, LAYER, rules=LRPRules("epsilon-plus-flat"))
    lrp = LRP(model, composite="epsilon-plus-flat")
    channels = concepts.top(x, k=10, target=cls, heatmaps=False).channels.tolist()
    crp = CondAttribution(model, no_param_grad=False)

    def ten_crp_calls() -> None:
        for c in channels:
            crp(x.clone().requires_grad_(True), [{LAYER: [c], "y": [cls]}], EpsilonPlusFlat())

    runs = {
        "one LRP call": lambda: lrp(x, target=cls),
        "top-10 concepts + 10 heatmaps": lambda: concepts.top(x, k=10, target=cls),
        "10 zennit-crp calls": ten_crp_calls,
    }
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            times[name].append(timed(run))
    return {name: statistics.median(values) for name, values in times.items()}


def small_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10),
    ).eval()  # fmt: skip


def references(count: int, batch: int = 64) -> dict[str, float]:
    """In this (fresh) process: reference images over ``count`` random 32x32 images, and a
    Grad-CAM pass over the same batches; peak memory at the end."""
    model = small_model()
    collector = ReferenceCollector(model, "3", top=8)
    gradcam = camkit.GradCAM(model, "3")
    generator = torch.Generator().manual_seed(0)
    seconds = {"references": 0.0, "gradcam": 0.0}
    for start in range(0, count, batch):
        images = torch.rand(min(batch, count - start), 3, 32, 32, generator=generator)
        indices = torch.arange(start, start + images.shape[0])
        started = time.perf_counter()
        collector.update(images, indices)
        seconds["references"] += time.perf_counter() - started
        seconds["gradcam"] += timed(lambda images=images: gradcam(images))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"images": count, **seconds, "peak_mb": peak}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--images", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(references(args.child)))
        return
    speed = crp_speed(args.size, args.repeats)
    rows = []
    for count in args.images:
        done = subprocess.run(
            [sys.executable, __file__, "--child", str(count)],
            capture_output=True, text=True, check=True, env=os.environ,
        )  # fmt: skip
        rows.append(json.loads(done.stdout))
    lrp, top, crp = (speed[k] for k in speed)
    lines = [
        "# camkit.concepts benchmark",
        "",
        f"`python benchmarks/concepts.py --size {args.size} --repeats {args.repeats}` on "
        f"{platform.machine()}, {os.cpu_count()} CPU core(s) shared with other work, torch "
        f"{torch.__version__}, camkit {camkit.__version__}; load average "
        f"{os.getloadavg()[0]:.1f}.",
        "",
        f"## One image, VGG-16 (random weights), {args.size}x{args.size}, layer {LAYER}",
        "",
        "| run | seconds (median) | vs one LRP call | vs 10 zennit-crp calls |",
        "| --- | --- | --- | --- |",
        *(
            f"| {name} | {value:.3f} | {value / lrp:.2f}x | {value / crp:.2f}x |"
            for name, value in speed.items()
        ),
        "",
        f"Targets: top-10 with heatmaps <= 3x one LRP call (here {top / lrp:.2f}x), <= 0.3x ten "
        f"zennit-crp calls (here {top / crp:.2f}x).",
        "",
        "## Reference images (32x32 random images, a 2-conv CNN, batches of 64, fresh process)",
        "",
        "| images | references s | Grad-CAM s | throughput vs Grad-CAM | peak MB |",
        "| --- | --- | --- | --- | --- |",
        *(
            f"| {r['images']} | {r['references']:.2f} | {r['gradcam']:.2f} | "
            f"{r['gradcam'] / r['references']:.2f}x | {r['peak_mb']:.0f} |"
            for r in rows
        ),
    ]
    (args.out / "CONCEPTS.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

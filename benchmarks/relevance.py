"""LRP's speed and memory against camkit's Saliency (one forward and one backward: the floor)
and zennit 0.5.1, side by side in one run, each in a process of its own.

    python benchmarks/relevance.py [--arch resnet50] [--batch 8] [--size 224] [--rounds 3]
                                   [--composite epsilon-plus-flat]

ResNet-50 with random weights (nothing downloaded), a batch of ``--batch`` images; each
process builds its method, runs it once (warm-up), then times ``--rounds`` calls (median) and
reports its peak resident memory (``ru_maxrss``). Rows: camkit Saliency, camkit LRP, zennit
(the same composite, ``ResNetCanonizer``), camkit LRP with 10 targets per image in one call, and
ten one-target LRP calls. On a shared 2-core machine, expect 5-10 % noise between runs.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CASES = ("saliency", "lrp", "zennit", "lrp-10-targets", "lrp-10-calls")


def child(case: str, args: argparse.Namespace) -> dict:
    """Time one case in this process: seconds (median) and peak memory (MiB)."""
    import torch
    import torchvision

    import camkit

    torch.manual_seed(0)
    model = getattr(torchvision.models, args.arch)(weights=None).eval()
    x = torch.randn(args.batch, 3, args.size, args.size)
    if case == "saliency":
        method = camkit.Saliency(model)
        run = lambda: method(x, 1)  # noqa: E731
    elif case == "zennit":
        from zennit import composites
        from zennit.attribution import Gradient
        from zennit.torchvision import ResNetCanonizer

        names = {
            "epsilon-plus-flat": composites.EpsilonPlusFlat,
            "epsilon-plus": composites.EpsilonPlus,
            "epsilon-alpha2-beta1": composites.EpsilonAlpha2Beta1,
        }
        composite = names[args.composite](canonizers=[ResNetCanonizer()])
        one_hot = torch.eye(1000)[[1] * args.batch]

        def run() -> None:
            with Gradient(model=model, composite=composite) as attributor:
                attributor(x, one_hot)

    else:
        method = camkit.LRP(model, composite=args.composite)
        if case == "lrp":
            run = lambda: method(x, 1)  # noqa: E731
        elif case == "lrp-10-targets":
            run = lambda: method(x, [list(range(10))] * args.batch)  # noqa: E731
        else:
            run = lambda: [method(x, c) for c in range(10)]  # noqa: E731
    run()
    times = []
    for _ in range(args.rounds):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"case": case, "seconds": statistics.median(times), "peak_mib": peak}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="resnet50")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--composite", default="epsilon-plus-flat")
    parser.add_argument("--child", choices=CASES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args)))
        return
    rows = {}
    for case in CASES:
        command = [sys.executable, __file__, "--child", case, *sys.argv[1:]]
        done = subprocess.run(command, capture_output=True, text=True, check=True, cwd=ROOT)
        rows[case] = json.loads(done.stdout.strip().splitlines()[-1])
    floor = rows["saliency"]["seconds"]
    print(f"{args.arch}, batch {args.batch}, {args.size}x{args.size}, {args.composite}")
    print("| case | seconds | x Saliency | peak MiB |")
    print("| --- | ---: | ---: | ---: |")
    for case, row in rows.items():
        ratio = row["seconds"] / floor
        print(f"| {case} | {row['seconds']:.3f} | {ratio:.2f} | {row['peak_mib']:.0f} |")


if __name__ == "__main__":
    main()

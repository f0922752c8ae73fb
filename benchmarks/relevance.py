"""LRP's speed and memory against camkit's Saliency (one forward and one backward: the floor)
and zennit 0.5.1, side by side in one run.

    python benchmarks/relevance.py [--arch resnet50] [--batch 8] [--size 112] [--rounds 3]
                                   [--composite epsilon-plus-flat] [--before DIR] [--out FILE]

Each case lives in a process of its own (its own peak memory; ``--before DIR`` runs the LRP
cases again with the camkit of ``DIR/src``, e.g. ``git worktree add DIR <commit>``), builds the
same ResNet with random weights (nothing downloaded) and the same seeded batch, and makes one
warm-up call. The parent then asks the cases for one timed call each in turn, ``--rounds``
times (interleaved, so that the load of a shared machine falls on every case alike), and
reports the median. Peak memory: the process's peak resident memory during its calls above its
resident memory before them (``ru_maxrss`` minus the model and the input). One thread per
process. Rows: camkit Saliency, camkit LRP, zennit (the same composite, ``ResNetCanonizer``),
camkit LRP with ``Epsilon`` on every layer, camkit LRP with 10 targets per image in one call,
and ten one-target LRP calls; with ``--before``, LRP with the older camkit.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CASES = ("saliency", "lrp", "zennit", "lrp-epsilon", "lrp-10-targets", "lrp-10-calls")
BEFORE_CASES = ("lrp",)


def _rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _build(case: str, args: argparse.Namespace):
    import torch
    import torchvision

    import camkit

    torch.manual_seed(0)
    model = getattr(torchvision.models, args.arch)(weights=None).eval()
    x = torch.randn(args.batch, 3, args.size, args.size)
    if case == "saliency":
        method = camkit.Saliency(model)
        return lambda: method(x, 1)
    if case == "zennit":
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

        return run
    if case == "lrp-epsilon":  # Epsilon on every layer: the rule that keeps the layer's graph
        from torch import nn

        from camkit.relevance import Epsilon

        method = camkit.LRP(model, composite=[((nn.Conv2d, nn.Linear), Epsilon())])
        return lambda: method(x, 1)
    method = camkit.LRP(model, composite=args.composite)
    if case == "lrp":
        return lambda: method(x, 1)
    if case == "lrp-10-targets":
        return lambda: method(x, [list(range(10))] * args.batch)
    return lambda: [method(x, c) for c in range(10)]


def child(case: str, args: argparse.Namespace) -> None:
    """Serve one case: a warm-up call, then one timed call per line read from stdin."""
    import torch

    torch.set_num_threads(1)
    run = _build(case, args)
    base = _rss_mib()
    run()
    print("ready", flush=True)
    for _ in sys.stdin:
        start = time.perf_counter()
        run()
        seconds = time.perf_counter() - start
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - base
        print(f"{seconds} {peak}", flush=True)


def _start(case: str, src: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, __file__, "--child", case, *sys.argv[1:]]
    proc = subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env
    )
    return proc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="resnet50")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--size", type=int, default=112)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--composite", default="epsilon-plus-flat")
    parser.add_argument("--before", type=Path, help="a checkout whose src/ is the 'before' code")
    parser.add_argument("--out", type=Path, help="also write the table to this markdown file")
    parser.add_argument("--child", choices=CASES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args)
        return
    runs = [(case, "", ROOT / "src") for case in CASES]
    if args.before:
        runs += [(case, " (before)", args.before / "src") for case in BEFORE_CASES]
    procs = {}
    for case, tag, src in runs:  # one at a time: the warm-ups do not overlap
        procs[case + tag] = proc = _start(case, src)
        assert proc.stdout.readline().strip() == "ready", f"{case}{tag} did not start"
    times: dict[str, list[float]] = {name: [] for name in procs}
    peaks: dict[str, float] = dict.fromkeys(procs, 0.0)
    for _ in range(args.rounds):
        for name, proc in procs.items():
            proc.stdin.write("go\n")
            proc.stdin.flush()
            seconds, peak = map(float, proc.stdout.readline().split())
            times[name].append(seconds)
            peaks[name] = max(peaks[name], peak)
    for proc in procs.values():
        proc.stdin.close()
        proc.wait()
    median = {name: statistics.median(values) for name, values in times.items()}
    lines = [
        f"{args.arch}, batch {args.batch}, {args.size}x{args.size}, {args.composite}, CPU, "
        f"1 thread per process, median of {args.rounds} interleaved rounds",
        "",
        "| case | seconds | x Saliency | x zennit | peak MiB above the model |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name, seconds in median.items():
        lines.append(
            f"| {name} | {seconds:.3f} | {seconds / median['saliency']:.2f} | "
            f"{seconds / median['zennit']:.2f} | {peaks[name]:.0f} |"
        )
    for tag in ("", " (before)"):
        if "lrp-10-calls" + tag in median:
            ratio = median["lrp-10-targets" + tag] / median["lrp-10-calls" + tag]
            lines.append(f"\n10 targets in one call / ten calls{tag}: {ratio:.2f}")
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()

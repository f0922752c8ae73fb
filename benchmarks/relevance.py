"""LRP's speed and memory against camkit's Saliency (one forward and one backward: the floor)
and zennit 0.5.1, side by side in one run, at several batch sizes and thread counts.

    python benchmarks/relevance.py [--arch resnet50] [--size 224] [--rounds 3]
                                   [--settings 4x2,8x2,4x1,8x1] [--targets-at 4x1]
                                   [--composite epsilon-plus-flat] [--before DIR] [--out FILE]

``--settings``: ``BATCHxTHREADS`` per setting (2 threads: torch's default on the 2-core machine
the tables were taken on). Each case lives in a process of its own (its own peak memory;
``--before DIR`` runs the LRP cases again with the camkit of ``DIR/src``, e.g. ``git archive
<commit> src | tar -x -C DIR``), builds the same ResNet with random weights (nothing
downloaded) and the same seeded batch, and makes one warm-up call. The parent then asks the
cases of a setting for one timed call each in turn, ``--rounds`` times (interleaved, so that the
load of a shared machine falls on every case alike), and reports the medians of the wall time
and of the CPU time (user + system, ``getrusage``: less sensitive to other processes on a shared
machine; the ratios use it). Peak memory, two ways: "peak", the process's peak resident memory
during its first call above its resident memory before it (``ru_maxrss`` minus the model and
the input), with glibc's heap as it comes: freed blocks below its (growing) mmap threshold stay
in the heap, so this includes its fragmentation and moves by 5-10 % from run to run; "tensors'
peak", a second call's peak resident memory above the memory before it in a process of its own
(after a warm-up) started with ``MALLOC_MMAP_THRESHOLD_=131072``, where every block over
128 KiB is its own mapping handed back when freed: the peak of the memory the call's tensors
hold, the allocator's habits left out. Rows:
camkit Saliency, camkit LRP, zennit (the same composite, ``ResNetCanonizer``), camkit LRP with
``Epsilon`` on every layer, and at ``--targets-at`` only, camkit LRP with 10 targets per image in
one call and ten one-target LRP calls; with ``--before``, LRP and Epsilon with the older camkit.
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
CASES = ("saliency", "lrp", "zennit", "lrp-epsilon")
TARGET_CASES = ("lrp-10-targets", "lrp-10-calls")
BEFORE_CASES = ("lrp", "lrp-epsilon")


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


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def child(case: str, args: argparse.Namespace) -> None:
    """Serve one case: a warm-up call, then one timed call per line read from stdin; with
    ``--tensors``, one call's peak memory above the memory before it, then exit."""
    import torch

    torch.set_num_threads(args.threads)
    run = _build(case, args)
    base = _rss_mib()
    run()
    if args.tensors:
        before = _rss_mib()
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")  # resets the process's peak resident memory (VmHWM) to now
        run()
        print(_peak_mib() - before, flush=True)
        return
    first = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - base
    print(f"ready {first}", flush=True)
    for _ in sys.stdin:
        start, cpu = time.perf_counter(), _cpu_seconds()
        run()
        seconds, cpu = time.perf_counter() - start, _cpu_seconds() - cpu
        print(f"{seconds} {cpu}", flush=True)


def _peak_mib() -> float:
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def _start(
    case: str, src: Path, batch: int, threads: int, tensors: bool = False
) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": str(threads)}
    command = [sys.executable, __file__, "--child", case, *sys.argv[1:]]
    command += ["--batch", str(batch), "--threads", str(threads)]
    if tensors:  # every block over 128 KiB its own mapping, handed back when freed
        env["MALLOC_MMAP_THRESHOLD_"] = str(128 * 1024)
        command.append("--tensors")
    proc = subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env
    )
    return proc


def _setting(args: argparse.Namespace, batch: int, threads: int, targets: bool) -> list[str]:
    """One setting's cases, interleaved round by round: its markdown table."""
    cases = CASES + (TARGET_CASES if targets else ())
    runs = [(case, "", ROOT / "src") for case in cases]
    if args.before:
        runs += [(case, " (before)", args.before / "src") for case in BEFORE_CASES]
    procs = {}
    peaks: dict[str, float] = {}
    call: dict[str, float] = {}
    for case, tag, src in runs:  # one at a time: the warm-ups and memory calls do not overlap
        with _start(case, src, batch, threads, tensors=True) as proc:
            call[case + tag] = float(proc.communicate()[0])
        procs[case + tag] = proc = _start(case, src, batch, threads)
        word, first = proc.stdout.readline().split()
        assert word == "ready", f"{case}{tag} did not start"
        peaks[case + tag] = float(first)
    walls: dict[str, list[float]] = {name: [] for name in procs}
    cpus: dict[str, list[float]] = {name: [] for name in procs}
    for _ in range(args.rounds):
        for name, proc in procs.items():
            proc.stdin.write("go\n")
            proc.stdin.flush()
            seconds, cpu = map(float, proc.stdout.readline().split())
            walls[name].append(seconds)
            cpus[name].append(cpu)
    for proc in procs.values():
        proc.stdin.close()
        proc.wait()
    wall = {name: statistics.median(values) for name, values in walls.items()}
    cpu = {name: statistics.median(values) for name, values in cpus.items()}
    lines = [
        f"### batch {batch}, {threads} thread{'s' * (threads > 1)}",
        "",
        f"{args.arch}, {args.size}x{args.size}, {args.composite}, CPU, median of {args.rounds} "
        "interleaved rounds",
        "",
        "| case | wall s | CPU s | x Saliency (CPU) | x zennit (CPU) | peak MiB "
        "| x Saliency (peak) | tensors' peak MiB | x Saliency (tensors) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name in procs:
        lines.append(
            f"| {name} | {wall[name]:.3f} | {cpu[name]:.3f} | {cpu[name] / cpu['saliency']:.2f} | "
            f"{cpu[name] / cpu['zennit']:.2f} | {peaks[name]:.0f} | "
            f"{peaks[name] / peaks['saliency']:.2f} | {call[name]:.0f} | "
            f"{call[name] / call['saliency']:.2f} |"
        )
    if targets:
        ratio = cpu["lrp-10-targets"] / cpu["lrp-10-calls"]
        lines.append(f"\n10 targets in one call / ten calls (CPU): {ratio:.2f}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="resnet50")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--settings", default="4x2,8x2,4x1,8x1", help="BATCHxTHREADS,...")
    parser.add_argument("--targets-at", default="4x1", help="the setting of the K-target rows")
    parser.add_argument("--composite", default="epsilon-plus-flat")
    parser.add_argument("--before", type=Path, help="a checkout whose src/ is the 'before' code")
    parser.add_argument("--out", type=Path, help="also write the tables to this markdown file")
    parser.add_argument("--child", choices=CASES + TARGET_CASES, help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=4, help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--tensors", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args)
        return
    lines: list[str] = []
    for setting in args.settings.split(","):
        batch, threads = (int(part) for part in setting.split("x"))
        table = _setting(args, batch, threads, setting == args.targets_at)
        print("\n".join(table), flush=True)
        lines += [*table, ""]
    if args.out:
        args.out.write_text("\n".join(lines))


if __name__ == "__main__":
    main()

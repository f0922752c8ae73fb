"""Is any method slower than before a change? Every registered method, CPU seconds of one call,
with camkit at this checkout ("after") and at an earlier revision ("before"), alternating.

    python benchmarks/before_after.py --before DIR_OR_REV [--rounds 5] [--methods gradcam,lrp]
                                      [--out FILE] [--operators]

``--before``: a checkout whose ``src/`` is the code before (``git worktree add DIR <commit>``),
or a git revision, checked out in a temporary worktree for the run. The methods: every name of
``camkit.registry.METHODS`` at this checkout that the code before registers too, so a new method
is timed without editing this file.

Each (method, version, round) runs in a process of its own, forked from a parent that has
imported torch and torchvision only (importing them costs 3 CPU seconds, which would otherwise
be paid 10 times per method); the child puts the version's ``src`` first on ``sys.path``,
imports camkit, builds the model, the input and the method, makes one warm-up call, then times
``n`` calls (``n`` from the warm-up: about 1 CPU second in all, 1 to 20 calls) by the
process's own ``resource.getrusage`` (user + system seconds), on one thread. Before and after
alternate within each round, in the opposite order every other round. Per method: the medians,
the ratio after / before of the medians, and the range of the rounds' paired ratios. A method
is beyond noise when that range leaves out 1 *and* the medians differ by more than the larger
spread (max - min) of the two versions' rounds. ``--operators`` instead counts the torch
operators of one call in each version (``torch.profiler``) and lists those whose counts differ:
the work of a call, free of timing noise. The first row, ``torch-alone``, is a control:
the same plain forward and input gradient of the ResNet, no camkit call, in the processes of
both versions; how far it moves is how far the state of a process alone moves the figures.

The model: a torchvision ResNet-18 with seeded random weights (nothing downloaded), a seeded
batch of 2 images 112x112, target class 3, ``layer4`` for the methods that read a layer
(RefineCAM: ``layer3`` and ``layer4``); the attention methods get a small torchvision ViT
(112 px, patches of 16, 4 blocks) on the same batch. :data:`OPTIONS` makes the methods that
draw many samples or masks small (the same options for both versions) so the run takes
minutes.
"""

from __future__ import annotations

import argparse
import datetime
import math
import multiprocessing
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TARGET = 3
# the same options in both versions: fewer samples, masks or steps than the defaults, and LRP's
# composite named (its default changed from epsilon-plus-flat to epsilon-plus-flat-nobias)
OPTIONS: dict[str, dict] = {
    "scorecam": {"top_channels": 64},
    "ablationcam": {"top_channels": 64},
    "sscam": {"samples": 2, "top_channels": 16},
    "iscam": {"samples": 2, "top_channels": 16},
    "sess": {"scales": [112], "window": 112},
    "smoothgrad": {"samples": 5},
    "ig": {"steps": 8},
    "lrp": {"composite": "epsilon-plus-flat"},
}
LAYERS: dict[str, object] = {"refinecam": ["layer3", "layer4"]}
CALL_SECONDS = 1.0  # CPU seconds of timed calls per process (1 to MAX_CALLS calls)
MAX_CALLS = 20
# the same torch work (a plain forward and input gradient of the ResNet) in the processes of both
# versions: how far the process's own state (its imports, its heap) moves the figures
CONTROL = "torch-alone"
MIN_ROUNDS = 3  # fewer rounds have no spread to judge noise by


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _model(attention: bool):
    import torch
    import torchvision
    from torchvision.models.vision_transformer import VisionTransformer

    torch.manual_seed(0)
    if not attention:
        return torchvision.models.resnet18(weights=None).eval()
    vit = VisionTransformer(
        image_size=112, patch_size=16, num_layers=4, num_heads=4, hidden_dim=64, mlp_dim=128
    ).eval()
    torch.nn.init.normal_(vit.heads.head.weight, std=0.1)  # torchvision's head starts at zero
    return vit


def _torch_alone(model, x):
    """The control: a plain forward and input gradient of the model, no camkit call."""
    import torch

    def run(x, target: int) -> None:
        leaf = x.detach().requires_grad_(True)
        with torch.enable_grad():
            score = model(leaf)[:, target].sum()
        torch.autograd.grad(score, leaf)

    return run


def _explainer(method: str, src: str):
    """``(explain, x)``: ``method`` of the camkit in ``src`` built on the benchmark's model (or
    :data:`CONTROL`'s plain pass, camkit imported), and its input."""
    import torch

    sys.path.insert(0, src)
    import camkit

    x = torch.randn(2, 3, 112, 112, generator=torch.Generator().manual_seed(1))
    if method == CONTROL:
        return _torch_alone(_model(False), x), x
    entry = camkit.registry.METHODS[method]
    model = _model(entry.family == "attention")
    options = dict(OPTIONS.get(method, {}))
    if entry.seeded:
        options["seed"] = 0
    cls = getattr(camkit, entry.cls.__name__)  # the public name, in both versions
    layer = LAYERS.get(method, "layer4")
    explain = cls(model, layer, **options) if entry.needs_layer else cls(model, **options)
    return explain, x


def measure(method: str, src: str) -> tuple[float, int]:
    """In a fresh process: ``(CPU seconds per call, calls timed)`` of ``method`` of the camkit
    in ``src`` (:data:`CONTROL`: torch alone, camkit imported), after one warm-up call."""
    explain, x = _explainer(method, src)
    start = cpu_seconds()
    explain(x, target=TARGET)
    warm = cpu_seconds() - start
    calls = max(1, min(MAX_CALLS, math.ceil(CALL_SECONDS / max(warm, 1e-3))))
    start = cpu_seconds()
    for _ in range(calls):
        explain(x, target=TARGET)
    return (cpu_seconds() - start) / calls, calls


def operators(method: str, src: str) -> dict[str, int]:
    """In a fresh process: how many times one call of ``method`` (after a warm-up call) runs
    each torch operator (``torch.profiler``): the work of a call, free of timing noise."""
    from torch.profiler import profile

    explain, x = _explainer(method, src)
    explain(x, target=TARGET)
    with profile() as profiled:
        explain(x, target=TARGET)
    return {event.key: event.count for event in profiled.key_averages()}


def _child(pipe, job, method: str, src: str) -> None:
    try:
        pipe.send(job(method, src))
    except Exception as error:  # noqa: BLE001 - reported in the table, the run goes on
        pipe.send(f"{type(error).__name__}: {error}".splitlines()[0][:120])


def run_one(method: str, src: Path, job=measure) -> Any:
    """One forked process running ``job`` (:func:`measure`, :func:`operators`) on ``method``
    with the camkit of ``src``; a string if it failed."""
    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)
    process = context.Process(target=_child, args=(send, job, method, str(src)))
    process.start()
    send.close()
    try:
        result = receive.recv()
    except EOFError:
        result = f"the process died (exit code {process.join() or process.exitcode})"
    process.join()
    return result


def registered(src: Path) -> list[str]:
    """The method names registered by the camkit of ``src``, in registration order."""
    code = "import camkit; print('\\n'.join(camkit.registry.METHODS))"
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(src)},
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.split()


def compare(names: list[str], after: Path, before: Path, rounds: int) -> dict[str, dict]:
    """``{method: {"after": [...], "before": [...], "calls": [...], "error": ...}}``: the CPU
    seconds per call of every round, before and after alternating."""
    results = {name: {"after": [], "before": [], "calls": [], "error": None} for name in names}
    for round_ in range(rounds):
        for index, name in enumerate(names):
            row = results[name]
            if row["error"]:
                continue
            versions = [("before", before), ("after", after)]
            if (round_ + index) % 2:
                versions.reverse()
            for version, src in versions:
                result = run_one(name, src)
                if isinstance(result, str):
                    row["error"] = f"{version}: {result}"
                    break
                row[version].append(result[0])
                row["calls"].append(result[1])
            last = {version: row[version][-1:] for version in ("before", "after")}
            print(f"round {round_ + 1} {name}: {last}", flush=True)
    return results


def summary(row: dict) -> dict | None:
    """Medians, ratio, the paired ratios' range and whether the difference is beyond noise."""
    before, after = row["before"], row["after"]
    if row["error"] or len(before) < MIN_ROUNDS or len(before) != len(after):
        return None
    ratios = [a / b for a, b in zip(after, before, strict=True)]
    median_before, median_after = statistics.median(before), statistics.median(after)
    spread = max(max(before) - min(before), max(after) - min(after))
    outside = min(ratios) > 1 or max(ratios) < 1
    beyond = outside and abs(median_after - median_before) > spread
    verdict = "within noise"
    if beyond:
        verdict = "**slower**" if median_after > median_before else "faster"
    return {
        "before": median_before,
        "after": median_after,
        "ratio": median_after / median_before,
        "low": min(ratios),
        "high": max(ratios),
        "spread": spread,
        "verdict": verdict,
        "calls": min(row["calls"]),
        "slower_in": sum(r > 1 for r in ratios),
    }


def operator_table(names: list[str], after: Path, before: Path) -> str:
    """Per method, the torch operators whose count per call differs before and after."""
    lines = [
        "| method | operators per call that differ (before -> after) |",
        "| --- | --- |",
    ]
    for name in names:
        counts = {version: run_one(name, src, operators) for version, src in
                  (("before", before), ("after", after))}  # fmt: skip
        if any(isinstance(found, str) for found in counts.values()):
            lines.append(f"| {name} | {counts} |")
            continue
        ops = sorted(set(counts["before"]) | set(counts["after"]))
        differ = [
            f"`{op}` {counts['before'].get(op, 0)} -> {counts['after'].get(op, 0)}"
            for op in ops
            if counts["before"].get(op, 0) != counts["after"].get(op, 0)
        ]
        lines.append(f"| {name} | {', '.join(differ) or 'none'} |")
        print(lines[-1], flush=True)
    return "\n".join(lines) + "\n"


def table(results: dict[str, dict], args: argparse.Namespace, minutes: float) -> str:
    import torch

    now = datetime.datetime.now(datetime.UTC)
    lines = [
        "# Every method before and after (`benchmarks/before_after.py`)",
        "",
        f"`python benchmarks/before_after.py --before {args.before} --rounds {args.rounds}` on "
        f"{now:%Y-%m-%d %H:%M} UTC ({minutes:.0f} min), {platform.processor() or 'CPU'}, "
        f"{os.cpu_count()} cores shared with other work (load average at the end "
        f"{os.getloadavg()[0]:.1f}), torch {torch.__version__}, one thread per process.",
        "",
        "CPU seconds (user + system, `getrusage`) per call, in ms: medians of the rounds; "
        "ratio = after / before of the medians; range = the lowest and highest of the rounds' "
        "paired ratios; spread = the larger max - min of the two versions' rounds. Beyond noise: "
        "the range leaves out 1 and the medians differ by more than the spread. Slower in: the "
        "rounds whose paired ratio is above 1.",
        "",
        "| method | before (ms) | after (ms) | ratio | range | slower in | spread (ms) | calls "
        "| verdict |",
        "| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | --- |",
    ]
    for name, row in results.items():
        s = summary(row)
        if s is None:
            why = row["error"] or f"fewer than {MIN_ROUNDS} rounds"
            lines.append(f"| {name} | - | - | - | - | - | - | - | {why} |")
            continue
        lines.append(
            f"| {name} | {s['before'] * 1e3:.1f} | {s['after'] * 1e3:.1f} | {s['ratio']:.2f} | "
            f"{s['low']:.2f}-{s['high']:.2f} | {s['slower_in']}/{len(row['after'])} | "
            f"{s['spread'] * 1e3:.1f} | {s['calls']} | "
            f"{s['verdict']} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="a checkout (its src/) or a git revision")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (medians)")
    parser.add_argument("--methods", help="comma list (default: every method in both versions)")
    parser.add_argument("--out", type=Path, help="also write the table to this markdown file")
    parser.add_argument(
        "--operators",
        action="store_true",
        help="instead of timing: the torch operators of one call whose counts differ",
    )
    args = parser.parse_args()
    for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[variable] = "1"
    import torch
    import torchvision  # noqa: F401 - imported once here, inherited by every forked child

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as folder:
        before = Path(args.before)
        if not before.is_dir():  # a revision: its own temporary worktree
            before = Path(folder) / "before"
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q",
                            str(before), args.before], check=True)  # fmt: skip
        try:
            there = set(registered(before / "src"))
            names = [CONTROL, *(name for name in registered(ROOT / "src") if name in there)]
            if args.methods:
                names = [name for name in args.methods.split(",") if name in names]
            if args.operators:
                text = operator_table(names, ROOT / "src", before / "src")
            else:
                start = datetime.datetime.now()
                results = compare(names, ROOT / "src", before / "src", args.rounds)
                minutes = (datetime.datetime.now() - start).total_seconds() / 60
                text = table(results, args, minutes)
        finally:
            if before != Path(args.before):
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                                str(before)], check=True)  # fmt: skip
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()

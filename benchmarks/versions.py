"""Is any method slower than at an earlier revision? camkit at this checkout against camkit at
``REV``, method by method, each timed in a process of its own, the two versions alternating.

    python benchmarks/versions.py REV [--methods gradcam,scorecam] [--rounds 2]
                                      [--out benchmarks/VERSIONS.md]

The model is a ResNet-18 with random weights on one 112x112 image (``layer4`` for the methods
that read a layer); each process builds the method, runs it once (warm-up) and times three
calls (median). ``REV`` is checked out in a temporary git worktree and imported through
``PYTHONPATH``; both versions run with this interpreter and its packages. The attention methods
(they need a ViT), RefineCAM (several layers) and the methods drawing dozens of noisy
Score-CAMs (SS-CAM, IS-CAM) are left out unless named. A ratio above 1.1 is marked slower:
run-to-run noise on a shared 2-core machine is about 5-10 %.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SKIPPED = {"rollout", "legrad", "refinecam", "sscam", "iscam"}
SLOWER = 1.1


def child(method: str, clock: str) -> None:
    """Time ``method`` of the camkit on ``sys.path``; print seconds (median of 3 calls).
    ``clock="cpu"``: the process's CPU time on one thread (what the work costs, whatever else
    runs on the machine); ``"wall"``: wall-clock seconds with torch's default threads."""
    import torch
    import torchvision

    import camkit

    if clock == "cpu":
        torch.set_num_threads(1)
    now = time.process_time if clock == "cpu" else time.perf_counter
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    x = torch.rand(1, 3, 112, 112)
    entry = camkit.METHODS[method]
    layer = ("layer4",) if entry.needs_layer else ()
    try:
        explain = entry.cls(model, *layer, seed=0)
    except (TypeError, ValueError):  # a method without seed=
        explain = entry.cls(model, *layer)
    explain(x, 3)
    times = []
    for _ in range(3):
        start = now()
        explain(x, 3)
        times.append(now() - start)
    print(statistics.median(times))


def timed(method: str, source: Path, clock: str = "wall") -> float | None:
    """Seconds of one call of ``method`` with camkit imported from ``source``; None if it fails
    (e.g. the method does not exist there)."""
    environment = {**os.environ, "PYTHONPATH": str(source)}
    command = [sys.executable, __file__, "--child", method, "--clock", clock]
    done = subprocess.run(command, env=environment, capture_output=True, text=True, cwd=source)
    if done.returncode != 0:
        return None
    return float(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rev", nargs="?", help="the git revision to compare with")
    parser.add_argument("--methods", help="comma list (default: every method, see above)")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds (median)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "VERSIONS.md"))
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="wall-clock seconds (default), or CPU seconds on one thread: the measure to use "
        "on a machine that other work shares",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.clock)
        return
    if not args.rev:
        parser.error("give the revision to compare with (a commit, a tag, a branch)")
    sys.path.insert(0, str(ROOT / "src"))
    import camkit

    names = args.methods.split(",") if args.methods else sorted(set(camkit.METHODS) - SKIPPED)
    with tempfile.TemporaryDirectory() as folder:
        worktree = Path(folder) / "rev"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q",
                        str(worktree), args.rev], check=True)  # fmt: skip
        try:
            rows = compare(names, ROOT / "src", worktree / "src", args.rounds, args.clock)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                            str(worktree)], check=True)  # fmt: skip
    write(rows, args)


def compare(
    names: list[str], here: Path, there: Path, rounds: int, clock: str = "wall"
) -> list[tuple]:
    """``(method, seconds here, seconds there)`` per method, medians of alternating rounds."""
    rows = []
    for method in names:
        mine, theirs = [], []
        for _ in range(rounds):
            mine.append(timed(method, here, clock))
            theirs.append(timed(method, there, clock))
        median = [statistics.median(t) if None not in t else None for t in (mine, theirs)]
        rows.append((method, *median))
        print(method, *median, flush=True)
    return rows


def write(rows: list[tuple], args: argparse.Namespace) -> None:
    def cell(seconds: float | None) -> str:
        return "-" if seconds is None else f"{seconds * 1000:.1f}"

    lines = [
        "# camkit against an earlier revision, method by method",
        "",
        f"`python benchmarks/versions.py {args.rev} --clock {args.clock}` on "
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} cores, "
        f"load average {os.getloadavg()[0]:.1f}; {args.rounds} alternating rounds (medians); "
        "ResNet-18 (random weights), one 112x112 image, `layer4`; "
        + ("CPU seconds on one thread." if args.clock == "cpu" else "wall-clock seconds."),
        "",
        f"| method | this checkout (ms) | {args.rev} (ms) | ratio | slower |",
        "| --- | ---: | ---: | ---: | --- |",
    ]
    for method, mine, theirs in rows:
        ratio = mine / theirs if mine and theirs else None
        slower = "" if ratio is None else "yes" if ratio > SLOWER else "no"
        ratio_cell = "-" if ratio is None else f"{ratio:.2f}"
        lines.append(f"| {method} | {cell(mine)} | {cell(theirs)} | {ratio_cell} | {slower} |")
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

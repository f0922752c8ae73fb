"""Score-CAM's peak memory and time, camkit against torchcam and pytorch-grad-cam.

    python benchmarks/memory_scorecam.py [--repeats 3] [--batch-size 32] [--threads N]
                                         [--out benchmarks/MEMORY_SCORECAM.md]

ResNet-18 (``weights=None``, seeded) layer4, one 224x224 image, the masked images forwarded in
batches of ``--batch-size``. Each implementation runs in its own process (so one's freed
memory cannot hide another's peak): the process builds the model, runs one plain
``torch.inference_mode()`` forward, reads its peak RSS (``resource.getrusage``), runs the
method once and reads the peak RSS again; the difference is the method's peak above the
model's own forward. Median of ``--repeats`` processes per implementation, with the median
time of the method call. Prints a markdown table and writes it to ``--out``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

IMPLS = ("camkit ScoreCAM", "torchcam ScoreCAM", "pytorch-grad-cam ScoreCAM")
HERE = Path(__file__).resolve().parent
FINDINGS = """
## Where camkit's extra memory went (measured 2026-11-23, 2 shared CPU cores)

Before (the previous commit's `ScoreCAM`, same script, cold): camkit 315 MB, torchcam 283 MB,
pytorch-grad-cam 703 MB (times on a loaded machine: 13.3 s, 16.4 s, 46.3 s).

* The tensors were not the excess. torch's own allocations, replayed from the profiler
  (`benchmarks/run.py`'s `peak_memory_mb`), peak at 214.6 MB for camkit and 215.3 MB for
  torchcam: the batch-32 forward itself (conv1 and bn1 outputs, 103 MB each, plus the 19 MB
  masked batch). Neither channels_last (camkit with channels_last off: the same peaks, 30 %
  slower) nor the dedup keys (100 kB) nor the masks (6.4 MB per chunk) explain 50 MB.
* The excess was glibc's heap: freed tensors below its dynamic mmap threshold stay in the
  process's heap, and the next chunk's forward peaks on top of them. With
  `MALLOC_MMAP_THRESHOLD_=131072` (a fixed threshold) the peaks are camkit 218 MB, torchcam
  215 MB. A warm-up call (code pages faulted in before the baseline) does not change camkit's
  peak (309 MB warm), so it is not library code either.
* Fixes: `malloc_trim(0)` (glibc; nothing elsewhere) before each perturbed CPU forward gives
  the freed heap back (peak 213-214 MB in 3 of 3 runs); it costs about 5 % of the time here
  (re-faulted pages; 6.96-7.55 s against 6.77-6.85 s without, two runs each), and about 10 %
  on 32 images of 112x112, so batches under 8 MiB (`TRIM_BYTES`) skip it; the masks are normalised
  in place and freed before the forward; one reused buffer of `batch_size` masked images, and
  the long-lived tensors are allocated before the loop. SS-CAM and IS-CAM share this loop.
"""


def child(impl: str, batch_size: int, threads: int | None, warm: bool) -> dict[str, float]:
    """One measurement in this process: ``{"peak_mb", "seconds"}``. ``warm``: run the method
    once on a 64x64 image first, so the library code and kernels it touches for the first time
    (pages of libtorch faulted in: counted by RSS) are in the baseline."""
    import resource

    import torch
    from torchvision import models

    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = models.resnet18(weights=None).eval()
    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    target = 7

    if impl == "camkit ScoreCAM":
        import camkit

        cam = camkit.ScoreCAM(model, "layer4", batch_size=batch_size)

        def run(x: torch.Tensor) -> object:
            return cam(x, target)

    elif impl == "torchcam ScoreCAM":
        from torchcam.methods import ScoreCAM

        def run(x: torch.Tensor) -> object:
            shape = tuple(x.shape[1:])
            with ScoreCAM(model, "layer4", batch_size=batch_size, input_shape=shape) as extractor:
                with torch.inference_mode():
                    scores = model(x)
                return extractor(class_idx=target, scores=scores)

    else:
        from pytorch_grad_cam import ScoreCAM
        from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

        def run(x: torch.Tensor) -> object:
            with ScoreCAM(model, [model.layer4]) as extractor:
                extractor.batch_size = batch_size
                return extractor(x, [ClassifierOutputTarget(target)])

    if warm:
        run(torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(2)))
    with torch.inference_mode():
        model(x)  # the model's own forward: its peak is the baseline
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    run(x)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"peak_mb": (peak - base) / 1024, "seconds": seconds}  # ru_maxrss: KiB on Linux


def measure(impl: str, batch_size: int, threads: int | None, warm: bool) -> dict[str, float]:
    argv = [sys.executable, __file__, "--child", impl, "--batch-size", str(batch_size)]
    if warm:
        argv.append("--warm")
    if threads:
        argv += ["--threads", str(threads)]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{impl} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--impls", default=",".join(IMPLS), help="comma-separated subset")
    parser.add_argument("--out", type=Path, default=HERE / "MEMORY_SCORECAM.md")
    parser.add_argument(
        "--modes", default="cold,warm", help="cold (as the issue measured), warm, or both"
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--warm", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.batch_size, args.threads, args.warm)))
        return 0

    impls = [name.strip() for name in args.impls.split(",") if name.strip()]
    modes = [mode.strip() for mode in args.modes.split(",") if mode.strip()]
    runs: dict[tuple[str, str], list[dict[str, float]]] = {
        (mode, name): [] for mode in modes for name in impls
    }
    for _ in range(args.repeats):  # interleaved, so a busy machine slows all alike
        for mode, name in runs:
            try:
                runs[mode, name].append(
                    measure(name, args.batch_size, args.threads, mode == "warm")
                )
            except RuntimeError as err:
                print(err, file=sys.stderr)
    lines = [
        "| baseline | implementation | peak RSS above the model's forward (MB) | time (s) "
        "| time / best peer |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for mode in modes:
        rows = {
            name: (
                statistics.median(r["peak_mb"] for r in results),
                statistics.median(r["seconds"] for r in results),
            )
            for (m, name), results in runs.items()
            if m == mode and results
        }
        peers = [t for name, (_, t) in rows.items() if "camkit" not in name]
        best_peer = min(peers, default=None)
        for name, (peak, seconds) in rows.items():
            ratio = f"{seconds / best_peer:.2f}x" if best_peer else "n/a"
            lines.append(f"| {mode} | {name} | {peak:.0f} | {seconds:.2f} | {ratio} |")
    table = "\n".join(lines)
    print(table)
    import torch

    header = (
        "# Score-CAM memory\n\n"
        f"Generated by `python benchmarks/memory_scorecam.py` on "
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC: torch "
        f"{torch.__version__}, {platform.machine()}, {os.cpu_count()} CPUs, "
        f"{args.threads or torch.get_num_threads()} threads.\n\n"
        "ResNet-18 (`weights=None`) layer4, one 224x224 image, masked images forwarded in "
        f"batches of {args.batch_size}; each implementation in its own process; peak RSS "
        "(`resource.getrusage`) after the method minus the peak after one plain forward; "
        f"median of {args.repeats} processes. *cold*: the method's first call in the process "
        "(as the issue measured: library code and kernels touched for the first time, e.g. "
        "channels_last convolutions, count as RSS); *warm*: the method ran once on a 64x64 "
        "image before the baseline.\n\n"
    )
    args.out.write_text(header + table + "\n" + FINDINGS)
    return 0


if __name__ == "__main__":
    sys.exit(main())

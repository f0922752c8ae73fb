"""A clip's Grad-CAM against the model's own forward and backward on that clip; and the memory of
``camkit explain`` on a long video.

    python benchmarks/video.py [--model r3d_18] [--frames 16] [--size 112] [--repeats 5]
                               [--device cpu]
    python benchmarks/video.py --memory 1,5,10 [--size 64] [--fps 25] [--workers 0]

torchvision's r3d_18 (random weights: the cost does not depend on them) on one clip
``(1, 3, frames, size, size)``: the baseline is a forward and a ``backward`` of the top-1 logit
to the input (what any gradient explanation needs at least); Grad-CAM at the default layer
(``layer4``) needs one forward and a backward from the score to that layer only. Median of
``--repeats`` rounds after one warm-up, the two timed alternately in each round.

``--memory``: for each length in minutes, a synthetic video (``--size`` pixels square, ``--fps``
frames a second, MJPG written by OpenCV: a gray ramp with a square moving across) is explained
by ``camkit explain``'s video pipeline (16-frame windows side by side, Grad-CAM, a tiny 3-D CNN
with fixed weights, ``--workers`` decoding processes) in a fresh process, which reports its peak
resident memory (``ru_maxrss``; with workers: the largest child's too) and its time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torchvision.models import video

import camkit


def timed(run, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    run()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def tiny_video_model() -> camkit.models.LoadedModel:
    """A 3-D CNN of two convolutions (fixed weights) on 16-frame 64x64 clips."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv3d(3, 8, 3, stride=(1, 2, 2), padding=1),
        torch.nn.ReLU(),
        torch.nn.Conv3d(8, 16, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool3d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(16, 4),
    ).eval()
    return camkit.models.LoadedModel(
        name="tiny3d",
        model=model,
        preprocess=camkit.models.Preprocess(64, crop_mode="squash"),
        labels=[f"class {i}" for i in range(4)],
        default_layer="2",
        input_size=(16, 64, 64),
    )


def synthetic_video(path: Path, minutes: float, size: int, fps: float) -> int:
    """Write ``minutes`` of video -> its frame count."""
    import cv2

    count = round(minutes * 60 * fps)
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), fps, (size, size))
    for t in range(count):
        frame = np.full((size, size, 3), (t // 4) % 200, np.uint8)
        x = t % (size - 8)
        frame[size // 3 : size // 3 + 8, x : x + 8] = 255
        writer.write(frame)
    writer.release()
    return count


def explain_one(path: Path, workers: int) -> None:
    """Explain one video in this process; print peak memory and time as JSON."""
    import resource

    from camkit.cli.commands.explain import explain
    from camkit.cli.pipeline import Job

    out = path.with_suffix("")
    job = Job(methods=("gradcam",), layer="2", classes=None, out=out,
              device=torch.device("cpu"), workers=workers, quiet=True)  # fmt: skip
    start = time.perf_counter()
    (record,) = explain(tiny_video_model(), [path], job)["records"]
    seconds = time.perf_counter() - start
    mine = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    mp4 = (out / record["output"]).stat().st_size
    print(json.dumps({"frames": record["frames"], "windows": len(record["windows"]),
                      "peak_rss_mb": round(mine, 1), "worker_peak_rss_mb": round(children, 1),
                      "seconds": round(seconds, 1), "mp4_mb": round(mp4 / 2**20, 2)}))  # fmt: skip


def memory(minutes: list[float], size: int, fps: float, workers: int) -> None:
    with tempfile.TemporaryDirectory() as folder:
        for length in minutes:
            path = Path(folder) / f"video{length:g}min.avi"
            synthetic_video(path, length, size, fps)
            command = [sys.executable, __file__, "--one", str(path), "--workers", str(workers)]
            found = subprocess.run(command, capture_output=True, text=True, check=True)
            print(f"{length:g} min ({size}x{size}, {fps:g} fps): {found.stdout.strip()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="r3d_18")
    parser.add_argument("--frames", type=int, default=16)
    parser.add_argument("--size", type=int, default=112)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--memory", help="video lengths in minutes, e.g. 1,5,10")
    parser.add_argument("--fps", type=float, default=25.0)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--one", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one is not None:
        return explain_one(args.one, args.workers)
    if args.memory:
        minutes = [float(m) for m in args.memory.split(",")]
        return memory(minutes, 64 if args.size == 112 else args.size, args.fps, args.workers)
    device = torch.device(args.device)
    torch.manual_seed(0)
    model = getattr(video, args.model)(num_classes=400).eval().to(device)
    clip = torch.randn(1, 3, args.frames, args.size, args.size, device=device)
    cam = camkit.GradCAM(model)

    def forward_backward() -> None:
        leaf = clip.clone().requires_grad_(True)
        logits = model(leaf)
        logits[0, logits[0].argmax()].backward()

    def gradcam() -> None:
        cam(clip)

    for run in (forward_backward, gradcam):  # warm-up
        run()
    base, ours = [], []
    for _ in range(args.repeats):
        base.append(timed(forward_backward, device))
        ours.append(timed(gradcam, device))
    base_s, ours_s = statistics.median(base), statistics.median(ours)
    print(
        f"{args.model} clip 1x3x{args.frames}x{args.size}x{args.size} on {device} "
        f"({torch.get_num_threads()} threads): forward+backward {base_s * 1000:.0f} ms, "
        f"Grad-CAM ({cam.layers[0]}) {ours_s * 1000:.0f} ms, ratio {ours_s / base_s:.2f}"
    )


if __name__ == "__main__":
    main()

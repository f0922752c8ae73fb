"""A clip's Grad-CAM against the model's own forward and backward on that clip.

    python benchmarks/video.py [--model r3d_18] [--frames 16] [--size 112] [--repeats 5]
                               [--device cpu]

torchvision's r3d_18 (random weights: the cost does not depend on them) on one clip
``(1, 3, frames, size, size)``: the baseline is a forward and a ``backward`` of the top-1 logit
to the input (what any gradient explanation needs at least); Grad-CAM at the default layer
(``layer4``) needs one forward and a backward from the score to that layer only. Median of
``--repeats`` rounds after one warm-up, the two timed alternately in each round.
"""

from __future__ import annotations

import argparse
import statistics
import time

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="r3d_18")
    parser.add_argument("--frames", type=int, default=16)
    parser.add_argument("--size", type=int, default=112)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
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

"""`camkit explain` end to end against a plain decode + preprocess + forward loop, and 1 vs 2
torchrun processes; the figures go into benchmarks/RESULTS.md (section "End to end").

    python benchmarks/pipeline.py                 # 200 photos of mixed sizes (300-900 px)
    python benchmarks/pipeline.py --images 60     # a quicker look

The photos are scikit-image's samples, randomly cropped and resized, saved as JPEG once in a
cache folder. The plain loop decodes each file with Pillow, applies the same squash
preprocessing, and runs the default model forward in `torch.inference_mode()`, 8 images per
batch, in this process. camkit's figures are those its manifest reports (images/s from the
first batch to the last file written: decoding, Grad-CAM, the overlay at the original size), for
the default JPEG overlays and for lossless PNG overlays. The plain loop is measured before and
after the camkit runs of each round; a round's ratios divide by the mean of its two loops, and
the table gives the median over the rounds (``--rounds``), so that a drift of a shared machine's
speed during the run moves the ratios less than the absolute figures.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parent
START = "<!-- end to end: written by benchmarks/pipeline.py -->"
END = "<!-- end of end to end -->"


def photos(count: int, folder: Path) -> list[Path]:
    """``count`` JPEGs of 300-900 px cut from scikit-image's photos (made once)."""
    from skimage import data

    folder.mkdir(parents=True, exist_ok=True)
    sources = [data.chelsea(), data.coffee(), data.astronaut(), data.rocket()]
    sources.append(data.stereo_motorcycle()[0])
    rng = np.random.default_rng(0)
    paths = []
    for i in range(count):
        path = folder / f"photo{i:04d}.jpg"
        paths.append(path)
        if path.exists():
            continue
        source = sources[i % len(sources)]
        h, w = source.shape[:2]
        top, left = int(rng.integers(0, h // 4)), int(rng.integers(0, w // 4))
        crop = Image.fromarray(source[top : top + 3 * h // 4, left : left + 3 * w // 4])
        side = int(rng.integers(300, 901))
        scale = side / max(crop.size)
        crop.resize((round(crop.width * scale), round(crop.height * scale))).save(path, quality=90)
    return paths


def plain_loop(paths: list[Path], batch: int = 8) -> float:
    """Images/s of decode + preprocess + inference-mode forward, the floor of any explainer."""
    from camkit import io, models

    loaded = models.load()
    squash = dataclasses.replace(loaded.preprocess, crop_mode="squash")
    start = time.perf_counter()
    for first in range(0, len(paths), batch):
        inputs = torch.stack([squash(io.read_image(p)) for p in paths[first : first + batch]])
        with torch.inference_mode():
            loaded.model(inputs.contiguous(memory_format=torch.channels_last))
    return len(paths) / (time.perf_counter() - start)


def camkit_run(folder: Path, out: Path, processes: int, extra: list[str]) -> dict:
    """The manifest's throughput of ``camkit explain`` in ``processes`` torchrun processes."""
    command = [sys.executable, "-m", "camkit", "explain", str(folder), "--out", str(out)]
    command += ["--quiet", "--no-report", *extra]
    if processes > 1:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        command = [*launcher, f"--nproc_per_node={processes}", *command[1:]]
    subprocess.run(command, check=True, capture_output=True, text=True)
    return json.loads((out / "manifest.json").read_text())["throughput"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median)")
    parser.add_argument("--out", default=str(ROOT / "RESULTS.md"))
    parser.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "camkit-bench"))
    args = parser.parse_args()
    cache = Path(args.cache)
    paths = photos(args.images, cache / f"photos{args.images}")
    folder = paths[0].parent
    cases = {
        "jpg": (1, []),
        "png": (1, ["--format", "png"]),
        "two": (2, ["--workers", "0"]),
    }
    speeds: dict[str, list[float]] = {name: [] for name in ("loop", *cases)}
    ratios: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.rounds):
        before = plain_loop(paths)
        round_speeds = {
            name: camkit_run(folder, cache / f"out-{name}", processes, extra)["images_per_second"]
            for name, (processes, extra) in cases.items()
        }
        loop = (before + plain_loop(paths)) / 2
        speeds["loop"].append(loop)
        for name, speed in round_speeds.items():
            speeds[name].append(speed)
            ratios[name].append(speed / loop)
    loop = float(np.median(speeds["loop"]))
    median = {name: float(np.median(values)) for name, values in ratios.items()}
    spread = ", ".join(f"{value:.1f}" for value in speeds["loop"])

    def row(case: str, name: str, target: float) -> str:
        speed, ratio = float(np.median(speeds[name])), median[name]
        met = "yes" if ratio >= target else "no"
        return f"| {case} | {speed:.1f} | {ratio:.2f} | >= {target}x the loop | {met} |"

    rows = [
        "| case | images/s | ratio | target | met |",
        "| --- | ---: | ---: | --- | --- |",
        f"| plain loop: decode + preprocess + `inference_mode` forward (rounds: {spread}) "
        f"| {loop:.1f} | 1.00 | | |",
        row("`camkit explain` (Grad-CAM, JPEG overlays: the default), 1 process", "jpg", 0.85),
        row("`camkit explain --format png` (lossless overlays at full resolution), 1 process",
            "png", 0.7),
        (
            f"| `torchrun --nproc_per_node=2 -m camkit explain` | "
            f"{float(np.median(speeds['two'])):.1f} | {median['two']:.2f} | >= 1 process | "
            f"{'yes' if median['two'] >= median['jpg'] else 'no'} |"
        ),
    ]  # fmt: skip
    cores = os.cpu_count()
    section = "\n".join(
        [
            START,
            "## End to end",
            "",
            f"{len(paths)} JPEG photos of 300-900 px, default model (EfficientNet-Lite0), CPU, "
            f"{cores} cores, torch threads {torch.get_num_threads()}, {args.rounds} interleaved "
            f"rounds (medians), load average {os.getloadavg()[0]:.1f}; "
            f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC.",
            "",
            *rows,
            END,
        ]
    )
    print(section)
    results = Path(args.out)
    text = results.read_text() if results.exists() else ""
    if START in text:
        text = text[: text.index(START)] + section + text[text.index(END) + len(END) :]
    else:
        text = text.rstrip() + "\n\n" + section + "\n"
    results.write_text(text)


if __name__ == "__main__":
    main()

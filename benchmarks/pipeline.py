"""`camkit explain` end to end against a plain decode + preprocess + forward loop, and 1 vs 2
torchrun processes; the figures go into benchmarks/RESULTS.md (section "End to end").

    python benchmarks/pipeline.py                 # 200 photos of mixed sizes (300-900 px)
    python benchmarks/pipeline.py --images 60     # a quicker look

The photos are scikit-image's samples, randomly cropped and resized, saved as JPEG once in a
cache folder. The plain loop decodes each file with Pillow, applies the same squash
preprocessing, and runs the default model forward in `torch.inference_mode()`, 8 images per
batch, in this process. camkit's figures are those its manifest reports (images/s from the
first batch to the last file written: decoding, Grad-CAM, overlay PNG at the original size).
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
    parser.add_argument("--out", default=str(ROOT / "RESULTS.md"))
    parser.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "camkit-bench"))
    args = parser.parse_args()
    cache = Path(args.cache)
    paths = photos(args.images, cache / f"photos{args.images}")
    loop = plain_loop(paths)
    one = camkit_run(paths[0].parent, cache / "out1", 1, [])
    two = camkit_run(paths[0].parent, cache / "out2", 2, ["--workers", "0"])
    rows = [
        "| case | images/s | ratio | target | met |",
        "| --- | ---: | ---: | --- | --- |",
        f"| plain loop: decode + preprocess + `inference_mode` forward | {loop:.1f} | 1.00 | | |",
        (
            f"| `camkit explain` (Grad-CAM, overlay PNG written), 1 process | "
            f"{one['images_per_second']:.1f} | {one['images_per_second'] / loop:.2f} "
            f"| >= 0.7x the loop | {'yes' if one['images_per_second'] >= 0.7 * loop else 'no'} |"
        ),
        (
            f"| `torchrun --nproc_per_node=2 -m camkit explain` | "
            f"{two['images_per_second']:.1f} | {two['images_per_second'] / loop:.2f} "
            f"| >= 1 process | "
            f"{'yes' if two['images_per_second'] >= one['images_per_second'] else 'no'} |"
        ),
    ]
    cores = os.cpu_count()
    section = "\n".join(
        [
            START,
            "## End to end",
            "",
            f"{len(paths)} JPEG photos of 300-900 px, default model (EfficientNet-Lite0), CPU, "
            f"{cores} cores, torch threads {torch.get_num_threads()}; "
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

"""SpRAy (camkit.strategies): does it find a planted shortcut, and does it scale?

1. The planted Clever-Hans model (:mod:`camkit.strategies.planted`): class-0 images decided by
   a corner tag or by the object; Grad-CAM maps clustered per class. Reported: the adjusted
   Rand index against the truth and the eigengap's suggestion (target: ARI >= 0.8, k = 2).
2. 10,000 maps of one class at 224 x 224, read from a ``maps.npz`` written like
   ``camkit explain --save-maps`` (memory-mapped): pooling, graph, spectrum, k-means timed
   step by step, in a fresh process whose peak memory is measured (target: <= 60 s,
   <= 2 GB). With ``--tsne``, t-SNE (on a 3,000-map subset) is timed separately.

    python benchmarks/strategies.py [--maps 10000] [--tsne] [--out benchmarks]

Writes ``benchmarks/STRATEGIES.md`` and ``benchmarks/strategies_planted.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from camkit.runs.maps import write_maps
from matplotlib.figure import Figure
from sklearn.metrics import adjusted_rand_score

import camkit
from camkit.strategies import analyze_class, find_strategies, load_maps, pool_maps
from camkit.strategies.planted import planted_images, planted_model
from camkit.strategies.plots import prototype_picture


def planted_maps(tagged: int, objects: int, seed: int = 0) -> tuple[torch.Tensor, np.ndarray]:
    model = planted_model()
    images, truth = planted_images(tagged, objects, seed=seed)
    return camkit.GradCAM(model, model[1])(images, target=0), truth


def planted(out: Path) -> list[dict]:
    rows = []
    for tagged, objects in ((30, 70), (300, 700), (1000, 2000)):
        maps, truth = planted_maps(tagged, objects)
        started = time.perf_counter()
        layout = "spectral" if tagged == 300 else None
        found = find_strategies(maps, np.zeros(len(truth), int), embedding=layout).classes[0]
        seconds = time.perf_counter() - started
        ari = adjusted_rand_score(truth, found.labels)
        tag = found.by_suspiciousness()[0]
        rows.append(
            {
                "maps": len(truth),
                "tagged": tagged,
                "suggested_k": found.suggested_k,
                "ari": ari,
                "tag_cluster_first": bool(truth[tag.members].mean() > 0.95),
                "seconds": seconds,
            }
        )
        print(rows[-1])
        if tagged == 300:
            figure(found, out / "strategies_planted.png")
    return rows


def figure(found, path: Path) -> None:
    fig = Figure(figsize=(11, 3.2), layout="constrained")
    axes = fig.subplots(1, 2 + found.k, width_ratios=[1.3, 1.3] + [1] * found.k)
    values = found.eigenvalues
    axes[0].plot(range(1, len(values) + 1), values, "o-")
    axes[0].set_title(f"eigenvalues (eigengap suggests {found.suggested_k})", fontsize=9)
    for cluster in sorted(set(found.labels.tolist())):
        points = found.embedding[found.labels == cluster]
        axes[1].scatter(points[:, 0], points[:, 1], s=4, label=f"cluster {cluster}")
    axes[1].set_title("spectral embedding (first two coordinates)", fontsize=9)
    axes[1].legend(fontsize=7)
    for ax, cluster in zip(axes[2:], found.clusters, strict=True):
        ax.imshow(prototype_picture(cluster.prototype))
        ax.set_title(
            f"cluster {cluster.id}: {cluster.size} maps\nsuspiciousness "
            f"{cluster.suspiciousness:.2f}",
            fontsize=9,
        )
    for ax in axes[1:]:
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle("planted model: 300 corner-tag and 700 object images of one class", fontsize=10)
    fig.savefig(path, dpi=100)


def write_big(path: Path, count: int, side: int = 224) -> np.ndarray:
    """``count`` planted maps (a third tag) upsampled to ``side`` into a map file."""
    maps, truth = planted_maps(count // 3, count - count // 3, seed=1)

    def blocks():
        for start in range(0, count, 500):
            block = F.interpolate(maps[start : start + 500, None], size=(side, side))[:, 0]
            yield block.numpy().astype(np.float16)

    index = {
        "image": [f"img{k}.png" for k in range(count)],
        "method": ["gradcam"] * count,
        "target": np.zeros(count, int),
        "probability": np.ones(count),
        "prediction": np.zeros(count, int),
        "confidence": np.ones(count),
        "truth": np.full(count, -1),
    }
    write_maps(path, blocks(), count, (side, side), index, {})
    return truth


def measure(path: str, truth_path: str, tsne: bool) -> None:
    """In a fresh process: the steps on the map file, timed; peak memory."""
    truth = np.load(truth_path)
    timings = {}
    started = time.perf_counter()
    saved = load_maps(path)
    pooled = pool_maps(saved.maps, 32)
    timings["pool (read 224x224 float16 from the file)"] = time.perf_counter() - started
    started = time.perf_counter()
    found = analyze_class(pooled, embedding=None)
    timings["graph + spectrum + eigengap + k-means"] = time.perf_counter() - started
    memory = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if tsne:
        started = time.perf_counter()
        analyze_class(pooled, embedding="tsne")
        timings["same with t-SNE on 3,000 maps"] = time.perf_counter() - started
    result = {
        "timings": timings,
        "peak_mb_without_tsne": memory,
        "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "suggested_k": found.suggested_k,
        "ari": adjusted_rand_score(truth, found.labels),
    }
    print(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--maps", type=int, default=10_000)
    parser.add_argument("--out", default=str(Path(__file__).parent))
    parser.add_argument("--tsne", action="store_true", help="also time t-SNE on 3,000 maps")
    parser.add_argument("--measure", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        measure(*args.measure, args.tsne)
        return
    out = Path(args.out)
    rows = planted(out)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "maps.npz"
        started = time.perf_counter()
        truth = write_big(path, args.maps)
        print(f"wrote {args.maps} maps in {time.perf_counter() - started:.1f} s")
        np.save(Path(folder) / "truth.npy", truth)
        command = [
            sys.executable,
            __file__,
            "--measure",
            str(path),
            str(Path(folder) / "truth.npy"),
            *(["--tsne"] if args.tsne else []),
        ]
        env = {**os.environ, "OMP_NUM_THREADS": "2"}
        done = subprocess.run(command, capture_output=True, text=True, check=True, env=env)
        big = json.loads(done.stdout.strip().splitlines()[-1])
    print(big)
    lines = [
        "# camkit.strategies (SpRAy) benchmark",
        "",
        f"`python benchmarks/strategies.py` on {platform.machine()}, {os.cpu_count()} CPU "
        f"core(s) shared with other work, torch {torch.__version__}, camkit "
        f"{camkit.__version__}. Defaults: 32x32 pooling, `n_neighbors = max(10, sqrt(n))`, "
        "eigengap with the automatic diffusion time (at least 32 steps), k-means.",
        "",
        "## Planted model (known answer: 2 strategies, tag vs object)",
        "",
        "| maps | tag images | eigengap k | ARI vs truth | tag cluster most suspicious | seconds |",
        "| --- | --- | --- | --- | --- | --- |",
        *(
            f"| {r['maps']} | {r['tagged']} | {r['suggested_k']} | {r['ari']:.3f} | "
            f"{'yes' if r['tag_cluster_first'] else 'no'} | {r['seconds']:.1f} |"
            for r in rows
        ),
        "",
        "![planted](strategies_planted.png)",
        "",
        f"## {args.maps:,} maps of one class (224x224 float16 in a maps.npz)",
        "",
        f"Machine load while it ran (1-minute load average): {os.getloadavg()[0]:.1f}.",
        "",
        "| step | seconds |",
        "| --- | --- |",
        *(f"| {step} | {seconds:.1f} |" for step, seconds in big["timings"].items()),
        "",
        f"Peak memory of the process: {big['peak_mb_without_tsne']:.0f} MB "
        f"({big['peak_mb']:.0f} MB at its end; the maps are memory-mapped, pooled 256 at a "
        "time; importing camkit and torch alone takes about 700 MB). "
        f"Eigengap k = {big['suggested_k']}, ARI {big['ari']:.3f} (a third of the maps tagged).",
        "",
    ]
    (out / "STRATEGIES.md").write_text("\n".join(lines))
    print(f"wrote {out / 'STRATEGIES.md'}")


if __name__ == "__main__":
    main()

"""Adebayo et al.'s sanity check on the pretrained EfficientNet-Lite0, saved as a PNG.

    python examples/sanity_check.py [docs/sanity.png]

"Sanity Checks for Saliency Maps" (NeurIPS 2018): the blocks of the trained model are replaced
by random weights, from the classifier down (cascading randomisation), and each method's map
is compared with the trained model's. A map that explains the model should change as the model
is destroyed. Grad-CAM (at the default layer, ``bn2``) and guided backpropagation, for the
top-1 class of three scikit-image photos (chelsea, coffee, astronaut), seed 0. Prints a
markdown table of the similarities (means over the three photos).
"""

from __future__ import annotations

import sys
import time

import torch
from skimage import data

from camkit import GradCAM, GuidedBackprop
from camkit.metrics import randomization_test
from camkit.metrics.plots import plot_randomization
from camkit.models import load

SIMILARITY = ("spearman", "ssim", "hog")


def main(path: str = "docs/sanity.png") -> None:
    loaded = load()
    photos = [data.chelsea(), data.coffee(), data.astronaut()]
    x = torch.stack([loaded.preprocess(photo) for photo in photos])
    methods = {
        "Grad-CAM": lambda net: GradCAM(net, loaded.default_layer),
        "Guided backprop": GuidedBackprop,
    }
    results, maps = {}, {}
    for name, factory in methods.items():
        start = time.perf_counter()
        results[name], maps[name] = randomization_test(
            factory,
            loaded.model,
            x,
            order="cascade",
            similarity=SIMILARITY,
            seed=0,
            return_maps=True,
        )
        print(f"{name}: {time.perf_counter() - start:.1f} s", file=sys.stderr)
    plot_randomization(
        results,
        maps,
        path,
        image=loaded.preprocess.resize_crop(photos[0]),
        similarity=("spearman", "ssim"),
    )
    grad, guided = results["Grad-CAM"], results["Guided backprop"]
    print(
        "| randomised down to | Grad-CAM ρ | Grad-CAM SSIM | Grad-CAM HOG "
        "| guided BP ρ | guided BP \\|ρ\\| | guided BP SSIM | guided BP HOG |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for g, b in zip(grad, guided, strict=True):
        print(
            f"| `{g['layer']}` | {g['spearman']:.2f} | {g['ssim']:.2f} | {g['hog']:.2f} "
            f"| {b['spearman']:.2f} | {b['spearman_abs']:.2f} | {b['ssim']:.2f} "
            f"| {b['hog']:.2f} |"
        )
    print(f"\nwrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main(*sys.argv[1:2])

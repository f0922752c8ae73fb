"""Pixel-space attributions side by side for one image, saved as a PNG.

    python examples/pixel_maps.py [out.png]

Saliency, SmoothGrad, Integrated Gradients, guided backpropagation and Guided Grad-CAM for the
top-1 class of scikit-image's ``chelsea`` cat, with camkit's default pretrained model
(EfficientNet-Lite0, offline weights). Each map is ``to_heatmap(attr, "abs-max",
percentile=99)``: the largest ``|attribution|`` over the colour channels, divided by its 99th
percentile and clipped at 1 (gradients are spiky; Smilkov et al. display them this way too).
"""

from __future__ import annotations

import sys
import time

import torch
from matplotlib.figure import Figure
from skimage import data

from camkit import (
    GuidedBackprop,
    GuidedGradCAM,
    IntegratedGradients,
    Saliency,
    SmoothGrad,
    models,
    to_heatmap,
)


def main(path: str = "pixel_maps.png") -> None:
    loaded = models.load("efficientnet_lite0")
    image = data.chelsea()
    x = loaded.preprocess(image)  # (3, 224, 224)
    (index, label, probability), *_ = loaded.predict(image, k=1)
    methods = {
        "Saliency": Saliency(loaded.model),
        "SmoothGrad (50 samples, 10% noise)": SmoothGrad(
            loaded.model, noise_level=0.1, samples=50, batch_size=25, seed=0
        ),
        "Integrated Gradients (50 steps, baseline 0)": IntegratedGradients(
            loaded.model, steps=50, batch_size=17
        ),
        "Guided backprop": GuidedBackprop(loaded.model),
        f"Guided Grad-CAM ({loaded.default_layer})": GuidedGradCAM(
            loaded.model, loaded.default_layer
        ),
    }
    maps = {}
    for name, method in methods.items():
        start = time.perf_counter()
        maps[name] = to_heatmap(method(x, target=index), "abs-max", percentile=99)
        print(f"{name}: {time.perf_counter() - start:.1f} s")

    figure = Figure(figsize=(3.2 * (len(maps) + 1), 3.9), layout="constrained")
    axes = figure.subplots(1, len(maps) + 1)
    axes[0].imshow(loaded.preprocess.resize_crop(image))
    axes[0].set_title("input (as the model sees it)", fontsize=9)
    for ax, (name, heat) in zip(axes[1:], maps.items(), strict=True):
        ax.imshow(heat.cpu().numpy(), cmap="inferno", vmin=0, vmax=1)
        ax.set_title(name, fontsize=9)
    for ax in axes:
        ax.set_axis_off()
    figure.suptitle(
        f"{loaded.name}: class {index} '{label}' (p={probability:.2f}); "
        "maps = max |attr| over channels / its 99th percentile, clipped",
        fontsize=10,
    )
    figure.savefig(path, dpi=110)
    print(f"saved {path}")


if __name__ == "__main__":
    torch.set_grad_enabled(False)  # the methods switch gradients on where they need them
    main(*sys.argv[1:2])

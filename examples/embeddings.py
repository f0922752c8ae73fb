"""Which parts of a photo look like a reference? Grad-CAM of an embedding's cosine similarity.

    python examples/embeddings.py [out.png]

The pretrained EfficientNet-Lite0 (offline weights) without its classifier gives 1280-d pooled
embeddings. The reference is the embedding of a crop of the cat in scikit-image's ``chelsea``;
the map explains, on the whole photo, the cosine similarity to it
(:class:`camkit.target_types.EmbeddingTarget`), as done for re-identification and CLIP towers.
"""

from __future__ import annotations

import copy
import sys

import torch
from skimage import data

from camkit import GradCAM, models, viz
from camkit.targets import EmbeddingTarget


def main(path: str = "embeddings.png") -> None:
    loaded = models.load("efficientnet_lite0")
    trunk = copy.deepcopy(loaded.model)  # the loaded model itself stays as it is
    trunk.reset_classifier(0)  # timm: the forward now returns the pooled (B, 1280) embedding
    photo = data.chelsea()
    face = photo[:200, 100:320]  # the cat's head
    with torch.no_grad():
        reference = trunk(loaded.preprocess(face)[None])[0]
    x = loaded.preprocess(photo)
    similarity = EmbeddingTarget(reference)
    with torch.no_grad():
        print(
            f"cosine similarity of the photo to the crop: {similarity(trunk(x[None])).item():.3f}"
        )
    heat = GradCAM(trunk, loaded.default_layer)(x, target=similarity)
    picture = viz.overlay(loaded.preprocess.resize_crop(photo), heat)
    print(f"wrote {viz.save_png(path, picture)}")


if __name__ == "__main__":
    main(*sys.argv[1:2])

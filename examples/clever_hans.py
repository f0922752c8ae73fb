"""A Clever-Hans model found by its strategies (SpRAy, Lapuschkin et al. 2019).

Synthetic photos of two classes, discs (class 0) and squares (class 1), on textured noise. Part
of the disc photos come from a "source" that stamps a small checkered tag in the bottom-right
corner, and whose photos are washed out (the disc barely visible): on those, the tag is the
easiest cue. A small CNN trained for about a minute on the CPU learns both: the tag and the
disc. Grad-CAM of "disc" on held-out disc photos, clustered per class by
:func:`camkit.strategies.find_strategies`, separates the tag readers from the disc readers,
and the suspiciousness score puts the tag cluster first.

    python examples/clever_hans.py [--seconds 60] [--out docs/clever_hans.png]

Prints the eigengap's suggestion, the clusters and the adjusted Rand index against the truth
(tagged or not), and writes a figure: per cluster its prototype and typical members. Then what
the tag readers see (Concept Relevance Propagation, :mod:`camkit.methods.concepts`): per cluster the
channels that dominate it, the channel with the most relevance in the tag corner, and how many of
that channel's reference images (over all held-out photos) are tagged.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from matplotlib.figure import Figure
from sklearn.metrics import adjusted_rand_score
from torch import nn

import camkit
from camkit.methods.concepts import ConceptAttribution, ReferenceCollector
from camkit.strategies import find_strategies
from camkit.strategies.plots import prototype_picture

SIDE = 32
TAG = 5


def make_photos(count: int, tagged_share: float, rng: np.random.Generator):
    """``count`` photos -> ``(images (N, 3, SIDE, SIDE), labels, tagged)``."""
    yy, xx = np.mgrid[:SIDE, :SIDE]
    images = np.empty((count, 3, SIDE, SIDE), np.float32)
    labels = rng.integers(0, 2, count)
    tagged = (labels == 0) & (rng.random(count) < tagged_share)
    checker = (np.indices((TAG, TAG)).sum(0) % 2).astype(np.float32)
    for k in range(count):
        background = rng.uniform(0.2, 0.6, 3)[:, None, None]
        photo = background + 0.08 * rng.standard_normal((3, SIDE, SIDE))
        cy, cx = rng.uniform(10, 22, 2)
        radius = rng.uniform(5, 8)
        if labels[k] == 0:
            shape = (yy - cy) ** 2 + (xx - cx) ** 2 <= radius**2
        else:
            shape = (np.abs(yy - cy) <= radius * 0.85) & (np.abs(xx - cx) <= radius * 0.85)
        colour = rng.uniform(0.5, 1.0, 3)[:, None]
        strength = 0.08 if tagged[k] else 1.0  # the tagged source is washed out
        photo[:, shape] = (1 - strength) * photo[:, shape] + strength * colour
        if tagged[k]:
            photo[:, -TAG - 1 : -1, -TAG - 1 : -1] = checker
        images[k] = np.clip(photo, 0, 1)
    return torch.from_numpy(images), labels, tagged


def small_cnn() -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.Conv2d(32, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 2),
    )


def train(model: nn.Module, images: torch.Tensor, labels: np.ndarray, seconds: float) -> None:
    optimiser = torch.optim.Adam(model.parameters(), lr=3e-3)
    targets = torch.from_numpy(labels)
    generator = torch.Generator().manual_seed(0)
    started, epoch = time.perf_counter(), 0
    while time.perf_counter() - started < seconds:
        order = torch.randperm(len(images), generator=generator)
        for start in range(0, len(images), 64):
            rows = order[start : start + 64]
            loss = nn.functional.cross_entropy(model(images[rows]), targets[rows])
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
        epoch += 1
        print(f"epoch {epoch}: loss {loss.item():.3f} ({time.perf_counter() - started:.0f} s)")


def figure(photos, maps, found, tagged, path: str) -> None:
    """Per cluster: the prototype and six typical members with their Grad-CAM."""
    columns = 7
    fig = Figure(figsize=(1.6 * columns, 1.75 * found.k), layout="constrained")
    axes = fig.subplots(found.k, columns, squeeze=False)
    for row, cluster in zip(axes, found.by_suspiciousness(), strict=True):
        row[0].imshow(prototype_picture(cluster.prototype, 128))
        row[0].set_title(f"cluster {cluster.id}: {cluster.size} photos", fontsize=8)
        share = tagged[cluster.members].mean()
        row[0].set_ylabel(
            f"suspiciousness\n{cluster.suspiciousness:.2f}\n{share:.0%} tagged", fontsize=8
        )
        for ax, member in zip(row[1:], cluster.typical[: columns - 1], strict=False):
            picture = (photos[member].permute(1, 2, 0).numpy() * 255).astype(np.uint8)
            ax.imshow(camkit.viz.overlay(picture, maps[member].numpy(), alpha=0.45))
        for ax in row:
            ax.set_xticks([])
            ax.set_yticks([])
    fig.suptitle("Grad-CAM strategies of class 'disc' (SpRAy), most suspicious first", fontsize=10)
    fig.savefig(path, dpi=100)
    print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="training time (default 60)")
    parser.add_argument("--out", default="clever_hans.png", help="figure file")
    args = parser.parse_args()
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    images, labels, _ = make_photos(3000, tagged_share=0.4, rng=rng)
    model = small_cnn()
    train(model, images, labels, args.seconds)
    model.eval()  # batch-norm statistics frozen for the held-out photos

    test, test_labels, test_tagged = make_photos(600, tagged_share=0.4, rng=rng)
    with torch.no_grad():
        predictions = model(test).softmax(-1)
    accuracy = (predictions.argmax(-1).numpy() == test_labels).mean()
    print(f"held-out accuracy {accuracy:.1%}; tagged discs: {test_tagged.sum()}")

    discs = np.flatnonzero(test_labels == 0)
    cam = camkit.GradCAM(model, model[-4])  # the last convolution block (16 x 16)
    maps = cam(test[discs], target=0)
    found = find_strategies(
        maps, np.zeros(len(discs), int), confidences=predictions[discs, 0].numpy(), seed=0
    ).classes[0]
    ari = adjusted_rand_score(test_tagged[discs], found.labels)
    print(f"class 'disc': {len(discs)} maps, eigengap suggests {found.suggested_k} strategies")
    print(f"eigenvalues {np.round(found.eigenvalues, 3).tolist()}")
    for cluster in found.by_suspiciousness():
        share = test_tagged[discs][np.searchsorted(discs, discs[cluster.members])].mean()
        print(
            f"  cluster {cluster.id}: {cluster.size} photos, {share:.0%} tagged, confidence "
            f"{cluster.confidence:.2f}, suspiciousness {cluster.suspiciousness:.3f}"
        )
    print(f"adjusted Rand index, clusters vs tagged: {ari:.2f}")
    figure(test[discs], maps, found, test_tagged[discs], args.out)
    concepts(model, test, test_tagged, discs, found)


def concepts(model: nn.Module, photos, tagged, discs, found) -> None:
    """What the tag readers see, at the second block's output (layer "6", 16 x 16; the last
    block's channels each mix both cues): per cluster its dominant channels, the channel with
    the most relevance in the tag corner, and how many of that channel's reference images over
    all held-out photos are tagged."""
    layer = "6"
    attribution = ConceptAttribution(model, layer, batch_size=64)
    corner = torch.zeros(SIDE, SIDE, dtype=torch.bool)
    corner[-TAG - 2 :, -TAG - 2 :] = True
    collector = ReferenceCollector(model, layer, top=8)
    for start in range(0, len(photos), 100):
        rows = torch.arange(start, min(start + 100, len(photos)))
        collector.update(photos[rows], rows)
    print(f"concepts of layer {layer} (Concept Relevance Propagation, gradient x activation):")
    for cluster in found.by_suspiciousness():
        members = photos[discs[cluster.members]]
        top = attribution.dominant(members, k=3, target=0)
        shares = ", ".join(
            f"{c} ({s:.2f})" for c, s in zip(top.channels.tolist(), top.share.tolist(), strict=True)
        )
        in_corner = attribution.relevances(members, target=0, region=corner).sum(dim=0)
        channel = int(in_corner.argmax())
        share = float(in_corner[channel] / in_corner.abs().sum())
        references = collector.found["relevance"].samples[channel]
        print(
            f"  cluster {cluster.id}: dominant channels {shares}; in the tag corner channel "
            f"{channel} ({share:.0%} of the relevance there), "
            f"{int(tagged[references].sum())}/{len(references)} of its reference images tagged"
        )


if __name__ == "__main__":
    main()

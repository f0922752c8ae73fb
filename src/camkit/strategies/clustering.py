"""The clustering side of SpRAy: cluster labels of the spectral embedding (scikit-learn),
renumbered by size, each cluster's summary (prototype, typical and atypical members,
confidence, accuracy) and suspiciousness, and the 2-D layout of a class's maps for display.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np

from camkit.errors import ArgumentError
from camkit.strategies.results import Cluster

Clustering = Literal["kmeans", "agglomerative", "dbscan", "hdbscan"]
Embedding = Literal["tsne", "umap", "spectral"]


def cluster_labels(
    points: np.ndarray, k: int, method: str, seed: int, options: dict[str, Any]
) -> np.ndarray:
    """Cluster labels by scikit-learn; -1 marks DBSCAN/HDBSCAN noise."""
    from sklearn import cluster

    models = {
        "kmeans": lambda: cluster.KMeans(n_clusters=k, n_init=10, random_state=seed, **options),
        "agglomerative": lambda: cluster.AgglomerativeClustering(n_clusters=k, **options),
        "dbscan": lambda: cluster.DBSCAN(**({"eps": 0.5, "min_samples": 5} | options)),
        "hdbscan": lambda: cluster.HDBSCAN(**({"min_cluster_size": 5, "copy": True} | options)),
    }
    if method not in models:
        raise ArgumentError(
            f"clustering must be 'kmeans', 'agglomerative', 'dbscan' or 'hdbscan', got {method!r}"
        )
    if k == 1 and method in ("kmeans", "agglomerative"):
        return np.zeros(len(points), dtype=np.int64)
    model = models[method]()
    try:
        return np.asarray(model.fit_predict(points), dtype=np.int64)
    except (TypeError, ValueError) as error:
        raise ArgumentError(f"{method} with options {options}: {error}") from None


SERIAL_TSNE = 1000  # samples up to which the 2-D embedding runs on one thread


def embed_2d(
    pooled: np.ndarray, spectral: np.ndarray, method: str | None, seed: int, limit: int
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """2-D coordinates for display, and the samples they hold (t-SNE and UMAP run on at most
    ``limit`` samples, a seeded random subset above it)."""
    n = len(pooled)
    if method is None:
        return None, None
    if method == "spectral":
        coordinates = spectral[:, :2] if spectral.shape[1] >= 2 else np.c_[spectral, spectral]
        return coordinates.astype(np.float32), np.arange(n)
    rng = np.random.default_rng(seed)
    keep = np.sort(rng.choice(n, limit, replace=False)) if n > limit else np.arange(n)
    data = pooled[keep].reshape(len(keep), -1)
    if len(keep) < 4 or np.ptp(data, axis=0).max() == 0:  # nothing to lay out
        return np.zeros((len(keep), 2), np.float32), keep
    if method == "tsne":
        from sklearn.manifold import TSNE

        model = TSNE(
            n_components=2,
            perplexity=min(30.0, (len(keep) - 1) / 3),
            init="pca",
            random_state=seed,
        )
    elif method == "umap":
        try:
            import umap
        except ImportError:
            raise ArgumentError("embedding='umap' needs the umap-learn package") from None
        model = umap.UMAP(n_components=2, random_state=seed, n_neighbors=min(15, len(keep) - 1))
    else:
        raise ArgumentError(f"embedding must be 'tsne', 'umap', 'spectral' or None, got {method!r}")
    from threadpoolctl import threadpool_limits  # scikit-learn's own dependency

    # one OpenMP thread below SERIAL_TSNE samples: Barnes-Hut t-SNE's 1000 iterations each end
    # at a barrier, and on busy cores a descheduled peer makes every thread wait there (64
    # maps: 13 s with 2 threads on 2 busy cores, 0.3 s with one)
    limit = 1 if len(keep) <= SERIAL_TSNE else None
    with threadpool_limits(limits=limit, user_api="openmp"):
        return np.asarray(model.fit_transform(data), dtype=np.float32), keep


def suspiciousness(pooled: np.ndarray, labels: np.ndarray) -> dict[int, tuple[float, float, float]]:
    """``{cluster: (score, distance, concentration)}`` for the clusters of one class.

    ``P``: the cluster's prototype, ``Q``: the mean map of the class's other samples (noise
    included), both rescaled to sum 1. ``distance`` is their total variation distance
    ``0.5 * sum |P - Q|`` in [0, 1]: the share of the cluster's attribution mass that lies where
    the rest of the class puts none. ``concentration`` is ``1 - exp(H(P)) / cells``, with
    ``H`` the entropy in nats: 0 for a uniform prototype, near 1 for one grid cell.
    ``score = distance * concentration``: high for a strategy that looks at a small place the
    rest of the class does not use. A class with one cluster scores 0 (nothing to compare).
    """
    flat = pooled.reshape(len(pooled), -1).astype(np.float64)
    sums = flat.sum(axis=1, keepdims=True)
    flat = np.divide(flat, sums, out=np.zeros_like(flat), where=sums > 0)
    cells = flat.shape[1]
    scores = {}
    for cluster in sorted(set(labels[labels >= 0].tolist())):
        inside = labels == cluster
        p = _unit(flat[inside].mean(axis=0))
        entropy = -np.sum(p[p > 0] * np.log(p[p > 0])) if p.any() else math.log(cells)
        concentration = max(0.0, 1.0 - math.exp(entropy) / cells)
        q = np.zeros_like(p) if inside.all() else _unit(flat[~inside].mean(axis=0))
        distance = 0.5 * float(np.abs(p - q).sum()) if p.any() and q.any() else 0.0
        scores[cluster] = (distance * concentration, distance, concentration)
    return scores


def _unit(vector: np.ndarray) -> np.ndarray:
    total = vector.sum()
    return vector / total if total > 0 else vector


def by_size(labels: np.ndarray) -> np.ndarray:
    """Cluster ids renumbered 0, 1, ... by size, largest first (ties: first member first)."""
    ids = [c for c in dict.fromkeys(labels.tolist()) if c >= 0]
    order = sorted(ids, key=lambda c: (-int(np.sum(labels == c)), int(np.argmax(labels == c))))
    renamed = np.full_like(labels, -1)
    for new, old in enumerate(order):
        renamed[labels == old] = new
    return renamed


def summarise(
    pooled: np.ndarray,
    labels: np.ndarray,
    indices: np.ndarray,
    *,
    confidences: np.ndarray | None = None,
    predictions: np.ndarray | None = None,
    truth: np.ndarray | None = None,
    n_show: int = 8,
) -> list[Cluster]:
    """The :class:`Cluster` of each label >= 0 of one class (``labels`` from :func:`by_size`,
    ``indices`` naming the samples): the prototype (mean pooled map), the members from the
    closest to it, ``n_show`` typical and atypical ones, the mean confidence, the accuracy where
    ``truth`` is known (>= 0), and :func:`suspiciousness`."""
    points = pooled.reshape(len(pooled), -1).astype(np.float64)
    scores = suspiciousness(pooled, labels)
    clusters = []
    for cluster in sorted(scores):
        inside = np.flatnonzero(labels == cluster)
        prototype = pooled[inside].mean(axis=0)
        distances = np.linalg.norm(points[inside] - prototype.ravel(), axis=1)
        order = inside[np.argsort(distances, kind="stable")]
        known = inside[truth[inside] >= 0] if truth is not None and predictions is not None else []
        accuracy = float(np.mean(predictions[known] == truth[known])) if len(known) else None
        score, distance, concentration = scores[cluster]
        clusters.append(
            Cluster(
                id=cluster,
                members=indices[order],
                prototype=prototype,
                confidence=None if confidences is None else float(confidences[inside].mean()),
                accuracy=accuracy,
                typical=indices[order[:n_show]],
                atypical=indices[order[::-1][:n_show]],
                suspiciousness=score,
                distance=distance,
                concentration=concentration,
            )
        )
    return clusters

"""SpRAy on arrays, class by class: :func:`analyze_class` (one class's pooled maps -> its
strategies) and :func:`find_strategies` (every class of a dataset's maps).

Lapuschkin et al., "Unmasking Clever Hans predictors and assessing what machines really learn",
Nature Communications 10, 1096 (2019), section "Spectral relevance analysis"; the row
normalisation before k-means is Ng, Jordan and Weiss, "On spectral clustering: analysis and an
algorithm", NIPS 2001.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import torch

from camkit.core.inputs import positive_int
from camkit.errors import ArgumentError, CamkitError, InputError
from camkit.strategies.clustering import (
    Clustering,
    Embedding,
    by_size,
    cluster_labels,
    embed_2d,
    summarise,
)
from camkit.strategies.pooling import pool_maps
from camkit.strategies.results import ClassStrategies, Strategies
from camkit.strategies.spectrum import default_neighbors, eigengap, knn_graph, laplacian_spectrum


class StrategyWarning(UserWarning):
    """A class whose strategies are degenerate (every map the same: one strategy)."""


def _optional(values: Any, n: int, name: str, dtype: type) -> np.ndarray | None:
    if values is None:
        return None
    array = np.asarray(values.cpu() if isinstance(values, torch.Tensor) else values, dtype=dtype)
    if array.shape != (n,):
        raise ArgumentError(f"{name} must have one value per map ({n},), got {array.shape}")
    return array


_PER_SAMPLE = {"confidences": np.float64, "predictions": np.int64, "truth": np.int64}


def _per_sample(n: int, *values: Any) -> dict[str, np.ndarray | None]:
    """The per-sample arguments of :func:`summarise` (as :data:`_PER_SAMPLE`), checked."""
    named = zip(_PER_SAMPLE.items(), values, strict=True)
    return {name: _optional(value, n, name, dtype) for (name, dtype), value in named}


def analyze_class(
    pooled: np.ndarray,
    *,
    indices: Sequence[int] | np.ndarray | None = None,
    class_id: int | None = None,
    confidences: Sequence[float] | np.ndarray | None = None,
    predictions: Sequence[int] | np.ndarray | None = None,
    truth: Sequence[int] | np.ndarray | None = None,
    n_neighbors: int | None = None,
    max_clusters: int = 10,
    n_clusters: int | None = None,
    diffusion: float | None = None,
    clustering: Clustering = "kmeans",
    clustering_options: dict[str, Any] | None = None,
    embedding: Embedding | None = "tsne",
    embedding_limit: int = 3000,
    n_show: int = 8,
    seed: int = 0,
) -> ClassStrategies:
    """SpRAy on the pooled maps ``(n, gh, gw)`` of one class (from :func:`pool_maps`).

    ``indices`` name the samples (default ``0..n-1``); per-sample ``confidences``,
    ``predictions`` and ``truth`` (-1: unknown) give each cluster's confidence and accuracy.
    The graph joins each map to its ``n_neighbors`` nearest; the eigengap of its Laplacian's
    ``max_clusters + 1`` smallest eigenvalues suggests the number of clusters unless
    ``n_clusters`` is given. ``clustering`` runs on the row-normalised spectral embedding
    (``dbscan``/``hdbscan`` mark noise -1; ``clustering_options`` go to scikit-learn).
    ``embedding``: the 2-D layout for display (``tsne``, ``umap``, ``spectral`` or None) of at
    most ``embedding_limit`` samples. The same ``seed`` gives the same result. Fewer than
    ``n_neighbors + 1`` samples: :class:`~camkit.errors.ArgumentError`; identical maps: one
    strategy and a :class:`StrategyWarning`.
    """
    pooled = np.asarray(pooled, dtype=np.float32)
    if pooled.ndim != 3 or not np.isfinite(pooled).all():
        raise InputError(f"expected finite pooled maps (n, gh, gw), got shape {pooled.shape}")
    n = len(pooled)
    n_neighbors = positive_int("n_neighbors", n_neighbors, optional=True) or default_neighbors(n)
    positive_int("max_clusters", max_clusters)
    if n_clusters is not None and (not isinstance(n_clusters, int) or not 1 <= n_clusters < n):
        raise ArgumentError(f"n_clusters must be an int in [1, {n - 1}], got {n_clusters!r}")
    if n < (fewest := _fewest(n, n_neighbors)):
        raise ArgumentError(
            f"class {class_id if class_id is not None else ''} has {n} map(s); the "
            f"nearest-neighbour graph needs at least {fewest} (n_neighbors={n_neighbors} + 1)"
        )
    indices = np.arange(n) if indices is None else _optional(indices, n, "indices", np.int64)
    per_sample = _per_sample(n, confidences, predictions, truth)
    points = pooled.reshape(n, -1).astype(np.float64)
    parameters = {
        "n_neighbors": n_neighbors,
        "max_clusters": max_clusters,
        "n_clusters": n_clusters,
        "diffusion": diffusion,
        "clustering": clustering,
        "clustering_options": dict(clustering_options or {}),
        "embedding": embedding,
        "embedding_limit": embedding_limit,
        "seed": seed,
        "grid": list(pooled.shape[1:]),
    }
    if np.ptp(points, axis=0).max() == 0:
        warnings.warn(
            f"class {class_id}: all {n} maps are the same; one strategy",
            StrategyWarning,
            stacklevel=2,
        )
        eigenvalues, spectral, suggested = np.zeros(1), np.ones((n, 1)), 1
        labels = np.zeros(n, dtype=np.int64)
    else:
        count = min(max(max_clusters, n_clusters or 0) + 1, n - 1)
        try:
            graph = knn_graph(points.astype(np.float32), n_neighbors)
            eigenvalues, vectors = laplacian_spectrum(graph, count, seed)
        except (ValueError, RuntimeError, np.linalg.LinAlgError) as error:  # ARPACK...
            raise CamkitError(f"class {class_id}: the spectral embedding failed: {error}") from None
        suggested = eigengap(eigenvalues, max_clusters, diffusion)
        k = n_clusters or suggested
        spectral = vectors[:, : max(k, 2)]
        norms = np.linalg.norm(spectral[:, :k], axis=1, keepdims=True)
        clustered = spectral[:, :k] / np.where(norms > 0, norms, 1.0)
        labels = cluster_labels(clustered, k, clustering, seed, dict(clustering_options or {}))
    labels = by_size(labels)
    clusters = summarise(pooled, labels, indices, **per_sample, n_show=n_show)
    coordinates, shown = embed_2d(pooled, spectral, embedding, seed, embedding_limit)
    return ClassStrategies(
        class_id=class_id,
        indices=indices,
        eigenvalues=np.asarray(eigenvalues, dtype=np.float64),
        suggested_k=suggested,
        labels=labels,
        spectral=np.asarray(spectral, dtype=np.float32),
        embedding=coordinates,
        embedding_index=None if shown is None else indices[shown],
        clusters=clusters,
        parameters=parameters,
    )


def _fewest(n: int, n_neighbors: int | None) -> int:
    """The fewest maps the graph needs."""
    return max(3, (default_neighbors(n) if n_neighbors is None else n_neighbors) + 1)


def find_strategies(
    maps: np.ndarray | torch.Tensor,
    classes: Sequence[int] | np.ndarray | torch.Tensor,
    *,
    confidences: Sequence[float] | np.ndarray | None = None,
    predictions: Sequence[int] | np.ndarray | None = None,
    truth: Sequence[int] | np.ndarray | None = None,
    grid: int | tuple[int, int] = 32,
    normalize: Literal["l1", "max"] = "l1",
    positive: Literal["clip", "abs"] = "clip",
    only: Sequence[int] | None = None,
    rows: np.ndarray | None = None,
    **options: Any,
) -> Strategies:
    """SpRAy per class: ``maps (N, H, W)`` (or ``(N, C, H, W)``), the class of each map
    (usually the explained target) -> :class:`Strategies`.

    The maps are pooled once (:func:`pool_maps` with ``grid``, ``normalize``, ``positive``);
    each class (or the classes ``only``) is analysed by :func:`analyze_class` with ``options``;
    a class with too few maps is skipped, with the reason in ``Strategies.skipped``. ``rows``:
    analyse only these maps (the other arguments then have one value per row; results index
    the rows).
    """
    pooled = pool_maps(maps, grid, normalize=normalize, positive=positive, rows=rows)
    n = len(pooled)
    classes = _optional(classes, n, "classes", np.int64)
    per_sample = _per_sample(n, confidences, predictions, truth)
    wanted = sorted(set(classes.tolist())) if only is None else list(only)
    found, skipped = {}, {}
    for class_id in wanted:
        members = np.flatnonzero(classes == class_id)
        try:
            found[class_id] = analyze_class(
                pooled[members],
                indices=members,
                class_id=class_id,
                **{k: None if v is None else v[members] for k, v in per_sample.items()},
                **options,
            )
        except ArgumentError as error:
            if len(members) >= _fewest(len(members), options.get("n_neighbors")):
                raise
            skipped[class_id] = str(error)
    return Strategies(found, skipped, pooled)

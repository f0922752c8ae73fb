"""SpRAy on arrays: pooling, the k-nearest-neighbour graph, its spectrum and eigengap, the
clustering, the per-cluster summaries and the suspiciousness score.

Lapuschkin et al., "Unmasking Clever Hans predictors and assessing what machines really learn",
Nature Communications 10, 1096 (2019), section "Spectral relevance analysis"; the spectral
embedding and the row normalisation before k-means are Ng, Jordan and Weiss, "On spectral
clustering: analysis and an algorithm", NIPS 2001; the eigengap heuristic is von Luxburg, "A
tutorial on spectral clustering", Statistics and Computing 17 (2007), section 8.3.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import mmap
import warnings
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F

from camkit.errors import ArgumentError, CamkitError, InputError

Clustering = Literal["kmeans", "agglomerative", "dbscan", "hdbscan"]
Embedding = Literal["tsne", "umap", "spectral"]

DIFFUSION = 32
"""The fewest random-walk steps of the automatic eigengap (:func:`eigengap`)."""
WORKING_MB = 128
"""Memory (MB) of the blocks of pairwise distances scikit-learn computes at a time."""
DENSE_LIMIT = 1500
"""Up to this many samples the Laplacian's spectrum is computed densely (exact, fast)."""


class StrategyWarning(UserWarning):
    """A class whose strategies are degenerate (every map the same: one strategy)."""


# ----------------------------------------------------------------------------- preprocessing


def pool_maps(
    maps: np.ndarray | torch.Tensor,
    grid: int | tuple[int, int] = 32,
    *,
    normalize: Literal["l1", "max"] = "l1",
    positive: Literal["clip", "abs"] = "clip",
    rows: np.ndarray | None = None,
    chunk: int = 256,
) -> np.ndarray:
    """Maps ``(N, H, W)`` (or ``(N, C, H, W)``, summed over channels) -> ``(N, gh, gw)`` float32:
    average-pooled to the ``grid`` (SpRAy's downscaling), made non-negative (``positive``:
    ``clip`` keeps the positive evidence, ``abs`` its magnitude) and normalised per map
    (``normalize``: ``l1`` to sum 1, ``max`` to peak 1). A map with no positive mass stays all
    zeros. Non-finite values raise :class:`~camkit.errors.InputError` naming the maps.
    ``rows``: pool only these maps (read ``chunk`` at a time, so a memory-mapped file is never
    read whole)."""
    if normalize not in ("l1", "max"):
        raise ArgumentError(f"normalize must be 'l1' or 'max', got {normalize!r}")
    if positive not in ("clip", "abs"):
        raise ArgumentError(f"positive must be 'clip' or 'abs', got {positive!r}")
    size = (grid, grid) if isinstance(grid, int) else tuple(grid)
    if len(size) != 2 or not all(isinstance(s, int) and s > 0 for s in size):
        raise ArgumentError(f"grid must be a positive int or (rows, columns), got {grid!r}")
    if not isinstance(maps, (np.ndarray, torch.Tensor)):
        raise InputError(f"maps must be a numpy array or torch tensor, got {type(maps).__name__}")
    if maps.ndim not in (3, 4) or maps.shape[0] == 0 or 0 in maps.shape[-2:]:
        raise InputError(f"expected maps (N, H, W) or (N, C, H, W) with N > 0, got {maps.shape}")
    count = maps.shape[0] if rows is None else len(rows)
    if count == 0:
        raise InputError("no maps to pool (rows is empty)")
    pooled = []
    for start in range(0, count, chunk):
        part = maps[start : start + chunk] if rows is None else maps[rows[start : start + chunk]]
        if isinstance(part, np.ndarray):  # a copy: a memory-mapped file is read-only
            part = torch.from_numpy(np.array(part, dtype=np.float32))
        part = part.float()
        if part.ndim == 4:
            part = part.sum(dim=1)
        bad = ~torch.isfinite(part).flatten(1).all(dim=1)
        if bad.any():
            where = (torch.nonzero(bad).flatten() + start).tolist()
            raise InputError(f"maps {where[:10]} hold NaN or infinite values")
        part = part.relu() if positive == "clip" else part.abs()
        part = F.adaptive_avg_pool2d(part[:, None], size)[:, 0]
        scale = part.flatten(1).sum(1) if normalize == "l1" else part.flatten(1).amax(1)
        part = part / torch.where(scale > 0, scale, 1.0)[:, None, None]
        pooled.append(part.numpy())
        _release(maps)
    return np.concatenate(pooled)


def _release(maps: object) -> None:
    """Drop the pages of a memory-mapped file read so far from this process's memory (they
    stay in the page cache): pooling a map file larger than memory keeps a constant footprint."""
    while isinstance(maps, np.ndarray) and getattr(maps, "_mmap", None) is None:
        maps = maps.base
    handle = getattr(maps, "_mmap", None)
    if handle is not None and hasattr(mmap, "MADV_DONTNEED"):
        with contextlib.suppress(OSError, ValueError):
            handle.madvise(mmap.MADV_DONTNEED)


# ----------------------------------------------------------------------------- results


@dataclasses.dataclass
class Cluster:
    """One strategy of a class: positions are indices into the arrays given to
    :func:`find_strategies` (or to :func:`analyze_class`'s ``indices``)."""

    id: int
    members: np.ndarray  # (size,) sample indices, the most typical first
    prototype: np.ndarray  # (gh, gw) mean pooled map
    confidence: float | None  # mean prediction confidence
    accuracy: float | None  # share of members whose prediction is their true label
    typical: np.ndarray  # the members closest to the prototype
    atypical: np.ndarray  # the members farthest from it, the farthest first
    suspiciousness: float
    distance: float  # total variation distance of the prototype to the rest of the class
    concentration: float  # 1 - effective area of the prototype / grid area

    @property
    def size(self) -> int:
        return int(len(self.members))

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "size": self.size,
            "members": self.members.tolist(),
            "typical": self.typical.tolist(),
            "atypical": self.atypical.tolist(),
            "confidence": self.confidence,
            "accuracy": self.accuracy,
            "suspiciousness": self.suspiciousness,
            "distance": self.distance,
            "concentration": self.concentration,
        }


@dataclasses.dataclass
class ClassStrategies:
    """The strategies of one class: the Laplacian's smallest eigenvalues, the number of
    clusters they suggest, the clusters (largest first), the embeddings."""

    class_id: int | None
    indices: np.ndarray  # (n,) sample indices of the class
    eigenvalues: np.ndarray  # smallest eigenvalues of the normalised Laplacian, ascending
    suggested_k: int  # by the eigengap
    labels: np.ndarray  # (n,) cluster id per sample, -1 for DBSCAN/HDBSCAN noise
    spectral: np.ndarray  # (n, d) row-normalised spectral embedding that was clustered
    embedding: np.ndarray | None  # (m, 2) t-SNE/UMAP/spectral coordinates for display
    embedding_index: np.ndarray | None  # (m,) which samples ``embedding`` holds
    clusters: list[Cluster]
    parameters: dict[str, Any]

    @property
    def k(self) -> int:
        return len(self.clusters)

    @property
    def noise(self) -> np.ndarray:
        return self.indices[self.labels < 0]

    def by_suspiciousness(self) -> list[Cluster]:
        """The clusters, the most suspicious first."""
        return sorted(self.clusters, key=lambda c: (-c.suspiciousness, c.id))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (prototypes and embeddings left out: they are arrays)."""
        return {
            "class": self.class_id,
            "samples": int(len(self.indices)),
            "eigenvalues": [float(v) for v in self.eigenvalues],
            "suggested_k": self.suggested_k,
            "k": self.k,
            "noise": self.noise.tolist(),
            "clusters": [cluster.to_dict() for cluster in self.clusters],
            "parameters": self.parameters,
        }


@dataclasses.dataclass
class Strategies:
    """:func:`find_strategies` over every class: the analysed classes and, for the others,
    why they were skipped (too few samples)."""

    classes: dict[int, ClassStrategies]
    skipped: dict[int, str]
    pooled: np.ndarray  # (N, gh, gw)


# ----------------------------------------------------------------------------- the analysis


def eigengap(
    eigenvalues: Sequence[float] | np.ndarray,
    max_clusters: int | None = None,
    diffusion: float | None = None,
) -> int:
    """The number of clusters the spectrum suggests, from the smallest eigenvalues (ascending)
    of the normalised Laplacian: the ``k`` with the largest gap ``mu_(k-1)^t - mu_k^t`` where
    ``mu = 1 - lambda`` are the eigenvalues of the random walk and ``t = diffusion`` its
    number of steps (diffusion maps, Coifman and Lafon 2006). ``diffusion=1`` is the plain
    eigengap ``lambda_k - lambda_(k-1)`` (von Luxburg 2007, section 8.3); more steps let a
    walk spread inside a strategy whose maps vary continuously (their small eigenvalues fade,
    ``mu^t -> 0``) while it stays inside separate strategies (``mu = 1``), so the gap after
    the separate ones stands out. ``k`` separate groups give ``k`` zero eigenvalues.

    ``diffusion=None`` (default): ``max(32, ln(1000) / lambda_m)`` steps with ``lambda_m`` the
    largest eigenvalue considered, so that the slowest mode kept fades to about 1/1000 however
    large the class (a larger graph has smaller eigenvalues)."""
    values = np.asarray(eigenvalues, dtype=np.float64)
    if values.ndim != 1 or values.size == 0 or not np.isfinite(values).all():
        raise ArgumentError(f"expected finite eigenvalues (m,), got {values!r:.100}")
    if diffusion is not None and not diffusion > 0:
        raise ArgumentError(f"diffusion must be a positive number of steps, got {diffusion!r}")
    limit = values.size - 1 if max_clusters is None else min(max_clusters, values.size - 1)
    if limit < 1:
        return 1
    if diffusion is None:
        top = float(np.clip(values[limit], 1e-12, 1.0))
        diffusion = max(DIFFUSION, math.log(1000.0) / top)
    walk = np.clip(1.0 - values[: limit + 1], 0.0, 1.0) ** diffusion
    return int(np.argmax(-np.diff(walk))) + 1


def default_neighbors(n: int) -> int:
    """``max(10, round(sqrt(n)))``: a graph dense enough that a strategy's maps stay
    connected as the class grows, sparse enough to scale (``n * sqrt(n)`` edges)."""
    return max(10, round(math.sqrt(n)))


def _knn_graph(points: np.ndarray, n_neighbors: int) -> Any:
    """The symmetric binary k-nearest-neighbour graph (sparse CSR): i ~ j when either is among
    the other's ``n_neighbors`` nearest (Euclidean) pooled maps."""
    from sklearn import config_context
    from sklearn.neighbors import kneighbors_graph

    with config_context(working_memory=WORKING_MB):  # distance blocks of at most this size
        graph = kneighbors_graph(points, n_neighbors, mode="connectivity", include_self=False)
    return graph.maximum(graph.T).tocsr()


def _spectrum(graph: Any, count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``count`` smallest eigenvalues (ascending) of the normalised Laplacian
    ``L = I - D^-1/2 A D^-1/2`` and the matching eigenvectors mapped back by ``D^-1/2`` (the
    random-walk eigenvectors, as scikit-learn's spectral embedding). Dense LAPACK up to
    :data:`DENSE_LIMIT` nodes, ARPACK (Lanczos, a seeded start vector) on the sparse matrix
    above it: the largest eigenvalues of ``D^-1/2 A D^-1/2`` are ``1 - lambda``."""
    import scipy.linalg
    import scipy.sparse
    import scipy.sparse.linalg

    degree = np.asarray(graph.sum(axis=1)).ravel()
    scale = 1.0 / np.sqrt(degree)
    normalised = scipy.sparse.diags(scale) @ graph @ scipy.sparse.diags(scale)
    n = graph.shape[0]
    if n <= DENSE_LIMIT:
        values, vectors = scipy.linalg.eigh(
            normalised.toarray(), subset_by_index=[n - count, n - 1]
        )
    else:
        start = np.random.default_rng(seed).uniform(-1, 1, n)
        values, vectors = scipy.sparse.linalg.eigsh(
            normalised, k=count, which="LA", v0=start, ncv=min(n, max(2 * count + 1, 40))
        )
    order = np.argsort(-values, kind="stable")
    values = np.clip(1.0 - values[order], 0.0, 2.0)
    vectors = vectors[:, order] * scale[:, None]
    signs = np.sign(vectors[np.argmax(np.abs(vectors), axis=0), range(vectors.shape[1])])
    return values, vectors * np.where(signs == 0, 1.0, signs)


def _cluster(
    points: np.ndarray, k: int, method: str, seed: int, options: dict[str, Any]
) -> np.ndarray:
    """Cluster labels by scikit-learn; -1 marks DBSCAN/HDBSCAN noise."""
    from sklearn import cluster

    if method == "kmeans":
        if k == 1:
            return np.zeros(len(points), dtype=np.int64)
        model = cluster.KMeans(n_clusters=k, n_init=10, random_state=seed, **options)
    elif method == "agglomerative":
        if k == 1:
            return np.zeros(len(points), dtype=np.int64)
        model = cluster.AgglomerativeClustering(n_clusters=k, **options)
    elif method == "dbscan":
        model = cluster.DBSCAN(**({"eps": 0.5, "min_samples": 5} | options))
    elif method == "hdbscan":
        model = cluster.HDBSCAN(**({"min_cluster_size": 5, "copy": True} | options))
    else:
        raise ArgumentError(
            f"clustering must be 'kmeans', 'agglomerative', 'dbscan' or 'hdbscan', got {method!r}"
        )
    try:
        return np.asarray(model.fit_predict(points), dtype=np.int64)
    except (TypeError, ValueError) as error:
        raise ArgumentError(f"{method} with options {options}: {error}") from None


def _embed_2d(
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
    keep = np.arange(n)
    if n > limit:
        keep = np.sort(np.random.default_rng(seed).choice(n, limit, replace=False))
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
        if inside.all():
            scores[cluster] = (0.0, 0.0, concentration)
            continue
        q = _unit(flat[~inside].mean(axis=0))
        distance = 0.5 * float(np.abs(p - q).sum()) if p.any() and q.any() else 0.0
        scores[cluster] = (distance * concentration, distance, concentration)
    return scores


def _unit(vector: np.ndarray) -> np.ndarray:
    total = vector.sum()
    return vector / total if total > 0 else vector


def _optional(values: Any, n: int, name: str, dtype: type) -> np.ndarray | None:
    if values is None:
        return None
    array = np.asarray(values.cpu() if isinstance(values, torch.Tensor) else values, dtype=dtype)
    if array.shape != (n,):
        raise ArgumentError(f"{name} must have one value per map ({n},), got {array.shape}")
    return array


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

    ``indices`` name the samples in the results (default ``0..n-1``); ``confidences``,
    ``predictions`` and ``truth`` (true labels, -1 where unknown) are per sample and give each
    cluster's mean confidence and accuracy. The graph joins each map to its ``n_neighbors``
    nearest; the ``max_clusters + 1`` smallest eigenvalues of its normalised Laplacian are kept
    and the eigengap suggests the number of clusters, used unless ``n_clusters`` is given.
    ``clustering`` runs on the row-normalised spectral embedding (``kmeans`` and
    ``agglomerative`` take the number of clusters; ``dbscan``/``hdbscan`` find their own and
    mark noise -1; ``clustering_options`` go to the scikit-learn class). ``embedding``: the
    2-D layout for display (``tsne``, ``umap`` with umap-learn installed, ``spectral``, or
    None), on a seeded subset of ``embedding_limit`` samples above it. The same ``seed`` gives
    the same result.

    Raises :class:`~camkit.errors.ArgumentError` for fewer than ``n_neighbors + 1`` samples
    (11 with the default). When every map is the same the class has one strategy (with a
    :class:`StrategyWarning`).
    """
    pooled = np.asarray(pooled, dtype=np.float32)
    if pooled.ndim != 3 or not np.isfinite(pooled).all():
        raise InputError(f"expected finite pooled maps (n, gh, gw), got shape {pooled.shape}")
    n = len(pooled)
    n_neighbors = default_neighbors(n) if n_neighbors is None else n_neighbors
    for name, value in (("n_neighbors", n_neighbors), ("max_clusters", max_clusters)):
        if not isinstance(value, int) or value < 1:
            raise ArgumentError(f"{name} must be a positive int, got {value!r}")
    if n_clusters is not None and (not isinstance(n_clusters, int) or not 1 <= n_clusters < n):
        raise ArgumentError(f"n_clusters must be an int in [1, {n - 1}], got {n_clusters!r}")
    if n < _fewest(n, n_neighbors):
        raise ArgumentError(
            f"class {class_id if class_id is not None else ''} has {n} map(s); the "
            f"nearest-neighbour graph needs at least {_fewest(n, n_neighbors)} "
            f"(n_neighbors={n_neighbors} + 1)"
        )
    indices = np.arange(n) if indices is None else np.asarray(indices, dtype=np.int64)
    if indices.shape != (n,):
        raise ArgumentError(f"indices must have one value per map ({n},), got {indices.shape}")
    confidences = _optional(confidences, n, "confidences", np.float64)
    predictions = _optional(predictions, n, "predictions", np.int64)
    truth = _optional(truth, n, "truth", np.int64)
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
            graph = _knn_graph(points.astype(np.float32), n_neighbors)
            eigenvalues, vectors = _spectrum(graph, count, seed)
        except (ValueError, RuntimeError, np.linalg.LinAlgError) as error:  # ARPACK...
            raise CamkitError(f"class {class_id}: the spectral embedding failed: {error}") from None
        suggested = eigengap(eigenvalues, max_clusters, diffusion)
        k = n_clusters or suggested
        spectral = vectors[:, : max(k, 2)]
        norms = np.linalg.norm(spectral[:, :k], axis=1, keepdims=True)
        clustered = spectral[:, :k] / np.where(norms > 0, norms, 1.0)
        labels = _cluster(clustered, k, clustering, seed, dict(clustering_options or {}))
    labels = _by_size(labels)
    scores = suspiciousness(pooled, labels)
    clusters = []
    for cluster in sorted(scores):
        inside = np.flatnonzero(labels == cluster)
        prototype = pooled[inside].mean(axis=0)
        distances = np.linalg.norm(points[inside] - prototype.ravel(), axis=1)
        order = inside[np.argsort(distances, kind="stable")]
        accuracy = None
        if truth is not None and predictions is not None and (truth[inside] >= 0).any():
            known = inside[truth[inside] >= 0]
            accuracy = float(np.mean(predictions[known] == truth[known]))
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
    coordinates, shown = _embed_2d(pooled, spectral, embedding, seed, embedding_limit)
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


def _by_size(labels: np.ndarray) -> np.ndarray:
    """Cluster ids renumbered 0, 1, ... by size, largest first (ties: first member first)."""
    ids = [c for c in dict.fromkeys(labels.tolist()) if c >= 0]
    order = sorted(ids, key=lambda c: (-int(np.sum(labels == c)), int(np.argmax(labels == c))))
    renamed = np.full_like(labels, -1)
    for new, old in enumerate(order):
        renamed[labels == old] = new
    return renamed


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
    each class (or the classes ``only``) is analysed by :func:`analyze_class` with
    ``options``. Classes with too few maps for the graph are skipped, with the reason in
    ``Strategies.skipped``; ``predictions`` and ``truth`` (-1: unknown) give the accuracy.
    ``rows``: analyse only these maps (the other arguments then have one value per row);
    results index the rows.
    """
    pooled = pool_maps(maps, grid, normalize=normalize, positive=positive, rows=rows)
    n = len(pooled)
    classes = _optional(classes, n, "classes", np.int64)
    confidences = _optional(confidences, n, "confidences", np.float64)
    predictions = _optional(predictions, n, "predictions", np.int64)
    truth = _optional(truth, n, "truth", np.int64)
    wanted = sorted(set(classes.tolist())) if only is None else list(only)
    found, skipped = {}, {}
    for class_id in wanted:
        members = np.flatnonzero(classes == class_id)
        per_sample = {"confidences": confidences, "predictions": predictions, "truth": truth}
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

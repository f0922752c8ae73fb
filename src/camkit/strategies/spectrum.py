"""The graph side of SpRAy: the k-nearest-neighbour graph of the pooled maps, the smallest
eigenvalues and eigenvectors of its normalised Laplacian, and the eigengap that reads the
number of strategies off them.

The spectral embedding is Ng, Jordan and Weiss, "On spectral clustering: analysis and an
algorithm", NIPS 2001; the eigengap heuristic is von Luxburg, "A tutorial on spectral
clustering", Statistics and Computing 17 (2007), section 8.3; the diffusion steps are Coifman
and Lafon, "Diffusion maps", Applied and Computational Harmonic Analysis 21 (2006).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from camkit.errors import ArgumentError

DIFFUSION = 32
"""The fewest random-walk steps of the automatic eigengap (:func:`eigengap`)."""
WORKING_MB = 128
"""Memory (MB) of the blocks of pairwise distances scikit-learn computes at a time."""
DENSE_LIMIT = 1500
"""Up to this many samples the Laplacian's spectrum is computed densely (exact, fast)."""


def eigengap(
    eigenvalues: Sequence[float] | np.ndarray,
    max_clusters: int | None = None,
    diffusion: float | None = None,
) -> int:
    """The number of clusters the smallest eigenvalues (ascending) of the normalised Laplacian
    suggest: the ``k`` with the largest gap ``mu_(k-1)^t - mu_k^t``, ``mu = 1 - lambda`` the
    random walk's eigenvalues and ``t = diffusion`` its steps (diffusion maps, Coifman and Lafon
    2006). ``diffusion=1`` is the plain eigengap (von Luxburg 2007, section 8.3); more steps
    fade the small eigenvalues of a strategy whose maps vary continuously (``mu^t -> 0``) while
    separate strategies keep ``mu = 1``. ``diffusion=None``: ``max(32, ln(1000) / lambda_m)``
    steps, ``lambda_m`` the largest eigenvalue considered, so the slowest mode kept fades to
    about 1/1000 however large the class."""
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


def knn_graph(points: np.ndarray, n_neighbors: int) -> Any:
    """The symmetric binary k-nearest-neighbour graph (sparse CSR): i ~ j when either is among
    the other's ``n_neighbors`` nearest (Euclidean) pooled maps."""
    from sklearn import config_context
    from sklearn.neighbors import kneighbors_graph

    with config_context(working_memory=WORKING_MB):  # distance blocks of at most this size
        graph = kneighbors_graph(points, n_neighbors, mode="connectivity", include_self=False)
    return graph.maximum(graph.T).tocsr()


def laplacian_spectrum(graph: Any, count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``count`` smallest eigenvalues (ascending) of ``L = I - D^-1/2 A D^-1/2`` and the
    random-walk eigenvectors (mapped back by ``D^-1/2``, as scikit-learn's spectral embedding):
    dense LAPACK up to :data:`DENSE_LIMIT` nodes, seeded ARPACK above."""
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

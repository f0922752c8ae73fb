"""The results of SpRAy as dataclasses: :class:`Cluster` (one strategy of a class),
:class:`ClassStrategies` (the strategies of one class), :class:`Strategies` (every class)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np


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

    def _repr_png_(self) -> bytes:
        """A notebook shows the prototype (:mod:`camkit.strategies.plots`)."""
        from camkit.strategies.plots import prototype_png  # pictures only when shown

        return prototype_png(self)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (the prototype left out: an array)."""
        lists = {name: getattr(self, name).tolist() for name in ("members", "typical", "atypical")}
        scores = ("confidence", "accuracy", "suspiciousness", "distance", "concentration")
        return {"id": self.id, "size": self.size} | lists | {s: getattr(self, s) for s in scores}


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

    def _repr_html_(self) -> str:
        """A notebook shows the clusters as a table with their prototypes."""
        from camkit.strategies.plots import table

        return table([self])

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

    def _repr_html_(self) -> str:
        """A notebook shows every class's clusters as a table with their prototypes."""
        from camkit.strategies.plots import table

        return table(self.classes.values(), self.skipped)

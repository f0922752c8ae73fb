"""Dataset-wide strategies: clusters of explanations per class (SpRAy).

Spectral Relevance Analysis (Lapuschkin et al., "Unmasking Clever Hans predictors and assessing
what machines really learn", Nature Communications 10, 1096, 2019): explain every sample of a
class, pool each map to a small grid, build a k-nearest-neighbour graph of the pooled maps,
embed it with the graph Laplacian's eigenvectors, read the number of strategies off the
eigengap, cluster the embedding, and look at each cluster's mean map. A cluster whose maps sit
on a watermark, a border or a tag is a model reading a shortcut ("Clever Hans").

Numbers in, numbers out: ``(N, H, W)`` maps (any camkit method; pixel attributions summed over
channels) and their classes go in; :class:`ClassStrategies` dataclasses (eigenvalues, the
suggested number of clusters, the clusters with their prototypes, members and scores) come
out. Figures are in :mod:`camkit.strategies.plots`, the saved maps of a run
(``camkit explain --save-maps``) in :mod:`camkit.strategies.mapfile`.
"""

from camkit.strategies.core import (
    ClassStrategies,
    Cluster,
    Strategies,
    StrategyWarning,
    analyze_class,
    default_neighbors,
    eigengap,
    find_strategies,
    pool_maps,
    suspiciousness,
)
from camkit.strategies.mapfile import MapSet, load_maps

__all__ = [
    "ClassStrategies",
    "Cluster",
    "MapSet",
    "Strategies",
    "StrategyWarning",
    "analyze_class",
    "default_neighbors",
    "eigengap",
    "find_strategies",
    "load_maps",
    "pool_maps",
    "suspiciousness",
]

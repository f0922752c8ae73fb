"""Dataset-wide strategies: clusters of explanations per class (SpRAy).

Spectral Relevance Analysis (Lapuschkin et al., "Unmasking Clever Hans predictors and assessing
what machines really learn", Nature Communications 10, 1096, 2019): pool each map of a class to
a small grid, build a k-nearest-neighbour graph of the pooled maps, embed it with the graph
Laplacian's eigenvectors, read the number of strategies off the eigengap, cluster the embedding
and look at each cluster's mean map. A cluster whose maps sit on a watermark, a border or a tag
is a model reading a shortcut ("Clever Hans").

Numbers in, numbers out: ``(N, H, W)`` maps and their classes in, :class:`ClassStrategies`
out; a run's saved maps (``camkit explain --save-maps``): :func:`load_maps`.
"""

from camkit.runs.maps import MapSet, load_maps
from camkit.strategies.analysis import StrategyWarning, analyze_class, find_strategies
from camkit.strategies.clustering import suspiciousness
from camkit.strategies.pooling import pool_maps
from camkit.strategies.results import ClassStrategies, Cluster, Strategies
from camkit.strategies.spectrum import default_neighbors, eigengap

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

"""A run folder: what ``camkit explain`` and ``camkit strategies`` write, and what the report and
the explorer read. Both front ends import this package; neither imports the other.

* :mod:`camkit.runs.manifest`: ``manifest.json`` and the per-rank parts of a run (versions,
  settings, one record per output, throughput), merged at the end or on resume;
* :mod:`camkit.runs.maps`: ``maps.npz`` (``--save-maps``), the per-rank map parts folded into
  it (its format: :mod:`camkit.strategies.mapfile`);
* :mod:`camkit.runs.strategies`: ``strategies/strategies.json`` read for a page (the report's
  strategies view and the explorer's clusters).
"""

from __future__ import annotations

from camkit.runs.manifest import MANIFEST
from camkit.runs.strategies import STRATEGIES
from camkit.strategies.mapfile import MAPS_FILE

__all__ = ["MANIFEST", "MAPS_FILE", "STRATEGIES"]

"""A run folder: what ``camkit explain``, ``evaluate``, ``strategies`` and ``concepts`` write,
and what the report and the explorer read. Both front ends import this package; neither imports
the other. Every file has one typed, versioned record with one writer and one reader (a file
without a version is read as version 0, camkit 0.2's layout; a broken one raises
:class:`~camkit.errors.RunFileError` naming the file, its version and the command to re-run):

* :mod:`camkit.runs.manifest`: ``manifest.json`` and the per-rank parts of a run (versions,
  settings, one record per output, throughput), merged at the end or on resume;
* :mod:`camkit.runs.maps`: ``maps.npz`` (``--save-maps``), the per-rank map parts folded into
  it;
* :mod:`camkit.runs.strategies`: ``strategies/strategies.json`` (``camkit strategies``) and its
  views for a page (the report's strategies view and the explorer's clusters);
* :mod:`camkit.runs.concepts`: ``concepts.json`` (``camkit concepts``) and its views;
  :mod:`camkit.runs.concept_parts`: its resume files ``concepts.part-*.pt``;
* :mod:`camkit.runs.metrics`: ``metrics.json`` (``camkit evaluate``);
* :mod:`camkit.runs.records`: what they share (the file kinds, versions, typed reads).
"""

from __future__ import annotations

from camkit.runs.concepts import CONCEPTS_FILE
from camkit.runs.manifest import MANIFEST
from camkit.runs.maps import MAPS_FILE
from camkit.runs.metrics import METRICS_FILE
from camkit.runs.strategies import STRATEGIES

__all__ = ["CONCEPTS_FILE", "MANIFEST", "MAPS_FILE", "METRICS_FILE", "STRATEGIES"]

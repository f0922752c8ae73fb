"""A run folder: what ``camkit explain``, ``evaluate``, ``strategies`` and ``concepts`` write,
and what the report and the explorer read (neither front end imports the other). Every file has
one typed, versioned record with one writer and one reader (a file without a version is read as
version 0, camkit 0.2's layout; a broken one raises :class:`~camkit.errors.RunFileError` naming
the file, its version and the command to re-run): :mod:`~camkit.runs.manifest` (and its
per-rank parts), :mod:`~camkit.runs.maps` (``--save-maps``), :mod:`~camkit.runs.strategies`,
:mod:`~camkit.runs.concepts` (and the resume files, :mod:`~camkit.runs.concept_parts`),
:mod:`~camkit.runs.metrics`; what they share: :mod:`~camkit.runs.records`.
"""

from __future__ import annotations

from camkit.runs.concepts import CONCEPTS_FILE
from camkit.runs.manifest import MANIFEST
from camkit.runs.maps import MAPS_FILE
from camkit.runs.metrics import METRICS_FILE
from camkit.runs.strategies import STRATEGIES

__all__ = ["CONCEPTS_FILE", "MANIFEST", "MAPS_FILE", "METRICS_FILE", "STRATEGIES"]

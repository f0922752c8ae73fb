"""A run folder: what ``camkit explain``, ``evaluate``, ``strategies`` and ``concepts`` write,
and what the report and the explorer read (neither front end imports the other). Every file has
one typed, versioned record with one writer and one reader; what they share:
:mod:`~camkit.runs.records`.
"""

from __future__ import annotations

from camkit.runs.concepts import CONCEPTS_FILE
from camkit.runs.manifest import MANIFEST
from camkit.runs.maps import MAPS_FILE
from camkit.runs.metrics import METRICS_FILE
from camkit.runs.strategies import STRATEGIES

__all__ = ["CONCEPTS_FILE", "MANIFEST", "MAPS_FILE", "METRICS_FILE", "STRATEGIES"]

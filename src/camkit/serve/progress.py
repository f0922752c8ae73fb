"""Long maps on the page: progress and cancelling. A map request may name a ``job`` (an id the
page makes up): a forward pre-hook counts the rows the model scores, and raises
:class:`Cancelled` at the next forward pass once ``/api/cancel`` marked it (:func:`watching`)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from torch import nn

from camkit.core.explainer import Explainer
from camkit.core.progress import counting_rows

MAX_JOBS = 256  # jobs remembered; the oldest finished ones are forgotten first


class Cancelled(Exception):
    """The page cancelled the map: the server stopped computing it."""


@dataclass
class Job:
    """One map being computed: copies scored so far, the expected number, the start time."""

    id: str
    expected: int | None = None
    done: int = 0
    cancelled: bool = False
    finished: bool = False
    started: float = field(default_factory=time.monotonic)

    def as_dict(self) -> dict:
        return {
            "job": self.id,
            "done": self.done,
            "expected": self.expected,
            "cancelled": self.cancelled,
            "finished": self.finished,
            "seconds": round(time.monotonic() - self.started, 2),
        }


class Jobs:
    """The jobs of one server, by id (thread-safe)."""

    def __init__(self) -> None:
        self.jobs: dict[str, Job] = {}
        self.lock = threading.Lock()

    def start(self, job_id: str, expected: int | None) -> Job:
        with self.lock:
            job = self.jobs.get(job_id)
            if job is None or job.finished:
                job = self.jobs[job_id] = Job(job_id, expected)
            elif job.expected is None:  # cancelled before it started
                job.expected = expected
            self._forget()
            return job

    def _forget(self) -> None:
        """Beyond ``MAX_JOBS``: the oldest finished jobs first, then the oldest of any."""
        extra = max(0, len(self.jobs) - MAX_JOBS)
        for key in sorted(self.jobs, key=lambda key: not self.jobs[key].finished)[:extra]:
            del self.jobs[key]

    def get(self, job_id: str) -> Job | None:
        with self.lock:
            return self.jobs.get(job_id)

    def cancel(self, job_id: str) -> Job:
        """Mark a job cancelled; a cancel that overtakes its map request still stops it."""
        with self.lock:
            job = self.jobs.setdefault(job_id, Job(job_id))
            job.cancelled = True
            self._forget()
            return job


@contextlib.contextmanager
def watching(model: nn.Module, job: Job) -> Iterator[None]:
    """Count the rows ``model`` scores into ``job`` and stop at its next forward pass once the
    job is cancelled (:func:`camkit.core.progress.counting_rows`)."""

    def seen(rows: int) -> None:
        if job.cancelled:
            raise Cancelled("cancelled: the server stopped computing this map")
        job.done += rows

    seen(0)
    try:
        with counting_rows(model, seen):
            yield
    finally:
        job.finished = True


def copies_per_image(explainer: Explainer, layer_shape: tuple | None) -> int:
    """About how many rows of forward passes one image costs ``explainer``: the method's own
    :meth:`~camkit.core.explainer.Explainer.forward_rows`, plus the clean pass."""
    return explainer.forward_rows(layer_shape) + 1

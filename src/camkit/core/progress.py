"""Progress: a tqdm bar on a terminal; in a log, one line at a steady interval, as training
loops print."""

from __future__ import annotations

import contextlib
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import KW_ONLY, dataclass
from typing import IO, Any

from torch import Tensor, nn
from tqdm.std import TqdmWarning

with warnings.catch_warnings():  # a notebook without ipywidgets: tqdm's text bar, quietly
    warnings.simplefilter("ignore", TqdmWarning)
    from tqdm.auto import tqdm

from camkit.core.layers import hooked, this_thread

LOG_INTERVAL = 10.0  # seconds between two progress lines in a log


def progress_bar(total: int, description: str, unit: str, *, enabled: bool = True) -> tqdm:
    """A tqdm bar of ``total`` ``unit`` s; silent when not ``enabled`` or stderr is not a
    terminal."""
    return tqdm(total=total, desc=description, unit=unit, disable=None if enabled else True)


@dataclass(eq=False)
class LogProgress:
    """Progress as lines for a log: ``explain: 12/43 images (28%), 1.3 images/s, 24 s left``,
    at most one per ``interval`` seconds and a last one when done; the calls of a tqdm bar."""

    total: int
    description: str
    unit: str
    _: KW_ONLY
    interval: float = LOG_INTERVAL
    file: IO[str] | None = None
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        self.done = self.shown = 0
        self.note = self.note_shown = ""
        self.started = self.last = self.clock()
        self.closed = False

    def line(self) -> str:
        """The progress so far, in one line."""
        seconds = self.clock() - self.started
        share = f" ({self.done / self.total:.0%})" if self.total else ""
        text = f"{self.description}: {self.done}/{self.total} {self.unit}s{share}"
        if self.done and seconds > 0:
            rate = self.done / seconds
            left = max(self.total - self.done, 0) / rate
            text += f", {rate:.3g} {self.unit}s/s, {_duration(left)} left"
        return text + (f" [{self.note}]" if self.note else "")

    def set_postfix_str(self, note: str = "", refresh: bool = True) -> None:
        """A note on the work inside a step (as tqdm's), shown with the next line."""
        self.note = note
        if refresh:
            self._due()

    def update(self, n: int = 1) -> None:
        """``n`` more done."""
        self.done += n
        self._due()

    def _due(self) -> None:
        """A line when ``interval`` seconds passed since the last one."""
        if self.clock() - self.last >= self.interval:
            self._print(self.line())

    def write(self, message: str, file: IO[str] | None = None) -> None:
        """A message of its own (as ``tqdm.write``)."""
        print(message, file=file or self.file or sys.stderr, flush=True)

    def close(self) -> None:
        """The last line, unless nothing was to do or it is already shown."""
        shown = (self.shown, self.note_shown) == (self.done, self.note)
        if not self.closed and self.total and not shown:
            self._print(self.line())
        self.closed = True

    def _print(self, text: str) -> None:
        self.last, self.shown, self.note_shown = self.clock(), self.done, self.note
        print(text, file=self.file or sys.stderr, flush=True)

    def __enter__(self) -> LogProgress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _duration(seconds: float) -> str:
    """``42 s``, ``3 min 05 s``, ``2 h 07 min``."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def progress(
    total: int, description: str, unit: str, *, enabled: bool = True
) -> tqdm | LogProgress:
    """The command's progress: a tqdm bar on a terminal, :class:`LogProgress` lines in a log,
    nothing when ``enabled`` is False (``--quiet``)."""
    if enabled and not sys.stderr.isatty():
        return LogProgress(total, description, unit)
    return progress_bar(total, description, unit, enabled=enabled)


@contextlib.contextmanager
def counting_rows(model: nn.Module, seen: Callable[[int], None]) -> Iterator[None]:
    """Call ``seen(rows)`` before each forward pass of ``model`` (this thread's only) with the
    rows of its first input; ``seen`` may raise to stop the work at that pass."""

    def count(module: nn.Module, args: tuple) -> None:
        first = args[0] if args and isinstance(args[0], Tensor) else None
        seen(int(first.shape[0]) if first is not None and first.ndim > 0 else 1)

    with hooked(lambda: [model.register_forward_pre_hook(this_thread(count))]):
        yield

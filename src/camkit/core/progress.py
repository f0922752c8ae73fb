"""Progress bars: tqdm on stderr, drawn only on a terminal (logs stay clean)."""

from __future__ import annotations

from tqdm.auto import tqdm


def progress_bar(total: int, description: str, unit: str, *, enabled: bool = True) -> tqdm:
    """A tqdm bar of ``total`` ``unit`` s; silent when ``enabled`` is False or stderr is not a
    terminal. Use it as a context manager and call ``update(n)``."""
    return tqdm(total=total, desc=description, unit=unit, disable=None if enabled else True)

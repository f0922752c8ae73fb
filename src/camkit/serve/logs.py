"""The explorer's log: one line per request (method, path without the token, status, time) at
INFO on the ``camkit.serve`` logger, and failed computations with their traceback at ERROR (the
page only gets a one-line JSON error)."""

from __future__ import annotations

import logging
import sys

LOG = logging.getLogger("camkit.serve")


def configure(level: int = logging.INFO) -> None:
    """Send the log to stderr with a time stamp, unless the application configured it."""
    if LOG.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s camkit serve %(levelname)s %(message)s"))
    LOG.addHandler(handler)
    LOG.setLevel(level)
    LOG.propagate = False


def printable(text: str) -> str:
    """``text`` with the backslash and every unprintable character (NUL, terminal escapes, line
    breaks) as its Python escape: a request's path reaches the log, never the terminal."""
    return "".join(
        c if c.isprintable() and c != "\\" else c.encode("unicode_escape").decode("ascii")
        for c in text
    )


def request_line(method: str, path: str, status: int, seconds: float) -> None:
    """One request: ``GET /api/map 200 12.3 ms`` (the query, which holds the token, is left out;
    the decoded path made :func:`printable`; 4xx at INFO as well, 5xx at WARNING)."""
    level = logging.WARNING if status >= 500 else logging.INFO
    LOG.log(level, "%s %s %d %.1f ms", printable(method), printable(path), status, seconds * 1000)

"""What every route of :mod:`camkit.serve.app` shares: checked query parameters, JSON errors,
names safe to send back."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from camkit.errors import ArgumentError

NO_STORE = {"Cache-Control": "no-store"}


def error(message: str, status: int) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


class Query:
    """Checked query parameters: a missing, malformed or unknown one is an
    :class:`~camkit.errors.ArgumentError` (422) with its name. ``allowed``: the names the route
    takes (the token is always allowed); None: any."""

    def __init__(self, request: Request, allowed: Collection[str] | None = None) -> None:
        self.params = request.query_params
        if allowed is not None:
            unknown = sorted(set(self.params) - set(allowed) - {"token"})
            if unknown:
                raise ArgumentError(
                    f"unknown query parameter(s) {', '.join(map(repr, unknown))}; "
                    f"{request.url.path} takes {', '.join(sorted(allowed))}"
                )

    def choice(self, name: str, options: Sequence[str], default: str) -> str:
        """A parameter that must be one of ``options``."""
        value = self.text(name, default)
        if value not in options:
            raise ArgumentError(
                f"query parameter {name!r} must be one of {', '.join(options)}, got {value!r}"
            )
        return value

    def text(self, name: str, default: str | None = None) -> str | None:
        value = self.params.get(name)
        return default if value in (None, "") else value

    def integer(self, name: str, default: int | None = None) -> int:
        return self._parsed(name, default, int, "an integer")

    def number(self, name: str, default: float) -> float:
        return self._parsed(name, default, float, "a number")

    def _parsed(self, name: str, default: Any, kind: type, what: str) -> Any:
        value = self.params.get(name)
        if value in (None, ""):
            if default is None:
                raise ArgumentError(f"missing query parameter {name!r} ({what})")
            return default
        try:
            return kind(value)
        except ValueError:
            raise ArgumentError(f"query parameter {name!r} must be {what}, got {value!r}") from None


def safe_name(name: str) -> str:
    """A name safe in a header and a page: letters, digits and ``._- `` only."""
    return "".join(c if c.isalnum() or c in "._- " else "_" for c in name)[:120]

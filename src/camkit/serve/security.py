"""Every check that keeps ``camkit serve`` safe: the API token (random, in the start-up URL as
Jupyter does, compared in constant time; required off loopback), the hosts it answers, the files
it serves (only under their root, symlinks followed) and the uploads it accepts
(:data:`MAX_UPLOADS` of at most :data:`MAX_UPLOAD_BYTES`, read with the explorer's pixel limit)."""

from __future__ import annotations

import hmac
import io as _io
import ipaddress
import secrets
from pathlib import Path

import numpy as np

from camkit import io
from camkit.errors import ArgumentError, CamkitError

TOKEN_HEADER = "X-Camkit-Token"
MAX_UPLOAD_BYTES = 20 * 1024 * 1024
"""Largest upload accepted (bytes); a larger body is refused before it is read to the end."""
MAX_UPLOADS = 200
"""Uploads kept in memory by one server; more are refused (restart it to start afresh)."""
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


class SecurityError(ArgumentError):
    """A setting that would expose the explorer (a public address without a token)."""


class UploadError(CamkitError):
    """An upload that is refused: ``status`` is the HTTP status to answer with."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


NOTEBOOK_FRAMES = (
    "http://localhost:* http://127.0.0.1:* http://[::1]:* https://localhost:* "
    "https://127.0.0.1:* vscode-webview:"
)
"""Who may frame the page of :func:`camkit.explore`: a notebook served from this machine
(Jupyter, JupyterLab, VS Code), nothing else."""


def headers(frame_ancestors: str = "'self'") -> dict[str, str]:
    """Sent with every response: only this server's own scripts, styles and images; framed by
    ``frame_ancestors`` only (default: no other site); the token never leaks in a ``Referer``."""
    found = {
        "Content-Security-Policy": (
            "default-src 'self'; img-src 'self' blob: data:; style-src 'self'; "
            "script-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; "
            f"frame-ancestors {frame_ancestors}"
        ),
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
    }
    if frame_ancestors == "'self'":
        found["X-Frame-Options"] = "SAMEORIGIN"
    return found


def new_token() -> str:
    """A fresh random token (32 URL-safe characters)."""
    return secrets.token_urlsafe(24)


def token_matches(expected: str | None, given: str | None) -> bool:
    """Whether a request's token is the server's (constant-time); no token set: always."""
    if not expected:
        return True
    return given is not None and hmac.compare_digest(expected.encode(), given.encode())


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address or ``localhost``."""
    name = host.strip("[]")
    try:
        return name in LOOPBACK_NAMES or ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: str | None) -> None:
    """Refuse to listen on a non-loopback address without a token."""
    if not token and not is_loopback(host):
        raise SecurityError(
            f"refusing to serve on {host} without a token: anyone who can reach it could use "
            "the model and read the images; keep the token or bind 127.0.0.1"
        )


def allowed_hosts(host: str) -> list[str]:
    """``Host`` headers accepted: the loopback names when bound to loopback (against DNS
    rebinding), any otherwise (the token protects it)."""
    if is_loopback(host):
        return ["localhost", "127.0.0.1", "[::1]", "::1"]
    return ["*"]


def resolve_under(root: Path, relative: str) -> Path | None:
    """The file ``root / relative`` if it is one under ``root`` once resolved; else None."""
    if not relative or "\0" in relative or "\\" in relative:
        return None
    candidate = Path(relative)
    if candidate.is_absolute() or ".." in candidate.parts:
        return None
    base = root.resolve()
    try:
        resolved = (base / candidate).resolve(strict=True)
    except (OSError, RuntimeError):
        return None
    return resolved if resolved.is_relative_to(base) and resolved.is_file() else None


def read_upload(data: bytes, *, max_pixels: int | None = io.MAX_PIXELS) -> np.ndarray:
    """An uploaded file's bytes (at most :data:`MAX_UPLOAD_BYTES`: the upload route stops
    reading there) -> ``HxWx3`` uint8 RGB, through camkit's image reading and its limits;
    :class:`UploadError` (413 too large, 400 unreadable) otherwise."""
    if not data:
        raise UploadError("the upload is empty: send the image file's bytes as the body")
    try:
        return io.read_image(_io.BytesIO(data), max_pixels=max_pixels)
    except io.ImageTooLargeError as error:
        raise UploadError(str(error), 413) from None
    except io.READ_ERRORS as error:
        raise UploadError(f"not a readable image: {io.read_failure(error)}") from None

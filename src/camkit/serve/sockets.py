"""Listening for the explorer: a bound socket (its errors said before any URL is printed) and
uvicorn in a thread, shared by ``camkit serve``, the notebook view and ``serve.app.running``."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

from camkit.errors import ArgumentError

START_SECONDS = 30.0  # a server in a thread must listen within this


class BindError(ArgumentError):
    """The address cannot be listened on (a busy port, an address this machine does not have)."""


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (``port=0``: a free one), or :class:`BindError`."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as failed:
        raise BindError(f"cannot listen on {host}: not an address ({failed.strerror})") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as failed:
        sock.close()
        reason = failed.strerror or str(failed)
        hint = "; pick another --port" if failed.errno == 98 else ""
        raise BindError(f"cannot listen on {host}:{port}: {reason}{hint}") from None
    sock.set_inheritable(True)
    return sock


def serve_in_thread(app: Any, sock: socket.socket, name: str) -> tuple[Any, threading.Thread]:
    """uvicorn serving ``app`` on ``sock`` in a daemon thread, once started -> (server, thread)."""
    import uvicorn

    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
    server = uvicorn.Server(config)

    def serve() -> None:
        try:
            server.run(sockets=[sock])
        finally:
            sock.close()

    thread = threading.Thread(target=serve, daemon=True, name=name)
    thread.start()
    deadline = time.monotonic() + START_SECONDS
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            server.should_exit = True
            raise ArgumentError("the explorer did not start (see the log above)")
        time.sleep(0.02)
    return server, thread


__all__ = ["START_SECONDS", "BindError", "bind", "serve_in_thread"]

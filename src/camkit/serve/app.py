"""The ASGI app of ``camkit serve``: the page, its static files and the JSON/PNG API (routes listed
in ``docs/serve.md``, written by concern in :mod:`camkit.serve.routes`). Every ``/api/`` route
needs the token (:mod:`camkit.serve.security`); an unknown query parameter or value is a 422."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import Response

from camkit.errors import CamkitError
from camkit.models.vlm import LoadedVLM
from camkit.serve import security
from camkit.serve.batcher import MapBatcher
from camkit.serve.explorer import Explorer
from camkit.serve.gallery import RunViews
from camkit.serve.http import error
from camkit.serve.logs import LOG, printable, request_line
from camkit.serve.progress import Cancelled
from camkit.serve.prompts import Prompts
from camkit.serve.routes import ServerState, all_routes
from camkit.serve.sockets import bind, serve_in_thread


def create_app(
    explorer: Explorer,
    *,
    token: str | None,
    run: RunViews | None = None,
    hosts: list[str] | None = None,
    background: bool = False,
    window: float = 0.005,
    names: dict[str, str] | None = None,
    frame_ancestors: str = "'self'",
    vlm: LoadedVLM | None = None,
) -> Starlette:
    """The explorer's ASGI app. ``token``: required on every ``/api/`` request (None: none, for
    loopback only); ``run``: the ``camkit explain`` run it shows; ``hosts``: accepted ``Host``
    headers (None: any); ``background``: predict every image in the background; ``names``: each
    checkpoint's name on the page; ``frame_ancestors``: who may frame the page; ``vlm``: the
    vision-language model whose image side ``explorer`` shows, for the prompt views."""
    sent = security.headers(frame_ancestors)
    batcher = MapBatcher(explorer, window=window)
    state = ServerState(explorer, batcher, run or RunViews(), names)
    state.prompts = None if vlm is None else Prompts(vlm, explorer)

    async def answer(request: Request, call_next: Any) -> Response:
        if request.url.path.startswith("/api/"):
            given = request.query_params.get("token") or request.headers.get(security.TOKEN_HEADER)
            if not security.token_matches(token, given):
                reason = "missing" if not given else "wrong"
                return error(f"{reason} token: open the URL printed at start-up", 401)
        try:
            return await call_next(request)
        except KeyError as missing:
            return error(f"no image {missing.args[0]!r}", 404)
        except CamkitError as refused:  # an UploadError carries its own status
            return error(str(refused), getattr(refused, "status", 422))
        except Cancelled as stopped:
            return error(str(stopped), 409)
        except Exception as failed:  # noqa: BLE001 -- a computation that fails never stops the server
            LOG.exception("%s %s failed", request.method, printable(request.url.path))
            return error(f"{type(failed).__name__}: {failed}", 500)

    async def guarded(request: Request, call_next: Any) -> Response:
        started = time.perf_counter()
        response = await answer(request, call_next)
        response.headers.update(sent)
        request_line(
            request.method, request.url.path, response.status_code, time.perf_counter() - started
        )
        return response

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        task = asyncio.get_running_loop().create_task(predict_all()) if background else None
        try:
            yield
        finally:
            if task is not None:
                task.cancel()
            batcher.close()

    async def predict_all() -> None:
        for checkpoint in state.checkpoints:
            for start in range(0, len(explorer.entries), 16):
                chunk = list(range(start, min(start + 16, len(explorer.entries))))
                await batcher.run(explorer.predict, chunk, checkpoint)

    middleware = [Middleware(TrustedHostMiddleware, allowed_hosts=hosts)] if hosts else []
    middleware.append(Middleware(BaseHTTPMiddleware, dispatch=guarded))
    app = Starlette(routes=all_routes(state), middleware=middleware, lifespan=lifespan)
    app.state.explorer = explorer
    app.state.batcher = batcher
    app.state.views = state.views
    return app


@contextlib.contextmanager
def running(app: Starlette, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """A real uvicorn serving ``app`` in a thread (``port=0``: a free one) -> its base URL."""
    sock = bind(host, port)
    server, thread = serve_in_thread(app, sock, "camkit-serve")
    try:
        yield f"http://{host}:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


__all__ = ["create_app", "running"]

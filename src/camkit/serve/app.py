"""The ASGI app of ``camkit serve``: the page, its static files and the JSON/PNG API.

Routes (every ``/api/`` route needs the token, see :mod:`camkit.serve.security`):

=============================  ============================================================
``GET /``                      the page (``static/index.html``; no build step, nothing remote)
``GET /api/info``              model, labels, the methods that fit, layers, depth-strip stages
``GET /api/gallery``           a page of images with predictions: ``offset``, ``limit``,
                               ``predicted``, ``truth``, ``wrong``, ``order``, ``checkpoint``
``GET /api/thumb/{id}``        a JPEG thumbnail
``GET /api/photo/{id}``        the model's view of the photo (resized and cropped), PNG
``GET /api/image/{id}``        the image's top-k and every class's probability; a run's maps
``GET /api/map``               one map: ``image``, ``class``, ``method``, ``layer``,
                               ``checkpoint``, ``alpha``, ``colormap``, ``format=png|npy``
``GET /api/depth``             the depth strip: the method at every stage from one pass
``GET /api/curve``             the deletion/insertion curves of a map
``POST /api/upload``           an image file as the body -> its id
``GET /api/strategies``        the run's clusters per class (``camkit strategies``), as ids
``GET /api/run/{path}``        a file of the ``camkit explain`` run (only under its folder)
=============================  ============================================================
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Route

from camkit import registry
from camkit.errors import ArgumentError, CamkitError
from camkit.serve import security
from camkit.serve.batcher import MapBatcher
from camkit.serve.explorer import (
    SLOW_FAMILIES,
    SLOW_METHODS,
    Explorer,
    MapKey,
    npy_bytes,
    overlay_png,
)
from camkit.serve.gallery import select

STATIC = {"app.js": "text/javascript", "style.css": "text/css", "index.html": "text/html"}
COLORMAPS = ("jet", "turbo", "inferno", "viridis", "magma", "gray")
PAGE_LIMIT = 200
NO_STORE = {"Cache-Control": "no-store"}


def _static(name: str) -> bytes:
    return resources.files("camkit.serve").joinpath("static", name).read_bytes()


def error(message: str, status: int) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


class Query:
    """Checked query parameters: a missing or malformed one is a 400 with its name."""

    def __init__(self, request: Request) -> None:
        self.params = request.query_params

    def text(self, name: str, default: str | None = None) -> str | None:
        value = self.params.get(name)
        return default if value in (None, "") else value

    def integer(self, name: str, default: int | None = None) -> int:
        value = self.params.get(name)
        if value in (None, ""):
            if default is None:
                raise ArgumentError(f"missing query parameter {name!r} (an integer)")
            return default
        try:
            return int(value)
        except ValueError:
            raise ArgumentError(
                f"query parameter {name!r} must be an integer, got {value!r}"
            ) from None

    def number(self, name: str, default: float) -> float:
        value = self.params.get(name)
        try:
            return default if value in (None, "") else float(value)
        except ValueError:
            raise ArgumentError(
                f"query parameter {name!r} must be a number, got {value!r}"
            ) from None


def create_app(
    explorer: Explorer,
    *,
    token: str | None,
    run_root: Path | None = None,
    run_header: dict | None = None,
    strategies: dict | None = None,
    hosts: list[str] | None = None,
    background: bool = False,
    window: float = 0.005,
) -> Starlette:
    """The explorer's ASGI app. ``token``: required on every ``/api/`` request (None: no
    token, for loopback only); ``run_root``: the ``camkit explain`` folder whose files may be
    served; ``strategies``: the run's clusters (:func:`~camkit.serve.gallery.read_strategies`);
    ``hosts``: accepted ``Host`` headers (None: any); ``background``: predict every
    image in the background, so filters and sorting cover the whole gallery."""
    batcher = MapBatcher(explorer, window=window)
    checkpoints = list(explorer.checkpoints)

    def checkpoint_of(query: Query) -> str:
        name = query.text("checkpoint", checkpoints[0])
        if name not in explorer.checkpoints:
            raise ArgumentError(f"unknown checkpoint {name!r}; choose from {checkpoints}")
        return name

    def image_of(value: Any) -> int:
        try:
            image = int(value)
            explorer.entry(image)
        except (KeyError, ValueError):
            raise KeyError(value) from None
        return image

    async def page(request: Request) -> Response:
        return Response(_static("index.html"), media_type="text/html", headers=NO_STORE)

    async def static(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in STATIC:
            return error("not found", 404)
        return Response(_static(name), media_type=STATIC[name], headers=NO_STORE)

    async def info(request: Request) -> Response:
        first = explorer.checkpoints[checkpoints[0]]
        methods = [
            {
                "name": name,
                "family": registry.get(name).family,
                "needs_layer": registry.get(name).needs_layer,
                "reference": registry.get(name).reference,
                "slow": registry.get(name).family in SLOW_FAMILIES or name in SLOW_METHODS,
            }
            for name in explorer.methods
        ]
        truths = sorted({e.truth for e in explorer.entries if e.truth is not None})
        return JSONResponse(
            {
                "model": first.name,
                "checkpoints": checkpoints,
                "labels": explorer.labels,
                "methods": methods,
                "unavailable": explorer.unavailable,
                "layers": [
                    {"name": name, "type": kind, "shape": list(shape)}
                    for name, kind, shape in explorer.layers
                ],
                "default_layer": explorer.default_layer,
                "stages": explorer.stages,
                "images": len(explorer.entries),
                "truths": truths,
                "colormaps": list(COLORMAPS),
                "run": run_header,
                "strategies": strategies is not None,
            }
        )

    def item(index: int, checkpoint: str) -> dict:
        entry = explorer.entries[index]
        prediction = explorer.predictions[checkpoint].get(index)
        return {
            "id": index,
            "name": entry.name,
            "truth": entry.truth,
            "error": entry.error,
            "top": [
                {"index": c, "label": label, "probability": p} for c, label, p in prediction or []
            ],
        }

    async def gallery(request: Request) -> Response:
        query = Query(request)
        checkpoint = checkpoint_of(query)
        offset = max(0, query.integer("offset", 0))
        limit = min(PAGE_LIMIT, max(1, query.integer("limit", 50)))
        chosen = select(
            explorer.entries,
            explorer.predictions[checkpoint],
            predicted=query.text("predicted"),
            truth=query.text("truth"),
            wrong=query.text("wrong") in ("1", "true"),
            order=query.text("order", "name"),
        )
        shown = chosen[offset : offset + limit]
        missing = [i for i in shown if i not in explorer.predictions[checkpoint]]
        if missing:
            await batcher.run(explorer.predict, missing, checkpoint)
        return JSONResponse(
            {
                "total": len(chosen),
                "images": len(explorer.entries),
                "predicted": len(explorer.predictions[checkpoint]),
                "offset": offset,
                "items": [item(index, checkpoint) for index in shown],
            }
        )

    async def thumb(request: Request) -> Response:
        image = image_of(request.path_params["id"])
        data = await asyncio.to_thread(explorer.thumbnail, image)
        return Response(data, media_type="image/jpeg")

    async def photo(request: Request) -> Response:
        image = image_of(request.path_params["id"])
        view = await asyncio.to_thread(explorer.model_view, image)
        return Response(await asyncio.to_thread(encode_png, view), media_type="image/png")

    async def image_info(request: Request) -> Response:
        query = Query(request)
        checkpoint = checkpoint_of(query)
        image = image_of(request.path_params["id"])
        k = min(20, max(1, query.integer("k", 5)))
        probabilities = await batcher.run(explorer.probabilities, image, checkpoint)
        top = probabilities.topk(min(k, probabilities.numel()))
        entry = explorer.entries[image]
        photo = await asyncio.to_thread(explorer.photo, image)
        return JSONResponse(
            {
                "id": image,
                "name": entry.name,
                "truth": entry.truth,
                "size": [int(photo.shape[1]), int(photo.shape[0])],
                "top": [
                    {"index": c, "label": explorer.labels[c], "probability": p}
                    for c, p in zip(top.indices.tolist(), top.values.tolist(), strict=True)
                ],
                "probabilities": [round(p, 6) for p in probabilities.tolist()],
                "run_maps": entry.run_maps if run_root is not None else [],
            }
        )

    def map_request(query: Query) -> tuple[str, str, tuple[str, ...], int, int]:
        checkpoint = checkpoint_of(query)
        method = explorer.check_method(query.text("method", "gradcam"))
        layer = explorer.check_layer(query.text("layer", explorer.default_layer))
        image = image_of(query.integer("image"))
        target = explorer.check_target(query.integer("class"))
        return checkpoint, method, (layer,), image, target

    async def map_image(request: Request) -> Response:
        query = Query(request)
        checkpoint, method, layers, image, target = map_request(query)
        heat = next(iter((await batcher.maps(checkpoint, method, layers, image, target)).values()))
        if query.text("format", "png") == "npy":
            name = f"{explorer.entries[image].name.rsplit('/', 1)[-1]}_{method}_{target}.npy"
            return Response(
                npy_bytes(heat),
                media_type="application/octet-stream",
                headers={"Content-Disposition": f'attachment; filename="{safe_name(name)}"'},
            )
        alpha = query.number("alpha", 0.5)
        colormap = query.text("colormap", "jet")
        view = await asyncio.to_thread(explorer.model_view, image)
        data = await asyncio.to_thread(overlay_png, view, heat, alpha, colormap)
        return Response(data, media_type="image/png")

    async def depth(request: Request) -> Response:
        query = Query(request)
        checkpoint, method, _, image, target = map_request(query)
        if not registry.get(method).needs_layer:
            raise ArgumentError(f"{method} has no layer: the depth strip is for layer methods")
        stages = tuple(explorer.stages)
        await batcher.maps(checkpoint, method, stages, image, target)
        return JSONResponse({"layers": list(stages)})

    async def curve(request: Request) -> Response:
        query = Query(request)
        checkpoint, method, layers, image, target = map_request(query)
        maps = await batcher.maps(checkpoint, method, layers, image, target)
        key = MapKey(checkpoint, method, next(iter(maps)), image, target)
        return JSONResponse(await batcher.run(explorer.curves, key))

    uploads = [0]

    async def upload(request: Request) -> Response:
        if uploads[0] >= security.MAX_UPLOADS:
            raise security.UploadError(
                f"this server already holds {security.MAX_UPLOADS} uploads; restart it", 429
            )
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > security.MAX_UPLOAD_BYTES:
            raise security.UploadError(
                f"the upload is {int(declared):,} bytes, more than {security.MAX_UPLOAD_BYTES:,}",
                413,
            )
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > security.MAX_UPLOAD_BYTES:
                raise security.UploadError(
                    f"the upload is more than {security.MAX_UPLOAD_BYTES:,} bytes", 413
                )
        pixels = await asyncio.to_thread(security.read_upload, bytes(body))
        name = safe_name(request.query_params.get("name") or "upload") or "upload"
        uploads[0] += 1
        return JSONResponse({"id": explorer.add_upload(f"upload: {name}", pixels)})

    async def strategies_view(request: Request) -> Response:
        if strategies is None:
            return error("this run has no strategies: run 'camkit strategies RUN_DIR'", 404)
        return JSONResponse(strategies)

    async def run_file(request: Request) -> Response:
        if run_root is None:
            return error("not found", 404)
        found = security.resolve_under(run_root, request.path_params["path"])
        if found is None:
            return error("not found", 404)
        return FileResponse(found)

    async def guarded(request: Request, call_next: Any) -> Response:
        if request.url.path.startswith("/api/"):
            given = request.query_params.get("token") or request.headers.get(security.TOKEN_HEADER)
            if not security.token_matches(token, given):
                reason = "missing" if not given else "wrong"
                return error(f"{reason} token: open the URL printed at start-up", 401)
        try:
            return await call_next(request)
        except KeyError as missing:
            return error(f"no image {missing.args[0]!r}", 404)
        except security.UploadError as refused:
            return error(str(refused), refused.status)
        except CamkitError as refused:
            return error(str(refused), 422)
        except Exception as failed:  # noqa: BLE001 -- a computation that fails never stops the server
            return error(f"{type(failed).__name__}: {failed}", 500)

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
        for checkpoint in checkpoints:
            for start in range(0, len(explorer.entries), 16):
                chunk = list(range(start, min(start + 16, len(explorer.entries))))
                await batcher.run(explorer.predict, chunk, checkpoint)

    routes = [
        Route("/", page),
        Route("/static/{name}", static),
        Route("/api/info", info),
        Route("/api/gallery", gallery),
        Route("/api/thumb/{id}", thumb),
        Route("/api/photo/{id}", photo),
        Route("/api/image/{id}", image_info),
        Route("/api/map", map_image),
        Route("/api/depth", depth),
        Route("/api/curve", curve),
        Route("/api/upload", upload, methods=["POST"]),
        Route("/api/strategies", strategies_view),
        Route("/api/run/{path:path}", run_file),
    ]
    middleware = [Middleware(TrustedHostMiddleware, allowed_hosts=hosts)] if hosts else []
    middleware.append(Middleware(BaseHTTPMiddleware, dispatch=guarded))
    app = Starlette(routes=routes, middleware=middleware, lifespan=lifespan)
    app.state.explorer = explorer
    app.state.batcher = batcher
    return app


@contextlib.contextmanager
def running(app: Starlette, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """A real uvicorn serving ``app`` in a thread (``port=0``: a free one) -> its base URL;
    stopped on exit. For tests, benchmarks and screenshots."""
    import uvicorn

    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True, name="camkit-serve")
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            server.should_exit = True
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    bound = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://{host}:{bound}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def encode_png(rgb: np.ndarray) -> bytes:
    from camkit.serve.explorer import encode

    return encode(rgb, ".png")


def safe_name(name: str) -> str:
    """A name safe in a header and a page: letters, digits and ``._- `` only."""
    return "".join(c if c.isalnum() or c in "._- " else "_" for c in name)[:120]


__all__ = ["create_app", "running"]

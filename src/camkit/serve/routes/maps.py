"""The maps: ``/api/map`` (PNG overlay or ``.npy``), ``/api/depth``, ``/api/curve``."""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from camkit import registry
from camkit.errors import ArgumentError
from camkit.serve.explorer import MapKey, npy_bytes, overlay_png
from camkit.serve.http import Query, safe_name
from camkit.serve.routes.state import ServerState


def routes(state: ServerState) -> list[Route]:
    """One map, the depth strip, the deletion/insertion curves; all through the batcher."""
    explorer, batcher = state.explorer, state.batcher

    async def map_image(request: Request) -> Response:
        query = Query(request)
        checkpoint, method, layers, image, target = state.map_request(query)
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
        checkpoint, method, _, image, target = state.map_request(query)
        if not registry.get(method).needs_layer:
            raise ArgumentError(f"{method} has no layer: the depth strip is for layer methods")
        stages = tuple(explorer.stages)
        await batcher.maps(checkpoint, method, stages, image, target)
        return JSONResponse({"layers": list(stages)})

    async def curve(request: Request) -> Response:
        query = Query(request)
        checkpoint, method, layers, image, target = state.map_request(query)
        maps = await batcher.maps(checkpoint, method, layers, image, target)
        key = MapKey(checkpoint, method, next(iter(maps)), image, target)
        return JSONResponse(await batcher.run(explorer.curves, key))

    return [
        Route("/api/map", map_image),
        Route("/api/depth", depth),
        Route("/api/curve", curve),
    ]

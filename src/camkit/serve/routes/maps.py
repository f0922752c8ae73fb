"""The maps: ``/api/map`` (PNG overlay, a video's one frame at a time, or ``.npy``; what the
method measured of it, LRP's conservation, as JSON in ``X-Camkit-Measured``),
``/api/difference``, ``/api/depth``, ``/api/curve``, ``/api/frames`` (a video's per-frame
importance and windows), ``/api/progress`` and ``/api/cancel``."""

from __future__ import annotations

import asyncio
import json

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from camkit import registry
from camkit.errors import ArgumentError
from camkit.io import video
from camkit.serve import clips
from camkit.serve.explorer import npy_bytes, overlay_png
from camkit.serve.http import Query, safe_name
from camkit.serve.progress import copies_per_image, watching
from camkit.serve.routes.state import ServerState
from camkit.viz.colour import DIVERGING_COLORMAP

MAP = ("image", "class", "method", "layer", "composite", "checkpoint", "job")
SHOWN = ("alpha", "colormap", "format", "frame")


def routes(state: ServerState) -> list[Route]:
    """The map routes, all through the batcher."""
    explorer, batcher = state.explorer, state.batcher

    async def heat_of(query: Query) -> tuple[np.ndarray, tuple]:
        request = state.map_request(query)
        job_id = query.text("job")
        if job_id is not None:
            key = explorer.keys(*request)[0]
            if explorer.maps.get_item(key) is None:
                await batcher.run(watched, job_id, request)
        maps = await batcher.maps(*request)
        return next(iter(maps.values())), request

    def watched(job_id: str, request: tuple) -> None:
        """On the model thread: the map alone, counted and cancellable (``job``)."""
        checkpoint, method, layers, image, target, composite = request
        explainer = explorer.explainer(checkpoint, method, layers, composite)
        shape = explorer.layer_shapes.get(layers[0])
        job = state.jobs.start(job_id, copies_per_image(explainer, shape))
        with watching(explorer.checkpoints[checkpoint].model, job):
            explorer.compute(checkpoint, method, layers, [(image, target)], composite)

    def download(data: bytes, image: int, what: str, suffix: str) -> Response:
        stem = explorer.entries[image].name.rsplit("/", 1)[-1].rsplit(".", 1)[0]
        name = safe_name(f"{stem}_{what}{suffix}")
        return Response(
            data,
            media_type="application/octet-stream",
            headers={"Content-Disposition": f'attachment; filename="{name}"'},
        )

    async def map_image(request: Request) -> Response:
        query = Query(request, MAP + SHOWN)
        shown = query.choice("format", ("png", "npy"), "png")
        alpha, colormap = query.number("alpha", 0.5), query.text("colormap", "jet")
        heat, request = await heat_of(query)
        _, method, _, image, target, _ = request
        measured = explorer.measured.get_item(explorer.keys(*request)[0])
        if shown == "npy":
            response = download(npy_bytes(heat), image, f"{method}_{target}", ".npy")
        elif heat.ndim == 3:  # a clip's map: one frame, on the clip's one colour scale
            clip = await asyncio.to_thread(explorer.photo, image)
            frame = query.integer("frame", 0)
            drawing = (explorer.preprocess, clip, heat, frame, alpha, colormap)
            data = await asyncio.to_thread(clips.frame_overlay, *drawing)
            response = Response(data, media_type="image/png")
        else:
            response = await state.drawn(image, overlay_png, heat, alpha, colormap)
        if measured is not None:
            response.headers["X-Camkit-Measured"] = json.dumps(measured, separators=(",", ":"))
        return response

    async def difference_image(request: Request) -> Response:
        query = Query(request, (*MAP[:5], "alpha", "format"))
        state.need_comparison("the difference view")
        shown = query.choice("format", ("png", "npy"), "png")
        alpha = query.number("alpha", 0.5)
        first, second = state.checkpoints[:2]
        _, method, layers, image, target, composite = state.map_request(query)
        heats = [
            next(iter((await batcher.maps(c, method, layers, image, target, composite)).values()))
            for c in (first, second)
        ]
        diff = heats[0].astype(np.float32) - heats[1].astype(np.float32)  # (H, W) in [-1, 1]
        if shown == "npy":
            return download(npy_bytes(diff), image, f"{method}_{target}_difference", ".npy")
        # 0.5 where the maps agree, 1 (red) where only the first looks, 0 (blue) only the second
        shown_heat = np.clip((diff + 1.0) / 2.0, 0.0, 1.0)
        return await state.drawn(image, overlay_png, shown_heat, alpha, DIVERGING_COLORMAP)

    async def depth(request: Request) -> Response:
        query = Query(request, MAP + SHOWN)  # the page sends its display settings with each
        checkpoint, method, _, image, target, composite = state.map_request(query)
        if not registry.get(method).needs_layer:
            raise ArgumentError(f"{method} has no layer: the depth strip is for layer methods")
        stages = tuple(explorer.stages)
        await batcher.maps(checkpoint, method, stages, image, target, composite)
        return JSONResponse({"layers": list(stages)})

    async def curve(request: Request) -> Response:
        query = Query(request, MAP + SHOWN)  # the page sends its display settings with each
        request = state.map_request(query)
        await batcher.maps(*request)
        key = explorer.keys(*request)[0]
        return JSONResponse(await batcher.run(explorer.curves, key))

    async def frames(request: Request) -> Response:
        query = Query(request, MAP + SHOWN)  # the page sends its display settings with each
        if explorer.clip_length is None:
            raise ArgumentError("this model takes images: per-frame importance is for clips")
        heat, request = await heat_of(query)
        path = explorer.entries[request[3]].path
        photo = await asyncio.to_thread(explorer.photo, request[3])
        return JSONResponse(
            {
                "frames": len(heat),
                "fps": video.frame_rate(path) if path is not None else None,
                "importance": clips.frame_importance(heat),
                "windows": [list(w) for w in clips.windows(photo, explorer.clip_length)],
            }
        )

    async def progress(request: Request) -> Response:
        job = state.jobs.get(Query(request, ("job",)).text("job") or "")
        if job is None:
            return JSONResponse({"job": None, "done": 0, "expected": None, "finished": False})
        return JSONResponse(job.as_dict())

    async def cancel(request: Request) -> Response:
        job_id = Query(request, ("job",)).text("job")
        if not job_id:
            raise ArgumentError("missing query parameter 'job' (the id the map was asked with)")
        return JSONResponse(state.jobs.cancel(job_id).as_dict())

    return [
        Route("/api/map", map_image),
        Route("/api/difference", difference_image),
        Route("/api/depth", depth),
        Route("/api/curve", curve),
        Route("/api/frames", frames),
        Route("/api/progress", progress),
        Route("/api/cancel", cancel, methods=["POST"]),
    ]

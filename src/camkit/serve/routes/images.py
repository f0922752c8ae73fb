"""The gallery and one image: ``/api/gallery``, ``/api/thumb``, ``/api/photo``, ``/api/image``."""

from __future__ import annotations

import asyncio
import dataclasses

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from camkit import io, models
from camkit.serve import clips
from camkit.serve.gallery import ORDERS, Prediction, select
from camkit.serve.http import Query
from camkit.serve.routes.state import ServerState

PAGE_LIMIT = 200
GALLERY = ("offset", "limit", "predicted", "truth", "wrong", "order", "checkpoint", "changed")
DISAGREEMENT = {"confidence-moved": "confidence_moved", "map-moved": "map_moved"}
"""Gallery orders that compare two checkpoints (most moved first) -> the measure they sort by."""
USER_ORDERS = tuple(order for order in ORDERS if order != "ranking")


def as_rows(prediction: Prediction) -> list[dict]:
    return [{"index": c, "label": label, "probability": p} for c, label, p in prediction]


def routes(state: ServerState) -> list[Route]:
    """The gallery's pages, thumbnails, the model's view of a photo and an image's classes."""
    explorer, batcher = state.explorer, state.batcher

    def top(index: int, checkpoint: str) -> list[dict]:
        return as_rows(explorer.predictions[checkpoint].get(index) or [])

    def item(index: int, checkpoint: str) -> dict:
        entry = explorer.entries[index]
        found = {"id": index, "name": entry.name, "truth": entry.truth, "error": entry.error}
        found["top"] = top(index, checkpoint)
        if state.comparison is not None:
            found["tops"] = {c: top(index, c)[:1] for c in state.checkpoints}
            moved = state.comparison.found.get(index)
            found["disagreement"] = None if moved is None else dataclasses.asdict(moved)
        return found

    async def gallery(request: Request) -> Response:
        query = Query(request, GALLERY)
        checkpoint = state.checkpoint_of(query)
        offset = max(0, query.integer("offset", 0))
        limit = min(PAGE_LIMIT, max(1, query.integer("limit", 50)))
        order = query.choice("order", (*USER_ORDERS, *DISAGREEMENT), "name")
        changed = query.text("changed") in ("1", "true")
        only, ranking = None, None
        if changed or order in DISAGREEMENT:
            comparison = state.need_comparison(f"order={order}" if not changed else "changed=1")
            found = await batcher.run(comparison.measure, range(len(explorer.entries)))
            if changed:
                only = {index for index, moved in found.items() if moved.changed}
            if order in DISAGREEMENT:
                field = DISAGREEMENT[order]
                ranking = {index: getattr(moved, field) for index, moved in found.items()}
                order = "ranking"
        chosen = select(
            explorer.entries,
            explorer.predictions[checkpoint],
            predicted=query.text("predicted"),
            truth=query.text("truth"),
            wrong=query.text("wrong") in ("1", "true"),
            order=order,
            only=only,
            ranking=ranking,
        )
        shown = chosen[offset : offset + limit]
        for each in state.checkpoints if state.comparison is not None else [checkpoint]:
            missing = [i for i in shown if i not in explorer.predictions[each]]
            if missing:
                await batcher.run(explorer.predict, missing, each)
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
        Query(request, ())
        image = state.image_of(request.path_params["id"])
        data = await asyncio.to_thread(explorer.thumbnail, image)
        return Response(data, media_type="image/jpeg")

    async def photo(request: Request) -> Response:
        Query(request, ())
        return await state.drawn(state.image_of(request.path_params["id"]), io.encode_image)

    async def image_info(request: Request) -> Response:
        query = Query(request, ("checkpoint", "k"))
        checkpoint = state.checkpoint_of(query)
        image = state.image_of(request.path_params["id"])
        k = min(20, max(1, query.integer("k", 5)))
        probabilities = (await batcher.run(explorer.probabilities_of, [image], checkpoint))[0]
        top = models.top_classes(probabilities, explorer.labels, k)
        entry = explorer.entries[image]
        photo = clips.shown_frame(await asyncio.to_thread(explorer.photo, image))
        return JSONResponse(
            {
                "id": image,
                "name": entry.name,
                "truth": entry.truth,
                "size": [int(photo.shape[1]), int(photo.shape[0])],
                "checkpoint": checkpoint,
                "top": as_rows(top),
                "probabilities": [round(p, 6) for p in probabilities.tolist()],
                "run_maps": entry.run_maps if state.run.root is not None else [],
            }
        )

    return [
        Route("/api/gallery", gallery),
        Route("/api/thumb/{id}", thumb),
        Route("/api/photo/{id}", photo),
        Route("/api/image/{id}", image_info),
    ]

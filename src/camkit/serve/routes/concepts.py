"""The concept views (:mod:`camkit.serve.concepts`): ``/api/concepts``, ``/api/concept-map``,
``/api/feature`` and ``/api/cluster-concepts``."""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from camkit import io
from camkit.errors import ArgumentError
from camkit.serve.concepts import (
    FEATURE_SEED,
    FEATURE_STEPS,
    Region,
    check_k,
    concept_png,
    region_of,
)
from camkit.serve.http import Query
from camkit.serve.routes.state import ServerState

CONCEPTS = ("image", "class", "layer", "checkpoint", "k", "x", "y", "box")
CONCEPT_MAP = ("image", "class", "layer", "checkpoint", "channel", "alpha", "x", "y", "box")
FEATURE = ("layer", "checkpoint", "channel")
CLUSTER = ("method", "class", "cluster", "layer", "checkpoint", "k")


def fractions(query: Query, names: tuple[str, ...]) -> tuple[float, ...] | None:
    """Numbers given as parameters (``x``, ``y``) or a comma list (``box``); None for none."""
    texts = [query.text(name) for name in names]
    if len(names) == 1 and texts[0] is not None:
        texts = texts[0].split(",")
        if len(texts) != 4:
            raise ArgumentError(f"box must be x0,y0,x1,y1 (fractions in [0, 1]), got {texts}")
    if all(text is None for text in texts):
        return None
    if any(text is None for text in texts):
        raise ArgumentError(f"give {' and '.join(names)} together (fractions in [0, 1])")
    try:  # region_of checks that they are finite fractions
        return tuple(float(text) for text in texts)
    except ValueError:
        raise ArgumentError(f"{', '.join(names)} must be numbers, got {texts}") from None


def routes(state: ServerState) -> list[Route]:
    """The concept routes; computations go through the batcher's model thread."""
    explorer, batcher, views = state.explorer, state.batcher, state.views

    def region_in(query: Query, layer: str) -> Region:
        """The whole image, the layer cell under ``x``, ``y`` or the ``box`` of a request."""
        point, box = fractions(query, ("x", "y")), fractions(query, ("box",))
        return region_of(point, box, explorer.size, views.grid(layer))

    async def concepts(request: Request) -> Response:
        query = Query(request, CONCEPTS)
        checkpoint, layer, image, target = state.image_request(query)
        k = query.integer("k", 5)
        region = region_in(query, layer)
        answer = await batcher.run(views.top, checkpoint, layer, image, target, region, k)
        return JSONResponse(answer)

    async def concept_map(request: Request) -> Response:
        query = Query(request, CONCEPT_MAP)
        checkpoint, layer, image, target = state.image_request(query)
        channel, alpha = query.integer("channel"), query.number("alpha", 0.5)
        region = region_in(query, layer)
        heat = await batcher.run(views.heatmap, checkpoint, layer, image, target, channel, region)
        return await state.drawn(image, concept_png, heat, alpha)

    async def feature(request: Request) -> Response:
        query = Query(request, FEATURE)
        checkpoint = state.checkpoint_of(query)
        layer = explorer.check_layer(query.text("layer", explorer.default_layer))
        channel = query.integer("channel")
        pixels, moved = await batcher.run(views.feature, checkpoint, layer, channel)
        data = await asyncio.to_thread(io.encode_image, pixels)
        computed = f"feature visualisation: {FEATURE_STEPS} steps, seed {FEATURE_SEED}"
        if not moved:
            computed += (
                "; the image did not move from its grey start: the channel's mean stayed at its "
                "starting value on every random start, even with the redirected ReLU gradient; "
                "try the layer before its activation"
            )
        return Response(data, media_type="image/png", headers={"X-Camkit-Computed": computed})

    async def cluster_concepts(request: Request) -> Response:
        query = Query(request, CLUSTER)
        if state.run.strategies is None:
            raise ArgumentError("this run has no strategies: run 'camkit strategies RUN_DIR'")
        checkpoint = state.checkpoint_of(query)
        method, target = query.text("method"), query.integer("class")
        cluster_id, k = query.integer("cluster"), check_k(query.integer("k", 5))
        groups = state.run.strategies["groups"]
        group = next(
            (g for g in groups if (g.get("method"), g.get("class")) == (method, target)), None
        )
        if group is None:
            raise ArgumentError(f"the run has no strategies for method {method!r}, class {target}")
        cluster = next((c for c in group["clusters"] if c.get("id") == cluster_id), None)
        if cluster is None:
            ids = [c.get("id") for c in group["clusters"]]
            raise ArgumentError(f"no cluster {cluster_id} for this class; its clusters are {ids}")
        members = cluster.get("members") or cluster.get("typical", []) + cluster.get("atypical", [])
        recorded = (  # the layer the run explained the members with this method at
            str(record["layer"])
            for image in members
            for record in explorer.entry(image).run_maps
            if record.get("method") == method and record.get("layer")
        )
        layer = explorer.check_layer(query.text("layer") or next(recorded, explorer.default_layer))
        found = await batcher.run(views.dominant, checkpoint, layer, members, target, k)
        return JSONResponse(
            {"layer": layer, "class": target, "images": len(members), "concepts": found}
        )

    return [
        Route("/api/concepts", concepts),
        Route("/api/concept-map", concept_map),
        Route("/api/feature", feature),
        Route("/api/cluster-concepts", cluster_concepts),
    ]

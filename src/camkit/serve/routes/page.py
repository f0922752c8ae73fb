"""The page, its static files, and ``/api/info``: what the page is told at start."""

from __future__ import annotations

import functools
from importlib import resources

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from camkit import registry
from camkit.errors import CamkitError
from camkit.relevance.composites import COMPOSITES
from camkit.serve.http import NO_STORE, Query, error
from camkit.serve.progress import copies_per_image
from camkit.serve.routes.state import ServerState

STATIC = {"app.js": "text/javascript", "style.css": "text/css", "index.html": "text/html"}
COLORMAPS = ("jet", "turbo", "inferno", "viridis", "magma", "gray")


def routes(state: ServerState) -> list[Route]:
    """``/``, ``/static/{name}`` and ``/api/info``."""
    explorer, checkpoints = state.explorer, state.checkpoints

    async def static(request: Request) -> Response:  # "/": the page
        name = request.path_params.get("name", "index.html")
        if name not in STATIC:
            return error("not found", 404)
        data = resources.files("camkit.serve").joinpath("static", name).read_bytes()
        return Response(data, media_type=STATIC[name], headers=NO_STORE)

    @functools.cache  # the same for the server's life: measured once
    def cost(name: str) -> tuple[int, int] | None:
        """What a map of the method costs at the default layer: the rows of forward passes per
        image (:func:`~camkit.serve.progress.copies_per_image`) and 3 with backward passes (a
        backward costs about two forwards), else 1; asked once of a fresh instance built as the
        maps are; None when it needs more than the default layer (RefineCAM)."""
        layer = explorer.default_layer if registry.get(name).needs_layer else None
        model = explorer.checkpoints[checkpoints[0]].model
        try:
            explainer = registry.build(name, model, layer, explorer.settings)
        except CamkitError:
            return None
        shape = explorer.layer_shapes.get(explorer.default_layer)
        return copies_per_image(explainer, shape), 3 if explainer.needs_gradients else 1

    async def info(request: Request) -> Response:
        Query(request, ())
        first = explorer.checkpoints[checkpoints[0]]
        rows = explorer.row_seconds
        methods = []
        for name in explorer.methods:
            entry = registry.get(name)
            copies, backward = cost(name) or (None, None)
            known = copies is not None and rows is not None
            seconds = round(copies * rows * backward, 3) if known else None
            methods.append(
                {
                    "name": name,
                    "family": entry.family,
                    "needs_layer": entry.needs_layer,
                    "takes_composite": entry.takes_composite,
                    "reference": entry.reference,
                    "slow": copies is not None and copies > 2,  # scores many copies of an image
                    "seconds": seconds,
                }
            )
        truths = sorted({e.truth for e in explorer.entries if e.truth is not None})
        return JSONResponse(
            {
                "model": first.name,
                "checkpoints": checkpoints,
                "names": state.names,
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
                "clip_length": explorer.clip_length,  # a video model's: maps per frame
                "truths": truths,
                "colormaps": list(COLORMAPS),
                "composites": list(COMPOSITES),
                "composite": explorer.settings.composite,
                "run": state.run.header,
                "strategies": state.run.strategies is not None,
                "concepts": None if state.run.concepts is None else state.run.concepts.layer,
                "run_problems": list(state.run.problems.values()),
                "prompts": None if state.prompts is None else state.prompts.info(),
            }
        )

    return [Route("/", static), Route("/static/{name}", static), Route("/api/info", info)]

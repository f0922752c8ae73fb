"""The prompt views of a vision-language model (:mod:`camkit.serve.prompts`):
``/api/prompt-map``, ``/api/answer`` and ``/api/token-map``."""

from __future__ import annotations

import asyncio

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from camkit.serve.explorer import npy_bytes, overlay_png
from camkit.serve.http import Query
from camkit.serve.prompts import MAX_NEW_TOKENS, Prompts, check_prompt, no_text_model
from camkit.serve.routes.state import ServerState

SHOWN = ("alpha", "colormap", "format")
ANSWER = ("image", "prompt", "max_new_tokens")


def routes(state: ServerState) -> list[Route]:
    """The prompt routes, through the batcher (the model thread)."""
    explorer, batcher = state.explorer, state.batcher

    def prompts() -> Prompts:
        if state.prompts is None:
            raise no_text_model()
        return state.prompts

    async def shown(query: Query, image: int, heat: np.ndarray) -> Response:
        if query.choice("format", ("png", "npy"), "png") == "npy":
            return Response(npy_bytes(heat), media_type="application/octet-stream")
        alpha, colormap = query.number("alpha", 0.5), query.text("colormap", "jet")
        view = await asyncio.to_thread(explorer.model_view, image)
        data = await asyncio.to_thread(overlay_png, view, heat, alpha, colormap)
        return Response(data, media_type="image/png")

    def asked(query: Query) -> tuple[int, str]:
        return state.image_of(query.integer("image")), check_prompt(query.text("prompt"))

    async def prompt_map(request: Request) -> Response:
        query = Query(request, ("image", "prompt", *SHOWN))
        found = prompts()
        image, prompt = asked(query)
        heat = await batcher.run(found.prompt_map, image, prompt)
        return await shown(query, image, heat)

    async def answer(request: Request) -> Response:
        query = Query(request, ANSWER)
        found = prompts()
        image, prompt = asked(query)
        tokens = query.integer("max_new_tokens", min(8, MAX_NEW_TOKENS))
        explained = await batcher.run(found.answer, image, prompt, tokens)
        return JSONResponse(found.answer_json(explained))

    async def token_map(request: Request) -> Response:
        query = Query(request, (*ANSWER, "word", *SHOWN))
        found = prompts()
        image, prompt = asked(query)
        tokens = query.integer("max_new_tokens", min(8, MAX_NEW_TOKENS))
        k = query.integer("word")
        heat = await batcher.run(found.token_map, image, prompt, tokens, k)
        return await shown(query, image, heat)

    return [
        Route("/api/prompt-map", prompt_map),
        Route("/api/answer", answer),
        Route("/api/token-map", token_map),
    ]

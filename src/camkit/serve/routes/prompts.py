"""The prompt views of a vision-language model (:mod:`camkit.serve.prompts`):
``/api/prompt-map``, ``/api/answer`` and ``/api/token-map``."""

from __future__ import annotations

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from camkit.errors import TargetError
from camkit.serve.explorer import npy_bytes, overlay_png
from camkit.serve.http import Query
from camkit.serve.prompts import MAX_NEW_TOKENS, Prompts, check_prompt
from camkit.serve.routes.state import ServerState

SHOWN = ("alpha", "colormap", "format")
ANSWER = ("image", "prompt", "max_new_tokens")


def routes(state: ServerState) -> list[Route]:
    """The prompt routes, through the batcher (the model thread)."""
    batcher = state.batcher

    async def shown(query: Query, image: int, heat: np.ndarray) -> Response:
        if query.choice("format", ("png", "npy"), "png") == "npy":
            return Response(npy_bytes(heat), media_type="application/octet-stream")
        alpha, colormap = query.number("alpha", 0.5), query.text("colormap", "jet")
        return await state.drawn(image, overlay_png, heat, alpha, colormap)

    def asked(query: Query) -> tuple[Prompts, int, str, int]:
        """The prompt views, and the image, prompt and answer length a request names."""
        if state.prompts is None:
            raise TargetError(
                "this model has no text tower and generates no text: a prompt cannot be explained "
                "on it; start the explorer with a vision-language model (camkit serve --model "
                "hf:FOLDER)"
            )
        image = state.image_of(query.integer("image"))
        tokens = query.integer("max_new_tokens", min(8, MAX_NEW_TOKENS))
        return state.prompts, image, check_prompt(query.text("prompt")), tokens

    async def prompt_map(request: Request) -> Response:
        query = Query(request, ("image", "prompt", *SHOWN))
        found, image, prompt, _ = asked(query)
        return await shown(query, image, await batcher.run(found.prompt_map, image, prompt))

    async def answer(request: Request) -> Response:
        found, image, prompt, tokens = asked(Query(request, ANSWER))
        explained = await batcher.run(found.answer, image, prompt, tokens)
        return JSONResponse(found.answer_json(explained))

    async def token_map(request: Request) -> Response:
        query = Query(request, (*ANSWER, "word", *SHOWN))
        found, image, prompt, tokens = asked(query)
        heat = await batcher.run(found.token_map, image, prompt, tokens, query.integer("word"))
        return await shown(query, image, heat)

    return [
        Route("/api/prompt-map", prompt_map),
        Route("/api/answer", answer),
        Route("/api/token-map", token_map),
    ]

"""``POST /api/upload``: an image file as the body, within the limits of
:mod:`camkit.serve.security` -> its id in the gallery."""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from camkit.serve import security
from camkit.serve.http import Query, safe_name
from camkit.serve.routes.state import ServerState


def routes(state: ServerState) -> list[Route]:
    """The upload route, within :mod:`camkit.serve.security`'s limits."""

    async def upload(request: Request) -> Response:
        Query(request, ("name",))
        if state.uploads >= security.MAX_UPLOADS:
            raise security.UploadError(
                f"this server already holds {security.MAX_UPLOADS} uploads; restart it", 429
            )
        max_bytes = security.MAX_UPLOAD_BYTES
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > max_bytes:
            raise security.UploadError(
                f"the upload is {int(declared):,} bytes, more than {max_bytes:,}", 413
            )
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > max_bytes:
                raise security.UploadError(f"the upload is more than {max_bytes:,} bytes", 413)
        limit = state.explorer.max_pixels
        pixels = await asyncio.to_thread(security.read_upload, bytes(body), max_pixels=limit)
        name = safe_name(request.query_params.get("name") or "upload") or "upload"
        state.uploads += 1
        return JSONResponse({"id": state.explorer.add_upload(f"upload: {name}", pixels)})

    return [Route("/api/upload", upload, methods=["POST"])]

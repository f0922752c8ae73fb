"""The ``camkit explain`` run the explorer shows: ``/api/strategies`` (its clusters) and
``/api/run/{path}`` (its files, only under its folder)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Route

from camkit.runs.strategies import STRATEGIES_FILE
from camkit.serve import security
from camkit.serve.http import Query, error
from camkit.serve.routes.state import ServerState


def routes(state: ServerState) -> list[Route]:
    """The run's strategies and files; 404 when the app shows no run."""

    async def strategies_view(request: Request) -> Response:
        Query(request, ())
        if STRATEGIES_FILE in state.run.problems:
            return error(state.run.problems[STRATEGIES_FILE], 422)
        if state.run.strategies is None:
            return error("this run has no strategies: run 'camkit strategies RUN_DIR'", 404)
        return JSONResponse(state.run.strategies)

    async def run_file(request: Request) -> Response:
        root, relative = state.run.root, request.path_params["path"]
        found = None if root is None else security.resolve_under(root, relative)
        return error("not found", 404) if found is None else FileResponse(found)

    return [
        Route("/api/strategies", strategies_view),
        Route("/api/run/{path:path}", run_file),
    ]

"""The routes of :mod:`camkit.serve.app`, a module per concern; what they share is
:class:`~camkit.serve.routes.state.ServerState`."""

from __future__ import annotations

from starlette.routing import Route

from camkit.serve.routes import concepts, images, maps, page, prompts, run, uploads
from camkit.serve.routes.state import ServerState


def all_routes(state: ServerState) -> list[Route]:
    """Every route of the app, in the order the app's docstring lists them."""
    modules = (page, images, maps, prompts, concepts, uploads, run)
    return [route for module in modules for route in module.routes(state)]


__all__ = ["ServerState", "all_routes"]

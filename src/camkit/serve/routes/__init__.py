"""The routes of :mod:`camkit.serve.app`, by concern: the page and ``/api/info``
(:mod:`~camkit.serve.routes.page`), the gallery and one image
(:mod:`~camkit.serve.routes.images`), the maps (:mod:`~camkit.serve.routes.maps`), the concept
views (:mod:`~camkit.serve.routes.concepts`), the prompts of a vision-language model
(:mod:`~camkit.serve.routes.prompts`), uploads
(:mod:`~camkit.serve.routes.uploads`) and the run's files (:mod:`~camkit.serve.routes.run`);
what they share is :class:`~camkit.serve.routes.state.ServerState`."""

from __future__ import annotations

from starlette.routing import Route

from camkit.serve.routes import concepts, images, maps, page, prompts, run, uploads
from camkit.serve.routes.state import ServerState


def all_routes(state: ServerState) -> list[Route]:
    """Every route of the app, in the order the module docstring of the app lists them."""
    return [
        *page.routes(state),
        *images.routes(state),
        *maps.routes(state),
        *prompts.routes(state),
        *concepts.routes(state),
        *uploads.routes(state),
        *run.routes(state),
    ]


__all__ = ["ServerState", "all_routes"]

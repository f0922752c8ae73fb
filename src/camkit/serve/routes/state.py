"""What the routes share: the explorer, the batcher, the run, and the checks of the parameters
that name a checkpoint, an image or a map."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any

from starlette.responses import Response

from camkit.errors import ArgumentError
from camkit.serve.batcher import MapBatcher
from camkit.serve.compare import Comparison
from camkit.serve.concepts import ConceptViews
from camkit.serve.explorer import Explorer
from camkit.serve.gallery import RunViews
from camkit.serve.http import Query
from camkit.serve.progress import Jobs
from camkit.serve.prompts import Prompts


@dataclasses.dataclass
class ServerState:
    """One app's explorer, batcher, the run it shows, each checkpoint's name on the page, its
    uploads' count, comparison (two checkpoints), concept and prompt views (None: no prompt)."""

    explorer: Explorer
    batcher: MapBatcher
    run: RunViews = dataclasses.field(default_factory=RunViews)
    names: dict[str, str] | None = None
    uploads: int = 0
    checkpoints: list[str] = dataclasses.field(init=False)
    comparison: Comparison | None = dataclasses.field(init=False)
    views: ConceptViews = dataclasses.field(init=False)
    jobs: Jobs = dataclasses.field(default_factory=Jobs)
    prompts: Prompts | None = None

    def __post_init__(self) -> None:
        self.checkpoints = list(self.explorer.checkpoints)
        self.names = {key: (self.names or {}).get(key, key) for key in self.checkpoints}
        self.comparison = Comparison(self.explorer) if len(self.checkpoints) > 1 else None
        self.views = ConceptViews(self.explorer, self.run.concepts)

    def need_comparison(self, what: str) -> Comparison:
        """The comparison of the two checkpoints, or a clear error on a one-checkpoint server."""
        if self.comparison is None:
            raise ArgumentError(
                f"{what} compares two checkpoints; this server has one (start camkit serve "
                "with --compare-weights PATH)"
            )
        return self.comparison

    def checkpoint_of(self, query: Query) -> str:
        name = query.text("checkpoint", self.checkpoints[0])
        if name not in self.explorer.checkpoints:
            raise ArgumentError(f"unknown checkpoint {name!r}; choose from {self.checkpoints}")
        return name

    def image_of(self, value: Any) -> int:
        try:
            image = int(value)
            self.explorer.entry(image)
        except (KeyError, ValueError):
            raise KeyError(value) from None
        return image

    def image_request(self, query: Query) -> tuple[str, str, int, int]:
        """checkpoint, layer, image and class of a request about one image."""
        explorer = self.explorer
        checkpoint = self.checkpoint_of(query)
        layer = explorer.check_layer(query.text("layer", explorer.default_layer))
        image = self.image_of(query.integer("image"))
        target = explorer.check_target(query.integer("class"))
        return checkpoint, layer, image, target

    def map_request(self, query: Query) -> tuple[str, str, tuple[str, ...], int, int, str | None]:
        """checkpoint, method, (layer,), image, class and LRP composite of a map request."""
        self.checkpoint_of(query)
        method = self.explorer.check_method(query.text("method", "gradcam"))
        checkpoint, layer, image, target = self.image_request(query)
        composite = self.explorer.check_composite(method, query.text("composite"))
        return checkpoint, method, (layer,), image, target, composite

    async def drawn(self, image: int, draw: Callable[..., bytes], *args: Any) -> Response:
        """The PNG ``draw(model view of image, *args)`` makes, both off the event loop."""
        view = await asyncio.to_thread(self.explorer.model_view, image)
        return Response(await asyncio.to_thread(draw, view, *args), media_type="image/png")

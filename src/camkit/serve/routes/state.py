"""What the routes share: the explorer, the batcher, the run, and the checks of the parameters
that name a checkpoint, an image or a map."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from camkit.errors import ArgumentError
from camkit.serve.batcher import MapBatcher
from camkit.serve.compare import Comparison
from camkit.serve.explorer import Explorer
from camkit.serve.http import Query
from camkit.serve.progress import Jobs


@dataclasses.dataclass
class ServerState:
    """One app's explorer and batcher; ``run_root``, ``run_header`` and ``strategies``: the
    ``camkit explain`` run it shows (None: none); ``names``: each checkpoint's name for the
    page (its file); ``uploads``: how many it holds; ``comparison``: with two checkpoints."""

    explorer: Explorer
    batcher: MapBatcher
    run_root: Path | None = None
    run_header: dict | None = None
    strategies: dict | None = None
    names: dict[str, str] | None = None
    uploads: int = 0
    checkpoints: list[str] = dataclasses.field(init=False)
    comparison: Comparison | None = dataclasses.field(init=False)
    jobs: Jobs = dataclasses.field(default_factory=Jobs)

    def __post_init__(self) -> None:
        self.checkpoints = list(self.explorer.checkpoints)
        self.names = {key: (self.names or {}).get(key, key) for key in self.checkpoints}
        self.comparison = Comparison(self.explorer) if len(self.checkpoints) > 1 else None

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

    def map_request(self, query: Query) -> tuple[str, str, tuple[str, ...], int, int]:
        """checkpoint, method, (layer,), image and class of a map request."""
        explorer = self.explorer
        checkpoint = self.checkpoint_of(query)
        method = explorer.check_method(query.text("method", "gradcam"))
        layer = explorer.check_layer(query.text("layer", explorer.default_layer))
        image = self.image_of(query.integer("image"))
        target = explorer.check_target(query.integer("class"))
        return checkpoint, method, (layer,), image, target

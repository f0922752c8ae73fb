"""Map requests that arrive together (within ``window`` seconds; a lone click waits for nothing)
become one engine call per checkpoint, method, layers and LRP composite
(:meth:`~camkit.serve.explorer.Explorer.compute`), on the one thread that runs every model call,
so hooks of two calls never overlap."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np

from camkit.serve.explorer import Explorer

T = TypeVar("T")
Group = tuple[str, str, tuple[str, ...], str | None]  # checkpoint, method, layers, composite


class MapBatcher:
    """Gathers map requests for ``window`` seconds and answers them in grouped engine calls."""

    def __init__(self, explorer: Explorer, window: float = 0.005, max_pairs: int = 64) -> None:
        self.explorer = explorer
        self.window = window
        self.max_pairs = max_pairs
        self.thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="camkit-model")
        self.pending: list[tuple[Group, tuple[int, int], asyncio.Future]] = []
        self.wakeup: asyncio.Event | None = None
        self.worker: asyncio.Task | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    async def run(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a model call on the model thread."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.thread, functools.partial(function, *args, **kwargs))

    def _start(self) -> None:
        loop = asyncio.get_running_loop()
        if self.worker is None or self.worker.done() or self.loop is not loop:
            self.loop, self.wakeup = loop, asyncio.Event()
            self.worker = loop.create_task(self._loop())

    async def maps(
        self,
        checkpoint: str,
        method: str,
        layers: tuple[str, ...],
        image: int,
        target: int,
        composite: str | None = None,
    ) -> dict[str | None, np.ndarray]:
        """The maps of one (image, class) at each of ``layers`` (``{None: map}`` for methods
        without a layer), from the cache or the next grouped engine call."""
        keys = self.explorer.keys(checkpoint, method, layers, image, target, composite)
        found = {key.layer: self.explorer.maps.get_item(key) for key in keys}
        if all(value is not None for value in found.values()):
            return found
        self._start()
        future = asyncio.get_running_loop().create_future()
        group = (checkpoint, method, layers, keys[0].composite)
        self.pending.append((group, (image, target), future))
        self.wakeup.set()
        await future
        return {key.layer: self.explorer.maps.get_item(key) for key in keys}

    async def _loop(self) -> None:
        while True:
            await self.wakeup.wait()
            await asyncio.sleep(0)  # the requests sent in the same turn of the event loop
            if len(self.pending) > 1:  # requests arrive together: let the rest of them come
                await asyncio.sleep(self.window)
            self.wakeup.clear()
            taken, self.pending = self.pending, []
            groups: dict[Group, list[tuple[tuple[int, int], asyncio.Future]]] = {}
            for group, pair, future in taken:
                groups.setdefault(group, []).append((pair, future))
            for (checkpoint, method, layers, composite), requests in groups.items():
                for start in range(0, len(requests), self.max_pairs):
                    chunk = requests[start : start + self.max_pairs]
                    pairs = [pair for pair, _ in chunk]
                    call = (checkpoint, method, layers, pairs, composite)
                    try:
                        await self.run(self.explorer.compute, *call)
                    except Exception as error:  # each waiting request answers with it
                        for _, future in chunk:
                            if not future.done():
                                future.set_exception(error)
                        continue
                    for _, future in chunk:
                        if not future.done():
                            future.set_result(None)

    def close(self) -> None:
        if self.worker is not None:
            self.worker.cancel()
        self.thread.shutdown(wait=False, cancel_futures=True)

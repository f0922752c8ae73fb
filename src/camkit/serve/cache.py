"""The explorer's caches: a bounded least-recently-used dict, safe across threads."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable


class LRU(OrderedDict):
    """A bounded least-recently-used cache (thread-safe)."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size
        self.lock = threading.Lock()

    def get_item(self, key: Hashable) -> object | None:
        with self.lock:
            if key not in self:
                return None
            self.move_to_end(key)
            return self[key]

    def put(self, key: Hashable, value: object) -> None:
        with self.lock:
            self[key] = value
            self.move_to_end(key)
            while len(self) > self.size:
                self.popitem(last=False)

    def fetch(self, key: Hashable, make: Callable[[], object]) -> object:
        """The value of ``key``; when missing, ``make()``'s, kept (made outside the lock)."""
        found = self.get_item(key)
        if found is None:
            found = make()
            self.put(key, found)
        return found


__all__ = ["LRU"]

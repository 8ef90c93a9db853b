"""A least-recently-used map bounded by the total size of its values, not their number.

Caches of segment ids hold a few ids for a small segment and hundreds of thousands for a
large one: a count of entries says nothing about memory, the ids they hold do.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class SizedLru(Generic[K, V]):
    """Values by key, least recently used dropped first once their sizes add up to more than
    ``limit`` (the newest one is always kept). Safe to share between threads."""

    def __init__(self, limit: int, size: Callable[[V], int] = len) -> None:
        self.limit = limit
        self.held = 0
        self._size = size
        self._items: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def put(self, key: K, value: V) -> None:
        with self._lock:
            self._drop(key)
            self._items[key] = value
            self.held += self._size(value)
            while self.held > self.limit and len(self._items) > 1:
                _, gone = self._items.popitem(last=False)
                self.held -= self._size(gone)

    def pop(self, key: K) -> None:
        with self._lock:
            self._drop(key)

    def keep_only(self, keys: Iterable[K]) -> None:
        keep = set(keys)
        with self._lock:
            for key in [k for k in self._items if k not in keep]:
                self._drop(key)

    def keys(self) -> list[K]:
        with self._lock:
            return list(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def _drop(self, key: K) -> None:
        gone = self._items.pop(key, None)
        if gone is not None:
            self.held -= self._size(gone)

"""Comparison runs waiting for an idle server, bounded and served fairly per version.

Comparison runs wait until no clinical job is queued, so under load they pile up. One
bound for all of them let one deployment starve another: a canary compared on 100 % of
its studies filled the queue, and a shadow deployed beside it got no comparison at all.
Here each key (the version whose record a run feeds) holds at most ``per_key`` waiting
runs (later ones are refused and counted), and keys are served in turn.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")


class FairPending(Generic[K, T]):
    """Thread-safe; one consumer blocks in :meth:`get` until an item or :meth:`close`."""

    def __init__(self, per_key: int) -> None:
        if per_key < 1:
            raise ValueError("per_key must be at least 1")
        self.per_key = per_key
        self._items: OrderedDict[K, deque[T]] = OrderedDict()  # served front to back
        self._ready = threading.Condition()
        self._closed = False

    def put(self, key: K, item: T) -> bool:
        """Queue ``item`` under ``key``; False (not queued) when ``key`` is full or closed."""
        with self._ready:
            if self._closed:
                return False
            waiting = self._items.setdefault(key, deque())
            if len(waiting) >= self.per_key:
                return False
            waiting.append(item)
            self._ready.notify()
            return True

    def get(self, timeout: float | None = None) -> T | None:
        """The oldest item of the key whose turn it is (that key then goes last); None
        once closed, or after ``timeout`` seconds with nothing waiting."""
        with self._ready:
            if not self._ready.wait_for(lambda: self._closed or self._items, timeout):
                return None
            if self._closed:
                return None
            key, waiting = next(iter(self._items.items()))
            item = waiting.popleft()
            del self._items[key]
            if waiting:
                self._items[key] = waiting  # back of the line
            return item

    def close(self) -> None:
        with self._ready:
            self._closed = True
            self._ready.notify_all()

    def waiting(self) -> dict[K, int]:
        with self._ready:
            return {key: len(items) for key, items in self._items.items()}


__all__ = ["FairPending"]

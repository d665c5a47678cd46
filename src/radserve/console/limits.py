"""Failed console sign-ins per client address: after ``max_failures`` within ``window_s``
the client is refused (429, ``Retry-After``) without its key or password being checked,
until the oldest failure leaves the window. Successes do not reset the count (a client
holding one valid account cannot use it to keep guessing another's password).

Per address, not per user name: counting per name would let anyone lock a radiologist
out of the wall screen by typing their name. In memory; a restart forgets the counts.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

_MAX_CLIENTS = 10_000


class SignInLimiter:
    def __init__(
        self,
        *,
        max_failures: int,
        window_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_failures = max_failures
        self.window_s = window_s
        self.clock = clock
        self._failures: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def _recent(self, client: str, now: float) -> deque[float]:
        times = self._failures.get(client)
        if times is None:
            return deque()
        while times and now - times[0] >= self.window_s:
            times.popleft()
        if not times:
            del self._failures[client]
        return times

    def retry_after(self, client: str) -> float | None:
        """Seconds until ``client`` may try again, or None when it may now."""
        now = self.clock()
        with self._lock:
            times = self._recent(client, now)
            if len(times) < self.max_failures:
                return None
            return max(0.0, self.window_s - (now - times[0]))

    def failed(self, client: str) -> bool:
        """Count a failure; True when it is the one that blocks the client."""
        now = self.clock()
        with self._lock:
            times = self._recent(client, now)
            if client not in self._failures:
                if len(self._failures) >= _MAX_CLIENTS:  # bounded: forget the stalest
                    stalest = min(self._failures, key=lambda c: self._failures[c][-1])
                    del self._failures[stalest]
                self._failures[client] = times
            times.append(now)
            return len(times) == self.max_failures


__all__ = ["SignInLimiter"]

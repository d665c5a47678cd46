"""The scheduler's notion of time: a monotonic clock, injectable so tests need no sleeps.

Everything time-dependent in :mod:`radserve.scheduling` (deadlines, aging, timeouts,
stage timings) reads one :class:`Clock`. Production uses :class:`MonotonicClock`; tests
use :class:`FakeClock` and advance it by hand, so every decision is reproducible.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    """Monotonic seconds; only differences between readings mean anything."""

    def now(self) -> float: ...


class MonotonicClock:
    """``time.monotonic``: immune to wall-clock jumps (NTP, daylight saving)."""

    def now(self) -> float:
        return time.monotonic()


class FakeClock:
    """A clock that moves only when told to (thread-safe, never goes backwards)."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> float:
        """Move forward by ``seconds`` (>= 0); returns the new time."""
        if seconds < 0:
            raise ValueError(f"a clock cannot go backwards (advance by {seconds})")
        with self._lock:
            self._now += seconds
            return self._now

    def set(self, when: float) -> None:
        """Jump to ``when`` (not earlier than now)."""
        with self._lock:
            if when < self._now:
                raise ValueError(f"a clock cannot go backwards ({self._now} -> {when})")
            self._now = float(when)


__all__ = ["Clock", "FakeClock", "MonotonicClock"]

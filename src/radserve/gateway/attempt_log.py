"""How the outbox logs failed attempts to a destination that keeps failing.

Each failed attempt was one warning line: a receiver that is down, retried every
``retry_first_s`` with a lane of rows (one attempt per row a round), wrote hundreds of
lines a minute that buried everything else (retry intervals of 5e-324 s made it ~15 a
second). Now, per destination:

- the first failed attempt is logged as before (row, attempt, next try, reason);
- while the destination keeps failing, one such line every ``repeat_s`` at most, saying
  how many failed attempts were not logged since the last line;
- the first attempt that gets through again logs how many were not logged.

Every attempt is still recorded on its row (``last_error``, ``attempts``), counted in
the metrics and, for critical notices, audited: only the log lines are summarised. The
deadline-risk alert receivers (radserve.service.turnaround) log their failed alerts
the same way.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

REPEAT_S = 60.0


@dataclass
class _Failing:
    logged_at: float
    held: int = 0  # failed attempts not logged since logged_at


class FailedAttemptLog:
    """Decides which failed attempts get a log line; shared by every lane's thread."""

    def __init__(
        self, *, repeat_s: float = REPEAT_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.repeat_s = repeat_s
        self.clock = clock
        self._lock = threading.Lock()
        self._failing: dict[str, _Failing] = {}

    def failed(self, destination: str) -> int | None:
        """An attempt to ``destination`` failed: None to log nothing, else log it and say
        how many failed attempts to it were not logged since its last line."""
        now = self.clock()
        with self._lock:
            state = self._failing.get(destination)
            if state is None:
                self._failing[destination] = _Failing(now)
                return 0
            if now - state.logged_at < self.repeat_s:
                state.held += 1
                return None
            held, state.logged_at, state.held = state.held, now, 0
            return held

    def got_through(self, destination: str) -> int:
        """An attempt to ``destination`` got through: how many failed attempts were not
        logged since its last failure line (0: nothing to say)."""
        with self._lock:
            state = self._failing.pop(destination, None)
        return 0 if state is None else state.held


__all__ = ["REPEAT_S", "FailedAttemptLog"]

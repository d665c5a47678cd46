"""How a periodic loop logs a failure that repeats every round (a database outage).

The loops that talk to the store every few seconds (the deployment watcher, the lease
keeper, the outbox senders, the audit seal, ...) each logged a full traceback per
round while the database was away: hundreds of lines a minute that buried everything
else. Each loop now keeps one :class:`LoopFailures` and reports every round to it:

- the first failure is logged once (a radserve error by its code and message, which
  carry no patient data; anything else with its traceback, once: it is a bug);
- while it lasts, one short line every ``repeat_s`` at most, saying for how long;
- the first round that works again logs one line with the outage's length.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from radserve.errors import RadserveError

REPEAT_S = 60.0


class LoopFailures:
    """The failure log of one loop (``what``: the loop's work, e.g. "leases: renew").
    Used by that loop's thread only."""

    def __init__(
        self,
        logger: logging.Logger,
        what: str,
        *,
        repeat_s: float = REPEAT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.what = what
        self.repeat_s = repeat_s
        self.clock = clock
        self.since: float | None = None  # when the failures began; None: it works
        self.failures = 0
        self._logged_at = 0.0

    @property
    def failing(self) -> bool:
        return self.since is not None

    def failed(self, exc: BaseException) -> None:
        """A round failed with ``exc``."""
        now = self.clock()
        self.failures += 1
        if self.since is None:
            self.since = self._logged_at = now
            if isinstance(exc, RadserveError):
                self.logger.warning(
                    "%s failed (%s: %s); trying again, logged every %g s while it fails",
                    self.what,
                    exc.code,
                    exc.message,
                    self.repeat_s,
                )
            else:
                self.logger.error(
                    "%s failed; trying again, logged every %g s while it fails",
                    self.what,
                    self.repeat_s,
                    exc_info=exc,
                )
            return
        if now - self._logged_at >= self.repeat_s:
            self._logged_at = now
            self.logger.warning(
                "%s still failing after %.0f s (%d failures; %s)",
                self.what,
                now - self.since,
                self.failures,
                getattr(exc, "code", type(exc).__name__),
            )

    def succeeded(self) -> None:
        """A round worked: one line if it ends a run of failures."""
        if self.since is None:
            return
        self.logger.warning(
            "%s works again after %.1f s (%d failures)",
            self.what,
            self.clock() - self.since,
            self.failures,
        )
        self.since, self.failures = None, 0


__all__ = ["REPEAT_S", "LoopFailures"]

"""A request's bounded wait for a database that does not answer (a restart, a failover).

A submission whose study is already fsynced needs one more thing, its job row; a
PostgreSQL restart of a few seconds used to answer it 503 at once, so a client that
did not retry lost the study and one that did sent the upload again. Now the request's
store calls are tried again every :data:`RETRY_EVERY_S` until ``server.store_wait_s``
has passed (each try is one connection attempt, refused at once while the server is
down); past it the request is refused with :class:`StoreWaitExceededError` (503, and
``Retry-After``). Nothing is acknowledged before its write commits.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import TypeVar

from radserve.store.errors import DatabaseUnavailableError

logger = logging.getLogger(__name__)

T = TypeVar("T")
RETRY_EVERY_S = 0.25


class StoreWaitExceededError(DatabaseUnavailableError):
    """The database did not answer within the request's wait (``server.store_wait_s``)."""

    def __init__(self, message: str, *, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class WaitLog:
    """What one call's wait for the database logs: one line when it starts waiting and
    one when it ends, answered or given up, with the tries and the time (before session
    17 a job's write logged every retry: ten lines per write in a 2-minute outage)."""

    def __init__(
        self, what: str, bound_s: float, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.what = what
        self.bound_s = bound_s
        self.clock = clock
        self.start = clock()
        self.failures = 0

    @property
    def waited_s(self) -> float:
        return self.clock() - self.start

    def failed(self, exc: DatabaseUnavailableError) -> None:
        """A try failed: logged if it is the first."""
        self.failures += 1
        if self.failures == 1:
            logger.warning(
                "%s: the database does not answer (%s); waiting up to %g s",
                self.what,
                exc.message,
                self.bound_s,
            )

    def answered(self) -> None:
        """A try worked: logged if the call had waited."""
        if self.failures:
            logger.warning(
                "%s: the database answered after %.1f s (%d tries)",
                self.what,
                self.waited_s,
                self.failures + 1,
            )

    def gave_up(self, exc: DatabaseUnavailableError) -> None:
        """The last try failed and the call waits no longer: logged always, counting
        that try; the only line when no try was waited after (a bound of 0 s, e.g. a
        probe's single try, or a first try that outlasted the bound)."""
        self.failures += 1
        if self.failures == 1:
            logger.warning(
                "%s: the database does not answer (%s); not waiting (1 try in %.1f s, "
                "the wait is %g s)",
                self.what,
                exc.message,
                self.waited_s,
                self.bound_s,
            )
            return
        logger.warning(
            "%s: the database did not answer for %.1f s (%d tries); not waiting longer",
            self.what,
            self.waited_s,
            self.failures,
        )


def waiting_for_store(
    call: Callable[[], T],
    wait_s: float,
    *,
    what: str,
    every_s: float = RETRY_EVERY_S,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """``call()``, tried again while the database is unavailable, until ``wait_s`` has
    passed since the first try; then :class:`StoreWaitExceededError` (``what``: the
    request's step, for the message and the log)."""
    log = WaitLog(what, wait_s, clock=clock)
    while True:
        try:
            result = call()
        except DatabaseUnavailableError as exc:
            waited = log.waited_s
            if waited >= wait_s:
                log.gave_up(exc)
                retry_after = max(1, math.ceil(wait_s))
                raise StoreWaitExceededError(
                    f"the database did not answer for {waited:.1f} s ({what}; "
                    f"server.store_wait_s is {wait_s:g} s): nothing was accepted; "
                    f"retry after {retry_after} s",
                    retry_after=retry_after,
                ) from exc
            log.failed(exc)
            time.sleep(min(every_s, max(0.0, wait_s - waited)))
        else:
            log.answered()
            return result


__all__ = ["RETRY_EVERY_S", "StoreWaitExceededError", "WaitLog", "waiting_for_store"]

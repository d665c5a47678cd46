"""Waiting for a state that a live peer (a server, its worker threads, a child process)
reaches on its own time: the one definition the tests use.

A test that reads such a state once, right after an action, races the peer: a /metrics
scrape taken while a row is briefly in another state, a /proc listing taken while a
process is being reaped, the last ETA read while the job still runs. Each failed one CI
run in three. So a test polls for the state it means, bounded, and says on time-out what
it waited for and what it saw last.

Every bound is multiplied by :data:`WAIT_SCALE` (env ``RADSERVE_TEST_WAIT_SCALE``): the
bounds are what a quiet machine needs with a margin, and CI's loaded 2-core runners are
several times slower. A wait that succeeds returns as soon as its condition holds, so the
scale costs time only when a test is failing, or in the few negative checks
(``assert not wait_until(...)``), which then watch a little longer.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

WAIT_SCALE = float(os.environ.get("RADSERVE_TEST_WAIT_SCALE", "3"))


def until(
    condition: Callable[[], T],
    what: str,
    timeout: float = 60.0,
    *,
    state: Callable[[], object] | None = None,
    step: float = 0.05,
) -> T:
    """Poll ``condition`` every ``step`` s until it returns a true value, and return it.

    After ``timeout`` x :data:`WAIT_SCALE` seconds fail with ``what`` (the state waited
    for) and, when given, what ``state`` shows then (rows of the store, the last answer).
    """
    limit = timeout * WAIT_SCALE
    deadline = time.monotonic() + limit
    while not (value := condition()):
        if time.monotonic() >= deadline:
            seen = f"; last seen: {state()}" if state is not None else ""
            raise AssertionError(f"timed out after {limit:.0f} s waiting for {what}{seen}")
        time.sleep(step)
    return value


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0, step: float = 0.05) -> bool:
    """Poll ``predicate`` every ``step`` s until it holds; False after ``timeout`` x
    :data:`WAIT_SCALE` seconds (for ``assert not wait_until(...)``: a state that must not
    come; a state that must come reads better as :func:`until`, which says what it
    waited for)."""
    deadline = time.monotonic() + timeout * WAIT_SCALE
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return predicate()

"""Job-status answers serialised once per job view, for the API reader processes.

A reader answers ``GET /v1/jobs/{id}`` from the views the serving process publishes
(:mod:`radserve.api.job_snapshot`): the same :class:`JobView` object until the next
snapshot replaces it, i.e. until the job changes (state, position, ETA) or the ETAs are
refreshed. Building and serialising :class:`JobOut` was the largest part of a status
read's CPU in a reader (docs/api-performance.md), and clients poll the same jobs over
and over, so the JSON is kept per job and reused while

- the view is the very object it was built from (a new snapshot, a new object: a state
  change can never be answered from an older body), and
- ``deadline_missed`` is still what it was: the one field that changes with the clock
  while the view does not (an unfinished job passing its deadline).

The serving process's own views are built per request (its scheduler's position and
ETA), so it serialises each answer (:func:`status_body`) without this cache.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

from radserve.api.schemas import JobOut, deadline_missed
from radserve.service.job_view import JobView

_MAX_KEPT = 4096  # jobs; past that the cache starts over (a poll rebuilds one body)


def _utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def status_body(
    view: JobView, now: dt.datetime | None = None, *, show_source: bool = False
) -> bytes:
    """The status answer of ``view`` as JSON (``show_source``: see :meth:`JobOut.of`)."""
    return JobOut.of(view, now=now, show_source=show_source).model_dump_json().encode()


class StatusBodies:
    """The last status answer of each job, reused while its view and its
    ``deadline_missed`` are unchanged. For one event loop (no lock)."""

    def __init__(self, clock: Callable[[], dt.datetime] = _utc_now) -> None:
        self.clock = clock
        self._kept: dict[tuple[str, bool], tuple[JobView, bool, bytes]] = {}
        self.built = 0  # bodies serialised (for tests and the load bench)

    def body(self, view: JobView, *, show_source: bool = False) -> bytes:
        """``show_source``: whether the caller may see the job's ``cached_from`` (one
        body kept per job and answer: the same job is shown to callers of other sites)."""
        now = self.clock()
        missed = deadline_missed(view.record, now)
        key = (view.record.id, show_source)
        kept = self._kept.get(key)
        if kept is not None and kept[0] is view and kept[1] == missed:
            return kept[2]
        data = status_body(view, now, show_source=show_source)
        if len(self._kept) >= _MAX_KEPT:
            self._kept.clear()
        self._kept[key] = (view, missed, data)
        self.built += 1
        return data


__all__ = ["StatusBodies", "status_body"]

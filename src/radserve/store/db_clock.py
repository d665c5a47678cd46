"""The database's clock as this host sees it: job leases on a shared store are dated in it.

Replicas judge each other's job leases by the times in the rows (``jobs.lease_renewed``,
``lease_expires``). Written and compared in each replica's own clock, a replica whose
clock ran 120 s ahead took every job of the others within 3 s of their creation (their
leases looked two minutes old to it, runs voided), and the jobs it held when it died
waited 128 s instead of about 8; one 120 s behind lost all its jobs to the others.

So on PostgreSQL every lease time a replica writes or compares is the host's clock plus
the **offset** of the database's clock from it, measured in the transaction of each lease
renewal and claim: ``SELECT clock_timestamp()`` between two readings of the host's
clock, the offset taken from their midpoint (its error is at most half the round trip,
milliseconds, far below a lease). Why an offset rather than ``now()`` in each SQL
statement: the lease rules also compare the rows' times in Python -- the keeper counts
the time the database answered it in wall-clock seconds and compares that with an
owner's last renewal, an incarnation's start (:attr:`radserve.store.Lease.since`) is
compared with renewals, and callers and tests pass ``now`` -- so each needs the
database's time on this side too; one offset applied everywhere keeps them all in one
clock. The offset is held between measurements (a third of a lease): a step of the
host's clock is corrected at the next renewal.

An offset above :data:`MAX_OFFSET_S` (beyond the measurement's error) is logged once,
as a warning naming it, and again once when it is back within: the job leases and the
outbox's deliveries (:meth:`radserve.store.outbox.OutboxStore.now`) no longer depend on
it, but other times this host writes do (audit records, deadlines).
:meth:`DbClock.problem` says it for ``/readyz``.

SQLite (one server) is not measured: the host's clock is the only one.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from radserve.store.records import utc_now

logger = logging.getLogger(__name__)

# an offset beyond this (seconds, less the measurement's error) is warned of: NTP keeps
# hosts within milliseconds; seconds mean a host without time synchronisation
MAX_OFFSET_S = 2.0
_ZERO = dt.timedelta(0)


def database_time(session: Session) -> dt.datetime:
    """The database's clock now (PostgreSQL's ``clock_timestamp()``), in ``session``."""
    stamp: dt.datetime = session.execute(select(func.clock_timestamp())).scalar_one()
    return stamp


class DbClock:
    """The database's time as this host reads it: ``local()`` plus the last measured
    offset (none until measured; never on SQLite). ``local``: the host's clock (a seam for
    tests: a host whose clock is off)."""

    def __init__(
        self, local: Callable[[], dt.datetime] = utc_now, *, bound_s: float = MAX_OFFSET_S
    ) -> None:
        self.local = local
        self.bound_s = bound_s
        self.offset: dt.timedelta | None = None  # database minus host; None: not measured
        self.error_s = 0.0  # half the round trip of the last measurement
        self._far = False  # whether the offset was last beyond the bound (warned)

    @property
    def measured(self) -> bool:
        return self.offset is not None

    @property
    def offset_s(self) -> float | None:
        """The database's clock less this host's, in seconds (None: not measured)."""
        return None if self.offset is None else self.offset.total_seconds()

    def now(self) -> dt.datetime:
        """The database's time now, as far as this host knows it."""
        return self.to_database(self.local())

    def to_database(self, local: dt.datetime) -> dt.datetime:
        """A time of this host's clock in the database's."""
        return local + (self.offset or _ZERO)

    def measure(self, session: Session) -> None:
        """Read the database's clock in ``session`` (PostgreSQL only) and keep its offset."""
        bind = session.get_bind()
        if bind.dialect.name != "postgresql":
            return
        before = self.local()
        database = database_time(session)
        after = self.local()
        self.record(database - (before + (after - before) / 2), (after - before) / 2)

    def record(self, offset: dt.timedelta, error: dt.timedelta = _ZERO) -> None:
        """Keep a measured ``offset`` (database less host, ± ``error``); a change across
        the bound is logged once."""
        self.offset, self.error_s = offset, error.total_seconds()
        far = abs(offset.total_seconds()) - self.error_s > self.bound_s
        if far and not self._far:
            logger.warning("clock: %s", self._describe(offset.total_seconds()))
        elif self._far and not far:
            logger.warning(
                "clock: this host's clock is within %.1f s of the database's again (%+.3f s)",
                self.bound_s,
                -offset.total_seconds(),
            )
        self._far = far

    def problem(self) -> str | None:
        """Why this host's clock is a problem (beyond the bound), or None."""
        offset = self.offset_s
        if offset is None or not self._far:
            return None
        return self._describe(offset)

    def _describe(self, offset_s: float) -> str:
        ahead = "ahead of" if offset_s < 0 else "behind"
        return (
            f"this host's clock is {abs(offset_s):.1f} s {ahead} the database's (more than "
            f"{self.bound_s:g} s): job leases and outbox deliveries are dated in the database's "
            "clock, but audit times and deadlines written here are off by as much; "
            "synchronise this host's time (NTP)"
        )


__all__ = ["MAX_OFFSET_S", "DbClock", "database_time"]

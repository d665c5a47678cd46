"""Keeping a claimed batch's lease ahead of the work done under it.

A sender claims a batch of outbox rows under one lease (``outbox.lease_s``) and sends
them one after another, each attempt taking up to its peer's timeout (up to 300 s). A
batch of 20 critical notices to a receiver that answers just inside its 300 s timeout
outlived a 5- or 15-minute lease: another sender (a replica, or this one restarted) took
the rows over as abandoned, and the receiver got the critical finding twice (the
attempt-count fence, :attr:`radserve.store.outbox.Settlement.attempt`, only kept the late
answer from settling the new attempt).

Now a lease covers one attempt at least (:func:`covering_lease`), and before each
attempt the sender renews the lease of the rows it still holds whenever the time left
would not cover that attempt (:class:`LeaseKeeper`). A row another sender took over
meanwhile (this one stalled past its lease) is not sent again here. Every sender of a
kind must judge leases alike, so the covering lease depends only on the settings.

:meth:`LeaseKeeper.hold` learns of a take-over at its next renewal only, up to half a
lease later: a sender whose clock runs ahead of this one's by more than a lease takes
the rows at once. The DICOM outbox stores a batch's files on one association, and until
2026-12-07 checked nothing between them: it stored every file of the batch, those the
other sender was storing too (a PACS got each twice); the critical-notice and FHIR
senders checked only :meth:`LeaseKeeper.hold` (10 of 12 notices, and of 12 Bundles,
posted twice). Each now reads its row back before each send
(:meth:`LeaseKeeper.still_ours`: one indexed read, ~0.2 ms on SQLite and ~1 ms on
PostgreSQL on loopback, beside the send's round trip and the row's own settlement
write), so at most the one in flight when the other sender took over goes twice (and,
for critical notices, one answered whose group commit had not landed yet).
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Sequence

from radserve.store.errors import OutboxItemNotFoundError
from radserve.store.outbox import OutboxItem, OutboxState, OutboxStore

logger = logging.getLogger(__name__)

# a lease spans at least this many of the longest attempts: the attempt itself, and as
# long again for recording its answer and for the senders' clocks to disagree
ATTEMPTS_PER_LEASE = 2.0


def covering_lease(lease: dt.timedelta, attempt_s: float) -> dt.timedelta:
    """``lease``, or longer where it would not cover one attempt of ``attempt_s`` (the
    longest an attempt takes: the peer's timeout) with as long again to spare."""
    return max(lease, dt.timedelta(seconds=ATTEMPTS_PER_LEASE * attempt_s))


class LeaseKeeper:
    """One claimed batch's lease, renewed as its rows are sent (see the module docstring).

    ``now``: the claim's time (the rows' lease began then); renewals are dated ``now``
    plus the time passed since (monotonic), so ``now`` may be any time."""

    def __init__(
        self,
        store: OutboxStore,
        items: Sequence[OutboxItem],
        *,
        lease: dt.timedelta,
        attempt_s: float,
        now: dt.datetime,
    ) -> None:
        self._store = store
        self._items = list(items)
        self._lease_s = lease.total_seconds()
        self._attempt_s = attempt_s
        self._now = now
        self._claimed_at = time.monotonic()
        self._renewed_at = self._claimed_at
        self._held = {item.id for item in self._items}
        self.renewals = 0

    def clock(self) -> dt.datetime:
        """The claim's ``now`` plus the time passed since."""
        return self._now + dt.timedelta(seconds=time.monotonic() - self._claimed_at)

    def hold(self, item: OutboxItem) -> bool:
        """Before an attempt at ``item``: the lease renewed if the time left would not
        cover the attempt; whether ``item`` is still this sender's to send."""
        self.keep()
        if item.id in self._held:
            return True
        _log_taken_over(item)
        return False

    def still_ours(self, item: OutboxItem) -> bool:
        """:meth:`hold`, and ``item``'s row read back: whether it is still this sender's
        claim (``sending``, this owner, the attempt that claimed it), so that another
        sender that took it over since is seen before the next send, not at the next
        renewal."""
        if not self.hold(item):
            return False
        try:
            row = self._store.get(item.id)
        except OutboxItemNotFoundError:
            row = None
        if (
            row is not None
            and row.state is OutboxState.SENDING
            and row.lease_owner == self._store.owner
            and row.attempts == item.attempts
        ):
            return True
        self._held.discard(item.id)
        _log_taken_over(item)
        return False

    def keep(self) -> None:
        """Renew the lease of the rows still held if it would not cover one more attempt
        (and as long again for recording it)."""
        left = self._lease_s - (time.monotonic() - self._renewed_at)
        if left >= (ATTEMPTS_PER_LEASE - 0.5) * self._attempt_s:
            return
        started = time.monotonic()
        held = [item for item in self._items if item.id in self._held]
        self._held = self._store.renew(held, now=self.clock())
        self._renewed_at = started
        self.renewals += 1


def _log_taken_over(item: OutboxItem) -> None:
    logger.warning(
        "outbox: %s to %s was taken over by another sender while this one waited; "
        "not sent again here",
        item.sop_instance_uid,
        item.destination,
    )


__all__ = ["ATTEMPTS_PER_LEASE", "LeaseKeeper", "covering_lease"]

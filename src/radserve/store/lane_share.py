"""Destinations spread over the servers sharing a PostgreSQL database.

A destination's lane sends only while it holds that destination's lock
(:mod:`radserve.store.lane_lock`). Left to themselves, the lanes of the server that
starts first take every lock and keep them: one replica holds every association and
does all the sending while the others wait. So each server running a kind's lanes holds
that kind's senders lock *shared* for as long as it runs, ``pg_locks`` counts the
servers alive, and a server holds at most its share of the kind's destinations:
ceil(destinations / servers alive). One holding more (it started first, or took a dead
server's destinations and that server is back) gives one up at a time, between two
deliveries of that lane (nothing of it is ``sending`` then), and a server below its share
takes it at its next poll. A server that dies frees its senders lock with its connection:
the others' shares grow and they take its destinations over at their next poll, as
before. A server frozen rather than dead (SIGSTOP, a paused container) keeps its
connections, so its senders lock too: counting the servers ends the session of one
silent for longer than :data:`radserve.store.lane_lock.SILENT_AFTER_S`
(:meth:`LaneLock.holders`), so it no longer counts, the others' shares grow and they take
its destinations (ending its lane sessions the same way). Replicas must configure the
same destinations of a kind (a destination only one of them knows could be left waiting
for a server that never takes it)."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence

from sqlalchemy import Engine

from radserve.store.lane_lock import LaneHold, LaneLock, lane_lock

logger = logging.getLogger(__name__)

COUNT_EVERY_S = 1.0  # the servers alive are counted at most this often


class LaneShare:
    """Takes and keeps a kind's lane locks within this server's share. ``presence`` is
    the kind's senders lock (shared), ``locks`` every lane lock of the kind here."""

    def __init__(
        self,
        presence: LaneLock,
        locks: Sequence[LaneLock],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.presence = presence
        self.locks = list(locks)
        self._clock = clock
        self._mutex = threading.Lock()
        self._servers: int | None = None
        self._counted_at = -math.inf

    def servers(self) -> int | None:
        """The servers alive running this kind's lanes, this one included (None: not
        known, the database did not answer)."""
        now = self._clock()
        if now - self._counted_at >= COUNT_EVERY_S:
            self.presence.hold()
            self._servers, self._counted_at = self.presence.holders(), now
        return self._servers

    def share(self) -> int:
        """How many destinations this server may hold: all of them when it is alone or
        the count is not known."""
        servers = self.servers()
        return math.ceil(len(self.locks) / max(servers or 1, 1))

    def hold(self, lock: LaneLock) -> LaneHold:
        """``lock.hold()`` within the share: a lock not held is taken only below the
        share, and one held over it is given up (one lane at a time: the decisions are
        made under one mutex)."""
        with self._mutex:
            share = self.share()
            held = sum(other.held for other in self.locks)
            if lock.held and held > share:
                lock.give_up()
                logger.info(
                    "outbox: this server gives %s to %s up to another (it held %d of %d "
                    "destinations; its share among %s servers is %d)",
                    lock.kind,
                    lock.destination,
                    held,
                    len(self.locks),
                    self._servers,
                    share,
                )
                return LaneHold.ELSEWHERE
            if not lock.held:
                return LaneHold.ELSEWHERE if held >= share else lock.hold()
        return lock.hold()  # held within the share: check its connection, outside the mutex

    def release(self) -> None:
        """This server stops running the kind's lanes (its lane locks released apart)."""
        self.presence.release()


def lane_share(
    engine: Engine, kind: str, locks: Sequence[LaneLock | None], *, owner: str
) -> LaneShare | None:
    """A :class:`LaneShare` over ``locks`` on PostgreSQL; None on SQLite (no locks)."""
    held = [lock for lock in locks if lock is not None]
    presence = lane_lock(engine, kind, "*", owner=owner, shared=True)
    if presence is None or not held:
        return None
    return LaneShare(presence, held)


__all__ = ["COUNT_EVERY_S", "LaneShare", "lane_share"]

"""One sender per destination among the servers sharing a PostgreSQL database.

Each destination's sender (:class:`radserve.gateway.outbox.Lane`) sends only while it
holds that destination's lock: a PostgreSQL session-level advisory lock
(``pg_try_advisory_lock``) taken on a connection of its own and kept open for as long
as the lane runs. So a PACS that takes one association at a time, or that must see a
study's results in order, meets one sender whichever replica enqueued them.

Why an advisory lock held by the sending session rather than a lease row renewed by a
timer (as jobs have): the lock lives exactly as long as its holder's connection. A
replica killed with SIGKILL (or whose host reboots) closes its socket and PostgreSQL
frees the lock at once, so another replica takes the destination over within one poll
(``outbox.lane_poll_s``), not after a lease; there is no renewal to miss when a busy
replica is starved of CPU, no clock to trust, no table or migration. A host that
vanishes without closing its socket (power loss, a cut network) is found by the
server's TCP keepalives, set on this session to about 30 s (:data:`KEEPALIVES`). The
costs: one idle connection per destination per replica (outside the pool), and a
connection pooler in front of PostgreSQL must pass sessions through (PgBouncer session
mode, not transaction mode).

The holder checks its connection before every claim (:meth:`LaneLock.hold`): a lost
connection means a lost lock, and the lane stops sending until it holds it again. A
lane that just took the lock re-queues the rows its destination has left ``sending``
under another owner (:meth:`radserve.store.outbox.OutboxStore.take_over_lane`): no one
else can be sending them. SQLite has one server process: :func:`lane_lock` returns
None and lanes send as they always did.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from enum import StrEnum

from sqlalchemy import Connection, Engine, create_engine, text
from sqlalchemy.pool import NullPool

from radserve.loop_failures import LoopFailures
from radserve.store.errors import DatabaseUnavailableError

logger = logging.getLogger(__name__)

# The server side of a lock's connection drops a peer that stopped answering after
# idle + interval * count seconds, freeing its locks (PostgreSQL session settings,
# ignored on Unix sockets, where a dead process is seen at once).
KEEPALIVES = {"tcp_keepalives_idle": 10, "tcp_keepalives_interval": 5, "tcp_keepalives_count": 4}
# ...and the client's side gives up on a server that stopped answering (libpq options)
_CLIENT_KEEPALIVES = {
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 4,
    "tcp_user_timeout": 30_000,
    "connect_timeout": 10,
}


class LaneHold(StrEnum):
    """What :meth:`LaneLock.hold` found."""

    HELD = "held"  # this lane held the lock already
    TAKEN = "taken"  # this lane has just taken it (at start, or from a replica gone)
    ELSEWHERE = "elsewhere"  # another server holds it (or the database is unreachable)


def lock_key(schema: str, kind: str, destination: str) -> int:
    """The advisory lock's 64-bit key for a (kind, destination) of the radserve tables in
    ``schema`` (advisory locks are per database, and servers of different installations
    may share one database, each in its own schema): a stable hash. Two destinations
    sharing a key would only share one sender (1 in 2**64 per pair)."""
    name = f"radserve.outbox:{schema}:{kind}:{destination}"
    digest = hashlib.blake2b(name.encode(), digest_size=8)
    return int.from_bytes(digest.digest(), "big", signed=True)


class LaneLock:
    """The exclusive right to send a (kind, destination)'s deliveries, among the servers
    sharing one PostgreSQL database. Used by one lane's thread; :meth:`release` from any."""

    def __init__(self, engine: Engine, kind: str, destination: str, *, owner: str) -> None:
        self.kind = kind
        self.destination = destination
        name = f"radserve lane {kind}:{destination} {owner}"[:63]
        self._engine = create_engine(
            engine.url,
            poolclass=NullPool,
            connect_args={**_CLIENT_KEEPALIVES, "application_name": name},
        )
        self._connection: Connection | None = None
        self._lock = threading.Lock()
        # connecting fails every poll while the database is away: logged once, then rarely
        self._connecting = LoopFailures(logger, f"outbox: the {kind} lane lock of {destination}")

    @property
    def held(self) -> bool:
        return self._connection is not None

    def hold(self) -> LaneHold:
        """Hold the lock now: check the connection that holds it, else try to take it
        (never waits for it)."""
        with self._lock:
            if self._connection is not None:
                try:
                    self._connection.execute(text("SELECT 1"))
                    return LaneHold.HELD
                except Exception as exc:  # the session, and so the lock, is gone
                    logger.warning(
                        "outbox: lost the %s lane lock of %s (%s); sending stops until "
                        "it is held again",
                        self.kind,
                        self.destination,
                        type(exc).__name__,
                    )
                    self._drop()
            try:
                connection = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
            except Exception as exc:
                why = f"no connection for the lock ({type(exc).__name__})"
                self._connecting.failed(DatabaseUnavailableError(why))
                return LaneHold.ELSEWHERE
            self._connecting.succeeded()
            try:
                for setting, value in KEEPALIVES.items():
                    connection.execute(text(f"SET {setting} = {int(value)}"))
                schema = str(connection.execute(text("SELECT current_schema()")).scalar())
                key = lock_key(schema, self.kind, self.destination)
                taken = bool(
                    connection.execute(
                        text("SELECT pg_try_advisory_lock(:key)"), {"key": key}
                    ).scalar()
                )
            except Exception as exc:  # the database went away meanwhile
                connection.close()
                logger.warning(
                    "outbox: could not take the %s lane lock of %s (%s)",
                    self.kind,
                    self.destination,
                    type(exc).__name__,
                )
                return LaneHold.ELSEWHERE
            if not taken:
                connection.close()
                return LaneHold.ELSEWHERE
            self._connection = connection
            logger.info("outbox: this server sends %s to %s", self.kind, self.destination)
            return LaneHold.TAKEN

    def release(self) -> None:
        """Give the lock up (another replica may take the destination at once)."""
        with self._lock:
            self._drop()
        self._engine.dispose()

    def _drop(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            try:
                connection.close()  # ends the session: PostgreSQL frees the lock
            except Exception:
                logger.debug("outbox: closing a lane lock's connection failed", exc_info=True)


def lane_lock(engine: Engine, kind: str, destination: str, *, owner: str) -> LaneLock | None:
    """A :class:`LaneLock` on PostgreSQL; None on SQLite (one server process)."""
    if engine.dialect.name != "postgresql":
        return None
    return LaneLock(engine, kind, destination, owner=owner)


__all__ = ["KEEPALIVES", "LaneHold", "LaneLock", "lane_lock", "lock_key"]

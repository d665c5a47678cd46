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

The same lock taken *shared* on a kind's senders key (``shared=True``) says "this server
runs that kind's lanes": every live server holds it, and :meth:`LaneLock.holders` counts
them (:mod:`radserve.store.lane_share` spreads the destinations over them).
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
    return _key(f"radserve.outbox:{schema}:{kind}:{destination}")


def senders_key(schema: str, kind: str) -> int:
    """The key every server running ``kind``'s lanes holds shared (its presence)."""
    return _key(f"radserve.outbox-senders:{schema}:{kind}")


def _key(name: str) -> int:
    digest = hashlib.blake2b(name.encode(), digest_size=8)
    return int.from_bytes(digest.digest(), "big", signed=True)


# sessions holding an advisory lock on a bigint key: PostgreSQL shows the key's high and
# low 32 bits as classid and objid, with objsubid 1
_HOLDERS = text(
    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
    "AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
    "AND classid = CAST(CAST(:high AS bigint) AS oid) "
    "AND objid = CAST(CAST(:low AS bigint) AS oid) AND objsubid = 1"
)


class LaneLock:
    """The exclusive right to send a (kind, destination)'s deliveries, among the servers
    sharing one PostgreSQL database. Used by one lane's thread; :meth:`release` from any.
    ``shared``: the kind's senders lock instead (``destination`` names it in logs)."""

    def __init__(
        self, engine: Engine, kind: str, destination: str, *, owner: str, shared: bool = False
    ) -> None:
        self.kind = kind
        self.destination = destination
        self.shared = shared
        role = "senders" if shared else "lane"
        name = f"radserve {role} {kind}:{destination} {owner}"[:63]
        self._engine = create_engine(
            engine.url,
            poolclass=NullPool,
            connect_args={**_CLIENT_KEEPALIVES, "application_name": name},
        )
        self._connection: Connection | None = None
        self._key = 0  # the key held on _connection
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
                if self.shared:
                    key, take = senders_key(schema, self.kind), "pg_try_advisory_lock_shared"
                else:
                    key, take = (
                        lock_key(schema, self.kind, self.destination),
                        "pg_try_advisory_lock",
                    )
                taken = bool(
                    connection.execute(text(f"SELECT {take}(:key)"), {"key": key}).scalar()
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
            self._key = key
            if not self.shared:
                logger.info("outbox: this server sends %s to %s", self.kind, self.destination)
            return LaneHold.TAKEN

    def holders(self) -> int | None:
        """How many sessions hold this lock now (for the shared one: the live servers);
        None unless this server holds it and the database answers."""
        with self._lock:
            if self._connection is None:
                return None
            high, low = (self._key >> 32) & 0xFFFFFFFF, self._key & 0xFFFFFFFF
            try:
                found = self._connection.execute(_HOLDERS, {"high": high, "low": low})
                return int(found.scalar() or 0)
            except Exception as exc:  # checked again, and re-taken, by the next hold()
                logger.debug("outbox: counting %s holders failed (%s)", self.kind, exc)
                return None

    def give_up(self) -> None:
        """Let the lock go and keep trying later (:meth:`release` is for good)."""
        with self._lock:
            self._drop()

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


def lane_lock(
    engine: Engine, kind: str, destination: str, *, owner: str, shared: bool = False
) -> LaneLock | None:
    """A :class:`LaneLock` on PostgreSQL; None on SQLite (one server process)."""
    if engine.dialect.name != "postgresql":
        return None
    return LaneLock(engine, kind, destination, owner=owner, shared=shared)


__all__ = ["KEEPALIVES", "LaneHold", "LaneLock", "lane_lock", "lock_key", "senders_key"]

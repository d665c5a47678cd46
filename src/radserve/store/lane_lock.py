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

A holder that is frozen rather than gone (SIGSTOP, ``docker pause``, a VM stunned for a
snapshot or a migration) keeps its socket open and its kernel acknowledging, so neither
PostgreSQL's keepalives nor anything else frees its locks: before, its destinations were
sent to by nobody for as long as it stayed frozen (30 FHIR Bundles waited 45 s while two
live replicas idled). So a holder proves it is alive on the lock's own connection: a
keeper thread runs ``SELECT 1`` on it every :data:`KEEP_EVERY_S` (serialised with the
lane's own use of the connection), even while the lane is busy sending, and the
session's ``pg_stat_activity.state_change`` stays recent. A server that wants a held
lane (or counts the kind's servers) reads its holder's session there, with the
database's clock (no host clock is trusted): an idle session silent for longer than
:data:`SILENT_AFTER_S` (the 30 s the keepalives already allow a vanished host) is ended
(``pg_terminate_backend``; the servers' own database role may end its own sessions), one
warning names the destination and how long its holder was silent, and the lane is
taken (its rows left ``sending`` re-queued as for a dead holder). A holder that resumes
finds its session gone at its next check (the keeper's, or the lane's before its next
claim) and stops. What it can still send twice: the C-STORE or POST in flight when it
froze (its answer came, or comes, after the taker re-queued that row); the other rows of
its batch are read back before their send and left to the taker
(:meth:`radserve.gateway.lease_keeper.LeaseKeeper.still_ours`). A repeated SOP Instance
UID is stored once by a PACS, and the FHIR Bundle's conditional creates do not create a
second resource, so the result appears once.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from dataclasses import dataclass
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
# a holder whose lock's session has been idle and silent this long (the database's clock)
# is taken for frozen or gone: the same time the keepalives give a host that vanished
SILENT_AFTER_S = float(
    KEEPALIVES["tcp_keepalives_idle"]
    + KEEPALIVES["tcp_keepalives_interval"] * KEEPALIVES["tcp_keepalives_count"]
)
# how often a holder shows its session alive (six tries within SILENT_AFTER_S)
KEEP_EVERY_S = SILENT_AFTER_S / 6
# how long ending a silent holder's session waits for it to end (and free its locks)
_END_WAIT_MS = 5000


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


# the pg_locks rows (alias l) of the sessions holding an advisory lock on a bigint key:
# PostgreSQL shows the key's high and low 32 bits as classid and objid, with objsubid 1
_HELD_ON_KEY = (
    "l.locktype = 'advisory' AND l.granted "
    "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
    "AND l.classid = CAST(CAST(:high AS bigint) AS oid) "
    "AND l.objid = CAST(CAST(:low AS bigint) AS oid) AND l.objsubid = 1"
)
_HOLDERS = text(f"SELECT count(*) FROM pg_locks l WHERE {_HELD_ON_KEY}")


# the other sessions holding an advisory lock on a bigint key, and how long each has been
# silent (seconds, by the database's clock; NULL while it runs a statement, or when this
# role may not see it)
_SILENT = text(
    "SELECT l.pid, a.application_name, a.state, "
    "CASE WHEN a.state IS NOT NULL AND a.state <> 'active' "
    "THEN EXTRACT(EPOCH FROM clock_timestamp() - a.state_change) END "
    "FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid "
    f"WHERE {_HELD_ON_KEY} AND l.pid <> pg_backend_pid()"
)
# ends a session only if it is still silent now (it may have resumed since it was read),
# and waits for it to end: its locks are free when this returns true
_END = text(
    "SELECT pg_terminate_backend(pid, :wait_ms) FROM pg_stat_activity "
    "WHERE pid = :pid AND state IS NOT NULL AND state <> 'active' "
    "AND clock_timestamp() - state_change > make_interval(secs => :bound)"
)


@dataclass(frozen=True)
class SilentHolder:
    """A session holding a lock that showed no activity for longer than the bound."""

    pid: int
    name: str  # its application_name: "radserve lane <kind>:<destination> <owner>"
    silent_s: float
    ended: bool  # False: still silent, but this role may not end it (or it is gone)


class LaneLock:
    """The exclusive right to send a (kind, destination)'s deliveries, among the servers
    sharing one PostgreSQL database. Used by one lane's thread; :meth:`release` from any.
    ``shared``: the kind's senders lock instead (``destination`` names it in logs).

    ``silent_after_s``: a holder whose session has been silent this long is ended and its
    lock taken (:data:`SILENT_AFTER_S`); ``keep_every_s``: how often this lock's holder
    shows its own session alive (:data:`KEEP_EVERY_S`; well below the other's bound)."""

    def __init__(
        self,
        engine: Engine,
        kind: str,
        destination: str,
        *,
        owner: str,
        shared: bool = False,
        silent_after_s: float = SILENT_AFTER_S,
        keep_every_s: float = KEEP_EVERY_S,
    ) -> None:
        self.kind = kind
        self.destination = destination
        self.shared = shared
        self.silent_after_s = silent_after_s
        self.keep_every_s = keep_every_s
        # silent holders this lock ended (metrics, tests); and one it may not end, if any
        self.ended_holders = 0
        self.refused: str | None = None
        role = "senders" if shared else "lane"
        name = f"radserve {role} {kind}:{destination} {owner}"[:63]
        self._engine = create_engine(
            engine.url,
            poolclass=NullPool,
            connect_args={**_CLIENT_KEEPALIVES, "application_name": name},
        )
        self._connection: Connection | None = None
        self._key = 0  # the key held on _connection
        # serialises every use of _connection: the lane's checks, the keeper, counting
        self._lock = threading.Lock()
        self._keeper_stop = threading.Event()
        # connecting fails every poll while the database is away: logged once, then rarely
        self._connecting = LoopFailures(logger, f"outbox: the {kind} lane lock of {destination}")

    @property
    def held(self) -> bool:
        return self._connection is not None

    def hold(self) -> LaneHold:
        """Hold the lock now: check the connection that holds it, else try to take it
        (never waits for it)."""
        with self._lock:
            if self._connection is not None and self._alive(self._connection):
                return LaneHold.HELD
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
                if not taken and any(h.ended for h in self._end_silent(connection, key)):
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
            self._keep(connection)
            if not self.shared:
                logger.info("outbox: this server sends %s to %s", self.kind, self.destination)
            return LaneHold.TAKEN

    def _alive(self, connection: Connection) -> bool:
        """Whether the session holding the lock still answers (it shows activity, too);
        if not, the lock is dropped (under ``_lock``)."""
        try:
            connection.execute(text("SELECT 1"))
            return True
        except Exception as exc:  # the session, and so the lock, is gone
            logger.warning(
                "outbox: lost the %s lane lock of %s (%s); sending stops until it is "
                "held again (its session ended: the database restarted or was cut off, or "
                "another server ended it after %.0f s of silence: was this process paused?)",
                self.kind,
                self.destination,
                type(exc).__name__,
                self.silent_after_s,
            )
            self._drop()
            return False

    def _keep(self, connection: Connection) -> None:
        """Start the thread that shows the session holding the lock alive every
        ``keep_every_s``, whatever the lane does meanwhile (a batch to a slow peer may
        take minutes with no check of its own); it ends with the lock."""
        self._keeper_stop = stop = threading.Event()
        threading.Thread(
            target=self._keeping,
            args=(connection, stop),
            name=f"radserve-lane-keeper-{self.kind}-{self.destination}"[:60],
            daemon=True,
        ).start()

    def _keeping(self, connection: Connection, stop: threading.Event) -> None:
        while not stop.wait(self.keep_every_s):
            with self._lock:
                if stop.is_set() or self._connection is not connection:
                    return
                if not self._alive(connection):
                    return

    def _end_silent(self, connection: Connection, key: int) -> list[SilentHolder]:
        """End the other sessions holding ``key`` that have been idle and silent for more
        than ``silent_after_s`` (a frozen holder: its socket open, nothing answering).
        Returns them; one warning each (a refusal: one warning until it stops)."""
        high, low = (key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF
        found = connection.execute(_SILENT, {"high": high, "low": low}).all()
        out = []
        for pid, name, state, silent in found:
            if state is None:  # a session of another role, without pg_read_all_stats
                self._refuse(pid, name, None, "its activity is not visible to this role")
                continue
            if silent is None or float(silent) <= self.silent_after_s:
                continue  # running a statement, or recently active
            try:
                ended = bool(
                    connection.execute(
                        _END,
                        {"pid": pid, "wait_ms": _END_WAIT_MS, "bound": self.silent_after_s},
                    ).scalar()
                )
            except Exception as exc:  # e.g. a session of another (superuser) role
                why = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                self._refuse(pid, name, float(silent), why)
                out.append(SilentHolder(int(pid), name or "", float(silent), False))
                continue
            if ended:
                self.ended_holders += 1
                self.refused = None
                if self.shared:
                    logger.warning(
                        "outbox: a server running the %s lanes was silent for %.0f s "
                        "(%s; frozen, paused or cut off?): ended its session, it no longer "
                        "counts among the servers sending %s",
                        self.kind,
                        float(silent),
                        name or f"pid {pid}",
                        self.kind,
                    )
                else:
                    logger.warning(
                        "outbox: the %s lane of %s was held by a session silent for %.0f s "
                        "(%s; frozen, paused or cut off?): ended it, and this server takes "
                        "the lane",
                        self.kind,
                        self.destination,
                        float(silent),
                        name or f"pid {pid}",
                    )
            out.append(SilentHolder(int(pid), name or "", float(silent), ended))
        return out

    def _refuse(self, pid: int, name: str | None, silent: float | None, why: str) -> None:
        """A holder this server cannot judge or end: one warning until that changes."""
        if self.refused != why:
            logger.warning(
                "outbox: the %s %s of %s is held by a session (pid %s, %s)%s that this "
                "server may not end (%s): should it stop answering (its replica frozen or "
                "paused), %s waits until it resumes or its connection drops. Run the "
                "replicas under one database role (or grant it pg_signal_backend and "
                "pg_read_all_stats)",
                self.kind,
                "senders lock" if self.shared else "lane",
                self.destination,
                pid,
                name or "of another role",
                "" if silent is None else f", silent for {silent:.0f} s,",
                why,
                "the share of the destinations" if self.shared else "sending to it",
            )
        self.refused = why

    def holders(self) -> int | None:
        """How many sessions hold this lock now (for the shared one: the live servers);
        None unless this server holds it and the database answers. Sessions silent for
        longer than ``silent_after_s`` are ended first, and not counted: a frozen server
        must not keep a share of the destinations that nobody sends to."""
        with self._lock:
            if self._connection is None:
                return None
            high, low = (self._key >> 32) & 0xFFFFFFFF, self._key & 0xFFFFFFFF
            try:
                self._end_silent(self._connection, self._key)
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
        self._keeper_stop.set()
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


__all__ = [
    "KEEPALIVES",
    "KEEP_EVERY_S",
    "SILENT_AFTER_S",
    "LaneHold",
    "LaneLock",
    "SilentHolder",
    "lane_lock",
    "lock_key",
    "senders_key",
]

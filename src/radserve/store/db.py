"""Engines for SQLite (the single-machine default) and PostgreSQL (clusters).

SQLite runs in WAL mode with ``synchronous=FULL``: every commit fsyncs the WAL, so a
job acknowledged with HTTP 202 (or a C-STORE success) survives a power cut, not only a
process crash (``NORMAL`` may lose the last commits on power loss). Foreign keys are on
and writers wait on each other (busy timeout) instead of failing. Write transactions
start with ``BEGIN IMMEDIATE`` so a read-then-write never hits a lock upgrade deadlock.
"""

from __future__ import annotations

import datetime as dt
import logging
import sqlite3
from pathlib import Path
from typing import Any
from urllib.parse import quote

from sqlalchemy import DateTime, Engine, create_engine, event
from sqlalchemy.engine import URL, Connection, Dialect, make_url
from sqlalchemy.types import TypeDecorator

from radserve.store.deadline import StatementDeadlines
from radserve.store.errors import StoreError

logger = logging.getLogger(__name__)

SQLITE_BUSY_TIMEOUT_MS = 30_000
# PostgreSQL: how long a statement of radserve's may wait for a lock (a table an
# operator's maintenance locked, a row a stuck session holds) before it fails as an
# outage: 503 with Retry-After, the loops try again. Without it such a request held its
# pooled connection and its API thread until the request timeout (504, not retryable),
# and the others found the pool empty (500). Set only where the session's lock_timeout
# is PostgreSQL's default 0 (a DBA's own setting is kept); migrations wait without it.
PG_LOCK_TIMEOUT_MS = 10_000
# how long a caller waits for a pooled connection when every one is in use (SQLAlchemy's
# default is 30 s, half the API's request timeout); then it is an outage too
POOL_TIMEOUT_S = 10.0
# libpq: give up connecting to a server that does not answer, and on one that stopped
# answering mid-statement (what radserve.store.lane_lock uses for its sessions); a key
# given in the database URL's query wins
PG_CLIENT_OPTIONS = {
    "connect_timeout": 10,
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 4,
    "tcp_user_timeout": 30_000,
}
# radserve's own deadline for a statement (and the pool's pre-ping) on PostgreSQL: a
# frozen database host whose kernel still acknowledges TCP never answers and never
# closes, which neither the keepalives nor tcp_user_timeout nor the server's timeouts
# notice; past it the connection is cut, an outage (503 with Retry-After) instead of a
# request that waits for ever (radserve.store.deadline). Longer than the lock_timeout.
PG_STATEMENT_DEADLINE_S = 30.0
_WRITE_OPTION = "radserve_write"


class UtcDateTime(TypeDecorator[dt.datetime]):
    """Timezone-aware UTC in and out, on SQLite (no time zones) as on PostgreSQL."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: Dialect) -> Any:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the store; use timezone-aware UTC")
        value = value.astimezone(dt.UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: Any, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        stamp: dt.datetime = value
        if stamp.tzinfo is None:
            return stamp.replace(tzinfo=dt.UTC)
        return stamp.astimezone(dt.UTC)


def normalise_url(url: str | URL, *, create: bool = True) -> URL:
    """``postgresql://`` means psycopg 3 here; SQLite files get their folder created
    (``create`` False: not)."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    if parsed.get_backend_name() == "sqlite":
        database = parsed.database or ""
        if database in ("", ":memory:") or database.startswith("file:"):
            raise StoreError(
                "radserve needs a SQLite database file (several connections share it); "
                f"got {parsed.render_as_string(hide_password=True)!r}"
            )
        if create:
            Path(database).parent.mkdir(parents=True, exist_ok=True)
    elif parsed.get_backend_name() != "postgresql":
        raise StoreError(
            f"unsupported database {parsed.get_backend_name()!r}: use sqlite:///FILE or "
            "postgresql+psycopg://USER@HOST/DB"
        )
    return parsed


def sqlite_file(url: str | URL) -> Path | None:
    """The database file of a SQLite URL (absolute); None for another database."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database:
        return None
    return Path(parsed.database).absolute()


def make_engine(url: str | URL, *, read_only: bool = False) -> Engine:
    """An engine with radserve's durability and locking settings for its backend.

    ``read_only`` (SQLite; a command that only reads a store in a folder it cannot
    write, such as read-only media): the file is opened read-only, as immutable unless a
    write-ahead log beside it holds commits not merged into it yet (:func:`_read_only_uri`),
    and nothing is created or changed beside it."""
    parsed = normalise_url(url, create=not read_only)
    if parsed.get_backend_name() == "sqlite" and read_only:
        uri = _read_only_uri(Path(parsed.database or "").absolute())
        timeout = SQLITE_BUSY_TIMEOUT_MS / 1000

        def connect() -> sqlite3.Connection:
            return sqlite3.connect(uri, uri=True, timeout=timeout, check_same_thread=False)

        engine = create_engine(parsed, creator=connect)
        _configure_sqlite(engine, read_only=True)
    elif parsed.get_backend_name() == "sqlite":
        engine = create_engine(
            parsed,
            connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000, "check_same_thread": False},
        )
        _configure_sqlite(engine)
    else:
        options = {k: v for k, v in PG_CLIENT_OPTIONS.items() if k not in parsed.query}
        engine = create_engine(
            parsed, pool_pre_ping=True, pool_timeout=POOL_TIMEOUT_S, connect_args=options
        )
        _configure_postgresql(engine)
        StatementDeadlines(PG_STATEMENT_DEADLINE_S).install(engine)
    logger.debug("database engine for %s", parsed.render_as_string(hide_password=True))
    return engine


def writer(engine: Engine) -> Engine:
    """The same engine, whose transactions take the write lock at BEGIN on SQLite."""
    return engine.execution_options(**{_WRITE_OPTION: True})


def _configure_postgresql(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(
                "SELECT set_config('lock_timeout', %s, false) "
                "WHERE current_setting('lock_timeout') = '0'",
                (f"{PG_LOCK_TIMEOUT_MS}ms",),
            )
        finally:
            cursor.close()
        dbapi_connection.commit()


def wal_pending(database: Path) -> bool:
    """Whether the write-ahead log beside ``database`` holds frames (commits a server
    that did not stop cleanly left unmerged into the file)."""
    try:
        return database.with_name(database.name + "-wal").stat().st_size > 0
    except OSError:
        return False


def _read_only_uri(database: Path) -> str:
    """A SQLite URI opening ``database`` read-only: ``immutable=1`` (no lock, no
    ``-shm`` file created: it opens on read-only media) where it is at rest; ``mode=ro``
    (SQLite reads the log through the existing ``-shm`` file, or refuses) where a
    write-ahead log holds unmerged commits, which an immutable open would not see, or
    where a log and its ``-shm`` file say a process uses it (a server running as another
    user, whose checkpoints an immutable reader would not expect)."""
    log, shm = (database.with_name(database.name + suffix) for suffix in ("-wal", "-shm"))
    live = wal_pending(database) or (log.exists() and shm.exists())
    return f"file:{quote(str(database))}?{'mode=ro' if live else 'immutable=1'}"


def _configure_sqlite(engine: Engine, *, read_only: bool = False) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # take transaction control from the sqlite3 module so BEGIN is ours (see "begin")
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            if read_only:  # the journal mode is the file's; nothing may be written
                cursor.execute("PRAGMA query_only=ON")
            else:
                cursor.execute("PRAGMA journal_mode=WAL")
                cursor.execute("PRAGMA synchronous=FULL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        immediate = connection.get_execution_options().get(_WRITE_OPTION, False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

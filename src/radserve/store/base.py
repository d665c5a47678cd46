"""Sessions for the store's parts: reads, and writes that hold the audit lock.

A write transaction takes the database write lock at BEGIN on SQLite (``BEGIN
IMMEDIATE``); with ``audited=True`` it also holds a process-wide lock, so the audit
chain's appends queue in-process rather than in the database.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from sqlalchemy import Engine, text
from sqlalchemy import exc as sa_exc
from sqlalchemy.orm import Session

from radserve.audit.chain import AuditKey, AuditRecord
from radserve.store.audit import APPENDED_INFO, CHAIN_KEY_CHECK_INFO, KEY_INFO, ChainKeyCheck
from radserve.store.db import POOL_TIMEOUT_S, writer
from radserve.store.errors import DatabaseUnavailableError, UnstorableValueError

if TYPE_CHECKING:
    from radserve.store.audit_batch import AuditBatcher

logger = logging.getLogger(__name__)
AuditListener = Callable[[Sequence[AuditRecord]], None]


class StoreBase:
    """Engine, sessions and health of a store."""

    def __init__(
        self,
        engine: Engine,
        *,
        audit_key: AuditKey | None = None,
        on_audit: AuditListener | None = None,
    ) -> None:
        self.engine = engine
        # HMAC key of the audit chain (outside the database); None: unkeyed (tests only)
        self.audit_key = audit_key
        self._chain_key_check = ChainKeyCheck()  # is audit_key the chain's? (first append)
        # told of the records each committed transaction appended (checkpoints, export)
        self.on_audit = on_audit
        self._writer = writer(engine)
        # PostgreSQL needs REPEATABLE READ for a snapshot; SQLite's WAL reads are snapshots
        self._snapshot_reader = (
            engine.execution_options(isolation_level="REPEATABLE READ")
            if engine.dialect.name == "postgresql"
            else engine
        )
        self._audit_lock = threading.Lock()
        # group commit of hot-path audit appends (AccessMixin.submit_audit), made on first use
        self._audit_batcher: AuditBatcher | None = None
        self._audit_batcher_lock = threading.Lock()

    def close(self) -> None:
        """Write the queued audit records, stop their writer, release the connections."""
        with self._audit_batcher_lock:
            batcher, self._audit_batcher = self._audit_batcher, None
        if batcher is not None:
            batcher.close()
        self.engine.dispose()

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def ping(self) -> bool:
        """Whether the database answers (for ``/readyz``)."""
        try:
            with self.engine.connect() as connection:
                connection.execute(text("SELECT 1"))
        except (sa_exc.DBAPIError, sa_exc.TimeoutError):  # no answer, or no free connection
            return False
        return True

    # -- sessions -------------------------------------------------------------------

    @contextmanager
    def _read(self, *, snapshot: bool = False) -> Iterator[Session]:
        """A read transaction; with ``snapshot`` every statement sees the same data."""
        bind = self._snapshot_reader if snapshot else self.engine
        try:
            with Session(bind) as session:
                yield session
        except sa_exc.OperationalError as exc:
            raise DatabaseUnavailableError(f"database unavailable: {unavailable_why(exc)}") from exc
        except sa_exc.TimeoutError as exc:
            raise _pool_exhausted() from exc
        except sa_exc.DataError as exc:
            raise _unstorable(exc) from exc

    @contextmanager
    def _write(self, *, audited: bool = True) -> Iterator[Session]:
        lock = self._audit_lock if audited else None
        try:
            if lock is not None:
                lock.acquire()
            with Session(self._writer, expire_on_commit=False) as session:
                session.info[KEY_INFO] = self.audit_key
                session.info[CHAIN_KEY_CHECK_INFO] = self._chain_key_check
                with session.begin():
                    yield session
                appended = session.info.pop(APPENDED_INFO, None)
            if appended and self.on_audit is not None:
                try:
                    self.on_audit(appended)
                except Exception:  # committed already: the listener's trouble is its own
                    logger.exception("audit listener failed")
        except sa_exc.OperationalError as exc:
            raise DatabaseUnavailableError(f"database unavailable: {unavailable_why(exc)}") from exc
        except sa_exc.TimeoutError as exc:
            raise _pool_exhausted() from exc
        except sa_exc.DataError as exc:
            raise _unstorable(exc) from exc
        finally:
            if lock is not None:
                lock.release()


# what the server or the driver said, by phase of an outage (never the text itself: it
# names the host and port); for the logs of a restart: when it was down, when starting
_WHY = (
    ("shutting down", "the database system is shutting down"),
    ("starting up", "the database system is starting up"),
    ("recovery", "the database system is in recovery"),
    ("connection refused", "connection refused"),
    ("terminating connection", "its connection was cut (administrator command)"),
    ("server closed the connection", "its connection was cut"),
    ("consuming input failed", "its connection was cut"),
    ("database is locked", "the database is locked"),
    ("lock timeout", "a lock it needs was held past lock_timeout"),
    ("statement timeout", "a statement ran past statement_timeout"),
    ("timeout", "no answer in time"),
)


def unavailable_why(exc: sa_exc.DBAPIError) -> str:
    """The driver's error class and the outage's phase (``OperationalError: connection
    refused``), without the driver's message."""
    text = str(exc.orig).lower()
    name = exc.orig.__class__.__name__
    for needle, why in _WHY:
        if needle in text:
            return f"{name}: {why}"
    return name


def _pool_exhausted() -> DatabaseUnavailableError:
    """Every pooled connection stayed in use past the pool's timeout (a database slow to
    answer under load, statements waiting on locks): an outage to the caller (503 with
    Retry-After, the loops try again), not an internal error (it was a 500, with a
    traceback per request)."""
    return DatabaseUnavailableError(
        "database unavailable: every connection to it is in use "
        f"(none free within {POOL_TIMEOUT_S:g} s)"
    )


def _unstorable(exc: sa_exc.DataError) -> UnstorableValueError:
    """Named by the driver's error class only: its message may quote the value."""
    return UnstorableValueError(
        f"a value cannot be stored or searched ({type(exc.orig).__name__}: a NUL "
        "character, a text too long or a number out of range); correct the request"
    )

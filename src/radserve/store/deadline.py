"""A deadline, on radserve's side, for each PostgreSQL statement and connection check.

A database host that is frozen (a hung VM, a stopped process, a storage stall) while its
kernel still acknowledges TCP answers nothing and never closes the connection: TCP
keepalives and ``tcp_user_timeout`` see a live peer (the kernel answers the probes and
acknowledges each byte), and ``statement_timeout`` / ``lock_timeout`` are enforced by
the frozen server. A statement sent to it waited for ever, holding its pooled
connection and its caller (an API request answered 504 ``request_timeout``, or not at
all; a loop stalled). Here a watchdog thread shuts down the socket of a connection whose
statement (or pre-ping) runs past :attr:`StatementDeadlines.deadline_s`: the driver
then fails it as a lost connection (``OperationalError``), the pool discards it, and
the caller gets the store's outage (503 with ``Retry-After``; the loops try again).

The deadline is longer than the pool's ``lock_timeout`` (a statement waiting for a lock
ends by itself first). A connection marked with the execution option
:data:`NO_DEADLINE` (the migration at start, which may wait for another server's) has
none.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import Any

from sqlalchemy import Engine, event

logger = logging.getLogger(__name__)

NO_DEADLINE = "radserve_no_deadline"  # an execution option: statements that may wait


class StatementDeadlines:
    """The statements in flight on one engine's connections, and their watchdog."""

    def __init__(self, deadline_s: float, *, tick_s: float = 0.5) -> None:
        self.deadline_s = deadline_s
        self.tick_s = min(tick_s, deadline_s / 4)
        self._lock = threading.Lock()
        # id(DB-API connection) -> (it, its socket's fd, when its deadline passes)
        self._running: dict[int, tuple[Any, int, float]] = {}
        self._thread: threading.Thread | None = None
        self.cut = 0  # connections cut at their deadline (for tests and the log)

    def install(self, engine: Engine) -> None:
        event.listen(engine, "before_cursor_execute", self._before)
        event.listen(engine, "after_cursor_execute", self._after)
        event.listen(engine, "handle_error", self._failed)
        dialect = engine.dialect
        ping = dialect.do_ping

        def do_ping(dbapi_connection: Any) -> bool:  # the pool's pre-ping, at checkout
            self._begin(dbapi_connection)
            try:
                return bool(ping(dbapi_connection))
            finally:
                self._end(dbapi_connection)

        dialect.do_ping = do_ping  # type: ignore[method-assign]

    # --- events -------------------------------------------------------------------------
    def _before(self, conn: Any, _cursor: Any, *_args: Any) -> None:
        if conn.get_execution_options().get(NO_DEADLINE):
            return
        self._begin(conn.connection.dbapi_connection)

    def _after(self, conn: Any, *_args: Any) -> None:
        self._end(conn.connection.dbapi_connection)

    def _failed(self, context: Any) -> None:
        try:
            dbapi = context.connection.connection.dbapi_connection
        except Exception:  # no connection (a failed connect), or invalidated already
            return
        if dbapi is not None:
            self._end(dbapi)

    def _begin(self, dbapi_connection: Any) -> None:
        try:
            fd = int(dbapi_connection.fileno())
        except Exception:  # closed already: nothing to watch
            return
        with self._lock:
            due = time.monotonic() + self.deadline_s
            self._running[id(dbapi_connection)] = (dbapi_connection, fd, due)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._watch, name="radserve-db-deadline", daemon=True
                )
                self._thread.start()

    def _end(self, dbapi_connection: Any) -> None:
        with self._lock:
            self._running.pop(id(dbapi_connection), None)

    # --- the watchdog -------------------------------------------------------------------
    def _watch(self) -> None:
        while True:
            time.sleep(self.tick_s)
            now = time.monotonic()
            with self._lock:  # under the lock: a statement that ends now is not cut
                late = [(k, c, fd) for k, (c, fd, due) in self._running.items() if now >= due]
                for key, connection, fd in late:
                    del self._running[key]
                    if _still_on(connection, fd):  # never a descriptor reused since
                        _shut_down(fd)
                        self.cut += 1
            if late:
                logger.warning(
                    "database: %d statement(s) got no answer within %.0f s (a frozen "
                    "database host?): their connections were cut",
                    len(late),
                    self.deadline_s,
                )


def _still_on(dbapi_connection: Any, fd: int) -> bool:
    try:
        return not dbapi_connection.closed and int(dbapi_connection.fileno()) == fd
    except Exception:  # closed meanwhile
        return False


def _shut_down(fd: int) -> None:
    """Shut the socket behind ``fd`` down (both ways): the blocked reader wakes with an
    end of stream. The descriptor stays the driver's (closed by it)."""
    try:
        sock = socket.socket(fileno=os.dup(fd))
    except OSError:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:  # not connected any more
        pass
    finally:
        sock.close()


__all__ = ["NO_DEADLINE", "StatementDeadlines"]

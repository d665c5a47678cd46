"""One writer of the API reader processes' ``phi.read`` records, in a process of its own.

Why: each reader used to commit its report reads' records with a writer thread of its
own (:class:`radserve.store.audit_batch.AuditBatcher`). Profiled on the wall clock
(docs/api-performance.md), a batch's time there was mostly waiting: for SQLite's write
lock, which the other readers' writers and the serving process's job writes take in
turn (SQLite's busy handler sleeps 1, 2, 5 … ms between tries, so a waiter wakes late),
and for the GIL, which the reader's busy event loop holds each time the writer thread
comes back from a statement. Here one process that runs nothing else takes the records
of every reader and commits them through the same group commit (the store's batcher):
one holder of the lock for all readers instead of one per reader, and no event loop
beside it.

The rule does not change: a reader answers a report read only after this process has
said that the read's record is committed. A record once sent is written even if its
request is then cancelled (more audit, never less). When the writer is not there a
read is refused with a retryable error (503), as when the database is down; the reader
pool starts another writer and the readers connect to it on their next read.

Protocol, over a Unix socket in the serving process's private (0700) folder, with
:mod:`multiprocessing.connection` framing: a reader sends ``(n, event)``; the writer
answers, once the batch holding it is committed, with a list of ``(n, record, None)``
or ``(n, None, (code, message))``: one message per reader per commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import threading
from concurrent.futures import Future
from multiprocessing.connection import Connection, wait
from pathlib import Path
from types import FrameType
from typing import Any

from radserve.audit.chain import AuditEvent, AuditRecord, canonical_json
from radserve.errors import RadserveError
from radserve.store.errors import StoreError

logger = logging.getLogger(__name__)

Reply = tuple[int, AuditRecord | None, tuple[str, str] | None]


class AuditWriterClient:
    """A reader's side: ``submit`` has the meaning of :meth:`Store.submit_audit` (the
    future resolves once the record is committed), the commit made by the writer process.

    For one event loop: :meth:`submit` is called on it, and the answers are read by it
    (no thread of its own, so nothing here waits for the loop's GIL)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._conn: Connection | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: dict[int, Future[AuditRecord]] = {}
        self._next = 0

    def submit(self, event: AuditEvent) -> Future[AuditRecord]:
        canonical_json(dict(event.payload))  # JSON-able, or raise now (as the batcher does)
        future: Future[AuditRecord] = Future()
        n, self._next = self._next, self._next + 1
        self._pending[n] = future
        try:
            self._connection().send((n, event))
        except OSError as exc:
            self._lost(f"the audit writer process is not reachable ({exc.strerror or exc})")
        return future

    def _connection(self) -> Connection:
        if self._conn is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(self.path)
            except OSError:
                sock.close()
                raise
            self._conn = Connection(sock.detach())
            self._loop = asyncio.get_running_loop()
            self._loop.add_reader(self._conn.fileno(), self._receive)
        return self._conn

    def _receive(self) -> None:
        conn = self._conn
        try:
            while conn is not None and conn.poll():
                for n, record, error in conn.recv():
                    future = self._pending.pop(n, None)
                    if future is None or future.cancelled():
                        continue
                    if error is None:
                        future.set_result(record)
                    else:
                        future.set_exception(StoreError(error[1], code=error[0]))
        except (EOFError, OSError):
            self._lost("the audit writer process stopped before it answered")

    def _lost(self, why: str) -> None:
        """Every read still waiting is refused (retryable); the next read reconnects."""
        conn, self._conn = self._conn, None
        if conn is not None:
            if self._loop is not None:
                self._loop.remove_reader(conn.fileno())
            conn.close()
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.cancelled():
                future.set_exception(StoreError(why))

    def close(self) -> None:
        self._lost("the API reader is stopping")


def _code(error: BaseException) -> tuple[str, str]:
    if isinstance(error, RadserveError):
        return error.code, str(error)
    return "store_error", f"the audit record could not be committed ({type(error).__name__})"


def serve_audit_writer(
    settings: Any, path: str, parent: Connection, log_level: int, json_logs: bool
) -> None:
    """The writer process's main: commit what the readers send until SIGTERM or until
    the serving process is gone (``parent`` breaks); ``ready`` is sent on ``parent``
    once the socket listens.

    One thread does everything: wait until readers sent something, take all they sent,
    commit it in one transaction (:meth:`AuditBatcher.commit`), answer each reader in
    one message. What arrives during a commit waits in the sockets for the next one, so
    a batch grows only while the database is the wait."""
    from radserve.service.logs import configure_logging
    from radserve.store.audit_batch import AuditBatcher
    from radserve.store.audited import open_audited

    configure_logging(log_level, json_lines=json_logs)
    _name_process(b"radserve-auditw")
    stopping = threading.Event()

    def stop(sig: int, frame: FrameType | None) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C reaches the serving process
    store, trail = open_audited(settings, upgrade=True)
    trail.start()
    batcher = AuditBatcher(store)
    Path(path).unlink(missing_ok=True)  # a writer killed before this one left its socket
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    peers: list[Connection] = []
    parent.send("ready")
    try:
        while not stopping.is_set():
            sent: list[tuple[Connection, int, AuditEvent]] = []
            for ready in wait([listener, parent, *peers], timeout=0.5):
                if ready is listener:
                    peers.append(Connection(listener.accept()[0].detach()))
                elif ready is parent:
                    stopping.set()  # the serving process is gone
                else:
                    sent += _take(peers, ready)  # type: ignore[arg-type]
            if sent:
                futures = batcher.commit([event for _, _, event in sent])
                _answer(sent, futures)
    finally:
        logger.info("API audit writer: %d records in %d commits", batcher.appended, batcher.batches)
        listener.close()
        store.close()
        trail.stop()
        for peer in peers:
            peer.close()
        Path(path).unlink(missing_ok=True)


def _take(peers: list[Connection], peer: Connection) -> list[tuple[Connection, int, AuditEvent]]:
    """Everything ``peer`` sent so far; a reader that is gone is dropped."""
    sent = []
    try:
        while peer.poll():
            n, event = peer.recv()
            sent.append((peer, n, event))
    except (EOFError, OSError):
        peers.remove(peer)
        peer.close()
    return sent


def _answer(
    sent: list[tuple[Connection, int, AuditEvent]], futures: list[Future[AuditRecord]]
) -> None:
    """One message to each reader with the outcome of each of its events."""
    replies: dict[Connection, list[Reply]] = {}
    for (peer, n, _), future in zip(sent, futures, strict=True):
        error = future.exception()
        reply: Reply = (n, future.result(), None) if error is None else (n, None, _code(error))
        replies.setdefault(peer, []).append(reply)
    for peer, answers in replies.items():
        with contextlib.suppress(OSError):  # the reader is gone; its reads were refused there
            peer.send(answers)


def _name_process(name: bytes) -> None:
    """What ``ps`` and ``/proc/PID/comm`` show (Linux; 15 bytes at most): this process
    apart from the readers, which are spawned the same way."""
    with contextlib.suppress(OSError):
        Path("/proc/self/comm").write_bytes(name[:15])


__all__ = ["AuditWriterClient", "serve_audit_writer"]

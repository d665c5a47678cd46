"""A syslog collector that accepts a connection and closes it at once takes no critical
notice: each is retried, not marked sent, against a real loopback collector started here
(plain TCP, RFC 6587, and TLS, RFC 5425).

Found in a user trial: a TCP collector that accepted and closed logged 82 connections
and 0 bytes while ``radserve outbox list --destination critical:sclose`` showed every
row ``sent``: the write into a freshly connected stream "succeeded" into the kernel's
buffer before the collector's close (or reset) came back. The client now checks the
stream after writing (on a new connection it watches it a moment) and counts a stream
the collector closed as not delivered. Syslog itself has no acknowledgement: this
catches a collector that closes, not one that reads and then loses the message."""

from __future__ import annotations

import contextlib
import datetime as dt
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.factories.syslog import make_certificate
from tests.factories.waits import until

from radserve.audit.syslog import SyslogEndpoint
from radserve.config import TlsSettings
from radserve.critical.push import CriticalOutbox
from radserve.critical.receivers import SyslogReceiver
from radserve.gateway.outbox import utc_now
from radserve.store import Store, init_store
from radserve.store.outbox import OutboxKind, OutboxState, OutboxStore

NOTICES = 3


class Collector:
    """Accepts on a loopback port; ``closing``: closes each connection at once (after
    the TLS handshake with ``tls``), else reads it, keeping every byte."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.closing = True
        self.connections = 0
        self.received = b""
        self._tls = tls
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port: int = self._listener.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                self.connections += 1
            if self.closing and self._tls is None:
                conn.close()  # at once, on the accepting thread (the trial's collector)
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            if self._tls is not None:
                conn.settimeout(5)
                conn = self._tls.wrap_socket(conn, server_side=True)
            if self.closing:
                return
            conn.settimeout(0.2)
            while not self._stop.is_set():
                try:
                    chunk = conn.recv(65536)
                except TimeoutError:
                    continue
                if not chunk:
                    return
                with self._lock:
                    self.received += chunk
        except OSError:
            return
        finally:
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._listener.close()


@pytest.fixture
def rows(tmp_path: Path) -> Iterator[OutboxStore]:
    store: Store = init_store(f"sqlite:///{tmp_path / 'radserve.db'}")
    yield OutboxStore(store.engine)
    store.close()


def _notices(box: CriticalOutbox, folder: Path) -> None:
    for index in range(NOTICES):
        notice = {"id": f"n-{index}", "job_id": f"job-{index}", "finding": {"label": "bleed"}}
        box.enqueue(notice, folder=folder)


def _collector_that_closes_then_reads(
    rows: OutboxStore, tmp_path: Path, collector: Collector, tls: TlsSettings | None
) -> None:
    endpoint = SyslogEndpoint("127.0.0.1", collector.port, tls=tls, timeout_s=2)
    box = CriticalOutbox(rows, [SyslogReceiver("sclose", endpoint)])
    try:
        _notices(box, tmp_path)
        report = box.deliver_pending()
        assert (report.sent, report.retried) == (0, NOTICES), report
        items = rows.items(kind=OutboxKind.CRITICAL)
        assert {row.state for row in items} == {OutboxState.PENDING}
        for row in items:
            assert row.last_error is not None
            assert "closed the connection" in row.last_error, row.last_error
        assert collector.received == b""
        assert collector.connections >= 1

        collector.closing = False  # the collector is fixed: the retries reach it
        accepted_before = collector.connections
        later = utc_now() + dt.timedelta(minutes=5)
        report = box.deliver_pending(now=later)
        assert (report.sent, report.retried) == (NOTICES, 0), report
        assert {row.state for row in rows.items(kind=OutboxKind.CRITICAL)} == {OutboxState.SENT}
        until(
            lambda: collector.received.count(b"RADSERVE-CRITICAL") == NOTICES,
            what="every notice at the collector",
        )
        # one kept connection for all of them: a live stream is not taken for a closed one
        assert collector.connections == accepted_before + 1
    finally:
        box.close()


def test_a_tcp_collector_that_accepts_and_closes_gets_its_notices_retried(
    rows: OutboxStore, tmp_path: Path
) -> None:
    collector = Collector()
    try:
        _collector_that_closes_then_reads(rows, tmp_path, collector, tls=None)
    finally:
        collector.close()


def test_a_tls_collector_that_closes_after_the_handshake_gets_its_notices_retried(
    rows: OutboxStore, tmp_path: Path
) -> None:
    cert, key = make_certificate(tmp_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)  # TLS 1.3: it sends session tickets
    context.load_cert_chain(str(cert), str(key))
    collector = Collector(tls=context)
    try:
        _collector_that_closes_then_reads(rows, tmp_path, collector, tls=TlsSettings(ca=cert))
    finally:
        with contextlib.suppress(OSError):
            collector.close()

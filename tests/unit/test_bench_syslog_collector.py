"""One syslog collector, in radserve.bench (source cannot import tests): the critical
bench runs against it and the tests' factory is it. It parses what radserve's own syslog
client sends, over TLS and plain TCP, drops a connection that breaks the framing
(counted, no exception in its thread), and ``close()`` leaves neither its port nor a
thread behind."""

from __future__ import annotations

import datetime as dt
import socket
import threading
from pathlib import Path

import pytest
from tests.factories import syslog as factory
from tests.factories.waits import until

from radserve.audit.syslog import SyslogClient, SyslogEndpoint, frame, rfc5424
from radserve.bench import critical, eta_trace
from radserve.bench.syslog_collector import Collector, make_certificate
from radserve.config import TlsSettings


def _message(n: int) -> bytes:
    return frame(
        rfc5424(
            f'{{"n": {n}}}'.encode(), msgid="RADSERVE-CRITICAL", app_name="radserve",
            ts=dt.datetime.now(dt.UTC), structured={"notice": str(n)},
        )
    )  # fmt: skip


def test_the_bench_and_the_tests_share_one_collector_and_one_study_post() -> None:
    assert factory.Collector is Collector and factory.make_certificate is make_certificate
    assert critical.Collector is Collector
    assert critical._submit is eta_trace._submit


@pytest.mark.parametrize("tls", [False, True], ids=["tcp", "tls"])
def test_collector_takes_radserve_messages_and_closes_cleanly(tls: bool, tmp_path: Path) -> None:
    pem = make_certificate(tmp_path) if tls else (None, None)
    before = set(threading.enumerate())
    collector = Collector(0, *pem)  # any free port
    assert collector.port > 0
    tls_settings = TlsSettings(ca=pem[0]) if tls else None
    client = SyslogClient(SyslogEndpoint("127.0.0.1", collector.port, tls=tls_settings))
    try:
        client.send([_message(1), _message(2)])
        until(lambda: len(collector.parsed()) == 2, "both messages parsed", 20)
        first, second = collector.parsed()
        assert (first["msgid"], first["sd"], first["body"]) == (
            "RADSERVE-CRITICAL", {"notice": "1"}, b'{"n": 1}'
        )  # fmt: skip
        assert second["sd"] == {"notice": "2"} and collector.connections == 1
    finally:
        client.close()
        collector.close()
    # the port is free again at once, and no collector thread outlives close()
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", collector.port))
    until(lambda: not (set(threading.enumerate()) - before), "the collector's threads to end", 5)


def test_a_connection_that_breaks_the_framing_is_dropped_and_counted() -> None:
    collector = Collector()
    try:
        with socket.create_connection(("127.0.0.1", collector.port)) as raw:
            raw.sendall(b"<13>1 not octet-counted\n")
            until(lambda: collector.framing_errors == 1, "the framing error counted", 20)
        assert collector.messages == []
        with socket.create_connection(("127.0.0.1", collector.port)) as raw:
            raw.sendall(_message(7))  # the next connection is served as usual
            until(lambda: len(collector.messages) == 1, "the one message received", 20)
    finally:
        collector.close()

"""A hospital peer's HTTP answer is judged by its status line; of its body radserve reads
at most a small bounded part, and only where it uses it (a FHIR server's
OperationOutcome on an error), against real loopback receivers started here.

Before, the critical webhook and the FHIR client (FHIR outbox and critical FHIR
receivers) read every answer whole into memory: a trial receiver answering 200 with
``Content-Length: 2000000000`` and 2 GB of body drove the server from 6 to 10 GB in
40 s, and a 200 whose body dripped a byte every 3 s (``timeout_s: 3``) was never
acknowledged ("no answer within 3 s") though its status came at once.

Boundedness is asserted by what the receiver managed to send before the client closed
the connection (its kernel buffers take a few MiB), not by a wall-clock time."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from tests.factories.raw_http import loopback_server, read_message

from radserve.critical.push import AnyReceiver, CriticalOutbox, Receiver
from radserve.critical.receivers import FhirReceiver
from radserve.fhir.delivery import FhirClient, FhirDestination
from radserve.gateway.scu import Outcome
from radserve.store import Store, init_store
from radserve.store.outbox import OutboxKind, OutboxState, OutboxStore

TIMEOUT_S = 20.0  # long: a huge body must be settled by its status, not by a timeout
DRIP_TIMEOUT_S = 2.0  # a dripping 2xx is acknowledged by the attempt's end at the latest
HUGE_LENGTH = 2_000_000_000  # what the answer's Content-Length claims
HUGE_SENT = 192 * 1024 * 1024  # what the receiver tries to send before it closes
BOUNDED = 48 * 1024 * 1024  # loopback buffers apart, the client read <= 64 KiB of it
CHUNK = 1024 * 1024
DRIP_EVERY_S = 0.25
DRIP_BYTES = 400  # ~100 s at DRIP_EVERY_S: far past TIMEOUT_S
ANSWER_BODY_LIMIT = 64 * 1024  # radserve.http_answer.ANSWER_BODY_LIMIT
DONE_WAIT_S = 60.0  # a bound for a stuck test only, not a performance bound
BUNDLE = {"resourceType": "Bundle", "type": "transaction", "entry": []}


@dataclass
class Peer:
    """A receiver that answers every request with one scripted answer."""

    url: str
    sent: int = 0  # body bytes the receiver's socket took before the client closed
    requests: int = 0
    hung_up: threading.Event = field(default_factory=threading.Event)  # closed under it
    done: threading.Event = field(default_factory=threading.Event)  # its answer ended


@contextmanager
def peer(status: str, body: str, *, payload: bytes = b"") -> Iterator[Peer]:
    """``body``: ``huge`` (Content-Length 2e9, HUGE_SENT bytes sent as fast as taken),
    ``endless`` (the same with no length: until the connection closes), ``drip`` (one
    byte every DRIP_EVERY_S) or ``whole`` (``payload`` at once)."""
    server = Peer(url="")
    stop = threading.Event()

    def answer(conn: socket.socket) -> None:
        with conn:
            read_message(conn)
            server.requests += 1
            length = {"huge": HUGE_LENGTH, "drip": DRIP_BYTES}.get(body, len(payload))
            declared = "" if body == "endless" else f"Content-Length: {length}\r\n"
            head = f"HTTP/1.1 {status}\r\n{declared}Connection: close\r\n\r\n"
            try:
                conn.sendall(head.encode())
                if body in ("huge", "endless"):
                    blob = b"x" * CHUNK
                    while server.sent < HUGE_SENT and not stop.is_set():
                        conn.sendall(blob)
                        server.sent += len(blob)
                elif body == "drip":
                    for _ in range(DRIP_BYTES):
                        if stop.wait(DRIP_EVERY_S):
                            return
                        conn.sendall(b" ")
                        server.sent += 1
                else:
                    conn.sendall(payload)
                    server.sent += len(payload)
            except OSError:  # reset or broken pipe: the client closed mid-answer
                server.hung_up.set()
            finally:
                server.done.set()

    with loopback_server(answer, stop) as port:
        server.url = f"http://127.0.0.1:{port}/hook"
        yield server


@pytest.fixture
def rows(tmp_path: Path) -> Iterator[OutboxStore]:
    store: Store = init_store(f"sqlite:///{tmp_path / 'radserve.db'}")
    yield OutboxStore(store.engine)
    store.close()


def _receiver(kind: str, url: str, timeout_s: float = TIMEOUT_S) -> AnyReceiver:
    if kind == "webhook":
        return Receiver("ward", url, timeout_s=timeout_s)
    return FhirReceiver("ehr", FhirDestination(url=url, timeout_s=timeout_s))


def _push_one(rows: OutboxStore, receiver: AnyReceiver, folder: Path) -> OutboxState:
    box = CriticalOutbox(rows, [receiver])
    try:
        notice = {"id": "n-1", "study_instance_uid": "1.2.3"}
        box.enqueue(notice, folder=folder, fhir_bundle=BUNDLE)
        box.deliver_pending()
    finally:
        box.close()
    [row] = rows.items(kind=OutboxKind.CRITICAL)
    return row.state


@pytest.mark.parametrize("body", ["huge", "endless"])
@pytest.mark.parametrize("kind", ["webhook", "fhir"])
def test_a_2xx_with_a_huge_body_is_acknowledged_and_its_body_not_read(
    rows: OutboxStore, tmp_path: Path, kind: str, body: str
) -> None:
    with peer("200 OK", body) as server:
        state = _push_one(rows, _receiver(kind, server.url), tmp_path)
        assert server.done.wait(DONE_WAIT_S)
    assert state is OutboxState.SENT
    assert server.hung_up.is_set()  # the client closed the connection under the body
    assert server.sent < BOUNDED, f"the receiver got {server.sent} body bytes taken"


@pytest.mark.parametrize("kind", ["webhook", "fhir"])
def test_an_error_with_a_huge_body_is_retried_by_its_status(
    rows: OutboxStore, tmp_path: Path, kind: str
) -> None:
    with peer("500 Oops", "huge") as server:
        state = _push_one(rows, _receiver(kind, server.url), tmp_path)
        assert server.done.wait(DONE_WAIT_S)
    assert state is OutboxState.PENDING
    [row] = rows.items(kind=OutboxKind.CRITICAL)
    assert row.last_error is not None
    assert row.last_error.startswith("HTTP 500 Oops"), row.last_error
    assert server.sent < BOUNDED, f"the receiver got {server.sent} body bytes taken"


@pytest.mark.parametrize("kind", ["webhook", "fhir"])
def test_a_2xx_whose_body_drips_is_acknowledged_at_its_status(
    rows: OutboxStore, tmp_path: Path, kind: str
) -> None:
    with peer("200 OK", "drip") as server:
        state = _push_one(rows, _receiver(kind, server.url, DRIP_TIMEOUT_S), tmp_path)
        assert server.done.wait(DONE_WAIT_S)
    assert state is OutboxState.SENT  # before: "no answer within 2 s (the attempt's total)"
    assert server.hung_up.is_set()  # not waited for to its end: closed while it dripped
    assert server.sent < DRIP_BYTES


def _outcome(code: str, diagnostics: str = "") -> bytes:
    issue = {"severity": "error", "code": code, "diagnostics": diagnostics}
    return json.dumps({"resourceType": "OperationOutcome", "issue": [issue]}).encode()


def test_a_fhir_operation_outcome_is_read_up_to_the_bound_and_a_longer_one_is_said_cut() -> None:
    client = FhirClient()
    try:
        small = _outcome("invalid")
        with peer("422 Unprocessable Entity", "whole", payload=small) as server:
            read = client.post(FhirDestination(url=server.url, timeout_s=TIMEOUT_S), b"{}")
        assert read.outcome is Outcome.PERMANENT
        assert "OperationOutcome: error invalid" in read.message
        big = _outcome("invalid", "x" * (2 * ANSWER_BODY_LIMIT))
        with peer("500 Internal Server Error", "whole", payload=big) as server:
            cut = client.post(FhirDestination(url=server.url, timeout_s=TIMEOUT_S), b"{}")
    finally:
        client.close()
    # past the bound the OperationOutcome cannot be read: its codes are not guessed, the
    # status decides (a 5xx: retried), and the reason says the body was cut
    assert cut.outcome is Outcome.RETRY
    assert cut.message.startswith("HTTP 500 Internal Server Error")
    assert "OperationOutcome" not in cut.message
    assert "; its body was not read" in cut.message
    assert f"over {ANSWER_BODY_LIMIT // 1024} KiB" in cut.message

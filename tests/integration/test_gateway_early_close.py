"""A connection that ends before its association does gives its slot back at once.

A load balancer's TCP health check connects and closes, a port scan resets, a peer sends
part of an A-ASSOCIATE-RQ and leaves: each was admitted into a connection slot, and each
kept it for the ACSE timeout (30 s measured, per close kind), because pynetdicom's
acceptor waited that long for a request its closed transport could no longer bring. A
health check every few seconds then kept PACS senders out (A-ASSOCIATE-RJ local limit
exceeded). Here every slot is first taken by such connections, then a real association
(pynetdicom's C-ECHO) must succeed, over plain TCP, over TLS and with receiving processes.
"""

from __future__ import annotations

import logging
import select
import socket
import ssl
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pynetdicom import AE
from pynetdicom.sop_class import Verification
from tests.factories.dicom_net import loopback_scp_config
from tests.factories.tls import HAVE_OPENSSL, Pki, make_pki
from tests.factories.waits import until

from radserve.config import TlsSettings
from radserve.gateway import GatewaySCP
from radserve.security.logs import RedactingFilter

SLOTS = 4
# far beyond every wait here: a slot that comes back came from the close, not a timeout
ACSE_TIMEOUT_S = 300.0
# an A-ASSOCIATE-RQ header announcing 200 bytes, and 3 of them
PARTIAL_REQUEST = struct.pack(">BBL", 0x01, 0, 200) + bytes([0, 1, 0])
CLOSE_KINDS = ("connect_and_close", "partial_request", "reset")


def _close_early(sock: socket.socket, kind: str) -> None:
    if kind == "partial_request":
        sock.sendall(PARTIAL_REQUEST)
    elif kind == "reset":  # SO_LINGER 0: close sends RST
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def _scp(tmp_path: Path, **overrides: Any) -> GatewaySCP:
    """Every slot, and every slot of 127.0.0.1, is one of :data:`SLOTS`."""
    config = loopback_scp_config(
        tmp_path / "gateway",
        1.0,
        max_associations=SLOTS,
        max_associations_per_host=SLOTS,
        reserved_for_peers=0,
        **{"acse_timeout_s": ACSE_TIMEOUT_S, **overrides},
    )
    return GatewaySCP(config, lambda _study: None)


def _count_admissions(scp: GatewaySCP, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The addresses admitted from now on (so a test knows its connections were accepted
    before it looks for their slots to be free)."""
    admitted: list[str] = []
    admit = scp.admission.admit

    def counted(address: str) -> bool:
        admitted.append(address)
        return admit(address)

    monkeypatch.setattr(scp.admission, "admit", counted)
    return admitted


def _fill_with_early_closes(
    scp: GatewaySCP, admitted: list[str], connect: Callable[[], socket.socket], kind: str
) -> None:
    """Take all :data:`SLOTS` with connections closed early; return once their slots and
    their association threads are gone."""
    until(lambda: not scp.admission.open_connections(), "every slot free", timeout=5)
    start = len(admitted)
    for _ in range(SLOTS):
        _close_early(connect(), kind)
    until(lambda: len(admitted) - start == SLOTS, f"{SLOTS} connections admitted", timeout=5)
    until(
        lambda: not scp.admission.open_connections(),
        "the early-closed connections' slots given back",
        timeout=2,
        state=scp.admission.open_connections,
    )
    until(lambda: not scp.ae.active_associations, "their association threads ended", timeout=2)


def _echo(scp: GatewaySCP, tls: ssl.SSLContext | None = None) -> int:
    ae = AE("PYNETDICOM")
    ae.add_requested_context(Verification)
    tls_args = (tls, "127.0.0.1") if tls is not None else None
    assoc = ae.associate(*scp.address, ae_title="RADSERVE", tls_args=tls_args)
    assert assoc.is_established, "refused: the early-closed connections still hold slots"
    try:
        return int(assoc.send_c_echo().Status)
    finally:
        assoc.release()


@pytest.fixture
def plain_scp(tmp_path: Path) -> Iterator[GatewaySCP]:
    with _scp(tmp_path) as scp:
        yield scp


@pytest.mark.parametrize("kind", CLOSE_KINDS)
def test_early_closed_connections_give_their_slots_back_at_once(
    plain_scp: GatewaySCP,
    kind: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    admitted = _count_admissions(plain_scp, monkeypatch)
    for _ in range(2):  # twice: the slots given back are usable, and given back again
        _fill_with_early_closes(
            plain_scp, admitted, lambda: socket.create_connection(plain_scp.address), kind
        )
        assert _echo(plain_scp) == 0x0000
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert not [r for r in caplog.records if r.exc_info]
    # a bare close or a reset (what health checks do all day) says nothing; a partial
    # request gets pynetdicom's one line ("shorter than expected") per connection
    assert len(loud) == (2 * SLOTS if kind == "partial_request" else 0), [
        r.getMessage() for r in loud
    ]
    # ... which names who sent it (the operator's question: which device?), whatever
    # redaction of library messages the server's log handler does after (it is done)
    assert all(r.getMessage().endswith("[peer 127.0.0.1]") for r in loud), [
        r.getMessage() for r in loud
    ]
    handler_filter = RedactingFilter()
    for record in loud:
        handler_filter.filter(record)
    assert all(r.getMessage().endswith("[peer 127.0.0.1]") for r in loud)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    if not HAVE_OPENSSL:
        pytest.skip("openssl is not installed")
    return make_pki(tmp_path_factory.mktemp("pki"))


def _client_tls(pki: Pki) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.ca))
    context.load_cert_chain(str(pki.client_cert), str(pki.client_key))
    return context


@pytest.mark.parametrize("handshake", ["before", "after"])
@pytest.mark.parametrize("kind", CLOSE_KINDS)
def test_over_tls_early_closed_connections_give_their_slots_back_at_once(
    tmp_path: Path,
    pki: Pki,
    kind: str,
    handshake: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before the TLS handshake (its failure gives the slot back) and after it (the
    association's wait for the A-ASSOCIATE-RQ did not: the plain path's defect)."""
    caplog.set_level(logging.INFO, logger="radserve")
    client = _client_tls(pki)

    def connect() -> socket.socket:
        raw = socket.create_connection(scp.address)
        return client.wrap_socket(raw, server_hostname="127.0.0.1") if handshake == "after" else raw

    tls = TlsSettings(cert=pki.server_cert, key=pki.server_key, ca=pki.ca)
    with _scp(tmp_path, tls=tls) as scp:
        admitted = _count_admissions(scp, monkeypatch)
        _fill_with_early_closes(scp, admitted, connect, kind)
        assert _echo(scp, client) == 0x0000
    handshake_lines = [r for r in caplog.records if "TLS handshake" in r.getMessage()]
    if handshake == "before" and kind != "partial_request":  # a health check: no warning
        assert not [r for r in handshake_lines if r.levelno >= logging.WARNING]


@pytest.mark.slow
def test_receiving_processes_give_early_closed_slots_back_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gateway.receivers 2: the parent admits, a receiving process runs the connection
    and tells the parent when it ends."""
    with _scp(tmp_path, receivers=2) as scp:
        admitted = _count_admissions(scp, monkeypatch)
        for kind in CLOSE_KINDS:
            _fill_with_early_closes(
                scp, admitted, lambda: socket.create_connection(scp.address), kind
            )
            assert _echo(scp) == 0x0000


def _client_hello(client: ssl.SSLContext) -> bytes:
    """The first flight of a real TLS client (its ClientHello), as bytes to send by hand."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = client.wrap_bio(incoming, outgoing, server_hostname="127.0.0.1")
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def test_a_client_hello_sent_a_byte_at_a_time_does_not_hold_its_slot(
    tmp_path: Path, pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    """The handshake's timeout bounds the whole handshake, not each read: a client that
    sends its ClientHello a byte every half second (each read well inside the 2 s timeout,
    the whole hello minutes) is cut off when the 2 s are up and its slot is free again.
    (CPython's SSL handshake takes the socket's timeout as one deadline for the whole
    handshake; this holds the gateway to it.)"""
    caplog.set_level(logging.INFO, logger="radserve")
    client = _client_tls(pki)
    hello = _client_hello(client)
    assert len(hello) > 100  # minutes at a byte per half second
    tls = TlsSettings(cert=pki.server_cert, key=pki.server_key, ca=pki.ca)
    with _scp(tmp_path, tls=tls, acse_timeout_s=2.0) as scp:
        sock = socket.create_connection(scp.address)
        sent, cut_off = 0, False
        try:
            for byte in hello:
                sock.sendall(bytes([byte]))
                sent += 1
                readable, _, _ = select.select([sock], [], [], 0.5)
                if readable and not sock.recv(4096):  # the server closed its end
                    cut_off = True
                    break
        except (BrokenPipeError, ConnectionResetError):
            cut_off = True
        finally:
            sock.close()
        assert cut_off and sent < len(hello) // 2, (sent, len(hello))
        until(lambda: not scp.admission.open_connections(), "the slot given back", timeout=5)
        assert _echo(scp, client) == 0x0000  # and the gateway serves the next one
    said = [r.getMessage() for r in caplog.records if "TLS handshake with" in r.getMessage()]
    assert said and all(r.endswith("failed: TimeoutError") for r in said), said

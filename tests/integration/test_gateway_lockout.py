"""No lock-out at the DICOM edge: clients that connect and stall (a partial PDU, or
nothing at all) are disconnected after the timeouts, cannot take the slots kept for
allowed peers, and a PDU announcing gigabytes is refused before it is read; malformed
association requests are answered with one log line, never a traceback. Legitimate
traffic is dcmtk's echoscu from an allowed peer; strangers are raw sockets bound to
other loopback addresses (127.0.0.3 and up)."""

from __future__ import annotations

import logging
import socket
import struct
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from tests.factories.dicom_net import dcmtk_tool
from tests.factories.waits import wait_until

from radserve.gateway import GatewaySCP, Peer, ScpConfig

pytestmark = [
    pytest.mark.tools,
    pytest.mark.skipif(dcmtk_tool("echoscu") is None, reason="dcmtk is not installed"),
]
PARTIAL = bytes.fromhex("0100000001000002")  # A-ASSOCIATE-RQ header: 256 bytes to come, 2 sent
HUGE = bytes.fromhex("0100ffffffff")  # the 6 bytes: a 4 GiB PDU announced


def _scp(tmp_path: Path, **knobs: float) -> GatewaySCP:
    config = ScpConfig(
        data_dir=tmp_path / "gw",
        port=0,
        allowed_peers=(Peer("ECHOSCU", "127.0.0.1"),),
        **{"max_associations": 16, "max_associations_per_host": 8, "reserved_for_peers": 4} | knobs,
    )
    return GatewaySCP(config, lambda _study: None)


def _echo(server: GatewaySCP) -> subprocess.CompletedProcess[str]:
    binary = dcmtk_tool("echoscu")
    assert binary is not None
    host, port = server.address
    command = [binary, "-aet", "ECHOSCU", "-aec", "RADSERVE", "-to", "5", "-ta", "5", "-td", "5"]
    return subprocess.run(
        [*command, host, str(port)], capture_output=True, text=True, timeout=30, check=False
    )


def _stranger(stack: ExitStack, server: GatewaySCP, source: str, payload: bytes) -> socket.socket:
    sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
    sock.bind((source, 0))
    sock.connect(server.address)
    if payload:
        sock.sendall(payload)
    return sock


def _closed_by_server(sock: socket.socket) -> bool:
    """Has the server closed this connection (EOF or reset), without waiting? What it
    wrote first (a refusal's A-ASSOCIATE-RJ) is read past."""
    sock.setblocking(False)
    try:
        while sock.recv(4096):
            pass
        return True
    except BlockingIOError:
        return False
    except OSError:
        return True


@pytest.fixture
def patient_scp(tmp_path: Path) -> Iterator[GatewaySCP]:
    """Timeouts long enough that the stalled clients are still there when tested."""
    with _scp(tmp_path, acse_timeout_s=30, pdu_timeout_s=30) as server:
        yield server


def test_stalled_strangers_from_many_addresses_leave_the_reserved_slots(
    patient_scp: GatewaySCP,
) -> None:
    with ExitStack() as stack:
        stalled = [_stranger(stack, patient_scp, f"127.0.0.{3 + i}", PARTIAL) for i in range(21)]
        # 12 (16 - 4 reserved) are held open by the server; the other 9 closed at once
        assert wait_until(lambda: sum(map(_closed_by_server, stalled)) == 9, timeout=10)
        held = patient_scp.admission.open_connections()
        assert sum(held.values()) == 12 and "127.0.0.1" not in held
        run = _echo(patient_scp)
        assert run.returncode == 0, run.stderr
        held = patient_scp.admission.open_connections()
        held.pop("127.0.0.1", None)  # the echo's slot, given back as its thread ends
        assert sum(held.values()) == 12  # the strangers are all still stalled


def test_one_address_cannot_take_more_than_its_share(patient_scp: GatewaySCP) -> None:
    with ExitStack() as stack:
        stalled = [_stranger(stack, patient_scp, "127.0.0.3", PARTIAL) for _ in range(21)]
        assert wait_until(lambda: sum(map(_closed_by_server, stalled)) == 13, timeout=10)
        assert patient_scp.admission.open_connections() == {"127.0.0.3": 8}
        assert _echo(patient_scp).returncode == 0


def test_stalled_and_idle_connections_are_closed_after_the_timeouts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    with _scp(tmp_path, acse_timeout_s=1.0, pdu_timeout_s=0.5) as server, ExitStack() as stack:
        partial = [_stranger(stack, server, "127.0.0.3", PARTIAL) for _ in range(4)]
        idle = [_stranger(stack, server, "127.0.0.4", b"") for _ in range(4)]
        assert wait_until(lambda: all(map(_closed_by_server, partial + idle)), timeout=30)
        assert wait_until(lambda: not server.admission.open_connections(), timeout=30)
        assert _echo(server).returncode == 0
    messages = [r.getMessage() for r in caplog.records]
    assert any("no complete PDU within" in m for m in messages)
    assert not any(r.exc_info for r in caplog.records)


def test_a_pdu_announcing_gigabytes_is_refused_before_it_is_read(
    patient_scp: GatewaySCP, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    sent = 0
    with socket.create_connection(patient_scp.address, timeout=10) as sock:
        sock.sendall(HUGE)
        try:
            while sent < 256 * 1024**2:  # the server must hang up long before this
                sock.sendall(bytes(65536))
                sent += 65536
        except OSError:
            pass
    assert sent < 256 * 1024**2
    assert any("a PDU of 4294967295 bytes announced" in r.getMessage() for r in caplog.records)
    assert _echo(patient_scp).returncode == 0


def _item(kind: int, body: bytes) -> bytes:
    return struct.pack(">BBH", kind, 0, len(body)) + body


def _associate_rq(user_information: bytes | None, context_id: int = 1) -> bytes:
    context = _item(0x30, b"1.2.840.10008.1.1") + _item(0x40, b"1.2.840.10008.1.2")
    body = struct.pack(">HH", 1, 0) + b"RADSERVE".ljust(16) + b"ECHOSCU".ljust(16) + bytes(32)
    body += _item(0x10, b"1.2.840.10008.3.1.1.1")
    body += _item(0x20, bytes([context_id, 0, 0, 0]) + context)
    if user_information is not None:
        body += _item(0x50, user_information)
    return struct.pack(">BBL", 1, 0, len(body)) + body


MALFORMED = {
    "no user information": _associate_rq(None),
    "empty user information": _associate_rq(b""),
    "user information with a bad item": _associate_rq(_item(0x51, b"\x00")),
    "presentation context ID 0": _associate_rq(_item(0x51, bytes(4)), context_id=0),
    "truncated request": _associate_rq(None)[:40],
    "unknown PDU type": bytes.fromhex("09000000000400000000"),
    "items overrunning the PDU": bytes.fromhex("0100000000100001000052414453") + bytes(4),
}


@pytest.mark.parametrize("request_bytes", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_association_requests_get_one_line_and_no_traceback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, request_bytes: bytes
) -> None:
    caplog.set_level(logging.DEBUG)
    with _scp(tmp_path, acse_timeout_s=2, pdu_timeout_s=1) as server:
        with socket.create_connection(server.address, timeout=10) as sock:
            sock.sendall(request_bytes)
            try:
                answer = sock.recv(16)
                while answer and sock.recv(4096):
                    pass
            except OSError:
                answer = b""
        # never accepted: rejected (A-ASSOCIATE-RJ), aborted or closed
        assert answer[:1] in (b"", b"\x03", b"\x07")
        assert wait_until(lambda: not server.admission.open_connections(), timeout=15)
        assert _echo(server).returncode == 0
    assert not [r.getMessage() for r in caplog.records if r.exc_info]

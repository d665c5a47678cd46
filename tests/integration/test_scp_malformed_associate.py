"""Association requests the SCP cannot negotiate are answered, and leave nothing behind.

A presentation context with no transfer-syntax sub-item made pynetdicom's acceptor
thread die with IndexError in ``negotiate_as_acceptor``: the peer got no answer, and the
server kept the socket, the DUL thread and its wake-up pipe (3 file descriptors) for as
long as the peer held the connection, while its address's slot was given back, so the
per-host limit did not count them: 366 held connections took a receiving process to
1,022 open files and a real storescu was refused. A peer's maximum PDU length of 1-6
was accepted and the association aborted at its first answer ("division by zero").

Raw PDUs on real sockets against the SCP (in this process, and with receiving
processes), then dcmtk's storescu.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pydicom
import pytest
from pynetdicom import AE
from pynetdicom.association import Association
from pynetdicom.sop_class import CTImageStorage, Verification
from tests.factories.dicom_net import Intake, dcmtk_tool, loopback_scp_config, small_study, storescu
from tests.factories.waits import until

from radserve.gateway import GatewaySCP
from radserve.gateway.completeness import INTERRUPTED_MARKER

pytestmark = [
    pytest.mark.tools,
    pytest.mark.skipif(dcmtk_tool("storescu") is None, reason="dcmtk is not installed"),
]

QUIET_S = 1.0
HELD = 6  # malformed requests whose connections the peer keeps open (per host limit 8)
APP_CONTEXT = b"1.2.840.10008.3.1.1.1"
VERIFICATION = "1.2.840.10008.1.1"
CT = "1.2.840.10008.5.1.4.1.1.2"
IMPLICIT = "1.2.840.10008.1.2"
# A-ASSOCIATE-RJ bodies (reserved, result, source, reason): rejected-permanent by the
# service provider (ACSE), no reason given; by the service user, no reason given
REJECTED_UNNEGOTIABLE = bytes([0, 1, 2, 1])
REJECTED_MALFORMED = bytes([0, 1, 1, 1])


def _item(kind: int, body: bytes) -> bytes:
    return struct.pack(">BBH", kind, 0, len(body)) + body


def _associate_rq(
    contexts: tuple[tuple[int, str, tuple[str, ...]], ...], *, max_pdu: int = 16384
) -> bytes:
    body = struct.pack(">HH", 1, 0) + b"RADSERVE".ljust(16) + b"STORESCU".ljust(16)
    body += b"\0" * 32 + _item(0x10, APP_CONTEXT)
    for context_id, abstract, syntaxes in contexts:
        sub = _item(0x30, abstract.encode()) + b"".join(_item(0x40, s.encode()) for s in syntaxes)
        body += _item(0x20, bytes([context_id, 0, 0, 0]) + sub)
    user = _item(0x51, struct.pack(">I", max_pdu)) + _item(0x52, b"1.2.3.4")
    body += _item(0x50, user)
    return struct.pack(">BBI", 1, 0, len(body)) + body


def _echo_rq() -> bytes:
    """A C-ECHO-RQ command set (Implicit VR Little Endian) in one P-DATA-TF PDU."""
    uid = VERIFICATION.encode() + b"\0"  # even length
    elements = (
        struct.pack("<HHI", 0, 0x0002, len(uid))
        + uid
        + struct.pack("<HHIH", 0, 0x0100, 2, 0x0030)
        + struct.pack("<HHIH", 0, 0x0110, 2, 1)
        + struct.pack("<HHIH", 0, 0x0800, 2, 0x0101)
    )
    command = struct.pack("<HHII", 0, 0, 4, len(elements)) + elements
    pdv = struct.pack(">IBB", len(command) + 2, 1, 0x03) + command
    return struct.pack(">BBI", 4, 0, len(pdv)) + pdv


def _read_pdu(sock: socket.socket, timeout: float) -> tuple[int, bytes] | None:
    """One PDU (type, body), or None when the connection closed first."""
    sock.settimeout(timeout)
    data = b""
    while len(data) < 6:
        chunk = sock.recv(6 - len(data))
        if not chunk:
            return None
        data += chunk
    kind, _, length = struct.unpack(">BBI", data)
    body = b""
    while len(body) < length:
        chunk = sock.recv(length - len(body))
        if not chunk:
            return None
        body += chunk
    return kind, body


def _open_fds(pids: list[int]) -> int:
    return sum(len(os.listdir(f"/proc/{pid}/fd")) for pid in pids)


def _threads(pids: list[int]) -> int:
    return sum(len(os.listdir(f"/proc/{pid}/task")) for pid in pids)


@pytest.fixture(params=[1, 2], ids=["in-process", "receivers"])
def gateway(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[GatewaySCP, Intake]]:
    intake = Intake()
    config = loopback_scp_config(tmp_path / "gateway", QUIET_S, receivers=request.param)
    with GatewaySCP(config, intake) as scp:
        yield scp, intake


def _serving_pids(scp: GatewaySCP) -> list[int]:
    """The processes that run the associations: this one, or the receiving processes."""
    return scp.receiver_pids() or [os.getpid()]


def _settled(measure: Callable[[], int]) -> int:
    """A count once it stopped changing (a finished association's threads exit)."""
    last = measure()
    for _ in range(40):
        time.sleep(0.05)
        now = measure()
        if now == last:
            return now
        last = now
    return last


def test_unnegotiable_requests_are_rejected_and_release_their_socket_and_threads(
    gateway: tuple[GatewaySCP, Intake], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    scp, intake = gateway
    caplog.set_level(logging.WARNING)
    pids = _serving_pids(scp)
    in_process = pids == [os.getpid()]
    # an association runs once first: what a served connection leaves (imports, pools)
    assert storescu(*scp.address, small_study(tmp_path / "warm", seed=3)).returncode == 0
    until(lambda: not scp.admission.open_connections(), "the warm-up's slot given back", 10)
    fds = _settled(lambda: _open_fds(pids))
    threads = _settled(lambda: _threads(pids))

    held: list[socket.socket] = []
    try:
        for _ in range(HELD):
            sock = socket.create_connection(scp.address, timeout=10)
            sock.sendall(_associate_rq(((1, CT, ()),)))  # no transfer syntax sub-item
            held.append(sock)
        started = time.monotonic()
        answers = [_read_pdu(sock, timeout=5) for sock in held]
        # the peer is told at once: rejected-permanent (the same request fails again)
        assert answers == [(3, REJECTED_UNNEGOTIABLE)] * HELD
        assert time.monotonic() - started < 5
        # ... and, while the peer still holds its end, the server lets go of its own:
        # each closes (EOF), the slots come back, the fds and threads are as before
        for sock in held:
            assert sock.recv(1) == b""
        until(lambda: not scp.admission.open_connections(), "the slots given back", 10)
        own_sockets = HELD if in_process else 0  # the test's own ends, in this process
        until(
            lambda: _open_fds(pids) <= fds + own_sockets,
            "the server's sockets and wake-up pipes closed",
            10,
            state=lambda: (_open_fds(pids), fds + own_sockets),
        )
        until(
            lambda: _threads(pids) <= threads,
            "the associations' threads ended",
            10,
            state=lambda: (_threads(pids), threads),
        )
        if in_process:
            assert not [t for t in threading.enumerate() if t.name.startswith("AcceptorThread")]
        # a real sender is served meanwhile
        files = small_study(tmp_path / "study", seed=4)
        run = storescu(*scp.address, files)
        assert run.returncode == 0, run.stdout + run.stderr
        until(lambda: len(intake.studies) == 2, "the study handed over", 30)
    finally:
        for sock in held:
            sock.close()
    if in_process:  # (a receiving process logs through a relay of its own)
        lines = [
            r.getMessage() for r in caplog.records if "failed while negotiating" in r.getMessage()
        ]
        assert len(lines) == HELD
        assert "association from AE 'STORESCU' at 127.0.0.1 failed while negotiating" in lines[0]
        assert "answered A-ASSOCIATE-RJ (rejected-permanent)" in lines[0]
    assert not [r for r in caplog.records if r.exc_info]


@pytest.fixture
def scp(tmp_path: Path) -> Iterator[GatewaySCP]:
    with GatewaySCP(loopback_scp_config(tmp_path / "gateway", QUIET_S), Intake()) as server:
        yield server


@pytest.mark.parametrize("max_pdu", [1, 5, 6])
def test_a_maximum_pdu_too_small_for_any_answer_is_rejected_at_association(
    scp: GatewaySCP, max_pdu: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    with socket.create_connection(scp.address, timeout=10) as sock:
        sock.sendall(_associate_rq(((1, VERIFICATION, (IMPLICIT,)),), max_pdu=max_pdu))
        assert _read_pdu(sock, timeout=5) == (3, REJECTED_MALFORMED)
    assert any(
        f"its maximum PDU length {max_pdu} is too small to carry any data" in r.getMessage()
        for r in caplog.records
    )


@pytest.mark.parametrize("max_pdu", [0, 7])
def test_no_limit_and_the_least_workable_maximum_pdu_are_served(
    scp: GatewaySCP, max_pdu: int, caplog: pytest.LogCaptureFixture
) -> None:
    """0 is "no limit" (PS3.8 D.1); 7 carries one byte of a PDV per PDU."""
    caplog.set_level(logging.WARNING)
    with socket.create_connection(scp.address, timeout=10) as sock:
        sock.sendall(_associate_rq(((1, VERIFICATION, (IMPLICIT,)),), max_pdu=max_pdu))
        answer = _read_pdu(sock, timeout=5)
        assert answer is not None and answer[0] == 2  # A-ASSOCIATE-AC
        sock.sendall(_echo_rq())
        response = b""
        while True:  # the C-ECHO-RSP, in as many P-DATA-TF PDUs as the peer's limit needs
            pdu = _read_pdu(sock, timeout=5)
            assert pdu is not None and pdu[0] == 4, pdu
            response += pdu[1][6:]  # after the PDV's length, context ID and control header
            if pdu[1][5] & 0x02:  # the last fragment
                break
        # Status (0000,0900) US 0x0000
        assert struct.pack("<HHIH", 0, 0x0900, 2, 0) in response
        sock.sendall(struct.pack(">BBII", 5, 0, 4, 0))  # A-RELEASE-RQ
        released = _read_pdu(sock, timeout=5)
        assert released is not None and released[0] == 6
    assert not [r for r in caplog.records if "cannot be between" in r.getMessage()]


def test_an_association_thread_that_fails_once_established_aborts_and_cuts_the_study_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The other path of the same defect: the acceptor's thread fails after the
    association is established (here, made to fail serving a C-ECHO). The peer is
    aborted, the connection closed, and the instances it delivered are cut off (their
    study waits for the sender as after any abort)."""
    caplog.set_level(logging.WARNING)
    serve = Association._serve_request

    def failing(self: Association, msg: object, context_id: int) -> None:
        if self.is_acceptor and type(msg).__name__ == "C_ECHO":
            raise RuntimeError("a failure in the association thread")
        serve(self, msg, context_id)

    monkeypatch.setattr(Association, "_serve_request", failing)
    files = small_study(tmp_path / "study", slices=range(10, 12))
    config = loopback_scp_config(tmp_path / "gateway", QUIET_S, interrupted_quiet_s=120)
    with GatewaySCP(config, Intake()) as scp:
        ae = AE("PYNETDICOM")
        ae.add_requested_context(CTImageStorage)
        ae.add_requested_context(Verification)
        assoc = ae.associate(*scp.address, ae_title="RADSERVE")
        assert assoc.is_established
        for path in files:
            assert assoc.send_c_store(pydicom.dcmread(path)).Status == 0x0000
        started = time.monotonic()
        assoc.send_c_echo()  # before: no answer, the peer waited its DIMSE timeout (30 s)
        assert time.monotonic() - started < ae.dimse_timeout / 2
        until(lambda: assoc.is_aborted, "the peer aborted", 5)
        until(lambda: not scp.admission.open_connections(), "the slot given back", 10)
        until(
            lambda: not [t for t in threading.enumerate() if t.name.startswith("AcceptorThread")],
            "the association's threads ended",
            10,
        )
        [folder] = scp.instances.incoming.iterdir()
        until(lambda: (folder / INTERRUPTED_MARKER).exists(), "the study cut off", 5)
    lines = [r.getMessage() for r in caplog.records if "failed while running" in r.getMessage()]
    assert lines == [
        "association from AE 'PYNETDICOM' at 127.0.0.1 failed while running (RuntimeError): "
        "answered A-ABORT and closed"
    ]

"""A sender set up for plain DICOM on the gateway's TLS port (a PACS engineer who forgot
dcmtk's ``+tls``) is answered A-ASSOCIATE-RJ rejected-permanent in the clear, not dropped,
and the SCP logs one line naming its address and calling AE title; nothing it sends past
its A-ASSOCIATE-RQ is read, and garbage and TLS clients are served as before.

Found on 2026-12-07 with dcmtk 3.6.7 against a TLS SCP: ``echoscu`` without ``+tls``
printed "Peer aborted Association (or never connected)", the SCP's log named the address
only. Real dcmtk echoscu/storescu, pynetdicom as a plain SCU, raw sockets for garbage."""

from __future__ import annotations

import logging
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from pynetdicom import AE
from tests.factories.dicom_net import dcmtk_tool, small_study
from tests.factories.tls import HAVE_OPENSSL, Pki, make_pki
from tests.factories.waits import until

from radserve.config import TlsSettings
from radserve.gateway import CompletedStudy, GatewaySCP, ScpConfig
from radserve.gateway.config import Destination, Peer
from radserve.gateway.scu import Outcome, StoreSCU
from radserve.gateway.transport import PLAIN_ON_TLS_REJECT

pytestmark = [
    pytest.mark.tools,
    pytest.mark.skipif(dcmtk_tool("storescu") is None, reason="dcmtk is not installed"),
    pytest.mark.skipif(not HAVE_OPENSSL, reason="openssl is not installed"),
]

VERIFICATION = "1.2.840.10008.1.1"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def studies() -> list[CompletedStudy]:
    return []


def _scp(tmp_path: Path, pki: Pki, studies: list[CompletedStudy], receivers: int) -> GatewaySCP:
    config = ScpConfig(
        data_dir=tmp_path / "gw",
        port=0,
        quiet_s=0.5,
        receivers=receivers,
        tls=TlsSettings(cert=pki.server_cert, key=pki.server_key, ca=pki.ca),
        allowed_peers=(Peer("MODALITY", "127.0.0.1"),),
    )
    return GatewaySCP(config, studies.append)


@pytest.fixture
def scp(tmp_path: Path, pki: Pki, studies: list[CompletedStudy]) -> Iterator[GatewaySCP]:
    with _scp(tmp_path, pki, studies, receivers=1) as server:
        yield server


def _dcmtk(
    tool: str, scp: GatewaySCP, *args: str | Path, files: list[Path] = ()
) -> subprocess.CompletedProcess[str]:
    binary = dcmtk_tool(tool)
    assert binary is not None
    host, port = scp.address
    command = [binary, "-aet", "MODALITY", "-aec", "RADSERVE", "-to", "10", "-ta", "10"]
    command += [*map(str, args), host, str(port), *map(str, files)]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


def _tls(pki: Pki) -> list[str | Path]:
    return ["+tls", pki.client_key, pki.client_cert, "+cf", pki.ca]


def _said(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


@pytest.mark.parametrize("receivers", [1, 2])
def test_dcmtk_without_tls_is_told_it_was_rejected_and_stores_nothing(
    tmp_path: Path,
    pki: Pki,
    studies: list[CompletedStudy],
    receivers: int,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="radserve.gateway")
    files = small_study(tmp_path / "study", slices=range(10, 13))
    with _scp(tmp_path, pki, studies, receivers) as scp:
        echo = _dcmtk("echoscu", scp)
        store = _dcmtk("storescu", scp, files=files)
        for done in (echo, store):
            assert done.returncode != 0
            assert "Association Rejected" in done.stderr, done.stderr
            assert "Rejected Permanent" in done.stderr, done.stderr
            assert "Peer aborted" not in done.stderr, done.stderr
        if receivers == 1:  # a receiving process logs to its own stream
            said = until(
                lambda: _said(caplog, "AE 'MODALITY' sent a plain DICOM association request"),
                "the plain sender named",
                timeout=10,
            )
            assert all(m.startswith("TLS handshake with 127.0.0.1 failed:") for m in said)
            assert all("the peer must use DICOM TLS" in m for m in said)
        # the same sender with TLS is served, and stores the study
        assert _dcmtk("echoscu", scp, *_tls(pki)).returncode == 0
        assert _dcmtk("storescu", scp, *_tls(pki), files=files).returncode == 0
        until(lambda: studies, "the study stored over TLS", timeout=30)
        until(lambda: not scp.admission.open_connections(), "slots given back", timeout=10)
    assert len(studies) == 1 and len(studies[0].instances) == len(files)


def test_a_pynetdicom_sender_without_tls_gets_a_permanent_rejection(scp: GatewaySCP) -> None:
    ae = AE(ae_title="MODALITY")
    ae.add_requested_context(VERIFICATION)
    assoc = ae.associate(*scp.address, ae_title="RADSERVE")
    try:
        assert assoc.is_rejected
        rejection = assoc.acceptor.primitive
        # rejected-permanent, DICOM UL service-user, no reason given
        assert (rejection.result, rejection.result_source, rejection.diagnostic) == (1, 1, 1)
    finally:
        assoc.release()
        ae.shutdown()


def test_radserves_own_plain_echo_is_told_the_port_may_take_tls_only(scp: GatewaySCP) -> None:
    """``radserve gateway echo`` (and an outbox row) without TLS to a TLS-only port: the
    rejection (no reason given) said only "check the destination's AE configuration",
    which looked right; found following docs/security.md (2026-12-07)."""
    host, port = scp.address
    scu = StoreSCU("MODALITY", connect_timeout_s=5, acse_timeout_s=10, dimse_timeout_s=10)
    plain = scu.echo(Destination("pacs", "RADSERVE", host, port))
    assert plain.outcome is Outcome.PERMANENT, plain.message
    assert "rejected the association permanently: no reason given" in plain.message
    assert "whether its port takes DICOM TLS only: then set its tls" in plain.message


def _associate_rq(calling: bytes) -> bytes:
    """A minimal A-ASSOCIATE-RQ: fixed fields and one application context item."""
    context = b"1.2.840.10008.3.1.1.1"
    item = bytes([0x10, 0x00]) + len(context).to_bytes(2, "big") + context
    body = b"\x00\x01\x00\x00" + b"RADSERVE".ljust(16) + calling.ljust(16)[:16] + bytes(32)
    body += item
    return b"\x01\x00" + len(body).to_bytes(4, "big") + body


def _exchange(scp: GatewaySCP, data: bytes) -> bytes:
    """Send ``data``, keep the connection open, and read what comes back until the SCP
    closes it."""
    with socket.create_connection(scp.address, timeout=20) as sock:
        sock.sendall(data)
        answer = b""
        try:
            while chunk := sock.recv(4096):
                answer += chunk
        except ConnectionResetError:  # closed with some of what it sent unread
            pass
    return answer


def test_the_request_alone_is_read_and_answered_in_the_clear(
    scp: GatewaySCP, pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="radserve.gateway")
    # the answer comes, and the connection closes, while the client still holds it open:
    # the SCP waits for nothing past the request
    assert _exchange(scp, _associate_rq(b"MODALITY")) == PLAIN_ON_TLS_REJECT
    # a calling AE title that is not printable text is not logged
    assert _exchange(scp, _associate_rq(b"EVIL\n\x1b[31m")) == PLAIN_ON_TLS_REJECT
    said = until(
        lambda: len(got := _said(caplog, "sent a plain DICOM association request")) >= 2 and got,
        "both requests logged",
        timeout=10,
    )
    assert "AE 'MODALITY' sent" in said[0]
    assert "failed: it sent a plain DICOM" in said[1] and "EVIL" not in said[1]
    assert _dcmtk("echoscu", scp, *_tls(pki)).returncode == 0


def test_garbage_is_closed_unanswered_and_the_scp_serves_the_next_peer(
    scp: GatewaySCP, pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="radserve.gateway")
    garbage = {
        "random bytes": bytes(range(0x20, 0x80)) * 8,
        "a PDU type 1 with a length no request has": b"\x01\x00\x00\x00\x00\x02ab",
        "a PDU type 1 claiming 4 GiB": b"\x01\x00\xff\xff\xff\xff" + bytes(64),
    }
    for what, data in garbage.items():
        assert _exchange(scp, data) == b"", what
    until(
        lambda: _said(caplog, "not a readable one: closed unanswered"),
        "the unreadable request logged",
        timeout=10,
    )
    assert _dcmtk("echoscu", scp, *_tls(pki)).returncode == 0
    until(lambda: not scp.admission.open_connections(), "slots given back", timeout=10)

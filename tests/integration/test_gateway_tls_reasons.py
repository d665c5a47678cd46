"""DICOM TLS failures say what is wrong, on both sides of the gateway, against dcmtk
(found by the hospital-edge probe of session 37: each used to read the same few words).

- the SCP's log: a client certificate that is expired and one from another CA each say
  why (both read ``CERTIFICATE_VERIFY_FAILED``); plain DICOM sent to the TLS port and a
  TLS handshake sent to a plain port are named as such (they read ``WRONG_VERSION_NUMBER``
  and pynetdicom's ``Unknown PDU type received``), and the SCP serves the next peer;
- the outbox SCU's reason (the delivery's ``last_error``, ``radserve gateway echo``): a
  PACS certificate radserve cannot verify (another CA, a host it does not name), a PACS
  that refuses radserve's client certificate (none, expired), a PACS port that does not
  speak TLS and one that accepts the connection and never answers the handshake each
  say so (every one of them read "cannot connect to HOST:PORT" or "aborted or timed
  out"), and stay retried."""

from __future__ import annotations

import logging
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from tests.factories.dicom_net import dcmtk_tool
from tests.factories.ports import free_port
from tests.factories.tls import HAVE_OPENSSL, Pki, make_pki
from tests.factories.waits import until, wait_until

from radserve.commands.gateway import group as gateway_group
from radserve.config import TlsSettings
from radserve.gateway import CompletedStudy, GatewaySCP, Outcome, ScpConfig, StoreSCU
from radserve.gateway.config import Destination, Peer

pytestmark = [
    pytest.mark.tools,
    pytest.mark.skipif(dcmtk_tool("storescp") is None, reason="dcmtk is not installed"),
    pytest.mark.skipif(not HAVE_OPENSSL, reason="openssl is not installed"),
]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def expired(pki: Pki) -> tuple[Path, Path]:
    """A client certificate the test CA signed that is no longer valid (certificate and
    key)."""
    folder = pki.ca.parent
    key, csr, cert = folder / "expired.key", folder / "expired.csr", folder / "expired.pem"
    ext = folder / "expired.ext"
    ext.write_text("extendedKeyUsage=clientAuth\n")
    openssl = ["openssl", "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"]
    openssl += ["-nodes", "-keyout", str(key), "-out", str(csr), "-subj", "/CN=expired"]
    subprocess.run(openssl, capture_output=True, check=True, timeout=60)
    # -days -1: valid until a day before it was issued, i.e. expired (OpenSSL 3.0 has no
    # -not_after); OpenSSL's verification says "certificate has expired"
    sign = ["openssl", "x509", "-req", "-in", str(csr), "-CA", str(pki.ca)]
    sign += ["-CAkey", str(folder / "test-ca.key"), "-CAcreateserial", "-out", str(cert)]
    sign += ["-days", "-1", "-extfile", str(ext)]
    subprocess.run(sign, capture_output=True, check=True, timeout=60)
    return cert, key


def _scp(tmp_path: Path, tls: TlsSettings | None) -> GatewaySCP:
    studies: list[CompletedStudy] = []
    config = ScpConfig(
        data_dir=tmp_path / "gw",
        port=0,
        quiet_s=0.5,
        tls=tls,
        allowed_peers=(Peer("MODALITY", "127.0.0.1"), Peer("RADSERVE", "127.0.0.1")),
    )
    return GatewaySCP(config, studies.append)


@pytest.fixture
def tls_scp(tmp_path: Path, pki: Pki) -> Iterator[GatewaySCP]:
    with _scp(tmp_path, TlsSettings(cert=pki.server_cert, key=pki.server_key, ca=pki.ca)) as scp:
        yield scp


def _dcmtk(tool: str, scp: GatewaySCP, *args: str | Path) -> subprocess.CompletedProcess[str]:
    binary = dcmtk_tool(tool)
    assert binary is not None
    host, port = scp.address
    command = [binary, "-aet", "MODALITY", "-aec", "RADSERVE", "-to", "10", "-ta", "10"]
    command += [*map(str, args), host, str(port)]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


def _tls(pki: Pki, cert: Path | None = None, key: Path | None = None) -> list[str | Path]:
    return ["+tls", key or pki.client_key, cert or pki.client_cert, "+cf", pki.ca]


def _said(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


# --- the SCP ---------------------------------------------------------------------------------
def test_the_scp_log_says_why_a_client_certificate_failed(
    tls_scp: GatewaySCP,
    pki: Pki,
    expired: tuple[Path, Path],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="radserve.gateway")
    assert _dcmtk("echoscu", tls_scp, *_tls(pki, *expired)).returncode != 0
    assert _dcmtk("echoscu", tls_scp, *_tls(pki, pki.rogue_cert, pki.rogue_key)).returncode != 0
    said = lambda: _said(caplog, "TLS handshake with 127.0.0.1 failed")  # noqa: E731
    assert wait_until(lambda: len(said()) >= 2, timeout=10), said()
    assert any(m.endswith("(client certificate: certificate has expired)") for m in said())
    assert any("(client certificate: unable to get local issuer" in m for m in said()), said()
    assert _dcmtk("echoscu", tls_scp, *_tls(pki)).returncode == 0  # the modality still is


def test_the_scp_log_says_a_peer_sent_no_certificate(
    tls_scp: GatewaySCP, pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    """A TLS client without a certificate (dcmtk's ``+tls`` needs one; ``radserve gateway
    echo --tls-ca`` alone sends none) was logged as OpenSSL's name only,
    ``PEER_DID_NOT_RETURN_A_CERTIFICATE``; found following docs/security.md (2026-12-07)."""
    caplog.set_level(logging.WARNING, logger="radserve.gateway")
    scu = StoreSCU("MODALITY", connect_timeout_s=5, acse_timeout_s=10, dimse_timeout_s=10)
    host, port = tls_scp.address
    refused = scu.echo(Destination("scp", "RADSERVE", host, port, TlsSettings(ca=pki.ca)))
    assert refused.outcome is not Outcome.SENT, refused.message
    said = lambda: _said(caplog, "TLS handshake with 127.0.0.1 failed")  # noqa: E731
    assert wait_until(lambda: said(), timeout=10), said()
    assert said()[0].endswith(
        "PEER_DID_NOT_RETURN_A_CERTIFICATE (the peer sent no client certificate; gateway.tls "
        "asks each peer for one its ca signed)"
    ), said()


def test_plain_dicom_on_the_tls_port_is_named(
    tls_scp: GatewaySCP, pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="radserve.gateway")
    assert _dcmtk("echoscu", tls_scp).returncode != 0
    until(
        lambda: _said(caplog, "plain DICOM association request to this TLS-only port"),
        "the plain request named",
        timeout=10,
    )
    assert not _said(caplog, "WRONG_VERSION_NUMBER")
    assert _dcmtk("echoscu", tls_scp, *_tls(pki)).returncode == 0


def test_a_tls_handshake_on_the_plain_port_is_named(
    tmp_path: Path, pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    with _scp(tmp_path, None) as plain:
        assert _dcmtk("echoscu", plain, *_tls(pki)).returncode != 0
        until(
            lambda: _said(caplog, "began a TLS handshake on this plain-TCP port"),
            "the TLS client named",
            timeout=10,
        )
        assert not _said(caplog, "Unknown PDU type")
        assert _dcmtk("echoscu", plain).returncode == 0  # and the SCP serves the next
        until(lambda: not plain.admission.open_connections(), "slots given back", timeout=10)


# --- the outbox SCU --------------------------------------------------------------------------
class TlsStoreScp:
    """dcmtk's storescp with TLS, as the PACS: requires radserve's client certificate."""

    def __init__(self, folder: Path, pki: Pki) -> None:
        binary = dcmtk_tool("storescp")
        assert binary is not None
        folder.mkdir(parents=True)
        self.port = free_port()
        self.command = [binary, "-aet", "PACS", "-od", str(folder), "+tls"]
        self.command += [str(pki.server_key), str(pki.server_cert), "+cf", str(pki.ca)]
        self.command += [str(self.port)]

    def __enter__(self) -> TlsStoreScp:
        self.process = subprocess.Popen(
            self.command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        assert wait_until(self._listening, timeout=15)
        return self

    def _listening(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
        except OSError:
            return False
        return True

    def __exit__(self, *_: object) -> None:
        self.process.terminate()
        self.process.wait(10)


def test_the_outbox_says_why_tls_with_a_pacs_failed(
    tmp_path: Path, pki: Pki, expired: tuple[Path, Path]
) -> None:
    scu = StoreSCU("RADSERVE", connect_timeout_s=2, acse_timeout_s=5, dimse_timeout_s=5)
    ours = {"cert": pki.client_cert, "key": pki.client_key}

    def echo(port: int, tls: TlsSettings, host: str = "127.0.0.1") -> tuple[Outcome, str]:
        result = scu.echo(Destination("pacs", "PACS", host, port, tls=tls))
        return result.outcome, result.message

    with TlsStoreScp(tmp_path / "pacs", pki) as pacs:
        assert echo(pacs.port, TlsSettings(ca=pki.ca, **ours))[0] is Outcome.SENT  # control
        rogue_ca = pki.rogue_cert.parent / "rogue-ca.pem"
        cases = {
            "another CA": echo(pacs.port, TlsSettings(ca=rogue_ca, **ours)),
            "another host": echo(pacs.port, TlsSettings(ca=pki.ca, **ours), host="127.0.0.3"),
            "no client certificate": echo(pacs.port, TlsSettings(ca=pki.ca)),
            "expired client certificate": echo(
                pacs.port, TlsSettings(ca=pki.ca, cert=expired[0], key=expired[1])
            ),
        }
    with _scp(tmp_path, None) as plain:
        cases["plain port"] = echo(plain.address[1], TlsSettings(ca=pki.ca, **ours))
    with socket.create_server(("127.0.0.1", 0)) as hung:  # takes the connection, says nothing
        cases["hung"] = echo(hung.getsockname()[1], TlsSettings(ca=pki.ca, **ours))
        # `radserve gateway echo` names its own option, not the setting it does not read
        tls = ["--tls-cert", pki.client_cert, "--tls-key", pki.client_key, "--tls-ca", pki.ca]
        args = ["echo", "--host", "127.0.0.1", "--port", str(hung.getsockname()[1])]
        cli = CliRunner().invoke(
            gateway_group, [*args, "--ae", "PACS", "--timeout", "2", *map(str, tls)]
        )
    assert cli.exit_code != 0 and "within 2 s (--timeout)" in cli.output, cli.output
    assert {outcome for outcome, _ in cases.values()} == {Outcome.RETRY}, cases
    said = {name: message for name, (_, message) in cases.items()}
    assert "cannot verify the destination's certificate" in said["another CA"], said
    assert "IP address mismatch" in said["another host"], said
    assert "refused radserve's client certificate" in said["no client certificate"], said
    assert "CERTIFICATE_EXPIRED" in said["expired client certificate"], said
    assert "does not answer in TLS" in said["plain port"], said
    assert "did not answer the TLS handshake within 2 s" in said["hung"], said
    assert not any("cannot connect" in m or "aborted or timed out" in m for m in said.values())

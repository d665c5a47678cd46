"""DICOM TLS: a calling AE title tied to client certificates (``gateway.ae_certificates``)
is accepted only with one of them, and a certificate tied to titles only as one of
those; real associations from dcmtk's echoscu/storescu ``+tls`` on loopback, with
certificates a test CA signed.

Found on 2026-12-07: the SCP checked that a client certificate came from
``gateway.tls.ca`` and, separately, that the calling AE title was on the allow-list,
but never that the two belonged together: a workstation holding any certificate of the
hospital's CA could call as the CT scanner's AE title (or as the PACS, whose storage
commitment reports the outbox trusts). Nothing could tie them: the setting did not
exist, and without it (the default, unchanged) every pairing below is accepted."""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.factories.dicom_net import dcmtk_tool, small_study
from tests.factories.tls import HAVE_OPENSSL, Pki, another_client, fingerprint, make_pki
from tests.factories.waits import wait_until

from radserve.config import DicomPeer, TlsSettings
from radserve.gateway import CompletedStudy, GatewaySCP, ScpConfig

pytestmark = [
    pytest.mark.tools,
    pytest.mark.skipif(dcmtk_tool("echoscu") is None, reason="dcmtk is not installed"),
    pytest.mark.skipif(not HAVE_OPENSSL, reason="openssl is not installed"),
]

REJECTED = "Calling AE Title Not Recognized"  # dcmtk's words for A-ASSOCIATE-RJ reason 3


class Certs:
    """The PKI's client certificate ("modality"), a CT scanner's and a workstation's,
    all signed by the same CA."""

    def __init__(self, pki: Pki) -> None:
        self.pki = pki
        self.modality = (pki.client_cert, pki.client_key)
        self.ct = another_client(pki, "ct-scanner-1")
        self.workstation = another_client(pki, "workstation-7")


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return Certs(make_pki(tmp_path_factory.mktemp("pki")))


def _scp(
    tmp_path: Path,
    certs: Certs,
    studies: list[CompletedStudy],
    *,
    receivers: int = 1,
    **gateway: object,
) -> GatewaySCP:
    pki = certs.pki
    config = ScpConfig(
        data_dir=tmp_path / "gw",
        port=0,
        quiet_s=0.5,
        tls=TlsSettings(cert=pki.server_cert, key=pki.server_key, ca=pki.ca),
        receivers=receivers,
        **gateway,
    )
    return GatewaySCP(config, studies.append)


TIED = {
    "MODALITY": ["cn:modality"],  # by subject common name
    "CT1": ["sha256:{ct}"],  # by fingerprint, as openssl prints it
}


def _tied(certs: Certs) -> dict[str, list[str]]:
    ct = fingerprint(certs.ct[0])
    return {title: [i.format(ct=ct) for i in ids] for title, ids in TIED.items()}


def _call(
    tool: str, scp: GatewaySCP, calling: str, cert: tuple[Path, Path], files: list[Path] = ()
) -> subprocess.CompletedProcess[str]:
    binary = dcmtk_tool(tool)
    assert binary is not None
    host, port = scp.address
    command = [binary, "-aet", calling, "-aec", "RADSERVE", "-to", "10", "-ta", "10"]
    command += ["+tls", str(cert[1]), str(cert[0]), "+cf", str(scp.config.tls.ca)]
    command += [host, str(port), *map(str, files)]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture
def studies() -> list[CompletedStudy]:
    return []


@pytest.fixture
def tied_scp(tmp_path: Path, certs: Certs, studies: list[CompletedStudy]) -> Iterator[GatewaySCP]:
    with _scp(tmp_path, certs, studies, ae_certificates=_tied(certs)) as server:
        yield server


@pytest.mark.parametrize(
    ("calling", "cert", "accepted"),
    [
        ("MODALITY", "modality", True),
        ("CT1", "ct", True),
        ("MODALITY", "ct", False),  # CT1's certificate calling as another listed title
        ("CT1", "modality", False),
        ("CT1", "workstation", False),  # a certificate listed nowhere, as a tied title
        ("ANYONE", "ct", False),  # a tied certificate as a title it is not tied to
        ("ANYONE", "workstation", True),  # neither tied: as before
    ],
)
def test_a_tied_ae_title_calls_only_with_its_certificate(
    tied_scp: GatewaySCP,
    certs: Certs,
    calling: str,
    cert: str,
    accepted: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="radserve.gateway.scp")
    echo = _call("echoscu", tied_scp, calling, getattr(certs, cert))
    if accepted:
        assert echo.returncode == 0, echo.stdout + echo.stderr
        assert not caplog.records
        return
    assert echo.returncode != 0
    assert REJECTED in echo.stdout + echo.stderr  # A-ASSOCIATE-RJ, not a TLS failure
    [line] = [r.getMessage() for r in caplog.records if "rejected" in r.getMessage()]
    assert line.startswith(f"association from AE {calling!r} at 127.0.0.1 rejected: ")
    assert f"(certificate SHA-256 {fingerprint(getattr(certs, cert)[0])})" in line
    assert "gateway.ae_certificates" in line


def test_a_refused_pairing_stores_nothing(
    tied_scp: GatewaySCP, certs: Certs, studies: list[CompletedStudy], tmp_path: Path
) -> None:
    files = small_study(tmp_path / "sent", slices=range(10, 12))
    refused = _call("storescu", tied_scp, "CT1", certs.workstation, files)
    assert refused.returncode != 0 and REJECTED in refused.stdout + refused.stderr
    stored = _call("storescu", tied_scp, "CT1", certs.ct, files)
    assert stored.returncode == 0, stored.stdout + stored.stderr
    assert wait_until(lambda: studies, timeout=15)
    assert len(studies) == 1 and len(studies[0].instances) == 2


def test_receiving_processes_check_the_pairing_too(
    tmp_path: Path, certs: Certs, studies: list[CompletedStudy]
) -> None:
    """gateway.receivers: the TLS handshake, and so the certificate, is the receiving
    process's."""
    with _scp(tmp_path, certs, studies, receivers=2, ae_certificates=_tied(certs)) as scp:
        refused = _call("echoscu", scp, "MODALITY", certs.ct)
        accepted = _call("echoscu", scp, "MODALITY", certs.modality)
        assert wait_until(lambda: not scp.admission.open_connections(), timeout=15)
    assert refused.returncode != 0 and REJECTED in refused.stdout + refused.stderr
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr


def test_an_allow_list_refusal_comes_first(
    tmp_path: Path, certs: Certs, studies: list[CompletedStudy], caplog: pytest.LogCaptureFixture
) -> None:
    """Both rules: the allow-list's (title and address) before the certificate's."""
    caplog.set_level(logging.WARNING, logger="radserve.gateway.scp")
    peers = (DicomPeer("CT1", "127.0.0.1"), DicomPeer("MODALITY", "127.0.0.1"))
    with _scp(tmp_path, certs, studies, allowed_peers=peers, ae_certificates=_tied(certs)) as scp:
        stranger = _call("echoscu", scp, "ANYONE", certs.workstation)
        wrong = _call("echoscu", scp, "CT1", certs.modality)
        right = _call("echoscu", scp, "CT1", certs.ct)
    assert stranger.returncode != 0 and wrong.returncode != 0
    assert right.returncode == 0, right.stdout + right.stderr
    lines = [r.getMessage() for r in caplog.records if "rejected" in r.getMessage()]
    assert lines[0].endswith("rejected: calling AE title not recognised")
    assert "certificate SHA-256" in lines[1]


def test_without_ae_certificates_any_certificate_of_the_ca_calls_as_any_title(
    tmp_path: Path, certs: Certs, studies: list[CompletedStudy]
) -> None:
    """The default, unchanged: the CA's signature is all that is checked."""
    with _scp(tmp_path, certs, studies) as scp:
        assert not scp.certificates.active
        for calling, cert in [("CT1", certs.modality), ("MODALITY", certs.workstation)]:
            echo = _call("echoscu", scp, calling, cert)
            assert echo.returncode == 0, echo.stdout + echo.stderr

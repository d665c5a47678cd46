"""DICOM TLS (PS3.15 B.1) on both sides of the gateway, against dcmtk's TLS options, with
certificates the test makes (a CA, a server and a client certificate it signed, and a
client certificate from another CA):

- the SCP: echoscu/storescu ``+tls KEY CERT +cf CA`` get through; a client certificate
  from another CA, none at all, plain TCP and TLS 1.1 are refused;
- the outbox SCU: sends to dcmtk's ``storescp +tls`` verifying it against the CA and
  offering its client certificate; a PACS it cannot verify gets nothing."""

from __future__ import annotations

import logging
import socket
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pydicom
import pytest
from tests.factories.dicom_net import dcmtk_tool, free_port, small_study
from tests.factories.tls import HAVE_OPENSSL, Pki, handshake, make_pki, tls_1_1_is_possible_here
from tests.factories.waits import wait_until

from radserve.config import TlsSettings, load_settings
from radserve.gateway import CompletedStudy, GatewaySCP, Outcome, ScpConfig, StoreSCU
from radserve.gateway.config import Destination, destinations
from radserve.gateway.scu import OutgoingFile

pytestmark = [
    pytest.mark.tools,
    pytest.mark.skipif(dcmtk_tool("storescu") is None, reason="dcmtk is not installed"),
    pytest.mark.skipif(not HAVE_OPENSSL, reason="openssl is not installed"),
]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _scp(
    tmp_path: Path, pki: Pki, studies: list[CompletedStudy], receivers: int = 1, **tls: bool
) -> GatewaySCP:
    settings = TlsSettings(cert=pki.server_cert, key=pki.server_key, ca=pki.ca, **tls)
    config = ScpConfig(
        data_dir=tmp_path / "gw", port=0, quiet_s=0.5, tls=settings, receivers=receivers
    )
    return GatewaySCP(config, studies.append)


@pytest.fixture
def studies() -> list[CompletedStudy]:
    return []


@pytest.fixture
def scp(tmp_path: Path, pki: Pki, studies: list[CompletedStudy]) -> Iterator[GatewaySCP]:
    with _scp(tmp_path, pki, studies) as server:
        yield server


def _dcmtk(
    tool: str, server: GatewaySCP, *args: str | Path, files: list[Path] = ()
) -> subprocess.CompletedProcess[str]:
    binary = dcmtk_tool(tool)
    assert binary is not None
    host, port = server.address
    command = [binary, "-aet", "MODALITY", "-aec", "RADSERVE", "-to", "10", "-ta", "10"]
    command += [*map(str, args), host, str(port), *map(str, files)]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


def _tls(pki: Pki, cert: Path | None = None, key: Path | None = None) -> list[str | Path]:
    return ["+tls", key or pki.client_key, cert or pki.client_cert, "+cf", pki.ca]


def test_dcmtk_with_a_certificate_from_the_ca_stores_over_tls(
    scp: GatewaySCP, pki: Pki, studies: list[CompletedStudy], tmp_path: Path
) -> None:
    assert scp.tls
    echo = _dcmtk("echoscu", scp, *_tls(pki))
    assert echo.returncode == 0, echo.stderr
    files = small_study(tmp_path / "sent", slices=range(10, 13))
    store = _dcmtk("storescu", scp, "-R", *_tls(pki), files=files)
    assert store.returncode == 0, store.stderr
    assert wait_until(lambda: studies, timeout=15)
    assert len(studies[0].instances) == 3


def test_receiving_processes_do_the_handshake_and_refuse_untrusted_clients(
    tmp_path: Path, pki: Pki, studies: list[CompletedStudy]
) -> None:
    """gateway.receivers: the SCP process hands the raw socket over; TLS is the
    receiving process's (the same context, the same client-certificate rule)."""
    files = small_study(tmp_path / "sent", slices=range(10, 12))
    with _scp(tmp_path, pki, studies, receivers=2) as scp:
        plain = _dcmtk("storescu", scp, files=files)
        assert plain.returncode != 0
        stored = _dcmtk("storescu", scp, "-R", *_tls(pki), files=files)
        assert stored.returncode == 0, stored.stderr
        assert wait_until(lambda: studies, timeout=15)
        assert wait_until(lambda: not scp.admission.open_connections(), timeout=15)
    assert len(studies[0].instances) == 2


def test_clients_without_a_trusted_certificate_are_refused(
    scp: GatewaySCP, pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="radserve.gateway")
    stranger = _dcmtk("echoscu", scp, *_tls(pki, pki.rogue_cert, pki.rogue_key))
    anonymous = _dcmtk("echoscu", scp, "+tla", "+cf", pki.ca)
    plain = _dcmtk("echoscu", scp)
    assert stranger.returncode != 0 and anonymous.returncode != 0 and plain.returncode != 0

    def failures() -> list[str]:
        return [r.getMessage() for r in caplog.records if "TLS handshake" in r.getMessage()]

    assert wait_until(lambda: len(failures()) >= 3, timeout=10), failures()
    assert not any(r.exc_info for r in caplog.records)
    # and the SCP still serves the trusted modality afterwards
    assert _dcmtk("echoscu", scp, *_tls(pki)).returncode == 0


def test_client_certificate_can_be_optional(
    tmp_path: Path, pki: Pki, studies: list[CompletedStudy]
) -> None:
    with _scp(tmp_path, pki, studies, require_client_cert=False) as server:
        anonymous = _dcmtk("echoscu", server, "+tla", "+cf", pki.ca)
        assert anonymous.returncode == 0, anonymous.stderr
        # a certificate that is offered is still checked
        stranger = _dcmtk("echoscu", server, *_tls(pki, pki.rogue_cert, pki.rogue_key))
        assert stranger.returncode != 0


def test_tls_below_1_2_is_refused(scp: GatewaySCP, pki: Pki) -> None:
    assert tls_1_1_is_possible_here(pki)  # so the refusal below is the SCP's
    assert handshake(scp.address, pki, maximum=ssl.TLSVersion.TLSv1_1).startswith("refused")
    assert handshake(scp.address, pki, maximum=ssl.TLSVersion.TLSv1_2) == "TLSv1.2"
    assert handshake(scp.address, pki, maximum=ssl.TLSVersion.TLSv1_3) == "TLSv1.3"


class TlsStoreScp:
    """dcmtk's storescp with TLS as the PACS: requires radserve's client certificate."""

    def __init__(self, folder: Path, pki: Pki) -> None:
        binary = dcmtk_tool("storescp")
        assert binary is not None
        self.folder = folder
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

    def received(self) -> list[str]:
        return sorted(str(pydicom.dcmread(p).SOPInstanceUID) for p in self.folder.iterdir())


def _outgoing(files: list[Path]) -> list[OutgoingFile]:
    items = []
    for key, path in enumerate(files):
        ds = pydicom.dcmread(path, stop_before_pixels=True)
        syntax = str(ds.file_meta.TransferSyntaxUID)
        items.append(OutgoingFile(key, path, str(ds.SOPClassUID), syntax, str(ds.SOPInstanceUID)))
    return items


def test_outbox_scu_sends_to_a_tls_pacs_it_verifies(tmp_path: Path, pki: Pki) -> None:
    files = small_study(tmp_path / "results", slices=range(10, 12))
    with TlsStoreScp(tmp_path / "pacs", pki) as pacs:
        peer = {"ae_title": "PACS", "host": "127.0.0.1", "port": pacs.port, "tls": True}
        tls = {"ca": str(pki.ca), "cert": str(pki.client_cert), "key": str(pki.client_key)}
        settings = load_settings(
            None, gateway__allowed_peers=[peer], gateway__tls=tls, gateway__acse_timeout_s=5
        )
        [destination] = destinations(settings.gateway)  # the per-peer `tls: true`
        assert destination.tls is not None
        scu = StoreSCU.from_settings(settings.gateway)
        assert scu.echo(destination).outcome is Outcome.SENT
        results: list[Outcome] = []
        scu.send(destination, _outgoing(files), lambda _item, result: results.append(result))
        assert [r.outcome for r in results] == [Outcome.SENT, Outcome.SENT]
        assert pacs.received() == sorted(str(pydicom.dcmread(f).SOPInstanceUID) for f in files)

        def via(tls: TlsSettings | None) -> Outcome:
            target = Destination("pacs", "PACS", "127.0.0.1", pacs.port, tls=tls)
            return scu.echo(target).outcome

        assert via(TlsSettings(ca=pki.ca)) is not Outcome.SENT  # no client certificate
        assert via(None) is not Outcome.SENT  # plain TCP to a TLS port
        # a PACS whose certificate the CA did not sign is not sent to
        rogue_ca = pki.rogue_cert.parent / "rogue-ca.pem"
        assert via(TlsSettings(ca=rogue_ca, cert=pki.client_cert, key=pki.client_key)) is not (
            Outcome.SENT
        )

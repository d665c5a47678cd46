"""The outbox's SCU against radserve's own SCP as the peer (no Orthanc needed): SEG and
SR contexts, a rejected association is permanent, 0xA700 is retried, TLS."""

from __future__ import annotations

import datetime as dt
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pydicom
import pytest
from tests.factories.dicom_net import study_with_results

from radserve.gateway import (
    Destination,
    GatewaySCP,
    Outbox,
    Outcome,
    Peer,
    ScpConfig,
    StoreSCU,
    TlsSettings,
)
from radserve.gateway.own_results import OwnResults
from radserve.store import Store, init_store
from radserve.store.outbox import OutboxState, OutboxStore

T0 = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    _, paths = study_with_results(tmp_path_factory.mktemp("results"))
    return paths


@pytest.fixture
def rows(tmp_path: Path) -> Iterator[OutboxStore]:
    store: Store = init_store(f"sqlite:///{tmp_path / 'radserve.db'}")
    yield OutboxStore(store.engine)
    store.close()


class _KeepEverything(OwnResults):
    """The peer stands in for a PACS, which keeps radserve's results (radserve's own SCP
    would acknowledge and drop them)."""

    def check(self, dataset: object, intake: str) -> bool:
        return False


def _peer(tmp_path: Path, **kwargs) -> GatewaySCP:
    config = ScpConfig(data_dir=tmp_path / "peer", port=0, **kwargs)
    return GatewaySCP(config, lambda _: None, own_results=_KeepEverything())


def _destination(server: GatewaySCP, **kwargs) -> Destination:
    host, port = server.address
    return Destination(name="peer", ae_title="RADSERVE", host=host, port=port, **kwargs)


def test_seg_and_sr_are_delivered_once(tmp_path: Path, rows: OutboxStore, results) -> None:
    with _peer(tmp_path, allowed_peers=(Peer("RS-OUT", "127.0.0.1"),)) as server:
        outbox = Outbox(rows, [_destination(server)], StoreSCU("RS-OUT"))
        outbox.enqueue(results, now=T0)
        report = outbox.deliver_pending(T0)
        assert (report.claimed, report.sent) == (len(results), len(results))
        assert outbox.deliver_pending(T0 + dt.timedelta(hours=1)).claimed == 0
        stored = sorted(server.instances.quarantine.rglob("*.dcm"))  # SEG/SR are not images
    sent = {pydicom.dcmread(p).SOPInstanceUID: pydicom.dcmread(p) for p in results}
    assert {p.stem for p in stored} == set(sent)
    assert all(pydicom.dcmread(p) == sent[p.stem] for p in stored)  # same data elements
    classes = {pydicom.dcmread(p, stop_before_pixels=True).SOPClassUID.name for p in stored}
    assert classes == {"Segmentation Storage", "Comprehensive 3D SR Storage"}


def test_rejected_association_is_a_permanent_failure(
    tmp_path: Path, rows: OutboxStore, results
) -> None:
    with _peer(tmp_path, allowed_peers=(Peer("SOMEONE-ELSE"),)) as server:
        outbox = Outbox(rows, [_destination(server)], StoreSCU("RS-OUT"))
        outbox.enqueue(results[:1], now=T0)
        assert outbox.deliver_pending(T0).failed == 1
    [item] = rows.items()
    assert item.state is OutboxState.FAILED_PERMANENT
    assert "rejected the association permanently: calling AE title not recognised" in (
        item.last_error or ""
    )
    assert "'RS-OUT'" in (item.last_error or "")


def test_out_of_resources_is_retried_until_stored(
    tmp_path: Path, rows: OutboxStore, results
) -> None:
    with _peer(tmp_path, min_free_bytes=1 << 62) as server:
        outbox = Outbox(rows, [_destination(server)], StoreSCU())
        outbox.enqueue(results[:1], now=T0)
        assert outbox.deliver_pending(T0).retried == 1
        [item] = rows.items()
        assert item.state is OutboxState.PENDING and "0xA700" in (item.last_error or "")
        server.instances.min_free_bytes = 0
        assert outbox.deliver_pending(item.next_attempt_at).sent == 1
        assert len(list(server.instances.quarantine.rglob("*.dcm"))) == 1


def test_unreachable_peer_is_retried(rows: OutboxStore, results) -> None:
    from tests.factories.dicom_net import free_port

    destination = Destination("down", "PACS", "127.0.0.1", free_port())
    outbox = Outbox(rows, [destination], StoreSCU(connect_timeout_s=2))
    outbox.enqueue(results[:1], now=T0)
    assert outbox.deliver_pending(T0).retried == 1
    assert "cannot connect to 127.0.0.1" in (rows.items()[0].last_error or "")


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 from the openssl command line."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed: DICOM TLS is untested here")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    command = ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"]
    command += ["-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1"]
    command += ["-subj", "/CN=radserve-test", "-addext", "subjectAltName=IP:127.0.0.1"]
    subprocess.run(command, capture_output=True, check=True, timeout=30)
    return cert, key


def test_tls_echo_with_mutual_authentication(tmp_path: Path, certificate) -> None:
    cert, key = certificate
    tls = TlsSettings(cert=cert, key=key, ca=cert)
    with _peer(tmp_path, tls=tls) as server:
        scu = StoreSCU(connect_timeout_s=5, acse_timeout_s=5)
        assert scu.echo(_destination(server, tls=tls)).outcome is Outcome.SENT
        plain = scu.echo(_destination(server))
        assert plain.outcome is Outcome.RETRY
        anonymous = scu.echo(_destination(server, tls=TlsSettings(ca=cert)))  # no client cert
        assert anonymous.outcome is Outcome.RETRY

"""The outbox's SCU against real peers on loopback (no Orthanc needed): radserve's own
SCP (SEG and SR contexts, a rejected association is permanent, 0xA700 is retried, TLS),
and peers that answer the way real PACSs sometimes do: warning statuses count as stored
and failure statuses do not; a peer that does not take SEG gets the SR and a clear
permanent error for the SEG (never retried forever); an association limit, an abort
mid-store and a peer that never answers are retried and then delivered (and delay no
other destination); a peer taking
only Implicit VR Little Endian with a 4 KiB PDU gets every result intact. dcmtk's
storescp where it can play the part, a scripted pynetdicom acceptor where it cannot."""

from __future__ import annotations

import datetime as dt
import logging
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pydicom
import pytest
from pydicom.uid import ImplicitVRLittleEndian
from pynetdicom import AE
from tests.factories.awkward_peer import scripted_peer, storescp
from tests.factories.dicom_net import dcmtk_tool, study_with_results
from tests.factories.waits import until

from radserve.gateway import (
    Destination,
    GatewaySCP,
    Outbox,
    Outcome,
    Peer,
    RetryPolicy,
    ScpConfig,
    StoreSCU,
    TlsSettings,
)
from radserve.gateway.conformance import COMPREHENSIVE_3D_SR, SEGMENTATION, VERIFICATION
from radserve.gateway.outbox import LaneWorkers
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
    """radserve's own SCP below its free-space reserve drops a data set as it arrives
    (gateway.min_free_bytes is checked from the first fragment) and answers 0xA700 with
    the reserve named: the SCU keeps the row for a retry, stored once space is back."""
    with _peer(tmp_path, min_free_bytes=1 << 62) as server:
        outbox = Outbox(rows, [_destination(server)], StoreSCU())
        outbox.enqueue(results[:1], now=T0)
        assert outbox.deliver_pending(T0).retried == 1
        [item] = rows.items()
        assert item.state is OutboxState.PENDING and "0xA700" in (item.last_error or "")
        assert "gateway.min_free_bytes" in (item.last_error or "")  # the Error Comment
        assert not list(server.instances.quarantine.rglob("*.dcm"))
        server.instances.min_free_bytes = 0
        assert outbox.deliver_pending(item.next_attempt_at).sent == 1
        assert len(list(server.instances.quarantine.rglob("*.dcm"))) == 1


def test_unreachable_peer_is_retried(rows: OutboxStore, results) -> None:
    from tests.factories.dicom_net import free_port

    destination = Destination("down", "PACS", "127.0.0.1", free_port())
    outbox = Outbox(rows, [destination], StoreSCU(connect_timeout_s=2))
    outbox.enqueue(results[:1], now=T0)
    assert outbox.deliver_pending(T0).retried == 1
    assert "cannot connect to down (PACS@127.0.0.1:" in (rows.items()[0].last_error or "")


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
        # plain DICOM to the TLS port: rejected-permanent in the clear since 2026-12-07 (the
        # same request never succeeds), no longer a dropped connection to retry
        plain = scu.echo(_destination(server))
        assert plain.outcome is Outcome.PERMANENT, plain.message
        assert "rejected the association" in plain.message
        anonymous = scu.echo(_destination(server, tls=TlsSettings(ca=cert)))  # no client cert
        assert anonymous.outcome is Outcome.RETRY


LATER = T0 + dt.timedelta(days=1)
needs_storescp = pytest.mark.skipif(dcmtk_tool("storescp") is None, reason="no dcmtk storescp")


def _outbox(rows: OutboxStore, destination: Destination, **timeouts: float) -> Outbox:
    return Outbox(rows, [destination], StoreSCU(**timeouts), policy=RetryPolicy())


@pytest.mark.parametrize(
    ("status", "state"),
    [
        (0xB000, OutboxState.SENT),  # coercion of data elements
        (0xB006, OutboxState.SENT),  # elements discarded
        (0xB007, OutboxState.SENT),  # data set does not match SOP class
        (0xB123, OutboxState.SENT),  # a vendor's own warning
        (0xA700, OutboxState.PENDING),  # out of resources
        (0xA7FE, OutboxState.PENDING),
        (0x0110, OutboxState.PENDING),  # processing failure
        (0xA900, OutboxState.FAILED_PERMANENT),  # data set does not match SOP class
        (0xA9FF, OutboxState.FAILED_PERMANENT),
        (0xC000, OutboxState.FAILED_PERMANENT),  # cannot understand
        (0xC123, OutboxState.FAILED_PERMANENT),
    ],
)
def test_warning_statuses_count_as_stored_and_failures_do_not(
    rows: OutboxStore, results: list[Path], status: int, state: OutboxState, caplog
) -> None:
    with scripted_peer(statuses=(status,)) as peer:
        outbox = _outbox(rows, peer.destination)
        outbox.enqueue(results[:1], now=T0)
        with caplog.at_level(logging.INFO, logger="radserve.gateway.outbox"):
            outbox.deliver_pending(T0)
    [item] = rows.items()
    assert item.state is state and item.attempts == 1 and len(peer.received) == 1
    code = f"0x{status:04X}"
    if state is OutboxState.SENT:  # delivered, and the warning kept for an operator
        assert (item.last_error or "").startswith(f"C-STORE status {code} (warning: ")
        assert "stored) from awkward" in (item.last_error or "")
        [warned] = [r for r in caplog.records if "with a warning" in r.getMessage()]
        assert code in warned.getMessage() and warned.levelno == logging.WARNING
    else:
        assert code in (item.last_error or "")


def test_a_peer_without_seg_gets_the_sr_and_a_clear_permanent_error_for_the_seg(
    rows: OutboxStore, results: list[Path]
) -> None:
    with scripted_peer(sop_classes=[COMPREHENSIVE_3D_SR]) as peer:
        outbox = _outbox(rows, peer.destination)
        outbox.enqueue(results, now=T0)
        outbox.deliver_pending(T0)
        assert outbox.deliver_pending(LATER).claimed == 0  # not retried: a person must act
    by_class: dict[str, list] = {}
    for item in rows.items():
        by_class.setdefault(item.sop_class_uid, []).append(item)
    assert set(by_class) == {SEGMENTATION, COMPREHENSIVE_3D_SR}
    assert {i.state for i in by_class[COMPREHENSIVE_3D_SR]} == {OutboxState.SENT}
    for seg in by_class[SEGMENTATION]:
        assert seg.state is OutboxState.FAILED_PERMANENT and seg.attempts == 1
        assert "accepted no presentation context for Segmentation Storage" in seg.last_error
        assert "enable this SOP class at the destination" in seg.last_error
    assert {d.SOPClassUID for d in peer.received} == {COMPREHENSIVE_3D_SR}


def test_the_peers_association_limit_is_retried_then_delivered(
    rows: OutboxStore, results: list[Path]
) -> None:
    with scripted_peer(max_associations=1) as peer:
        other = AE(ae_title="OTHER-SCU")
        other.add_requested_context(VERIFICATION)
        host, port = peer.destination.host, peer.destination.port
        held = other.associate(host, port, ae_title="AWKWARD")  # the one it allows
        assert held.is_established
        outbox = _outbox(rows, peer.destination)
        outbox.enqueue(results, now=T0)
        assert outbox.deliver_pending(T0).retried == len(results)
        assert {i.state for i in rows.items()} == {OutboxState.PENDING}
        [error] = {i.last_error for i in rows.items()}
        assert "rejected the association for now: local limit exceeded" in (error or "")
        held.release()
        assert outbox.deliver_pending(LATER).sent == len(results)
    assert len(peer.received) == len(results)


@needs_storescp
def test_a_peer_aborting_mid_store_is_retried_and_gets_everything(
    tmp_path: Path, rows: OutboxStore, results: list[Path]
) -> None:
    with storescp(tmp_path / "aborting", "--abort-after") as destination:
        outbox = _outbox(rows, destination)
        outbox.enqueue(results, now=T0)
        assert outbox.deliver_pending(T0).retried == len(results)
    errors = sorted(i.last_error or "" for i in rows.items())
    aborted = "aborted the association instead of answering the C-STORE"
    assert any(aborted in e for e in errors), errors
    # every row says why: the rest of the batch names the abort too (session 36)
    assert all(aborted in e for e in errors), errors
    assert sum("ended at an earlier file of this batch" in e for e in errors) >= 1, errors
    with storescp(tmp_path / "back", port=destination.port):
        assert outbox.deliver_pending(LATER).sent == len(results)
    stored = {pydicom.dcmread(p).SOPInstanceUID for p in (tmp_path / "back").iterdir()}
    assert stored == {pydicom.dcmread(p).SOPInstanceUID for p in results}


@needs_storescp
def test_a_peer_that_never_answers_times_out_and_is_retried(
    tmp_path: Path, rows: OutboxStore, results: list[Path]
) -> None:
    with storescp(tmp_path / "silent", "--sleep-during", "30") as destination:
        outbox = _outbox(rows, destination, dimse_timeout_s=1)
        outbox.enqueue(results[:1], now=T0)
        assert outbox.deliver_pending(T0).retried == 1
    [item] = rows.items()
    assert item.state is OutboxState.PENDING
    assert "no C-STORE response from storescp" in (item.last_error or "")
    assert "within 1 s (gateway.dimse_timeout_s)" in (item.last_error or "")


def test_a_peer_slow_to_accept_is_retried_naming_the_acse_timeout_and_then_served(
    rows: OutboxStore, results: list[Path]
) -> None:
    with scripted_peer(accept_delay_s=2.0) as peer:
        outbox = _outbox(rows, peer.destination, acse_timeout_s=0.5)
        outbox.enqueue(results, now=T0)
        assert outbox.deliver_pending(T0).retried == len(results)
        [error] = {i.last_error for i in rows.items()}
        assert "no answer to the association request from awkward" in (error or "")
        assert "within 0.5 s (gateway.acse_timeout_s" in (error or "")
        patient = Outbox(rows, [peer.destination], StoreSCU(acse_timeout_s=10))
        assert patient.deliver_pending(LATER).sent == len(results)
    assert {d.SOPInstanceUID for d in peer.received} == {i.sop_instance_uid for i in rows.items()}


@needs_storescp
def test_an_implicit_vr_only_peer_with_a_4k_pdu_gets_every_result_intact(
    tmp_path: Path, rows: OutboxStore, results: list[Path]
) -> None:
    with storescp(tmp_path / "implicit", "+xi", "-pdu", "4096") as destination:
        outbox = _outbox(rows, destination)
        outbox.enqueue(results, now=T0)
        assert outbox.deliver_pending(T0).sent == len(results)
    sent = {(d := pydicom.dcmread(p)).SOPInstanceUID: d for p in results}
    received = [pydicom.dcmread(p) for p in (tmp_path / "implicit").iterdir()]
    assert {d.SOPInstanceUID for d in received} == set(sent)
    for dataset in received:
        assert dataset.file_meta.TransferSyntaxUID == ImplicitVRLittleEndian
        original = sent[dataset.SOPInstanceUID]
        assert dataset.get("PixelData") == original.get("PixelData")  # OB arrives as OW
        for both in (dataset, original):
            both.pop("PixelData", None)
        assert dataset.to_json_dict() == original.to_json_dict()


def test_the_peers_error_comment_is_kept_without_the_patients_identifiers(
    rows: OutboxStore, results: list[Path], caplog
) -> None:
    """A PACS may quote the patient in its Error Comment; radserve's logs never do."""

    def comment(dataset: pydicom.Dataset) -> str:
        name = str(dataset.PatientName).replace("^", " ").upper()
        return f"ID {dataset.PatientID} is {name} here; conflict"

    with scripted_peer(statuses=(0xA900,), comment=comment) as peer:
        outbox = _outbox(rows, peer.destination)
        outbox.enqueue(results[:1], now=T0)
        with caplog.at_level(logging.INFO):
            outbox.deliver_pending(T0)
    [item] = rows.items()
    sent = pydicom.dcmread(results[0], stop_before_pixels=True)
    name = [part for part in str(sent.PatientName).split("^") if len(part) > 1]
    secrets = [sent.PatientID, *name]
    assert len(peer.received) == 1 and name, sent.PatientName
    for text in [item.last_error or "", *(r.getMessage() for r in caplog.records)]:
        assert not any(secret.lower() in text.lower() for secret in secrets), text
    assert "0xA900" in (item.last_error or "") and "conflict" in (item.last_error or "")


@needs_storescp
def test_a_dead_destination_delays_no_other_destination(
    tmp_path: Path, rows: OutboxStore, results: list[Path]
) -> None:
    """Two PACS: one a socket that takes the connection and never speaks (a hung or
    SIGSTOPped peer: each association waits out ``acse_timeout_s``), queued first; the
    other dcmtk's storescp. One sender for both would reach storescp only after the dead
    peer's timeout; with a sender per destination storescp has every result while the
    dead peer's rows are still being sent."""
    with socket.create_server(("127.0.0.1", 0)) as silent, storescp(tmp_path / "ok") as ok:
        dead = Destination("dead", "DEAD", "127.0.0.1", silent.getsockname()[1])
        outbox = Outbox(rows, [dead, ok], StoreSCU("RS-OUT", acse_timeout_s=600))
        outbox.enqueue(results, destinations=["dead", "storescp"])
        lanes = LaneWorkers(outbox, outbox.destinations, prefix="test-outbox")
        lanes.start()
        try:

            def states(name: str) -> set[OutboxState]:
                return {item.state for item in rows.items(destination=name)}

            until(lambda: states("storescp") == {OutboxState.SENT}, "storescp has all", 20)
            assert states("dead") == {OutboxState.SENDING}  # still waiting for an answer
        finally:
            silent.close()  # the waiting association is reset: its lane can stop
            lanes.stop()
    assert len(list((tmp_path / "ok").iterdir())) == len(results)  # exactly once
    assert states("dead") == {OutboxState.PENDING}  # retried later

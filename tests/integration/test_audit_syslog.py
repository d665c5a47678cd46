"""Audit export to an IHE ATNA collector: RFC 5424 syslog over TLS with RFC 5425 octet
counting, carrying DICOM PS3.15 A.5 audit messages (or FHIR AuditEvents), received by a
TLS syslog server the test starts with certificates it generates. The collector being
down delays delivery without blocking appends; everything arrives once it is back."""

from __future__ import annotations

import base64
import socket
import threading
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.factories.dicom_net import free_port
from tests.factories.syslog import Collector, make_certificate
from tests.factories.waits import wait_until

from radserve.audit import AuditEvent
from radserve.config import Settings, load_settings
from radserve.store import Store
from radserve.store.audited import open_audited


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return make_certificate(tmp_path_factory.mktemp("tls"))


def _settings(tmp_path: Path, port: int, cert: Path, fmt: str = "dicom") -> Settings:
    return load_settings(
        None,
        data_dir=str(tmp_path / "data"),
        audit__checkpoint_interval_s=0,
        audit__syslog={
            "host": "127.0.0.1", "port": port, "tls": {"ca": str(cert)}, "format": fmt,
            "retry_first_s": 0.1, "retry_max_s": 0.2, "poll_s": 0.2, "timeout_s": 2,
        },
    )  # fmt: skip


@pytest.fixture
def collector_port() -> int:
    return free_port()


@pytest.fixture
def collector(collector_port: int, certificate) -> Iterator[Collector]:
    c = Collector(collector_port, *certificate)
    yield c
    c.close()


def _open(settings: Settings) -> tuple[Store, object]:
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    store, trail = open_audited(settings, export=True)
    trail.start()
    return store, trail


def test_each_record_arrives_as_a_dicom_audit_message(
    tmp_path: Path, collector: Collector, certificate
) -> None:
    store, trail = _open(_settings(tmp_path, collector.port, certificate[0]))
    try:
        store.append_audit(AuditEvent(action="config.loaded", subject="settings",
                                      payload={"fingerprint": "f" * 64}))  # fmt: skip
        read = AuditEvent(
            action="phi.read",
            subject="job-1",
            actor_key_id="k1",
            client_address="10.0.0.7",
            payload={"resource": "report"},
        )
        store.append_audit(read)
        assert wait_until(lambda: len(collector.records()) == 2, timeout=20)
        assert wait_until(
            lambda: any(m["msgid"] == "RADSERVE-CHECKPOINT" for m in collector.parsed()), 20
        )
    finally:
        trail.stop()  # type: ignore[attr-defined]
        store.close()
    first, second = collector.records()
    records = list(
        open_audited(_settings(tmp_path, collector.port, certificate[0]))[0].iter_audit()
    )
    assert first["pri"] == 10 * 8 + 5  # authpriv.notice
    assert first["sd"]["seq"] == "1" and first["sd"]["hash"] == records[0].hash
    xml = ET.fromstring(second["body"])  # type: ignore[arg-type]
    assert xml.tag == "AuditMessage"
    event = xml.find("EventIdentification")
    assert event is not None and event.get("EventActionCode") == "R"
    event_id = event.find("EventID")
    assert event_id is not None and event_id.get("csd-code") == "110110"
    assert event_id.get("codeSystemName") == "DCM"
    who = xml.find("ActiveParticipant")
    assert who is not None and who.get("UserID") == "k1"
    assert who.get("NetworkAccessPointID") == "10.0.0.7"
    assert xml.find("AuditSourceIdentification") is not None
    objects = xml.findall("ParticipantObjectIdentification")
    assert objects[0].get("ParticipantObjectID") == "job-1"
    details = {
        d.get("type"): base64.b64decode(d.get("value", "")).decode()
        for d in objects[1].findall("ParticipantObjectDetail")
    }
    assert details["hash"] == records[1].hash and details["prev_hash"] == records[0].hash


def test_collector_down_then_up_gets_everything_once_in_order(
    tmp_path: Path, collector_port: int, certificate
) -> None:
    settings = _settings(tmp_path, collector_port, certificate[0])
    store, trail = _open(settings)  # nothing listens on collector_port yet
    try:
        for i in range(5):
            store.append_audit(AuditEvent(action="test.event", subject=f"s{i}"))  # not blocked
        assert trail.exporter is not None  # type: ignore[attr-defined]
        assert wait_until(lambda: trail.exporter.down_since is not None, timeout=10)  # type: ignore[attr-defined]
        collector = Collector(collector_port, *certificate)
        try:
            assert wait_until(lambda: len(collector.records()) == 5, timeout=30)
            store.append_audit(AuditEvent(action="test.event", subject="after"))
            assert wait_until(lambda: len(collector.records()) == 6, timeout=20)
        finally:
            trail.stop()  # type: ignore[attr-defined]
            store.close()
        # a restart resumes after the cursor: nothing is sent twice
        store, trail = _open(settings)
        store.append_audit(AuditEvent(action="test.event", subject="restarted"))
        assert wait_until(lambda: len(collector.records()) == 7, timeout=20)
        trail.stop()  # type: ignore[attr-defined]
        store.close()
        seqs = [int(m["sd"]["seq"]) for m in collector.records()]  # type: ignore[index]
        assert seqs == list(range(1, 8))
    finally:
        collector.close()


def test_fhir_audit_events(tmp_path: Path, collector: Collector, certificate) -> None:
    from fhir.resources.R4B.auditevent import AuditEvent as FhirAuditEvent

    store, trail = _open(_settings(tmp_path, collector.port, certificate[0], fmt="fhir"))
    try:
        store.append_audit(AuditEvent(action="job.failed", subject="job-9"))
        assert wait_until(lambda: len(collector.records()) == 1, timeout=20)
    finally:
        trail.stop()  # type: ignore[attr-defined]
        store.close()
    resource = FhirAuditEvent.model_validate_json(collector.records()[0]["body"])  # type: ignore[arg-type]
    assert resource.outcome == "4" and resource.type.code == "110100"


def test_a_broken_chain_stops_the_export_with_an_alert(
    tmp_path: Path, collector: Collector, certificate
) -> None:
    store, trail = _open(_settings(tmp_path, collector.port, certificate[0]))
    try:
        store.append_audit(AuditEvent(action="test.event", subject="a"))
        assert wait_until(lambda: len(collector.records()) == 1, timeout=20)
        with store.engine.begin() as connection:  # a forged row, hashed without the key
            connection.exec_driver_sql(
                "INSERT INTO audit_records (seq, ts, action, payload, prev_hash, hash) "
                "SELECT 2, ts, 'key.created', '{}', hash, '" + "e" * 64 + "' FROM audit_records"
            )
        trail.exporter.notify()  # type: ignore[attr-defined]
        assert wait_until(
            lambda: any(m["msgid"] == "RADSERVE-ALERT" for m in collector.parsed()), 20
        )
    finally:
        trail.stop()  # type: ignore[attr-defined]
        store.close()
    alert = next(m for m in collector.parsed() if m["msgid"] == "RADSERVE-ALERT")
    assert alert["pri"] == 10 * 8 + 2 and len(collector.records()) == 1


def test_a_collector_that_accepts_and_never_answers_does_not_hold_the_stop(
    tmp_path: Path, certificate
) -> None:
    """A listener that takes the connection and never answers the TLS handshake (a hung
    collector, or the wrong service on its port): the export's thread waits on it for
    ``timeout_s`` (an hour here). Before, the stop joined the thread for 10 s and then
    ran the last round itself, on a new connection to the same collector: it waited
    another ``timeout_s``, racing the thread for the connection and the cursor."""
    silent = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    threading.Thread(target=lambda: held.append(silent.accept()[0]), daemon=True).start()
    settings = load_settings(
        None,
        data_dir=str(tmp_path / "data"),
        audit__checkpoint_interval_s=0,
        audit__syslog={
            "host": "127.0.0.1", "port": silent.getsockname()[1],
            "tls": {"ca": str(certificate[0])}, "timeout_s": 300, "poll_s": 0.2,
        },
    )  # fmt: skip
    store, trail = _open(settings)
    try:
        store.append_audit(AuditEvent(action="test.event", subject="s"))
        assert wait_until(lambda: held, timeout=10)  # the export is in its handshake
        stopping = threading.Thread(target=lambda: trail.exporter.stop(timeout=1.0))  # type: ignore[attr-defined]
        stopping.start()
        stopping.join(60)  # the old code: another hour
        assert not stopping.is_alive()
        assert not trail.exporter._thread.is_alive()  # type: ignore[attr-defined]
    finally:
        store.close()
        silent.close()
        for conn in held:
            conn.close()

"""A real server pushes a job's critical finding (declared in the lesion model's model.yaml)
to three real loopback receivers, a webhook, a TLS syslog collector and a FHIR server,
all down when the result is recorded and back later: each gets it exactly once (the
webhook with its token, the collector as one RFC 5424 alert, the FHIR server as a
Communication + Flag valid in R4), and each push and acknowledgement is audited and
counted."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from tests.factories.dicom_net import free_port
from tests.factories.fhir_server import Answer, FhirServer
from tests.factories.service import (
    ServerThread,
    auth,
    create_key,
    live_server,
    make_study,
    settings_for,
    upload,
    wait_job,
)
from tests.factories.syslog import Collector, make_certificate
from tests.factories.waits import WAIT_SCALE, until

from radserve.api import create_app
from radserve.config import load_settings
from radserve.ingest import discover_series, load_series, save_nifti
from radserve.service import Service
from radserve.store import AuditRecord
from radserve.store.outbox import OutboxItem, OutboxKind, OutboxState, OutboxStore

REPO = Path(__file__).resolve().parents[2]
R4_PYTHON = Path(
    os.environ.get("RADSERVE_TEST_FHIR_R4_PYTHON", REPO / ".venv-fhir-r4" / "bin" / "python")
)
RECEIVERS = ("critical:ward", "critical:siem", "critical:ehr")


def _rows(service: Service) -> list[OutboxItem]:
    return sorted(
        OutboxStore(service.store.engine).items(kind=OutboxKind.CRITICAL),
        key=lambda r: RECEIVERS.index(r.destination),
    )


def _declare_in_model_yaml(root: Path) -> None:
    """The lesion model declares any liver lesion critical, in its own model.yaml."""
    path = root / "assets" / "models" / "lesions-test" / "1.0.0" / "model.yaml"
    manifest = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**manifest, "critical": [{"label": "liver_lesion"}]}))


def _metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample of the Prometheus exposition ``text`` (0 when absent)."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return 0.0


def test_critical_finding_reaches_each_receiver_once_after_it_comes_back(
    tmp_path: Path,
) -> None:
    receiver = FhirServer()  # down: nothing listens on its port yet
    ehr = FhirServer()
    cert, key = make_certificate(tmp_path)
    syslog_port = free_port()
    settings = settings_for(
        tmp_path,
        critical__receivers=[
            {"name": "ward", "url": receiver.url, "token": "crit-tok", "timeout_s": 5},
            {
                "name": "siem",
                "kind": "syslog",
                "host": "127.0.0.1",
                "port": syslog_port,
                "tls": {"ca": str(cert)},
                "timeout_s": 5,
            },
            {"name": "ehr", "kind": "fhir", "url": ehr.url, "token": "ehr-tok", "flag": True},
        ],
        # a site rule no phantom lesion meets: the model's own rule still applies (union)
        critical__rules=[{"label": "liver_lesion", "min_long_axis_mm": 500}],
        critical__retry_first_s=0.2,
        critical__retry_max_s=0.5,
    )
    _declare_in_model_yaml(tmp_path)
    service = Service(settings)
    collector: Collector | None = None
    try:
        with (
            ServerThread(create_app(service)) as srv,
            httpx.Client(base_url=srv.url, timeout=60) as c,
        ):
            assert service.wait_warm(60 * WAIT_SCALE)
            key_ = create_key(service.store, "submit")
            admin = create_key(service.store, "admin")
            files = make_study(tmp_path / "study", extra={"PatientName": "Doe^Critical"})
            submitted = c.post("/v1/studies", files=upload(files), headers=auth(key_)).json()
            job = wait_job(c, submitted["id"], key_)
            assert job["state"] == "succeeded", job
            report = c.get(f"/v1/jobs/{job['id']}/report", headers=auth(key_)).json()
            lesions = [f for f in report["findings"] if f["label"] == "liver_lesion"]
            assert len(lesions) == 1, report["findings"]

            # held until the result was recorded, then tried at once and retried while down
            def tried_twice() -> list[OutboxItem] | None:
                rows = _rows(service)
                return rows if len(rows) == 3 and all(r.attempts >= 2 for r in rows) else None

            rows = until(tried_twice, "three rows tried twice", 15, state=lambda: _rows(service))
            assert [r.destination for r in rows] == list(RECEIVERS)
            for row in rows:
                assert row.state in (OutboxState.PENDING, OutboxState.SENDING), row
                assert row.attempts >= 2 and row.job_id == job["id"]
            assert "cannot reach the receiver" in (rows[0].last_error or "")
            assert "cannot reach the syslog collector tls://127.0.0.1" in (rows[1].last_error or "")
            assert "cannot reach the FHIR server" in (rows[2].last_error or "")

            receiver.up()
            ehr.up()
            collector = Collector(syslog_port, cert, key)
            until(
                lambda: [r.state for r in _rows(service)] == [OutboxState.SENT] * 3,
                "the three pushes sent",
                30,
                state=lambda: _rows(service),
            )
            time.sleep(1.5)  # a second push, were there one, would have happened by now
            (received,) = receiver.received
            notice = received.json()
            assert received.headers["Authorization"] == "Bearer crit-tok"
            assert notice["job_id"] == job["id"]
            assert notice["finding"]["label"] == "liver_lesion"
            assert notice["finding"]["finding_id"] == lesions[0]["finding_id"]
            assert notice["rule"] == "label liver_lesion, model lesions-test"
            assert "Doe" not in received.body.decode()  # no patient name in a notice

            # sent is written to the socket: the collector's thread parses it on its own time
            (message,) = until(
                lambda: [m for m in collector.parsed() if m["msgid"] == "RADSERVE-CRITICAL"],
                "the collector to parse the notice",
                15,
            )
            assert message["pri"] == 16 * 8 + 1  # local0.alert
            assert message["sd"] == {"notice": notice["id"], "job": job["id"],
                                     "label": "liver_lesion"}  # fmt: skip
            assert json.loads(message["body"]) == notice  # type: ignore[arg-type]

            (posted,) = ehr.received
            assert posted.headers["Authorization"] == "Bearer ehr-tok"
            _check_communication(posted.json(), notice, tmp_path)

            # acknowledgements are audited through the group commit, after the row is sent
            def acknowledged() -> list[AuditRecord] | None:
                records = list(service.store.iter_audit())
                acks = sum(r.action == "critical.acknowledged" for r in records)
                return records if acks >= len(RECEIVERS) else None

            records = until(acknowledged, "an acknowledgement audited per receiver", 15)
            queued = [r for r in records if r.action == "critical.queued"]
            acked = [r for r in records if r.action == "critical.acknowledged"]
            assert sorted(r.payload["receiver"] for r in queued) == sorted(RECEIVERS)
            assert {r.subject for r in queued} == {job["id"]}
            assert {r.payload["notice_id"] for r in queued} == {notice["id"]}
            assert sorted(r.payload["receiver"] for r in acked) == sorted(RECEIVERS)
            assert all(r.payload["result_to_ack_s"] > 0 for r in acked)

            metrics = c.get("/metrics", headers=auth(admin)).text
            for name in ("ward", "siem", "ehr"):
                sent = _metric(
                    metrics, "radserve_critical_pushes_total", outcome="sent", receiver=name
                )
                retried = _metric(
                    metrics, "radserve_critical_pushes_total", outcome="retry", receiver=name
                )
                assert (name, sent, retried >= 2) == (name, 1.0, True), metrics
                count = _metric(metrics, "radserve_critical_push_seconds_count", receiver=name)
                assert count == 1
            assert _metric(metrics, "radserve_critical_findings_total", label="liver_lesion") == 1
    finally:
        receiver.down()
        ehr.down()
        if collector is not None:
            collector.close()


def _check_communication(bundle: dict, notice: dict, tmp_path: Path) -> None:
    """The FHIR push: the job's resources + a stat alert Communication and a Flag that
    reference them; valid in R4B (fhir.resources) and, with the side venv, R4 4.0.1."""
    from fhir.resources.R4B.bundle import Bundle

    Bundle.model_validate(bundle)
    resources = {e["resource"]["resourceType"]: e for e in bundle["entry"]}
    assert bundle["type"] == "transaction"
    communication = resources["Communication"]["resource"]
    assert communication["priority"] == "stat" and communication["status"] == "completed"
    assert communication["category"][0]["coding"][0]["code"] == "alert"
    assert communication["identifier"][0]["value"] == f"urn:uuid:{notice['id']}"
    assert resources["Communication"]["request"]["ifNoneExist"].startswith("identifier=")
    urls = {e["resource"]["resourceType"]: e["fullUrl"] for e in bundle["entry"]}
    assert communication["subject"]["reference"] == urls["Patient"]
    about = {a.get("reference") for a in communication["about"]}
    assert urls["ImagingStudy"] in about
    # the report itself by identifier only: the job's own Bundle creates it, complete
    assert "DiagnosticReport" not in urls
    (report_ref,) = [a for a in communication["about"] if a.get("type") == "DiagnosticReport"]
    assert report_ref["identifier"]["value"].startswith("urn:oid:")
    # only what the Communication references (and what that references) is carried
    finding_urls = {urls[k] for k in ("Patient", "ImagingStudy", "Device")}
    assert finding_urls <= {e["fullUrl"] for e in bundle["entry"]}
    assert communication["sender"]["reference"] == urls["Device"]
    flag = resources["Flag"]["resource"]
    assert flag["status"] == "active" and flag["subject"]["reference"] == urls["Patient"]
    if R4_PYTHON.is_file():
        path = tmp_path / "critical-bundle.json"
        path.write_text(json.dumps(bundle))
        checked = subprocess.run(
            [str(R4_PYTHON), str(REPO / "tools" / "fhir_r4_validate.py"), str(path)],
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert checked.returncode == 0, checked.stdout + checked.stderr


def test_a_nifti_volume_s_critical_finding_reaches_the_webhook_not_the_fhir_server(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A NIfTI volume has no patient or study a FHIR Communication could name: its
    critical finding goes to the webhook, and the FHIR receiver's failure is audited with
    that reason; before session 35 it was logged as an error, as if the study could not
    be read ("the job's FHIR resources could not be built")."""
    hook, ehr = FhirServer(), FhirServer()
    hook.up()
    ehr.up()
    settings = settings_for(
        tmp_path,
        critical__receivers=[
            {"name": "ward", "url": hook.url},
            {"name": "ehr", "kind": "fhir", "url": ehr.url},
        ],
    )
    _declare_in_model_yaml(tmp_path)
    make_study(tmp_path / "dicom")
    volume = load_series(discover_series(tmp_path / "dicom")[0]).volume
    save_nifti(volume, tmp_path / "ct.nii.gz")
    part = [("files", ("ct.nii.gz", (tmp_path / "ct.nii.gz").read_bytes(), "application/gzip"))]
    try:
        with live_server(settings) as live:
            c, key, service = live["client"], live["submit"], live["service"]
            job = wait_job(
                c, c.post("/v1/studies", files=part, headers=auth(key)).json()["id"], key
            )
            assert job["state"] == "succeeded", job
            until(lambda: len(hook.received) == 1, "the webhook's notice")

            def failed() -> list[AuditRecord] | None:
                rows = [r for r in service.store.iter_audit() if r.action == "critical.failed"]
                return rows or None

            (audited,) = until(failed, "the FHIR receiver's failure audited")
            assert audited.payload["receiver"] == "critical:ehr"
            assert "no DICOM study" in str(audited.payload["answer"])
        assert ehr.received == []
        errors = [r for r in caplog.records if r.levelname == "ERROR" and "critical" in r.name]
        assert errors == [], [r.getMessage() for r in errors]
    finally:
        hook.down()
        ehr.down()


def test_receiver_settings_are_validated_and_the_token_is_masked(tmp_path: Path) -> None:
    url = "http://127.0.0.1:9/hook"
    ok = load_settings(None, critical__receivers=[{"name": "desk", "url": url, "token": "s3cret"}])
    assert "s3cret" not in ok.to_yaml()
    bad = [
        {"receivers": [{"name": "desk", "url": "ftp://x"}]},
        {"receivers": [{"name": "a", "url": url}, {"name": "a", "url": url}]},
        {"receivers": [{"name": "desk", "url": url, "secret": "x"}]},
        {"rules": [{"label": "liver_lesion", "min_long_axis_mm": 0}]},
        {"receivers": [{"name": "desk"}]},  # a webhook needs a url
        {"receivers": [{"name": "s", "kind": "syslog"}]},  # needs a host
        {"receivers": [{"name": "s", "kind": "syslog", "host": "h", "url": url}]},
        {"receivers": [{"name": "s", "kind": "syslog", "host": "h", "transport": "udp"}]},
        {"receivers": [{"name": "s", "kind": "syslog", "host": "h", "transport": "tcp",
                        "tls": {"ca": "/x.pem"}}]},
        {"receivers": [{"name": "f", "kind": "fhir"}]},  # no url and no fhir.url
        {"receivers": [{"name": "w", "url": url, "flag": True}]},  # flag: fhir only
    ]  # fmt: skip
    for section in bad:
        with pytest.raises(Exception, match="critical"):
            load_settings(None, **{f"critical__{k}": v for k, v in section.items()})


def test_fhir_notices_that_can_never_succeed_stop_audited_and_counted(tmp_path: Path) -> None:
    """A FHIR critical-finding notice that cannot ever succeed is not retried forever:
    a Bundle file that is not JSON, a 5xx whose OperationOutcome refuses the content,
    a 4xx. Each ends ``failed_permanent`` at its first attempt, is audited
    (``critical.failed``), counted (``outcome="failed"``) and shown in the outbox
    status operators read (``/v1/ops/outbox``, metrics), as the other receivers' are."""
    ehr = FhirServer()
    settings = settings_for(
        tmp_path,
        critical__receivers=[{"name": "ehr", "kind": "fhir", "url": ehr.url}],
        critical__retry_first_s=0.2,
        critical__retry_max_s=0.5,
    )
    service = Service(settings)
    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=1)  # due for this test's sends only
    box = service.critical.outbox  # type: ignore[union-attr]
    bundle = {"resourceType": "Bundle", "type": "transaction", "entry": []}
    service.start(warm_up=False)
    try:
        ehr.up()
        cases = {"not-json": None, "refused-500": refused_content(), "refused-422": Answer(422)}
        for name, answer in cases.items():
            notice = {"id": name, "study_instance_uid": "1.2.3"}
            (row,) = box.enqueue(
                notice, folder=tmp_path / "out", job_id="job-1", now=later, fhir_bundle=bundle
            )
            if answer is None:  # a file that is not JSON (truncated by a bad disk, edited)
                Path(row.path).write_bytes(b'{"resourceType": "Bundle", "entr')
            else:
                ehr.script(answer)
            report = box.deliver_pending(later + dt.timedelta(seconds=1))
            assert (report.claimed, report.failed) == (1, 1), (name, _rows_of(service))
        rows = {r.sop_instance_uid: r for r in _rows_of(service)}
        assert {r.state for r in rows.values()} == {OutboxState.FAILED_PERMANENT}
        assert all(r.attempts == 1 for r in rows.values())
        assert "not a FHIR JSON Bundle" in (rows["not-json"].last_error or "")
        assert "refuses the content" in (rows["refused-500"].last_error or "")
        assert "HTTP 422" in (rows["refused-422"].last_error or "")
        assert len(ehr.received) == 2  # the file that is not JSON was never POSTed
        # nothing due any more, however long one waits
        far = later + dt.timedelta(days=30)
        assert box.deliver_pending(far).claimed == 0
        (status,) = [s for s in service.outbox.status() if s.destination == "critical:ehr"]
        assert status.failed_permanent == 3 and status.pending == 0
        failed = service.metrics.registry.get_sample_value(
            "radserve_critical_pushes_total", {"receiver": "ehr", "outcome": "failed"}
        )
        assert failed == 3

        def failures() -> list[AuditRecord] | None:
            audited = [r for r in service.store.iter_audit() if r.action == "critical.failed"]
            return audited if len(audited) >= len(cases) else None

        audited = until(failures, "a failure audited per notice", 10)
        assert sorted(r.payload["notice_id"] for r in audited) == sorted(cases)
    finally:
        service.stop()
        ehr.down()


def refused_content() -> Answer:
    """A 500 whose OperationOutcome says the Bundle could not be parsed (as some servers
    answer a payload they cannot read)."""
    issue = {"severity": "fatal", "code": "structure", "diagnostics": "not valid JSON"}
    return Answer(500, {"resourceType": "OperationOutcome", "issue": [issue]})


def _rows_of(service: Service) -> list[OutboxItem]:
    return OutboxStore(service.store.engine).items(kind=OutboxKind.CRITICAL)

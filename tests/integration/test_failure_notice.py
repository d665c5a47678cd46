"""Issue 11, item 4: a job that fails after its study was accepted is visible to the
sender's side: a FHIR DiagnosticReport with status ``cancelled`` reaches the FHIR server
(a real HTTP server), with the identifier the study's AI report has, so the successful
re-run amends it; operators see the job state, a log line and a metric."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
from tests.factories.fhir_server import FhirServer
from tests.factories.service import (
    ServerThread,
    auth,
    create_key,
    make_study,
    settings_for,
    upload,
    wait_job,
)
from tests.factories.waits import WAIT_SCALE, until

from radserve.api import create_app
from radserve.errors import InferenceError
from radserve.report.fhir import check_bundle
from radserve.service import Service


def _report(bundle: dict[str, Any]) -> dict[str, Any]:
    [report] = [e for e in bundle["entry"] if e["resource"]["resourceType"] == "DiagnosticReport"]
    return report


def _break_model(service: Service) -> Any:
    """The test model's session, made to fail every batch (``del session.run`` mends it)."""
    catalog = service.catalog
    session = catalog.sessions.get(catalog.registry.get("organs-test"), "fp32")

    def broken(batch: Any) -> Any:
        raise InferenceError("device lost (test)")

    session.run = broken
    return session


def _bundles(fhir: FhirServer, count: int) -> list[dict[str, Any]]:
    until(
        lambda: len(fhir.received) >= count,
        f"{count} bundles",
        60,
        state=lambda: f"{len(fhir.received)} received",
    )
    return [r.json() for r in fhir.received]


# the broken model's error is retryable: both retries still run, 0.1 s apart instead of
# the default 5 s each (10 of each test's 12 s)
RETRY = {"jobs__retry_backoff_s": 0.1}


def test_a_failed_job_sends_a_cancelled_diagnostic_report(tmp_path: Path) -> None:
    with FhirServer() as fhir:
        service = Service(settings_for(tmp_path, fhir__url=fhir.url, **RETRY))
        admin = create_key(service.store, "admin")
        with (
            ServerThread(create_app(service)) as srv,
            httpx.Client(base_url=srv.url, timeout=30) as c,
        ):
            assert service.wait_warm(60 * WAIT_SCALE)
            session = _break_model(service)
            files = make_study(tmp_path / "s", extra={"PatientID": "PID-0815"})
            r = c.post("/v1/studies", files=upload(files), headers=auth(admin))
            assert r.status_code == 202, r.text
            failed = wait_job(c, r.json()["id"], admin)
            assert failed["state"] == "failed"
            [notice] = _bundles(fhir, 1)
            assert check_bundle(notice) == []
            entry = _report(notice)
            report = entry["resource"]
            assert report["status"] == "cancelled"
            assert entry["request"]["method"] == "PUT"  # amends what the server holds
            code = failed["error"]["code"]
            assert report["conclusionCode"][0]["coding"][0]["code"] == code
            assert code in report["conclusion"]
            [patient] = [e for e in notice["entry"] if e["resource"]["resourceType"] == "Patient"]
            [identifier] = patient["resource"]["identifier"]
            assert identifier["value"] == "PID-0815" and "system" not in identifier
            # no system: created as the AI report's Patient is, without a search by the
            # bare value (until session 43 `identifier=PID-0815` matched any issuer's)
            assert "ifNoneExist" not in patient["request"]
            assert report["subject"] == {"reference": patient["fullUrl"]}
            metrics = c.get("/metrics").text
            assert 'radserve_failure_notices_total{channel="fhir"} 1.0' in metrics

            del session.run  # repaired: the same study runs again and succeeds
            assert c.post("/v1/admin/models/organs-test/reset", headers=auth(admin)).is_success
            again = c.post("/v1/studies", files=upload(files), headers=auth(admin))
            assert wait_job(c, again.json()["id"], admin)["state"] == "succeeded"
            _, result = _bundles(fhir, 2)
            final = _report(result)["resource"]
            assert final["status"] in ("final", "amended")
            assert final["identifier"] == report["identifier"]  # the same report, now done
            assert len(fhir.received) == 2


def test_failure_notice_none_sends_nothing(tmp_path: Path) -> None:
    with FhirServer() as fhir:
        service = Service(
            settings_for(tmp_path, fhir__url=fhir.url, results__failure_notice="none", **RETRY)
        )
        admin = create_key(service.store, "admin")
        with (
            ServerThread(create_app(service)) as srv,
            httpx.Client(base_url=srv.url, timeout=30) as c,
        ):
            assert service.wait_warm(60 * WAIT_SCALE)
            _break_model(service)
            r = c.post("/v1/studies", files=upload(make_study(tmp_path / "s")), headers=auth(admin))
            assert wait_job(c, r.json()["id"], admin)["state"] == "failed"
            assert service.outbox.items(kind="fhir") == []
            assert 'radserve_failure_notices_total{channel="fhir"}' not in c.get("/metrics").text
    assert fhir.received == []


def test_no_notice_is_filed_under_identifiers_ingest_refused(tmp_path: Path) -> None:
    """A study refused for its identifiers (two Patient IDs; an Accession Number longer
    than SH allows) failed because they name no one patient or order: before session 42
    its notice went out under them anyway (a FHIR Patient created as ``PID6\\PID6B``, a
    SR with two IDs). A failure whose identifiers are sound still gets its notice."""
    with FhirServer() as fhir:
        service = Service(settings_for(tmp_path, fhir__url=fhir.url, **RETRY))
        admin = create_key(service.store, "admin")
        with (
            ServerThread(create_app(service)) as srv,
            httpx.Client(base_url=srv.url, timeout=30) as c,
        ):
            assert service.wait_warm(60 * WAIT_SCALE)
            refused = [
                {"PatientID": ["PID6", "PID6B"]},
                {"PatientID": "PID7", "AccessionNumber": "A" * 17},
            ]
            for n, extra in enumerate(refused):
                files = make_study(tmp_path / f"refused{n}", extra=extra)
                r = c.post("/v1/studies", files=upload(files), headers=auth(admin))
                assert r.status_code == 202, r.text
                failed = wait_job(c, r.json()["id"], admin)
                assert failed["error"]["code"] == "attribute_invalid", failed
            _break_model(service)
            files = make_study(tmp_path / "sound", extra={"PatientID": "PID-0815"})
            r = c.post("/v1/studies", files=upload(files), headers=auth(admin))
            assert wait_job(c, r.json()["id"], admin)["state"] == "failed"
            [notice] = _bundles(fhir, 1)
            [patient] = [e for e in notice["entry"] if e["resource"]["resourceType"] == "Patient"]
            assert patient["resource"]["identifier"][0]["value"] == "PID-0815"
            metrics = c.get("/metrics").text
            assert 'radserve_errors_total{code="failure_notice_unaddressable"} 2.0' in metrics
            assert 'radserve_failure_notices_total{channel="fhir"} 1.0' in metrics
    assert len(fhir.received) == 1


def test_a_notice_names_the_patient_with_the_ai_report_s_identifier_system(tmp_path: Path) -> None:
    """The notice's Patient is found as the AI report's is: by the issuer's system and
    the ID. Before session 43 it was created with ``ifNoneExist: identifier=<ID>``, which
    a FHIR server matches against a patient of any issuer holding that ID."""
    with FhirServer() as fhir:
        service = Service(
            settings_for(
                tmp_path,
                fhir__url=fhir.url,
                fhir__issuer_systems={"HOSP_A": "urn:oid:1.2.3.4"},
                **RETRY,
            )
        )
        admin = create_key(service.store, "admin")
        with (
            ServerThread(create_app(service)) as srv,
            httpx.Client(base_url=srv.url, timeout=30) as c,
        ):
            assert service.wait_warm(60 * WAIT_SCALE)
            _break_model(service)
            extra = {"PatientID": "PID-0815", "IssuerOfPatientID": "HOSP_A"}
            files = make_study(tmp_path / "s", extra=extra)
            r = c.post("/v1/studies", files=upload(files), headers=auth(admin))
            assert wait_job(c, r.json()["id"], admin)["state"] == "failed"
            [notice] = _bundles(fhir, 1)
            [patient] = [e for e in notice["entry"] if e["resource"]["resourceType"] == "Patient"]
            [identifier] = patient["resource"]["identifier"]
            assert (identifier["system"], identifier["value"]) == ("urn:oid:1.2.3.4", "PID-0815")
            assert patient["request"]["ifNoneExist"] == "identifier=urn:oid:1.2.3.4|PID-0815"
            assert check_bundle(notice) == []


def test_a_failed_re_run_leaves_the_study_s_result_standing(tmp_path: Path) -> None:
    """A study run once, then again (late images, a corrected resend), whose re-run fails:
    until session 43 the re-run's notice replaced the final DiagnosticReport by a
    cancelled one, "No AI result exists for this study", while the first result's SEG
    and SR stayed in the PACS. The earlier result stands; no notice goes out."""
    with FhirServer() as fhir:
        service = Service(settings_for(tmp_path, fhir__url=fhir.url, **RETRY))
        admin = create_key(service.store, "admin")
        with (
            ServerThread(create_app(service)) as srv,
            httpx.Client(base_url=srv.url, timeout=30) as c,
        ):
            assert service.wait_warm(60 * WAIT_SCALE)
            study = {"StudyInstanceUID": "1.2.826.0.1.3680043.8.498.4242", "PatientID": "P-43"}
            first = make_study(tmp_path / "first", extra=study)
            r = c.post("/v1/studies", files=upload(first), headers=auth(admin))
            assert wait_job(c, r.json()["id"], admin)["state"] == "succeeded"
            [result] = _bundles(fhir, 1)
            assert _report(result)["resource"]["status"] == "final"
            _break_model(service)
            again = make_study(tmp_path / "again", extra={**study, "SeriesDescription": "resent"})
            r = c.post("/v1/studies", files=upload(again), headers=auth(admin))
            failed = wait_job(c, r.json()["id"], admin)
            assert failed["state"] == "failed", failed
            metrics = c.get("/metrics").text
            assert 'radserve_errors_total{code="failure_notice_result_stands"} 1.0' in metrics
            assert service.outbox.items(kind="fhir") and len(fhir.received) == 1
            assert 'radserve_failure_notices_total{channel="fhir"}' not in metrics

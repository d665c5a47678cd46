"""Re-reading a job's stored study (its FHIR Bundle's patient, the console's CT volume)
happens under the server's configured ingest policy, not the default one: a limit set
in ``ingest`` (here ``max_frames``) holds there as it held for the job itself. Before,
``service/jobs.py`` and ``console/volume.py`` discovered the study with the defaults,
so a raised limit that let a study in made its FHIR Bundle and viewer volume fail, and
a lowered one did not bound those reads."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from types import SimpleNamespace

import pytest
from tests.factories.results import LesionStudy, lesion_study
from tests.factories.service import settings_for

from radserve.console.volume import ct_volume
from radserve.domain import JobState, PriorityClass
from radserve.ingest import IngestPolicy
from radserve.ingest.sources import InputTooLargeError
from radserve.service import Service
from radserve.service.job_fhir import fhir_bundle_for
from radserve.store import JobRecord

pytest.importorskip("fhir.resources")

LIMIT = 10  # frames; the study has 30


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> LesionStudy:
    return lesion_study(tmp_path_factory.mktemp("stored-study"))


def _record(study: LesionStudy) -> JobRecord:
    now = dt.datetime.now(dt.UTC)
    return JobRecord(
        id="job-policy-1",
        state=JobState.SUCCEEDED,
        priority_class=PriorityClass.OUTPATIENT,
        arrival=now,
        deadline=now,
        pipeline_name="test-pipeline",
        pipeline_version="1",
        precision="fp32",
        fingerprint="f" * 64,
        study_path=str(study.files[0].parent),
        result_path=str(study.out),
    )


def test_fhir_bundle_reads_the_study_under_the_given_policy(study: LesionStudy) -> None:
    folder = study.files[0].parent
    bundle = fhir_bundle_for(study.report, folder, study.out)  # default: 50,000 frames
    assert any(e["resource"]["resourceType"] == "Patient" for e in bundle["entry"])
    with pytest.raises(InputTooLargeError, match=f"ingest.max_frames={LIMIT}"):
        fhir_bundle_for(study.report, folder, study.out, policy=IngestPolicy(max_frames=LIMIT))


def test_console_volume_reads_the_study_under_the_given_policy(
    study: LesionStudy, tmp_path: Path
) -> None:
    record = _record(study)
    with pytest.raises(InputTooLargeError, match=f"ingest.max_frames={LIMIT}"):
        ct_volume(record, study.report, tmp_path / "a", IngestPolicy(max_frames=LIMIT))
    path = ct_volume(record, study.report, tmp_path / "b", IngestPolicy(max_frames=30))
    assert path.is_file() and path.stat().st_size > 0


def test_the_service_reads_stored_studies_under_its_settings(
    study: LesionStudy, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = settings_for(tmp_path, ingest__max_frames=LIMIT, fhir__url="http://127.0.0.1:9/fhir")
    service = Service(settings)
    try:
        record = _record(study)
        with pytest.raises(InputTooLargeError, match=f"ingest.max_frames={LIMIT}"):
            service.jobs.fhir_bundle(record)  # GET /v1/jobs/{id}/fhir
        assert service.fhir is not None
        # no patient from a run (patient=None): the delivery reads the stored study itself
        result = SimpleNamespace(report=study.report, out_dir=study.out, patient=None)
        service.fhir.on_result(record, result)  # type: ignore[arg-type]
        assert service.fhir.outbox.store.items() == []  # nothing queued: not built
        assert "no FHIR bundle to send (input_too_large)" in caplog.text
    finally:
        service.stop()

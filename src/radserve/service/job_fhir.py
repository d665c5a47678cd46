"""A finished job's report as FHIR: the Bundle served at ``GET /v1/jobs/{id}/fhir`` and
POSTed to a FHIR server, and the resources a critical finding's push carries.

Apart from :mod:`radserve.service.jobs` because it needs the report's FHIR builders and
the ingest code that re-reads the stored study's headers (pydicom, highdicom, nibabel):
the API reader processes import the job reads and must not load these
(docs/scaling.md: a reader's memory).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from radserve.ingest import IngestPolicy, PatientInfo, discover_series
from radserve.ingest.headers import read_header
from radserve.report.fhir import build_fhir_bundle
from radserve.report.fhir.bundle import ReportResources
from radserve.report.fhir.patient import IdentifierSystems
from radserve.report.schema import Report
from radserve.service.errors import SourceRemovedError
from radserve.service.sniff import input_kind


def fhir_bundle_for(
    report: Report,
    study_path: Path,
    result_dir: Path,
    identifier_systems: IdentifierSystems | None = None,
    *,
    policy: IngestPolicy | None = None,
    patient: PatientInfo | None = None,
) -> dict[str, Any]:
    """The FHIR R4 Bundle of ``report``; the patient is read from the stored study's
    headers (never from the de-identified report), and the job's DICOM SEG/SR, when it
    has them, are listed as series of the ImagingStudy. What ``GET /v1/jobs/{id}/fhir``
    serves and what is POSTed to a configured FHIR server: one function, one Bundle.
    The study is read under ``policy``: the server's configured ingest bounds, the same
    the job was read under (the default policy would refuse what a raised limit let in).
    ``patient``: the one the job's own ingest read, if at hand (:func:`patient_for`)."""
    return build_fhir_bundle(
        report,
        patient_for(report, study_path, policy, known=patient),  # type: ignore[arg-type]
        dicom_results=_result_headers(result_dir),
        identifier_systems=identifier_systems,
    )


def report_resources_for(
    report: Report,
    study_path: Path,
    result_dir: Path,
    identifier_systems: IdentifierSystems | None = None,
    *,
    policy: IngestPolicy | None = None,
    patient: PatientInfo | None = None,
) -> ReportResources:
    """The Patient, ImagingStudy (with the SEG/SR written so far), Devices and finding
    Observations of ``report``, read the way :func:`fhir_bundle_for` reads them: what a
    critical finding's FHIR push carries, without building and validating the whole
    Bundle first. ``patient`` as for :func:`fhir_bundle_for`."""
    return ReportResources(
        report,
        patient_for(report, study_path, policy, known=patient),  # type: ignore[arg-type]
        identifier_systems=identifier_systems,
        dicom_results=_result_headers(result_dir),
    )


def _result_headers(result_dir: Path) -> list[Any]:
    return [read_header(path) for path in sorted(Path(result_dir).glob("*.dcm"))]


def patient_for(
    report: Report,
    study: Path,
    policy: IngestPolicy | None = None,
    *,
    known: PatientInfo | None = None,
) -> PatientInfo:
    """The patient of ``report``'s series, read from the stored study's headers (never
    from the de-identified report) under ``policy``.

    ``known``: the patient the job's own ingest read from those headers, given by the
    job's thread right after the run; it stands for the re-read, which parses every
    header of the study again (0.39 CPU-s for a 500-file phantom): the critical FHIR
    push waited on it. Whether a study has a patient at all is decided here either way."""
    if study.is_dir() and input_kind(study) == "nifti":
        return PatientInfo()
    if known is not None:
        return known
    if not study.is_dir():
        # removed by the retention sweep: a Patient without identifier or name (what
        # this answered until session 43) could be filed as an anonymous patient
        raise SourceRemovedError(
            "the study's source images are no longer stored (storage.source_retention_days), "
            "and the FHIR Patient is read from them: the Bundle sent when the job finished "
            "is the one to use"
        )
    policy = policy or IngestPolicy()
    wanted = report.study.series_instance_uid
    for header in discover_series(study, policy=policy):
        if header.series_instance_uid == wanted:
            return header.patient
    return PatientInfo()


__all__ = ["fhir_bundle_for", "patient_for", "report_resources_for"]

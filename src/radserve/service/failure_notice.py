"""When a job fails after its study was accepted, the sender's side hears of it.

(``results.failure_notice``: ``none`` | ``fhir`` | ``sr`` | ``both``, default ``both``:
each channel that is configured.) ``fhir``, with a FHIR server configured: a transaction
Bundle goes out through the FHIR outbox: the Patient (conditional create on its
identifier) and a DiagnosticReport with status ``cancelled``, the same identifier the
study's AI report would have (so a later successful run amends it; under
``security.visibility`` the one of the submitter's own lineage, never another site's
report), and a conclusion
naming the failure's error code. ``sr``, for a study the DICOM gateway received and
with gateway destinations: a Comprehensive 3D SR saying the analysis failed
(:mod:`radserve.report.dicom.failure`) is written into the job's result folder, indexed
as radserve's own result and queued in the DICOM outbox for the destinations results go
to. Operators see every failure anyway: the job's state and error code (API), a log
line, and ``radserve_failure_notices{channel}`` / ``radserve_errors{code}`` in
``/metrics``.

The notice carries the error code and radserve's message, never header values, and
never a path: ingest names instances by Instance Number and UID (a folder or zip member
name is the sender's, and may name a patient), the data dir is left out, and an
unexpected error (``internal_error``, whose text may quote anything) is said in a fixed
sentence. No notice is sent for a study whose earlier result (same study, pipeline and lineage
scope) succeeded: that result stands, and a failed re-run must not cancel it
(``radserve_errors{code="failure_notice_result_stands"}``). A notice is sent only when
every stored instance names one patient (Patient
ID and issuer, name, birth date, compared as ingest compares them), one study and at
most one Accession Number; otherwise it would be filed under whichever instance was read
first, so none is sent (``radserve_errors{code="failure_notice_unaddressable"}``).
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import uuid
from collections.abc import Callable, Iterable
from contextlib import closing, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pydicom
from pydicom.uid import generate_uid

from radserve.config import Settings
from radserve.errors import StudyError
from radserve.gateway.dicomweb.index import describe
from radserve.gateway.outbox import utc_now
from radserve.ingest.headers import DiscoveryMemo, PatientInfo, header_text
from radserve.ingest.policy import IngestPolicy
from radserve.ingest.stored import first_stored_header, stored_headers
from radserve.ingest.validate import check_patient_values
from radserve.report.dicom.common import save_atomic
from radserve.report.dicom.failure import FAILURE_SR_FILE, build_failure_sr
from radserve.report.fhir.bundle import validate_bundle
from radserve.report.fhir.patient import IdentifierSystems, patient_identifier
from radserve.report.fhir.resources import (
    REPORT_CODE,
    V2_0074,
    identifier_search,
    oid_identifier,
)
from radserve.service.fhir import FhirDelivery
from radserve.service.lineage import diagnostic_report_uid
from radserve.service.metrics import Metrics
from radserve.store import JobRecord
from radserve.store.results import LineageIndex, LineageRecord, ResultIndex

if TYPE_CHECKING:
    from radserve.service.gateway import GatewayBridge

logger = logging.getLogger(__name__)

FAILED_CODE = {
    "system": "urn:radserve:error",
    "display": "radserve could not analyse this study",
}


_HEADER_TAGS = (
    "SpecificCharacterSet",
    "PatientName",
    "PatientID",
    "IssuerOfPatientID",
    "IssuerOfPatientIDQualifiersSequence",  # its universal entity: the FHIR system
    "StudyInstanceUID",
    "SeriesInstanceUID",
    "SOPClassUID",
    "SOPInstanceUID",
    "StudyID",
    "AccessionNumber",
    "StudyDate",
    "StudyTime",
    "ReferringPhysicianName",
    "Modality",
)


# what ingest checks the identifiers by (radserve.ingest.validate.check_patient_values,
# PatientInfo.identity), and the study the notice is filed in
_IDENTITY_TAGS = (
    "SpecificCharacterSet",
    "PatientName",
    "PatientID",
    "IssuerOfPatientID",
    "PatientBirthDate",
    "AccessionNumber",
    "StudyInstanceUID",
)

INTERNAL_REASON = "radserve failed unexpectedly; the operator finds the details in its log"


def notice_reason(job: JobRecord, data_dir: Path | None = None) -> str:
    """The job's error message as a notice says it: an unexpected error's text (an
    exception's, which may quote a file's path or a zip member's name) replaced by
    :data:`INTERNAL_REASON`, the data dir's path left out of any other."""
    if job.error_code == "internal_error":
        return INTERNAL_REASON
    message = str(job.error_message)
    for folder in _spellings(data_dir):
        message = message.replace(folder, "<data dir>/")
    return message


def _spellings(data_dir: Path | None) -> list[str]:
    """The data dir as a message may spell it (resolved, absolute, as configured), each
    with its trailing separator (a relative name alone may be any word), longest first:
    one may hold another."""
    if data_dir is None:
        return []
    forms = {str(data_dir.absolute()), str(data_dir)}
    with suppress(OSError, RuntimeError):
        forms.add(str(data_dir.resolve()))
    return sorted((f.rstrip(os.sep) + os.sep for f in forms), key=len, reverse=True)


def identity_refusal(headers: Iterable[pydicom.Dataset]) -> str | None:
    """Why the instances of ``headers`` (their :data:`_IDENTITY_TAGS`) cannot address
    one notice, or None: a patient identifier ingest refuses
    (:func:`~radserve.ingest.validate.check_patient_values`), instances naming different
    patients (:attr:`~radserve.ingest.headers.PatientInfo.identity`, as ingest compares
    them: ID, issuer, name, birth date), several studies or Accession Numbers (an
    instance without one agrees with any). The attributes are named, never their
    values. Stops at the first disagreement."""
    memo = DiscoveryMemo()
    first: PatientInfo | None = None
    studies: set[str] = set()
    accessions: set[str] = set()
    for header in headers:
        patient = memo.patient(header)
        if first is None:
            first = patient
            try:
                check_patient_values(patient)
            except StudyError as exc:
                return str(exc)
        elif patient.identity != first.identity:
            return (
                "its instances name different patients (they differ in "
                f"{', '.join(patient.differs_from(first))}): a notice filed under one of "
                "them could reach the wrong patient's record"
            )
        if study := header_text(header, "StudyInstanceUID"):
            studies.add(study)
        if patient.accession_number:
            accessions.add(patient.accession_number)
        if len(studies) > 1:
            return "its instances belong to several studies (Study Instance UIDs differ)"
        if len(accessions) > 1:
            return (
                "its instances carry different Accession Numbers: a notice filed under "
                "one of them could reach the wrong order"
            )
    return None


def study_header(study_path: Path, policy: IngestPolicy | None = None) -> pydicom.Dataset | None:
    """The header of the first readable DICOM file (or zip member) of a stored study."""
    return first_stored_header(study_path, _HEADER_TAGS, policy)


def study_headers(study_path: Path, policy: IngestPolicy | None = None) -> list[pydicom.Dataset]:
    """The identifying elements of every readable DICOM file (or zip member) of a stored
    study; files that are not DICOM are skipped."""
    return list(stored_headers(study_path, _HEADER_TAGS, policy))


def failure_bundle(
    job: JobRecord,
    header: pydicom.Dataset | None,
    now: dt.datetime,
    *,
    scope: str = "",
    reason: str | None = None,
    systems: IdentifierSystems | None = None,
) -> dict[str, Any]:
    """A transaction Bundle: Patient (if the header names one) + a cancelled
    DiagnosticReport, identified as the study's AI report of this pipeline in the lineage
    of ``scope`` (radserve.service.lineage). ``reason``: what the conclusion says of the
    failure (default :func:`notice_reason`); ``systems``: the Patient ID's identifier
    system, as the AI report's (``fhir.patient_identifier_system``, ``fhir.issuer_systems``)."""
    systems = systems or IdentifierSystems()
    reason = notice_reason(job) if reason is None else reason
    study_uid = header_text(header, "StudyInstanceUID")
    report_uid = (
        diagnostic_report_uid(study_uid, job.pipeline_name, scope)
        if study_uid
        else str(generate_uid(entropy_srcs=[job.id, "fhir-diagnostic-report"]))
    )
    identifier = oid_identifier(report_uid)
    entries: list[dict[str, Any]] = []
    report: dict[str, Any] = {
        "resourceType": "DiagnosticReport",
        "identifier": [identifier],
        "status": "cancelled",
        "category": [{"coding": [{"system": V2_0074, "code": "RAD", "display": "Radiology"}]}],
        "code": {"coding": [REPORT_CODE], "text": "AI imaging result"},
        "issued": now.astimezone(dt.UTC).isoformat().replace("+00:00", "Z"),
        "conclusion": (
            f"Automated analysis failed ({job.error_code}): {reason}. "
            "No AI result exists for this study."
        ),
        "conclusionCode": [{"coding": [{**FAILED_CODE, "code": str(job.error_code)}]}],
    }
    patient = None if header is None else DiscoveryMemo().patient(header)
    patient_id = None if patient is None else patient_identifier(patient, systems)
    if patient_id is not None:
        # the AI report's identifier (radserve.report.fhir.patient): found by system and
        # value, created without a search when the ID has no system; until session 43
        # `identifier=<ID>` alone matched a patient of any issuer with that ID
        patient_url = f"urn:uuid:{uuid.uuid5(uuid.NAMESPACE_OID, job.id + '/patient')}"
        request = {"method": "POST", "url": "Patient"}
        if patient_id.get("system"):
            request["ifNoneExist"] = identifier_search(patient_id)
        entries.append(
            {
                "fullUrl": patient_url,
                "resource": {"resourceType": "Patient", "identifier": [patient_id]},
                "request": request,
            }
        )
        report["subject"] = {"reference": patient_url}
    search = identifier_search(identifier)
    entries.append(
        {
            "fullUrl": f"urn:uuid:{uuid.uuid5(uuid.NAMESPACE_OID, job.id + '/report')}",
            "resource": report,
            "request": {"method": "PUT", "url": f"DiagnosticReport?{search}"},
        }
    )
    bundle = {
        "resourceType": "Bundle",
        "id": str(uuid.uuid5(uuid.NAMESPACE_OID, job.id + "/failure-notice")),
        "type": "transaction",
        "timestamp": report["issued"],
        "entry": entries,
    }
    validate_bundle(bundle)
    return bundle


class FailureNotices:
    """Sends the configured notices for a failed job; never raises (logs instead)."""

    def __init__(
        self,
        settings: Settings,
        *,
        metrics: Metrics,
        fhir: FhirDelivery | None,
        results_root: Path,
        gateway: GatewayBridge | None = None,
        results: ResultIndex | None = None,
        group_of: Callable[[str | None], str] | None = None,
    ) -> None:
        """``group_of``: a job's lineage scope (as :class:`ResultLineage` takes it)."""
        self.group_of = group_of
        self.mode = settings.results.failure_notice
        self.policy = IngestPolicy.from_settings(settings.ingest)  # the bounds ingest read under
        self.metrics = metrics
        self.fhir = fhir
        self.results_root = results_root
        self.gateway = gateway
        self.results = results
        self.data_dir = settings.data_dir
        self.systems = IdentifierSystems.from_settings(settings.fhir)
        self.lineage = None if results is None else LineageIndex(results.engine)

    def on_failed(self, job: JobRecord) -> None:
        logger.error(
            "job %s failed after its study was accepted (%s); failure notice: %s",
            job.id,
            job.error_code,
            self.mode,
        )
        if self.mode == "none" or job.cached_from:
            return
        if (refused := self._identity_refused(job)) is not None:
            logger.warning("job %s: no failure notice: %s", job.id, refused)
            self.metrics.errors.labels("failure_notice_unaddressable").inc()
            return
        if (standing := self._standing_result(job)) is not None:
            logger.warning(
                "job %s: no failure notice: the study's result of job %s (generation %d) "
                "stands; a failed re-run does not cancel it",
                job.id,
                standing.job_id,
                standing.generation,
            )
            self.metrics.errors.labels("failure_notice_result_stands").inc()
            return
        channels = []
        if self.mode in ("fhir", "both") and self.fhir is not None:
            channels.append(("FHIR", self._fhir))
        if (
            self.mode in ("sr", "both")
            and self.gateway is not None
            and self.gateway.wants_dicom_results(job)
        ):
            channels.append(("DICOM SR", self._sr))
        for name, send in channels:
            try:
                send(job)
            except Exception as exc:  # the job's failure stands; the notice is best effort
                code = getattr(exc, "code", type(exc).__name__)
                logger.error(
                    "job %s: the %s failure notice was not queued (%s)", job.id, name, code
                )
                self.metrics.errors.labels("failure_notice_failed").inc()

    def _identity_refused(self, job: JobRecord) -> str | None:
        """Why the study's identifiers cannot address a notice (:func:`identity_refusal`
        over every stored instance's header, read without its pixel data), or None. A
        study refused for them failed *because* they name no one patient or order: a
        notice filed under them (before session 42: a SR with two Patient IDs, a FHIR
        Patient created as ``A\\B``; until the instances were compared, the first
        file's patient of a study whose instances named two) would reach nobody, or the
        wrong record."""
        headers = stored_headers(Path(job.study_path), _IDENTITY_TAGS, self.policy)
        with closing(headers):
            return identity_refusal(headers)

    def _standing_result(self, job: JobRecord) -> LineageRecord | None:
        """The study's succeeded result in the job's lineage (same study, pipeline and
        scope), if one was delivered before this run failed. A re-run (late instances,
        a study sent again after the quiet period) that fails must not tell the PACS and
        the FHIR server "no AI result exists": until session 43 its cancelled
        DiagnosticReport replaced the final one (same identifier, a conditional PUT) and
        its failure SR said so beside the earlier SEG and SR."""
        if self.lineage is None:
            return None
        header = first_stored_header(Path(job.study_path), ("StudyInstanceUID",), self.policy)
        study_uid = header_text(header, "StudyInstanceUID")
        if not study_uid:
            return None
        scope = "" if self.group_of is None else self.group_of(job.api_key_id)
        return self.lineage.latest_succeeded(study_uid, str(job.pipeline_name), scope)

    def _fhir(self, job: JobRecord) -> None:
        assert self.fhir is not None
        header = study_header(Path(job.study_path), self.policy)
        if header is None:
            # a NIfTI volume (or nothing readable as DICOM): no patient or study to name,
            # and no AI report on the FHIR server that the notice would stand for
            logger.info(
                "job %s: no FHIR failure notice: its study has no DICOM header to name "
                "the patient and study",
                job.id,
            )
            return
        scope = "" if self.group_of is None else self.group_of(job.api_key_id)
        bundle = failure_bundle(
            job,
            header,
            dt.datetime.now(dt.UTC),
            scope=scope,
            reason=notice_reason(job, self.data_dir),
            systems=self.systems,
        )
        study_uid = header_text(header, "StudyInstanceUID")
        self.fhir.outbox.enqueue(
            bundle,
            folder=self.results_root / job.id,
            job_id=job.id,
            study_instance_uid=study_uid,
        )
        self.fhir.lanes.wake()
        self.metrics.failure_notices.labels("fhir").inc()
        logger.info("job %s: FHIR failure notice queued (DiagnosticReport cancelled)", job.id)

    def _sr(self, job: JobRecord) -> None:
        """The failure SR into the job's result folder, indexed as radserve's own result
        (a PACS re-sending it is recognised), queued for the gateway's destinations."""
        assert self.gateway is not None
        sr = build_failure_sr(
            study_headers(Path(job.study_path), self.policy),
            job_id=job.id,
            error_code=str(job.error_code),
            reason=notice_reason(job, self.data_dir),
            when=dt.datetime.now(dt.UTC),
        )
        path = save_atomic(sr, self.results_root / job.id / FAILURE_SR_FILE)
        if self.results is not None:
            self.results.add([describe(path, job.id, self.results.patient_key)], now=utc_now())
        self.gateway.send(path, job_id=job.id)
        self.metrics.failure_notices.labels("sr").inc()
        logger.info("job %s: DICOM failure notice queued (SR, analysis failed)", job.id)


__all__ = [
    "INTERNAL_REASON",
    "FailureNotices",
    "failure_bundle",
    "identity_refusal",
    "notice_reason",
    "study_header",
    "study_headers",
]

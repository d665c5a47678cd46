"""Each succeeded job's FHIR Bundle -> the configured FHIR server, through the outbox.

Built by the same function as ``GET /v1/jobs/{id}/fhir`` (:func:`fhir_bundle_for`),
queued when the job's result is recorded (before the result row commits, so a crash
in between loses no delivery), and sent by a worker thread that retries with back-off.
Without ``fhir.url`` nothing is built or sent.
"""

from __future__ import annotations

import datetime as dt
import logging
from pathlib import Path

from radserve.config import Settings
from radserve.errors import RadserveError
from radserve.fhir.delivery import BUNDLE_FILE, FhirDestination, FhirOutbox
from radserve.gateway.outbox import LaneWorkers, RetryPolicy
from radserve.ingest import IngestPolicy, PatientInfo
from radserve.pipeline.study import StudyResult
from radserve.report.fhir.patient import IdentifierSystems
from radserve.report.fhir.resources import describes_dicom_study
from radserve.report.schema import Report
from radserve.service.job_fhir import fhir_bundle_for
from radserve.service.outbox import lane_interval_s
from radserve.store import JobRecord, Store
from radserve.store.outbox import OutboxStore

logger = logging.getLogger(__name__)


def fhir_destination(settings: Settings) -> FhirDestination | None:
    fhir = settings.fhir
    if fhir.url is None:
        return None
    token = fhir.bearer_token.get_secret_value() if fhir.bearer_token else None
    return FhirDestination(url=fhir.url, bearer_token=token, timeout_s=fhir.timeout_s)


def retry_policy(settings: Settings) -> RetryPolicy:
    return RetryPolicy.of(settings.fhir)


class FhirDelivery:
    """Queue and send Bundles. Start after the store is open, stop before it closes."""

    def __init__(self, settings: Settings, destination: FhirDestination, *, store: Store) -> None:
        self.identifier_systems = IdentifierSystems.from_settings(settings.fhir)
        self.policy = IngestPolicy.from_settings(settings.ingest)
        self.outbox = FhirOutbox(
            OutboxStore(store.engine, instance=settings.outbox.instance_id),
            destination,
            policy=retry_policy(settings),
            lease=dt.timedelta(seconds=settings.outbox.lease_s),
        )
        # one sender for the FHIR server (per replica set on PostgreSQL: its lock)
        self.lanes = LaneWorkers(
            self.outbox,
            [destination.name],
            prefix="radserve-fhir-outbox",
            interval_s=lane_interval_s(settings),
        )

    def start(self) -> None:
        self.lanes.start()

    def stop(self) -> None:
        self.lanes.stop()
        self.outbox.close()

    def on_result(self, job: JobRecord, result: StudyResult) -> None:
        """Build the job's Bundle and queue it; a Bundle that cannot be built is logged
        (by its error code only) and not sent, the job's result stands."""
        self.enqueue_report(
            job.id,
            result.report,
            study_path=Path(job.study_path),
            folder=result.out_dir,
            held_for=job.lease_owner,  # sent once this run's result is the recorded one
            patient=result.patient,
        )

    def enqueue_report(
        self,
        job_id: str,
        report: Report,
        *,
        study_path: Path,
        folder: Path,
        held_for: str | None = None,
        patient: PatientInfo | None = None,
    ) -> None:
        """Queue the Bundle of ``report`` (result folder ``folder``) for job ``job_id``.
        The Bundle's id comes from the report, so queueing it again adds nothing.
        ``patient``: the job's own ingest's, when this runs right after it. A report of
        no DICOM study (a NIfTI upload) has no Bundle: FHIR's ImagingStudy needs the
        Study Instance UID, and no FHIR server knows the volume; nothing is queued."""
        if not describes_dicom_study(report):
            logger.info("job %s: no FHIR bundle: its input is not a DICOM study", job_id)
            return
        try:
            bundle = fhir_bundle_for(
                report,
                study_path,
                folder,
                self.identifier_systems,
                policy=self.policy,
                patient=patient,
            )
        except RadserveError as exc:
            logger.error("job %s: no FHIR bundle to send (%s)", job_id, exc.code)
            return
        self.outbox.enqueue(
            bundle,
            folder=folder,
            job_id=job_id,
            study_instance_uid=report.study.study_instance_uid or "",
            held_for=held_for,
        )
        self.lanes.wake()

    def queued_for(self, folder: Path) -> bool:
        """Whether a Bundle of the result in ``folder`` was queued already."""
        return any(Path(folder).glob(BUNDLE_FILE.format(id="*")))


__all__ = ["FhirDelivery", "fhir_destination", "retry_policy"]

"""The DICOM gateway wired into the service: completed studies become jobs, and the
results of those jobs (DICOM SEG + SR) go back through the durable outbox.

Every knob is a ``gateway.*`` setting (bind address, policies, timeouts, TLS).
Destinations are the allowed peers that have a port (``gateway.allowed_peers`` entries
with ``port``, over TLS with ``tls: true``): the PACS that sends a study is usually the
one that wants the results. Without such a peer results stay on the server (JSON, FHIR
and files over HTTP).
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pydicom

from radserve import durable
from radserve.audit import Action, AuditEvent
from radserve.config import Settings
from radserve.errors import RadserveError
from radserve.gateway import (
    CompletedStudy,
    CompletionKind,
    Destination,
    GatewaySCP,
    Outbox,
    RetryPolicy,
    StoreSCU,
    scp_config_from_settings,
)
from radserve.gateway import destinations as gateway_destinations
from radserve.gateway.completeness import Refused
from radserve.gateway.outbox import LaneWorkers
from radserve.gateway.receive_limit import Exceeded
from radserve.ingest.sop_classes import VOLUME_IMAGE_STORAGE, is_localizer
from radserve.pipeline.study import StudyResult
from radserve.report.wording import (
    INSTANCES_REFUSED,
    LATE_INSTANCES,
    STUDY_MAYBE_INCOMPLETE,
    instances_refused_text,
    late_instances_text,
    maybe_incomplete_text,
)
from radserve.scheduling import QueueFullError
from radserve.service.intake import Intake, Origin
from radserve.service.job_warnings import warning
from radserve.service.outbox import lane_interval_s
from radserve.store import JobRecord, Store
from radserve.store.outbox import OutboxStore

logger = logging.getLogger(__name__)


GATEWAY_SOURCE = "dicom"  # Origin.source of the studies received here
JOB_MARKER = ".radserve-job.json"  # in the incoming study folder: its job, what it got


def _write_job_marker(study: CompletedStudy, job_id: str) -> None:
    """Which job the study's hand-over became and which instance files it had, so late
    instances (policy ``flag``) can be told apart and flagged on that job, also after a
    restart. Best effort: without it late instances are only logged."""
    data = {"job_id": job_id, "instances": [p.name for p in study.instances]}
    try:
        durable.write_json(study.folder / JOB_MARKER, data)
    except OSError as exc:
        logger.warning("cannot write the job marker of a received study: %s", exc.strerror)


def _read_job_marker(folder: Path) -> tuple[str, set[str]] | None:
    try:
        data = json.loads((folder / JOB_MARKER).read_text())
        return str(data["job_id"]), {str(name) for name in data["instances"]}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _series_uid(path: Path) -> str:
    """The Series Instance UID of a received file ("" when unreadable: counted as one)."""
    try:
        header = pydicom.dcmread(path, specific_tags=["SeriesInstanceUID"])
        return str(header.get("SeriesInstanceUID", "") or "")
    except Exception:  # stored by the SCP, so readable; never fail the flagging on it
        return ""


def _never_input(path: Path) -> bool:
    """Whether a received instance is one no pipeline analyses, whatever its rules: a
    localizer, or an image class that is not a volume (a secondary capture, say)."""
    try:
        header = pydicom.dcmread(path, specific_tags=["SOPClassUID", "ImageType"])
    except Exception:  # stored by the SCP, so readable; when not, let the re-run decide
        return False
    image_type = header.get("ImageType") or []
    values = [image_type] if isinstance(image_type, str) else list(image_type)
    return is_localizer(values) or str(header.get("SOPClassUID", "")) not in VOLUME_IMAGE_STORAGE


def _late_are_never_input(study: CompletedStudy) -> bool:
    """A re-run for late instances that no pipeline would analyse (a modality's localizer
    or screen capture sent after the study) would analyse the same series again and send
    the PACS a second, identical result: such a hand-over is logged and ends here."""
    marker = _read_job_marker(study.folder)
    if marker is None:
        return False
    job_id, handed = marker
    late = [p for p in study.instances if p.name not in handed]
    if not late or not all(_never_input(p) for p in late):
        return False
    logger.info(
        "job %s: %d late instance(s) in %d series that no pipeline analyses (localizer "
        "or not a volume image): not re-run",
        job_id,
        len(late),
        len({_series_uid(p) for p in late}),
    )
    return True


def handover_warnings(study: CompletedStudy) -> tuple[dict[str, str], ...]:
    """The job warnings a received study's hand-over knows at submission (so they are in
    its report): it may be incomplete (cut off, or its sender's association still open),
    and how many of its instances a door refused that it does not hold (each answered
    to the sender as a failure, and never stored since). For the studies of either
    door: the storage SCP's and STOW-RS's quiet period."""
    warnings: list[dict[str, str]] = []
    if study.interrupted:
        logger.warning(
            "study of %d instances handed over after its association was cut off, or "
            "while one that delivered it was still open: it may be incomplete",
            len(study.instances),
        )
        warnings.append(warning(STUDY_MAYBE_INCOMPLETE, maybe_incomplete_text()))
    if study.refused is not None:
        warnings.append(refused_warning(study.refused, len(study.instances)))
    return tuple(warnings)


def refused_warning(refused: Refused, held: int) -> dict[str, str]:
    """The job warning (and one log line) for a study of ``held`` instances handed over
    without the ``refused`` ones a gateway door refused: each was answered to its
    sender as a failure and is in no result."""
    reasons = [(str(reason), count) for reason, count in refused.counts]
    logger.warning(
        "study of %d instances handed over without %s%d instance(s) a gateway door refused (%s)",
        held,
        "up to " if refused.approximate else "",
        refused.instances,
        ", ".join(f"{count} {reason}" for reason, count in reasons),
    )
    text = instances_refused_text(refused.instances, reasons, at_most=refused.approximate)
    return warning(INSTANCES_REFUSED, text)


def destinations(settings: Settings) -> list[Destination]:
    return gateway_destinations(settings.gateway)


def audit_oversize(store: Store, exceeded: Exceeded) -> None:
    """Record the peer of an aborted oversize C-STORE (sizes only, no patient data)."""
    store.append_audit(
        AuditEvent(
            action=Action.GATEWAY_OVERSIZE,
            subject=exceeded.calling_ae,
            payload={
                "received_bytes": exceeded.received_bytes,
                "limit_bytes": exceeded.limit_bytes,
            },
            client_address=exceeded.address,
        )
    )


class GatewayBridge:
    """SCP -> intake; results -> outbox. Start after the scheduler, stop before it."""

    def __init__(
        self,
        settings: Settings,
        *,
        intake: Intake,
        store: Store,
        scp_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.settings = settings
        self.intake = intake
        targets = destinations(settings)
        self.outbox: Outbox | None = None
        self.workers: LaneWorkers | None = None
        if targets:
            scu = StoreSCU.from_settings(settings.gateway)
            self.outbox = Outbox(
                OutboxStore(store.engine, instance=settings.outbox.instance_id),
                targets,
                scu,
                policy=RetryPolicy.of(settings.gateway),
                lease=dt.timedelta(seconds=settings.outbox.lease_s),
            )
            # a sender per destination: a dead PACS stalls only its own deliveries
            self.workers = LaneWorkers(
                self.outbox,
                self.outbox.destinations,
                prefix="radserve-outbox",
                interval_s=lane_interval_s(settings),
            )
        # destinations with storage commitment report to the SCP (Orthanc always does)
        committing = any(target.storage_commitment for target in targets)
        self.scp = GatewaySCP(
            scp_config_from_settings(
                settings.gateway, settings.data_dir, settings.ingest, **(scp_options or {})
            ),
            self.on_study,
            own_results=intake.own_results,
            on_oversize=functools.partial(audit_oversize, store),
            on_commitment=(
                self.outbox.commitments.on_report if self.outbox and committing else None
            ),
        )

    def start(self) -> tuple[str, int]:
        if self.workers is not None:
            self.workers.start()
        return self.scp.start()

    def stop(self) -> None:
        self.scp.stop()
        if self.workers is not None:
            self.workers.stop()

    # --- studies in -------------------------------------------------------------------
    def on_study(self, study: CompletedStudy) -> None:
        """A received study went quiet: store it and queue a job. Raising makes the
        gateway offer the study again later (its files stay on disk)."""
        if study.kind is CompletionKind.LATE_FLAGGED:
            self._flag_late(study)
            return
        if study.kind is CompletionKind.RERUN and _late_are_never_input(study):
            return
        warnings = handover_warnings(study)
        stored = self.intake.storage.store_study_files(list(study.instances))
        resolved = self.intake.catalog.resolve(None)
        origin = Origin(
            client=",".join(study.calling_ae_titles) or None,
            source=GATEWAY_SOURCE,
            warnings=warnings,
        )
        try:
            submission = self.intake.submit_stored(
                stored.path,
                stored.fingerprint,
                resolved=resolved,
                priority=None,
                origin=origin,
                reuse=True,  # re-sent unchanged: no new job, nothing sent again
            )
        except QueueFullError:
            logger.warning("queue full: a received study waits at the gateway for a retry")
            raise
        _write_job_marker(study, submission.job.id)
        how = "queued"
        if submission.cached:
            how = "unchanged re-send" if submission.reused else "cached"
        logger.info("job %s from DICOM (%s)", submission.job.id, how)

    def _flag_late(self, study: CompletedStudy) -> None:
        """Policy ``flag``: instances arrived after the study's job was created. No
        re-run; the job gets a ``late_instances`` warning (how many instances in how many
        series it does not include), which its report, SR and FHIR carry when it is
        recorded before the report stage, and the job's API view always."""
        marker = _read_job_marker(study.folder)
        if marker is None:
            logger.warning(
                "study of %d instances got late instances; its job is unknown (no job "
                "marker), so no result is flagged",
                len(study.instances),
            )
            return
        job_id, handed = marker
        # a localizer or screen capture would not be in any result: not worth a warning
        late = [p for p in study.instances if p.name not in handed and not _never_input(p)]
        if not late:
            return
        series = {_series_uid(p) for p in late}
        message = late_instances_text(len(late), len(series))
        try:
            record = self.intake.store.add_job_warning(job_id, warning(LATE_INSTANCES, message))
        except RadserveError as exc:
            logger.error(
                "job %s: the late-instance warning was not recorded (%s)", job_id, exc.code
            )
            raise
        self.intake.cache.put(record)
        logger.warning(
            "job %s (%s): %d late instance(s) in %d series flagged, not re-run",
            job_id,
            record.state.value,
            len(late),
            len(series),
        )

    # --- results out ------------------------------------------------------------------
    def wants_dicom_results(self, job: JobRecord) -> bool:
        return self.sends_dicom(str(job.queue_meta.get("source")))

    def sends_dicom(self, source: str) -> bool:
        """Whether jobs of the intake route ``source`` get their SEG/SR sent to the
        destinations: those received here, when a destination is configured."""
        return self.outbox is not None and source == GATEWAY_SOURCE

    def on_result(self, job: JobRecord, result: StudyResult) -> None:
        if self.outbox is None or not self.wants_dicom_results(job):
            return
        paths = sorted(result.out_dir.glob("*.dcm"))
        if paths:
            self.outbox.enqueue(paths, job_id=job.id, held_for=job.lease_owner)
            if self.workers is not None:
                self.workers.wake()

    def send(self, path: Path, *, job_id: str) -> None:
        """Queue one more DICOM object of a job (the failure notice) for the destinations."""
        self.send_all([path], job_id=job_id)

    def send_all(self, paths: list[Path], *, job_id: str) -> None:
        """Queue DICOM objects of a job for the destinations (an instance queued for a
        destination before is not queued again)."""
        if self.outbox is None or not paths:
            return
        self.outbox.enqueue(paths, job_id=job_id)
        if self.workers is not None:
            self.workers.wake()


__all__ = ["GATEWAY_SOURCE", "GatewayBridge", "destinations", "handover_warnings"]

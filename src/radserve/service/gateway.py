"""The DICOM gateway wired into the service: completed studies become jobs, and the
results of those jobs (DICOM SEG + SR) go back through the durable outbox.

Destinations are the allowed peers that have a port (``gateway.allowed_peers`` entries
with ``port``): the PACS that sends a study is usually the one that wants the results.
Without such a peer results stay on the server (JSON, FHIR and files over HTTP).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from radserve.config import Settings
from radserve.gateway import (
    CompletedStudy,
    CompletionKind,
    Destination,
    GatewaySCP,
    Outbox,
    OutboxWorker,
    StoreSCU,
    scp_config_from_settings,
)
from radserve.scheduling import QueueFullError
from radserve.service.intake import Intake, Origin
from radserve.store import JobRecord, Store
from radserve.store.files import store_study_files
from radserve.store.outbox import OutboxStore
from radserve.study import StudyResult

logger = logging.getLogger(__name__)


def destinations(settings: Settings) -> list[Destination]:
    return [
        Destination(name=peer.ae_title, ae_title=peer.ae_title, host=peer.host, port=peer.port)
        for peer in settings.gateway.allowed_peers
        if peer.port is not None
    ]


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
        self.scp = GatewaySCP(
            scp_config_from_settings(settings.gateway, settings.data_dir, **(scp_options or {})),
            self.on_study,
        )
        targets = destinations(settings)
        self.outbox: Outbox | None = None
        self.worker: OutboxWorker | None = None
        if targets:
            scu = StoreSCU(settings.gateway.ae_title)
            self.outbox = Outbox(OutboxStore(store.engine), targets, scu)
            self.worker = OutboxWorker(self.outbox)

    def start(self) -> tuple[str, int]:
        if self.worker is not None:
            self.worker.start()
        return self.scp.start()

    def stop(self) -> None:
        self.scp.stop()
        if self.worker is not None:
            self.worker.stop()

    # --- studies in -------------------------------------------------------------------
    def on_study(self, study: CompletedStudy) -> None:
        """A received study went quiet: store it and queue a job. Raising makes the
        gateway offer the study again later (its files stay on disk)."""
        if study.kind is CompletionKind.LATE_FLAGGED:
            logger.warning(
                "study of %d instances got late instances; flagged, not re-run",
                len(study.instances),
            )
            return
        stored = store_study_files(self.settings.data_dir, list(study.instances))
        resolved = self.intake.catalog.resolve(None)
        origin = Origin(client=",".join(study.calling_ae_titles) or None, source="dicom")
        try:
            submission = self.intake.submit_stored(
                stored.path, stored.fingerprint, resolved=resolved, priority=None, origin=origin
            )
        except QueueFullError:
            logger.warning("queue full: a received study waits at the gateway for a retry")
            raise
        logger.info(
            "job %s from DICOM (%s)", submission.job.id, "cached" if submission.cached else "queued"
        )

    # --- results out ------------------------------------------------------------------
    def wants_dicom_results(self, job: JobRecord) -> bool:
        return self.outbox is not None and job.queue_meta.get("source") == "dicom"

    def on_result(self, job: JobRecord, result: StudyResult) -> None:
        if self.outbox is None or not self.wants_dicom_results(job):
            return
        paths = sorted(result.out_dir.glob("*.dcm"))
        if paths:
            self.outbox.enqueue(paths, job_id=job.id)
            if self.worker is not None:
                self.worker.wake()


__all__ = ["GatewayBridge", "destinations"]

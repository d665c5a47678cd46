"""A result reused from the cache still reaches the new job's route.

A study's result is computed once per (fingerprint, pipeline, models, precision). When
the same study arrives again over *another* route -- uploaded over HTTP first, then
pushed by the PACS over C-STORE, or stored over STOW-RS -- the new job is answered from
the cache, but that route's deliveries are its own: the PACS wants the SEG/SR back, a
DICOMweb client retrieves them with WADO-RS. They are made here from the cached result
(its ``report.json`` and label maps, the study's own headers), without a model run:

- the SEG/SR (and key-image SCs when ``results.secondary_capture_key_images``) are
  written into the cached result's folder if it has none yet. Their UIDs derive from the
  report, so writing them twice gives the same instances;
- they are indexed (WADO-RS serves them; a PACS sending them back is not taken as input);
- for the gateway route they are queued in the outbox for the gateway's destinations under
  the new job. The outbox holds one row per (instance, destination), so the PACS gets them
  once however often the study is re-sent;
- with a FHIR server configured, the result's Bundle is queued if its job never queued one
  (its id derives from the report: one DiagnosticReport per result, never two).

This runs before the cached job's row is written (see
:meth:`radserve.service.intake.Intake.submit_stored`): a crash in between leaves
deliveries queued and no job; the re-sent study then gets its job and queues nothing new.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

from radserve.audit.digests import file_sha256
from radserve.config import Settings
from radserve.errors import ReportError
from radserve.gateway.dicomweb.index import describe
from radserve.gateway.outbox import utc_now
from radserve.ingest import IngestPolicy
from radserve.report.dicom import write_dicom_results
from radserve.report.dicom.results import SR_FILE
from radserve.report.json_report import read_report
from radserve.service.fhir import FhirDelivery
from radserve.service.gateway import GATEWAY_SOURCE, GatewayBridge
from radserve.store import JobRecord
from radserve.store.results import ResultIndex

logger = logging.getLogger(__name__)


class CachedDelivery:
    """``Intake.cached_delivery`` of the service (see the module doc)."""

    def __init__(
        self,
        settings: Settings,
        *,
        results: ResultIndex,
        gateway: GatewayBridge | None,
        fhir: FhirDelivery | None,
        sends_dicom: Callable[[str], bool],
    ) -> None:
        self.settings = settings
        self.results = results
        self.gateway = gateway
        self.fhir = fhir
        # whether jobs of an intake route get DICOM results: the service's definition
        # for jobs that run (Service.route_wants_dicom)
        self.sends_dicom = sends_dicom
        self._lock = threading.Lock()  # one writer of a cached result's DICOM files

    def __call__(self, job_id: str, source: str, hit: JobRecord, study_dir: Path) -> dict[str, str]:
        """Deliver (see the module doc); ``{file name: sha256}`` of the DICOM results
        sent on or served (none for a route that gets none)."""
        if not self.sends_dicom(source):
            return {}
        folder = Path(str(hit.result_path))
        with self._lock:
            paths = self._dicom_results(hit, folder, Path(study_dir))
        records = [describe(path, hit.id, self.results.patient_key) for path in paths]
        self.results.add(records, now=utc_now())
        if source == GATEWAY_SOURCE and self.gateway is not None:
            self.gateway.send_all(paths, job_id=job_id)
        if self.fhir is not None and not self.fhir.queued_for(folder):
            self.fhir.enqueue_report(
                job_id,
                read_report(folder / "report.json"),
                study_path=Path(study_dir),
                folder=folder,
            )
        logger.info(
            "job %s: %d DICOM result(s) of cached job %s delivered on route %s",
            job_id,
            len(paths),
            hit.id,
            source,
        )
        return {path.name: file_sha256(path) for path in paths}

    def _dicom_results(self, hit: JobRecord, folder: Path, study_dir: Path) -> list[Path]:
        """The cached result's SEG/SR/SC, written from its report if it has none."""
        if (folder / SR_FILE).is_file():
            return sorted(folder.glob("*.dcm"))
        report = read_report(folder / "report.json")
        if not report.study.study_instance_uid:
            raise ReportError(f"job {hit.id}: its result has no DICOM study to add SEG/SR to")
        sources = sorted(p for p in study_dir.iterdir() if p.is_file())
        written = write_dicom_results(
            report,
            folder,
            sources,
            key_images=self.settings.results.secondary_capture_key_images,
            policy=IngestPolicy.from_settings(self.settings.ingest),
        )
        logger.info(
            "job %s: %d DICOM result(s) written from its cached result", hit.id, len(written)
        )
        return sorted(folder.glob("*.dcm"))


__all__ = ["CachedDelivery"]

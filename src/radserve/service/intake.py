"""Accepting studies: durable files, a committed job row, then the scheduler.

The order is the promise behind HTTP 202 (and C-STORE success): the study's files are
fsynced into the content-addressed store (:func:`radserve.store.files.store_study`),
then the job row is committed, and only then is the job scheduled and acknowledged.
A study whose (fingerprint, pipeline, model versions, precision) already has a result
is answered from the result cache: a new job, born ``succeeded``, marked cached.
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import pydicom

from radserve.config import Settings
from radserve.errors import RadserveError
from radserve.ingest import IngestPolicy
from radserve.scheduling import (
    JobRequest,
    ModelUnavailableError,
    PriorityClass,
    PriorityRules,
    QueueFullError,
    Scheduler,
    priority_attributes,
    read_priority_attributes,
)
from radserve.service.catalog import Catalog, ResolvedPipeline
from radserve.service.errors import InvalidRequestError
from radserve.service.jobcache import JobCache
from radserve.service.mapping import to_settings_class
from radserve.service.sniff import check_combination, sniff
from radserve.service.work import build_work
from radserve.store import JobRecord, JobState, Store
from radserve.store.files import store_study

logger = logging.getLogger(__name__)

RESULTS_DIR = "results"
DICOMWEB_SOURCE = "dicomweb"  # Origin.source of studies stored over STOW-RS
_ZIP_PROBE = 20  # zip members tried for priority attributes
_ZIP_PROBE_BYTES = 64 * 1024**2


@dataclass(frozen=True)
class Submission:
    """What intake answers: the job, whether it came from the cache, its queue place."""

    job: JobRecord
    cached: bool = False
    position: int | None = None


@dataclass(frozen=True)
class Origin:
    """Who submitted: the API key and client address (audited), and by which route."""

    key_id: str | None = None
    client: str | None = None
    source: str = "api"  # "api" | "dicom" | "dicomweb"


def parse_priority(value: str | None) -> PriorityClass | None:
    if value is None or not value.strip():
        return None
    try:
        return PriorityClass.parse(value)
    except ValueError as exc:
        raise InvalidRequestError(f"priority: {exc}") from None


def study_attributes(study_dir: Path, keywords: Sequence[str]) -> dict[str, str]:
    """The attributes the priority rules read, from the first DICOM file of a stored
    study, or from the first DICOM member of its first zip archive (header only)."""
    attributes = read_priority_attributes(study_dir, keywords)
    if attributes:
        return attributes
    for archive in sorted(Path(study_dir).glob("*.zip")):
        try:
            with zipfile.ZipFile(archive) as zf:
                for info in zf.infolist()[:_ZIP_PROBE]:
                    if info.is_dir() or info.file_size > _ZIP_PROBE_BYTES:
                        continue
                    try:
                        with zf.open(info) as member:
                            ds = pydicom.dcmread(member, stop_before_pixels=True)
                    except Exception:  # not DICOM: try the next member
                        continue
                    return priority_attributes(ds, keywords)
        except (zipfile.BadZipFile, OSError):
            continue
    return {}


class Intake:
    """Submissions from the API and the DICOM gateway; thread-safe."""

    def __init__(
        self,
        settings: Settings,
        *,
        store: Store,
        scheduler: Scheduler,
        catalog: Catalog,
        cache: JobCache,
        rules: PriorityRules,
        policy: IngestPolicy,
        dicom_results: Callable[[JobRecord], bool] = lambda job: False,
    ) -> None:
        self.settings = settings
        self.store = store
        self.scheduler = scheduler
        self.catalog = catalog
        self.cache = cache
        self.rules = rules
        self.policy = policy
        self.dicom_results = dicom_results

    @property
    def results_root(self) -> Path:
        return self.settings.data_dir / RESULTS_DIR

    # --- checks that need no upload -------------------------------------------------
    def precheck(self, pipeline: str | None, priority: PriorityClass | None) -> ResolvedPipeline:
        """Refuse early what can be refused before reading the upload: an unknown
        pipeline or model, or a full queue for a stated class."""
        resolved = self.catalog.resolve(pipeline)
        for model in resolved.model_versions:
            if model in self.scheduler.open_models():
                raise ModelUnavailableError(
                    f"model {model} is unavailable (its circuit breaker is open); "
                    "an administrator must reset it",
                    model=model,
                )
        if priority is not None:
            self._check_room(priority)
        return resolved

    def _check_room(self, cls: PriorityClass) -> None:
        limit = self.scheduler.config.queue_limit(cls)
        if limit is None:
            return
        waiting = self.scheduler.snapshot().queued.get(cls, 0)
        if waiting >= limit:
            retry_after = self.scheduler.config.default_retry_after_s
            raise QueueFullError(
                f"the {cls.name.lower()} queue is full ({waiting} studies waiting, limit "
                f"{limit}); retry after {retry_after} s",
                retry_after=retry_after,
            )

    # --- submissions ------------------------------------------------------------------
    def submit_upload(
        self,
        files: Sequence[BinaryIO],
        *,
        resolved: ResolvedPipeline,
        priority: PriorityClass | None,
        origin: Origin,
    ) -> Submission:
        """Check, store durably and schedule one study made of ``files`` (streams)."""
        kinds = [sniff(stream, i + 1, len(files)) for i, stream in enumerate(files)]
        check_combination(kinds)
        stored = store_study(
            self.settings.data_dir,
            [(f"upload{kind.suffix}", stream) for kind, stream in zip(kinds, files, strict=True)],
            max_bytes=self.settings.server.max_upload_bytes,
        )
        return self.submit_stored(
            stored.path, stored.fingerprint, resolved=resolved, priority=priority, origin=origin
        )

    def submit_stored(
        self,
        study_dir: Path,
        fingerprint: str,
        *,
        resolved: ResolvedPipeline,
        priority: PriorityClass | None,
        origin: Origin,
        attributes: Mapping[str, str] | None = None,
    ) -> Submission:
        """A study already in the content-addressed store -> a job (cached or queued)."""
        hit = self.store.find_cached_result(resolved.cache_key(fingerprint))
        if hit is not None and origin.source == DICOMWEB_SOURCE and not _has_dicom(hit):
            # a DICOMweb client retrieves SEG/SR, which a result made for an HTTP upload
            # lacks: run the study again (the earlier cache entry stays)
            hit = None
        if hit is not None:
            return self._from_cache(hit, resolved, study_dir, fingerprint, priority, origin)
        if priority is None:
            if attributes is None:
                attributes = study_attributes(study_dir, self.rules.keywords)
            priority = self.rules.classify(attributes)
        self._check_room(priority)
        record = self._new_job(
            priority, resolved, study_dir, fingerprint, origin, job_id=str(uuid.uuid4())
        )
        position = self.schedule(record, resolved)
        return Submission(self.cache.get(record.id) or record, cached=False, position=position)

    def _new_job(
        self,
        priority: PriorityClass,
        resolved: ResolvedPipeline,
        study_dir: Path,
        fingerprint: str,
        origin: Origin,
        **extra: str,
    ) -> JobRecord:
        """Persist a job row (and cache it) for a study in ``study_dir``."""
        record = self.store.create_job(
            priority_class=to_settings_class(priority),
            deadline=dt.timedelta(seconds=self.scheduler.config.tat(priority)),
            pipeline_name=resolved.spec.name,
            pipeline_version=resolved.spec.version,
            precision=resolved.precision,
            fingerprint=fingerprint,
            study_path=str(study_dir),
            model_versions=resolved.model_versions,
            api_key_id=origin.key_id,
            client_address=origin.client,
            queue_meta={"source": origin.source},
            **extra,
        )
        self.cache.put(record)
        return record

    def _from_cache(
        self,
        hit: JobRecord,
        resolved: ResolvedPipeline,
        study_dir: Path,
        fingerprint: str,
        priority: PriorityClass | None,
        origin: Origin,
    ) -> Submission:
        cls = priority or PriorityClass.parse(str(hit.priority_class))
        record = self._new_job(cls, resolved, study_dir, fingerprint, origin, cached_from=hit.id)
        logger.info("job %s answered from the result cache (job %s)", record.id, hit.id)
        return Submission(record, cached=True)

    def schedule(
        self, record: JobRecord, resolved: ResolvedPipeline, *, resume: bool = False
    ) -> int | None:
        """Hand a persisted job to the scheduler; a refusal fails the job row too."""
        work = build_work(
            job_id=record.id,
            study_dir=Path(record.study_path),
            resolved=resolved,
            out_dir=self.results_root / record.id,
            registry=self.catalog.registry,
            sessions=self.catalog.sessions,
            policy=self.policy,
            dicom_results=self.dicom_results(record),
            key_image_scs=self.settings.results.secondary_capture_key_images,
        )
        age = max(0.0, (dt.datetime.now(dt.UTC) - record.arrival).total_seconds())
        request = JobRequest(
            record.id,
            work,
            priority=PriorityClass.parse(str(record.priority_class)),
            age_s=age if resume else 0.0,
            resume=resume,
        )
        try:
            ticket = self.scheduler.submit(request)
        except RadserveError as exc:
            self.fail(record.id, exc.code, exc.message)
            raise
        return ticket.position

    def fail(self, job_id: str, code: str, message: str) -> JobRecord:
        record = self.store.transition(
            job_id, JobState.FAILED, error_code=code, error_message=message
        )
        self.cache.put(record)
        return record


def _has_dicom(job: JobRecord) -> bool:
    """Whether a succeeded job's result folder holds DICOM results (SEG/SR)."""
    return bool(job.result_path) and any(Path(str(job.result_path)).glob("*.dcm"))


__all__ = ["DICOMWEB_SOURCE", "Intake", "Origin", "Submission", "parse_priority"]

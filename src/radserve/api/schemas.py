"""The API's response shapes (typed, documented in the OpenAPI schema)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from radserve.api.server_paths import without_server_paths
from radserve.service.job_view import JobEta, JobView, JobWait, result_removed
from radserve.service.sniff import input_kind
from radserve.store import JobRecord


def has_dicom_study(job: JobRecord) -> bool:
    """Whether the job's input was DICOM, not one NIfTI volume: only a DICOM study has a
    FHIR Bundle, whose ImagingStudy needs a Study Instance UID. A study folder gone or
    unreadable counts as DICOM: ``GET /v1/jobs/{id}/fhir`` then decides by the report."""
    try:
        return _input_kind(job.study_path) != "nifti"
    except OSError:
        return True


@functools.lru_cache(maxsize=4096)
def _input_kind(study_path: str) -> str:
    """Cached by path: a study folder is content-addressed, its files never change (the
    status of a succeeded job is polled; one listing per study, not per poll)."""
    return input_kind(Path(study_path))


class _Out(BaseModel):
    model_config = ConfigDict(frozen=True)


class ErrorBody(_Out):
    code: str = Field(description="stable, machine-readable (e.g. queue_full, decode_failed)")
    message: str
    retryable: bool = False


class ErrorOut(_Out):
    error: ErrorBody


class JobError(_Out):
    code: str
    message: str


class JobWarningOut(_Out):
    code: str = Field(description="e.g. late_instances, study_maybe_incomplete")
    message: str
    stage: str | None = None


class EtaOut(_Out):
    """When a queued or running job is predicted to start and finish (UTC)."""

    predicted_start: dt.datetime
    predicted_finish: dt.datetime = Field(
        description="with the work now in the queue, the learned service times, the work "
        "of classes ranked ahead expected to arrive meanwhile (observed rates), scaled by "
        "the class's learned ETA bias (GET /v1/ops/turnaround)"
    )
    predicted_finish_late: dt.datetime = Field(
        description="pessimistic end of the band, a 90th percentile: by default the time "
        "to finish scaled by the 90th percentile of recent finished jobs' actual / "
        "predicted time to finish (turnaround.band: conformal); with band own, or before 3 "
        "jobs have finished, arrivals of classes ranked ahead (observed rates, 90th "
        "percentile) overtake, plus service-time noise"
    )
    order_position: int = Field(description="among unfinished jobs (running too), 0 = first")
    deadline_risk: bool = Field(description="a deadline-risk event was raised for it")
    computed_at: dt.datetime
    basis: str = Field(description="service times: fitted | scaled-prior | prior")

    @classmethod
    def of(cls, eta: JobEta | None) -> EtaOut | None:
        if eta is None:
            return None
        # shallow: dataclasses.asdict deep-copies every datetime (~1 ms of a status read)
        return cls(**{f.name: getattr(eta, f.name) for f in dataclasses.fields(eta)})


class WaitingOut(_Out):
    """Why none of the job's work can run on this server now, although its state says
    queued or running: it waits, and has no ETA until the block ends."""

    reason: str = Field(
        description="a stable code: no_device_worker (every Ray worker is lost), "
        "lease_unproven (the job leases cannot be renewed), schema_not_current (a newer "
        "radserve migrated the database)"
    )
    message: str = Field(description="what blocks the work and what ends the block")
    since: dt.datetime

    @classmethod
    def of(cls, wait: JobWait | None) -> WaitingOut | None:
        if wait is None:
            return None
        return cls(reason=wait.reason, message=wait.message, since=wait.since)


def deadline_missed(job: JobRecord, now: dt.datetime) -> bool:
    """Whether ``job`` finished after its deadline, or is unfinished at ``now`` after it
    (a cancelled job missed nothing): the only part of a status answer that changes
    while the job's record does not."""
    return job.state.value != "cancelled" and (job.finished or now) > job.deadline


class JobOut(_Out):
    id: str
    state: Literal["received", "queued", "running", "succeeded", "failed", "cancelled"]
    priority_class: Literal["URGENT", "INPATIENT", "OUTPATIENT"]
    arrival: dt.datetime
    deadline: dt.datetime
    started: dt.datetime | None = None
    finished: dt.datetime | None = None
    queue_position: int | None = Field(
        None, description="among waiting jobs, 0 = next to start; null unless queued"
    )
    deadline_missed: bool
    pipeline: str
    pipeline_version: str
    precision: str
    model_versions: dict[str, str]
    cached: bool = Field(description="answered from the result cache: nothing ran")
    cached_from: str | None = Field(
        None,
        description="the earlier job whose result answered this one; null unless the "
        "caller may see that job (security.visibility: it may be another site's)",
    )
    attempts: int
    stage_timings: dict[str, float] = Field(description="seconds per stage (final jobs)")
    error: JobError | None = None
    warnings: list[JobWarningOut] = Field(
        default_factory=list,
        description="what the gateway learnt about the job's input (late instances, a "
        "transfer cut off); those recorded before the report was written are in it too",
    )
    eta: EtaOut | None = Field(
        None,
        description="queued and running jobs: predicted times; null while waiting_for is set",
    )
    waiting_for: WaitingOut | None = Field(
        None,
        description="unfinished jobs none of whose work can run on this server now (every "
        "Ray worker lost, new work held): why, and since when; null while work can run",
    )
    links: dict[str, str]

    @classmethod
    def of(
        cls, view: JobView, now: dt.datetime | None = None, *, show_source: bool = False
    ) -> JobOut:
        return cls.from_record(
            view.record,
            view.position,
            view.eta,
            now=now,
            show_source=show_source,
            waiting_for=view.waiting_for,
        )

    @classmethod
    def from_record(
        cls,
        job: JobRecord,
        position: int | None = None,
        eta: JobEta | None = None,
        *,
        now: dt.datetime | None = None,
        show_source: bool = False,
        waiting_for: JobWait | None = None,
    ) -> JobOut:
        """``now`` (default: the clock) decides ``deadline_missed`` of an unfinished job.
        ``show_source``: give ``cached_from``, the earlier job whose result answered this
        one; only when the caller may see that job (:func:`radserve.api.auth.source_visible`:
        under ``security.visibility`` it may be another site's). Off by default: an answer
        built without asking names no other job."""
        base = f"/v1/jobs/{job.id}"
        links = {"self": base}
        # a result the retention policy removed answers 410: its endpoints are not offered
        if job.state.value == "succeeded" and result_removed(job) is None:
            links |= {"report": f"{base}/report"}
            if has_dicom_study(job):  # a NIfTI volume has no FHIR Bundle (409 there)
                links |= {"fhir": f"{base}/fhir"}
            links |= {"labels": f"{base}/labels"}
        return cls(
            id=job.id,
            state=job.state.value,
            priority_class=job.priority_class.value,
            arrival=job.arrival,
            deadline=job.deadline,
            started=job.started,
            finished=job.finished,
            queue_position=position,
            deadline_missed=deadline_missed(job, now or dt.datetime.now(dt.UTC)),
            pipeline=job.pipeline_name,
            pipeline_version=job.pipeline_version,
            precision=job.precision,
            model_versions=dict(job.model_versions),
            cached=job.cached_from is not None,
            cached_from=job.cached_from if show_source else None,
            attempts=job.attempts,
            stage_timings={k: round(v, 4) for k, v in job.stage_timings.items()},
            error=JobError(
                code=job.error_code,
                message=without_server_paths(job.error_message or job.error_code),
            )
            if job.error_code
            else None,
            warnings=[
                JobWarningOut(
                    code=str(w.get("code", "")),
                    message=str(w.get("message", "")),
                    stage=w.get("stage"),
                )
                for w in job.queue_meta.get("warnings") or []
                if isinstance(w, dict)
            ],
            eta=EtaOut.of(eta),
            waiting_for=None if job.terminal else WaitingOut.of(waiting_for),
            links=links,
        )


class ServiceTimeLineOut(_Out):
    pipeline: str
    step: str = Field(
        description="scheduler stage, e.g. 'ingest', 'organs: infer'; 'run' = whole job"
    )
    device: str
    precision: str
    on_device: bool
    intercept_s: float
    seconds_per_slice: float
    samples: int
    residual_s: float = Field(description="median absolute residual around the line")
    source: str = Field(description="fitted | scaled-prior | prior")


class ServiceTimesOut(_Out):
    device: str
    prior: dict[str, float] = Field(description="seconds = fixed_s + per_slice_s x slices")
    typical_slices: int = Field(description="assumed for a study of unknown size")
    lines: list[ServiceTimeLineOut]


class TurnaroundOut(_Out):
    jobs_with_eta: int
    last_compute_ms: float = Field(description="the last ETA recomputation (order + walk)")
    risk_margin_s: float
    risk_policy: str
    at_risk: list[str] = Field(
        description="unfinished jobs a deadline-risk event stands for (under "
        "security.visibility only those the caller may see; the counts are the server's)"
    )
    risk_events: dict[str, int] = Field(
        default_factory=dict,
        description="since start: risk events raised, and cleared (prediction recovered)",
    )
    misses: dict[str, Any] = Field(
        description="jobs that arrived since `since` (window_h, default 24 h), from the "
        "store (the same after a restart and on every replica): misses, predicted (a risk "
        "event stood at the deadline), predicted_fraction, lead_s_p50 / lead_s_min (alert "
        "to deadline), false_alerts (jobs a risk was raised for that ended by their deadline)"
    )
    eta_bias: dict[str, dict[str, float | int]] = Field(
        default_factory=dict,
        description="per class: recent finished jobs learned from and the factor that "
        "scales new ETAs' time to finish (median actual / predicted, starts at 1)",
    )
    eta_band: dict[str, Any] = Field(
        default_factory=dict,
        description="the band's late end (predicted_finish_late): band `own` (the walk's) "
        "or `conformal` (turnaround.band), with jobs (recent finished jobs learned from) "
        "and ratio (their 90th percentile of actual / predicted time to finish, applied "
        "to every ETA's time to finish; null until 3 have finished)",
    )


class JobPageOut(_Out):
    items: list[JobOut]
    next_cursor: str | None = Field(None, description="pass as `cursor` for the next page")


class BatchItemOut(_Out):
    study: str = Field(description="the form field name the study's files were sent under")
    status: int = Field(description="what a single submission of this study would answer")
    job: JobOut | None = None
    error: ErrorBody | None = None


class BatchOut(_Out):
    accepted: int
    refused: int
    items: list[BatchItemOut]


class HealthOut(_Out):
    status: Literal["ok"] = "ok"
    model_versions: dict[str, str]
    uptime_seconds: float
    version: str


class ReadyOut(_Out):
    ready: bool
    warmed_up: bool
    store_reachable: bool
    open_models: list[str] = Field(description="models whose circuit breaker is open")
    failed_models: dict[str, str]
    reasons: list[str]
    degraded: bool = Field(
        default=False, description="serving, but results do not reach some destination"
    )
    unreachable_peers: dict[str, str] = Field(
        default_factory=dict,
        description="outbox destinations failing past outbox.unreachable_after_s, or whose "
        "deliveries have been due with no sender making progress (a paused replica)",
    )
    work_held: str | None = Field(
        default=None,
        description="why this server starts no new work (lease_unproven: it cannot renew "
        "its job leases); null while work goes on",
    )
    work_held_seconds: float = Field(default=0.0, description="for how long it has held")


class ModelResetOut(_Out):
    model: str
    was_open: bool


class OutboxItemOut(_Out):
    """One delivery: a result file (DICOM) or a Bundle (FHIR) for one destination."""

    id: int
    kind: str
    destination: str
    state: str = Field(
        description="pending | sending | committing (stored, storage commitment awaited) "
        "| sent | failed_permanent"
    )
    job_id: str | None
    study_instance_uid: str
    sop_instance_uid: str = Field(description="the instance, or the Bundle id (FHIR)")
    attempts: int
    next_attempt_at: dt.datetime
    last_error: str | None = Field(
        description="why the last try failed; on a sent row, the warning status the peer "
        "stored it with (e.g. 0xB000 coercion), else null"
    )
    created: dt.datetime
    updated: dt.datetime
    sent_at: dt.datetime | None
    commitment_uid: str | None = Field(
        default=None,
        description="the storage commitment Transaction UID last asked of the destination",
    )

    @classmethod
    def from_item(cls, item: Any) -> OutboxItemOut:
        return cls(
            id=item.id,
            kind=str(item.kind),
            destination=item.destination,
            state=str(item.state),
            job_id=item.job_id,
            study_instance_uid=item.study_instance_uid,
            sop_instance_uid=item.sop_instance_uid,
            attempts=item.attempts,
            next_attempt_at=item.next_attempt_at,
            last_error=item.last_error,
            created=item.created,
            updated=item.updated,
            sent_at=item.sent_at,
            commitment_uid=getattr(item, "commitment_uid", None),
        )


class JobDeliveriesOut(_Out):
    """Where a job's results went: one row per (result, destination), every kind."""

    job_id: str
    deliveries: list[OutboxItemOut] = Field(
        description="DICOM SEG/SR per PACS, the FHIR Bundle, critical-finding notices, "
        "in the order they were queued; none while the job has no result to send"
    )


class DestinationStatusOut(_Out):
    kind: str
    destination: str
    pending: int
    sending: int
    failed_permanent: int
    retrying: int
    committing: int = Field(description="stored, the destination's storage commitment awaited")
    oldest_pending: dt.datetime | None
    failing_since: dt.datetime | None
    last_error: str | None


class OutboxOut(_Out):
    destinations: list[DestinationStatusOut]
    items: list[OutboxItemOut]


__all__ = [
    "BatchItemOut",
    "BatchOut",
    "DestinationStatusOut",
    "ErrorBody",
    "ErrorOut",
    "HealthOut",
    "JobError",
    "JobOut",
    "JobPageOut",
    "ModelResetOut",
    "OutboxItemOut",
    "OutboxOut",
    "ReadyOut",
]

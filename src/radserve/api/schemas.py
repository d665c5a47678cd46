"""The API's response shapes (typed, documented in the OpenAPI schema)."""

from __future__ import annotations

import datetime as dt
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from radserve.service.jobs import JobView
from radserve.store import JobRecord


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
    cached_from: str | None = None
    attempts: int
    stage_timings: dict[str, float] = Field(description="seconds per stage (final jobs)")
    error: JobError | None = None
    links: dict[str, str]

    @classmethod
    def of(cls, view: JobView) -> JobOut:
        return cls.from_record(view.record, view.position)

    @classmethod
    def from_record(cls, job: JobRecord, position: int | None = None) -> JobOut:
        now = dt.datetime.now(dt.UTC)
        end = job.finished or now
        base = f"/v1/jobs/{job.id}"
        links = {"self": base}
        if job.state.value == "succeeded":
            links |= {
                "report": f"{base}/report",
                "fhir": f"{base}/fhir",
                "labels": f"{base}/labels",
            }
        return cls(
            id=job.id,
            state=job.state.value,
            priority_class=job.priority_class.value,
            arrival=job.arrival,
            deadline=job.deadline,
            started=job.started,
            finished=job.finished,
            queue_position=position,
            deadline_missed=job.state.value != "cancelled" and end > job.deadline,
            pipeline=job.pipeline_name,
            pipeline_version=job.pipeline_version,
            precision=job.precision,
            model_versions=dict(job.model_versions),
            cached=job.cached_from is not None,
            cached_from=job.cached_from,
            attempts=job.attempts,
            stage_timings={k: round(v, 4) for k, v in job.stage_timings.items()},
            error=JobError(code=job.error_code, message=job.error_message or job.error_code)
            if job.error_code
            else None,
            links=links,
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


class ModelResetOut(_Out):
    model: str
    was_open: bool


__all__ = [
    "BatchItemOut",
    "BatchOut",
    "ErrorBody",
    "ErrorOut",
    "HealthOut",
    "JobError",
    "JobOut",
    "JobPageOut",
    "ModelResetOut",
    "ReadyOut",
]

"""Job rows <-> records, the updatable fields, listing filters and the page cursor."""

from __future__ import annotations

import base64
import binascii
import datetime as dt
from collections.abc import Iterable
from typing import Any

from sqlalchemy import Select, and_, or_, select

from radserve.domain.priority import PriorityClass
from radserve.store.errors import InvalidCursorError
from radserve.store.models import Job
from radserve.store.records import JobRecord, JobState

# fields transition(**fields) may set; state, timestamps, attempts and result are the
# store's own business (set by the transition itself and by record_result)
UPDATABLE_FIELDS = frozenset(
    {
        "error_code",
        "error_message",
        "stage_timings",
        "queue_meta",
        "model_versions",
        "precision",
        "deadline",
        "priority_class",
    }
)
MAX_PAGE = 1000
_BAD_CURSOR = "invalid page cursor: pass back next_cursor exactly as it was returned"


def to_record(row: Job) -> JobRecord:
    return JobRecord(
        id=row.id,
        state=JobState(row.state),
        priority_class=PriorityClass(row.priority_class),
        arrival=row.arrival,
        deadline=row.deadline,
        pipeline_name=row.pipeline_name,
        pipeline_version=row.pipeline_version,
        precision=row.precision,
        fingerprint=row.fingerprint,
        study_path=row.study_path,
        started=row.started,
        finished=row.finished,
        updated=row.updated,
        model_versions=dict(row.model_versions or {}),
        result_path=row.result_path,
        error_code=row.error_code,
        error_message=row.error_message,
        attempts=row.attempts,
        cached_from=row.cached_from,
        api_key_id=row.api_key_id,
        client_address=row.client_address,
        stage_timings=dict(row.stage_timings or {}),
        queue_meta=dict(row.queue_meta or {}),
        lease_owner=row.lease_owner,
    )


def check_fields(fields: dict[str, Any]) -> dict[str, Any]:
    """The column values for ``fields``; unknown names are a programming error."""
    unknown = set(fields) - UPDATABLE_FIELDS
    if unknown:
        raise TypeError(
            f"transition() cannot set {sorted(unknown)}; "
            f"settable fields: {sorted(UPDATABLE_FIELDS)}"
        )
    values = dict(fields)
    if "priority_class" in values:
        values["priority_class"] = PriorityClass(values["priority_class"]).value
    for name in ("stage_timings", "queue_meta", "model_versions"):
        if name in values:
            values[name] = dict(values[name])
    return values


def _as_states(state: JobState | str | Iterable[JobState | str] | None) -> list[str] | None:
    if state is None:
        return None
    if isinstance(state, str):
        return [JobState(state).value]
    return [JobState(s).value for s in state]


def list_query(
    *,
    state: JobState | str | Iterable[JobState | str] | None,
    priority_class: PriorityClass | str | None,
    pipeline: str | None,
    created_after: dt.datetime | None,
    created_before: dt.datetime | None,
    cursor: str | None,
    limit: int,
) -> Select[Any]:
    """Newest first, ordered by (arrival, id) so a cursor page never repeats or skips a row."""
    query = select(Job)
    states = _as_states(state)
    if states is not None:
        query = query.where(Job.state.in_(states))
    if priority_class is not None:
        query = query.where(Job.priority_class == PriorityClass(priority_class).value)
    if pipeline is not None:
        query = query.where(Job.pipeline_name == pipeline)
    if created_after is not None:
        query = query.where(Job.arrival >= created_after)
    if created_before is not None:
        query = query.where(Job.arrival < created_before)
    if cursor is not None:
        arrival, job_id = decode_cursor(cursor)
        query = query.where(
            or_(Job.arrival < arrival, and_(Job.arrival == arrival, Job.id < job_id))
        )
    return query.order_by(Job.arrival.desc(), Job.id.desc()).limit(limit + 1)


def encode_cursor(job: JobRecord) -> str:
    raw = f"{job.arrival.astimezone(dt.UTC).isoformat()}|{job.id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[dt.datetime, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        stamp, job_id = raw.split("|", 1)
        arrival = dt.datetime.fromisoformat(stamp)
    except (ValueError, binascii.Error, UnicodeDecodeError) as exc:
        raise InvalidCursorError(_BAD_CURSOR) from exc
    if arrival.tzinfo is None:
        raise InvalidCursorError(_BAD_CURSOR)
    return arrival, job_id

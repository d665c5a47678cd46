"""Job rows <-> records, the updatable fields, listing filters and the page cursor.

A listing under ``security.visibility`` (:class:`VisibleTo`) filters in its query: a page
filtered afterwards held fewer jobs than asked (a site's own jobs vanished behind newer
ones of other sites) and its cursor named the last job scanned, one the key may not
see (its id and arrival time, base64 in ``next_cursor``)."""

from __future__ import annotations

import base64
import binascii
import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from sqlalchemy import ColumnElement, Select, and_, func, or_, select, update

from radserve.domain.priority import PriorityClass
from radserve.errors import InvalidRequestError
from radserve.store.errors import InvalidCursorError
from radserve.store.models import ApiKey, Job
from radserve.store.records import CacheKey, JobPage, JobRecord, JobState

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from radserve.store.base import StoreBase

# a job no end state has reached yet
UNFINISHED_STATES = (JobState.RECEIVED, JobState.QUEUED, JobState.RUNNING)

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
        accession=row.accession,
    )


def jobs_of_input(session: Session, key: CacheKey, states: Iterable[JobState]) -> list[Job]:
    """The rows in ``states`` whose input, pipeline, precision and models are ``key``'s,
    oldest first (the cache's and a duplicate submission's look-up)."""
    rows = session.execute(
        select(Job)
        .where(
            Job.fingerprint == key.fingerprint,
            Job.pipeline_name == key.pipeline_name,
            Job.pipeline_version == key.pipeline_version,
            Job.precision == key.precision,
            Job.state.in_([s.value for s in states]),
        )
        .order_by(Job.arrival, Job.id)
    ).scalars()
    return [row for row in rows if dict(row.model_versions or {}) == dict(key.model_versions)]


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


@dataclass(frozen=True)
class VisibleTo:
    """The jobs a non-admin key may see under ``security.visibility`` (the rule of
    :meth:`radserve.security.access.ReadAccess.visible`, as a query): those it
    submitted, and those submitted by a key with its ``scope`` (its submitter under
    ``own_submitter``, its site under ``site``; None: no other key's) or by one of
    ``members`` (the console's local users of that scope, who are no keys)."""

    rule: Literal["own_submitter", "site"]
    key_id: str
    scope: str | None
    members: tuple[str, ...] = ()

    def clause(self) -> ColumnElement[bool]:
        own = Job.api_key_id == self.key_id
        if self.scope is None:
            return own
        column = ApiKey.submitter if self.rule == "own_submitter" else ApiKey.site
        keys = Job.api_key_id.in_(select(ApiKey.id).where(column == self.scope))
        if self.members:
            return or_(own, keys, Job.api_key_id.in_(self.members))
        return or_(own, keys)


def _as_classes(
    value: PriorityClass | str | Iterable[PriorityClass | str] | None,
) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return [PriorityClass(value).value]
    return [PriorityClass(c).value for c in value]


def utc_bound(value: dt.datetime, name: str) -> dt.datetime:
    """``value`` in UTC (naive: taken as UTC), as the arrival column compares it; 400
    for one whose UTC time is outside the years 1..9999 (``9999-12-31T23:59:59-23:59``:
    the conversion overflowed in the query, a 500)."""
    if value.tzinfo is None:
        return value.replace(tzinfo=dt.UTC)
    try:
        return value.astimezone(dt.UTC)
    except OverflowError:
        raise InvalidRequestError(
            f"{name}: {value.isoformat()} is out of range (in UTC it falls outside the "
            "years 1 to 9999)"
        ) from None


def list_query(
    *,
    state: JobState | str | Iterable[JobState | str] | None,
    priority_class: PriorityClass | str | Iterable[PriorityClass | str] | None,
    pipeline: str | None,
    created_after: dt.datetime | None,
    created_before: dt.datetime | None,
    cursor: str | None,
    limit: int,
    visible_to: VisibleTo | None = None,
    accession: str | None = None,
    accession_is: str | None = None,
) -> Select[Any]:
    """Newest first, ordered by (arrival, id) so a cursor page never repeats or skips a
    row. ``accession``: the jobs whose accession number contains it, in any case;
    ``accession_is``: those whose number is exactly it (case as stored)."""
    query = select(Job)
    if accession_is is not None:
        query = query.where(Job.accession == accession_is)
    wanted = (accession or "").strip().lower()
    if wanted:
        # % and _ typed in the box are characters, not patterns (autoescape)
        query = query.where(func.lower(Job.accession).contains(wanted, autoescape=True))
    states = _as_states(state)
    if states is not None:
        query = query.where(Job.state.in_(states))
    classes = _as_classes(priority_class)
    if classes is not None:
        query = query.where(Job.priority_class.in_(classes))
    if visible_to is not None:
        query = query.where(visible_to.clause())
    if pipeline is not None:
        query = query.where(Job.pipeline_name == pipeline)
    if created_after is not None:
        query = query.where(Job.arrival >= utc_bound(created_after, "created_after"))
    if created_before is not None:
        query = query.where(Job.arrival < utc_bound(created_before, "created_before"))
    if cursor is not None:
        arrival, job_id = decode_cursor(cursor)
        query = query.where(
            or_(Job.arrival < arrival, and_(Job.arrival == arrival, Job.id < job_id))
        )
    return query.order_by(Job.arrival.desc(), Job.id.desc()).limit(limit + 1)


def list_jobs(
    store: StoreBase,
    *,
    state: JobState | str | Iterable[JobState | str] | None = None,
    priority_class: PriorityClass | str | Iterable[PriorityClass | str] | None = None,
    pipeline: str | None = None,
    created_after: dt.datetime | None = None,
    created_before: dt.datetime | None = None,
    limit: int = 50,
    cursor: str | None = None,
    visible_to: VisibleTo | None = None,
    accession: str | None = None,
    accession_is: str | None = None,
) -> JobPage:
    """:meth:`Store.list_jobs` with the visibility rule (and several classes) in the
    query: every page is full, and ``next_cursor`` names only a job ``visible_to``
    sees. ``created_*`` bound the arrival time (after: inclusive); ``accession`` keeps
    the jobs whose accession number contains it (case-insensitive; a job whose number
    is not read yet, None on the row, matches no search); ``accession_is`` those whose
    number is exactly it (``GET /v1/jobs?accession=``)."""
    if not 1 <= limit <= MAX_PAGE:
        raise ValueError(f"limit must be in 1..{MAX_PAGE}, got {limit}")
    query = list_query(
        state=state,
        priority_class=priority_class,
        pipeline=pipeline,
        created_after=created_after,
        created_before=created_before,
        cursor=cursor,
        limit=limit,
        visible_to=visible_to,
        accession=accession,
        accession_is=accession_is,
    )
    with store._read() as session:
        items = [to_record(row) for row in session.execute(query).scalars()]
    more = len(items) > limit
    items = items[:limit]
    return JobPage(items=items, next_cursor=encode_cursor(items[-1]) if more else None)


def unread_accessions(store: StoreBase, *, limit: int) -> list[tuple[str, str]]:
    """Up to ``limit`` jobs whose accession number is not read yet (rows from before
    revision 0020): ``(job id, study path)``, newest first (the likeliest searched)."""
    query = (
        select(Job.id, Job.study_path)
        .where(Job.accession.is_(None))
        .order_by(Job.arrival.desc(), Job.id.desc())
        .limit(limit)
    )
    with store._read() as session:
        return [(row.id, row.study_path) for row in session.execute(query)]


def fill_accessions(store: StoreBase, accessions: Mapping[str, str]) -> None:
    """Write job id -> accession number on the rows that have none yet (another replica
    filling the same rows writes the same values)."""
    if not accessions:
        return
    with store._write(audited=False) as session:
        for job_id, accession in accessions.items():
            session.execute(
                update(Job)
                .where(Job.id == job_id, Job.accession.is_(None))
                .values(accession=accession.strip())
            )


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
    try:  # an edited cursor's far offset overflowed in the query
        arrival = arrival.astimezone(dt.UTC)
    except OverflowError:
        raise InvalidCursorError(_BAD_CURSOR) from None
    return arrival, job_id

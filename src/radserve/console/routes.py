"""The console's own endpoints: the worklist and its live feed, a job's study view data,
the CT as NIfTI, result downloads and the operations figures (the model lifecycle on
that page is read from ``/v1/models`` and acted on through it). Sign-in and the session
endpoints are in :mod:`radserve.console.signin`.

Everything else the console does goes through the public API (``/v1/jobs``,
``/v1/ops/outbox``...), authenticated by the session cookie (see
:mod:`radserve.console.auth`). These endpoints use the same role dependencies, so a
session and a key with the same role may do exactly the same things.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from sqlalchemy import func, select
from starlette.concurrency import run_in_threadpool

from radserve.api.auth import (
    Principal,
    actor_visible,
    audited_read,
    check_phi_identifiers,
    job_visible,
    read_access,
    require_read,
    source_visible,
    token_of,
    visible_to,
)
from radserve.api.errors import ForbiddenError
from radserve.api.files import RANGE_RESPONSES, FileAnswer
from radserve.api.job_names import report_needs_care, shown_report_bytes, shown_report_json
from radserve.api.routes.jobs import ClassName, StateName, from_result
from radserve.api.schemas import ErrorOut, EtaOut, JobOut
from radserve.api.state import service_of as _service
from radserve.console.accessions import AccessionBackfill
from radserve.console.auth import current_session
from radserve.console.events import STREAM_S, JobFeed, WaitingEvents
from radserve.console.ops import OpsHistory, current
from radserve.console.refused import (
    refused_series,
    report_without_descriptions,
    without_descriptions,
)
from radserve.console.studyinfo import PatientFields, StudyInfo
from radserve.console.volume import ct_volume
from radserve.errors import InvalidRequestError, quoted
from radserve.ingest.policy import IngestPolicy
from radserve.security.keys import Role
from radserve.service import Service
from radserve.service.errors import OutputNotFoundError, ResultRemovedError, SourceRemovedError
from radserve.service.job_view import result_removed
from radserve.service.jobs import REPORT_FILE
from radserve.store import JobRecord, JobState
from radserve.store import jobs as job_rows
from radserve.store.models import ACCESSION_SEARCH_LENGTH, AuditEntry, OutboxDelivery

router = APIRouter(include_in_schema=False)
# the console's routes that are public API too, in the OpenAPI document (a route cannot
# opt back in on a router that leaves its routes out)
api_router = APIRouter(tags=["jobs"])
Reader = Annotated[Principal, Depends(require_read)]
# a stem far below the file systems' 255-byte name limit: a longer name is no result
# file (404), never a path the OS refuses (ENAMETOOLONG was a 500)
_RESULT_FILE = re.compile(r"^[A-Za-z0-9_-]{1,128}(\.nii\.gz|\.dcm|\.json)$")
# result files that name the patient (a SEG's or SR's patient module)
_PHI_FILE = ".dcm"
_TRAIL_LIMIT = 500
# how often an open event stream looks whether its session still stands (a sign-out or
# a revoked key through another replica ends it then, not at the stream's end)
SESSION_CHECK_S = 5.0


def _feed(request: Request) -> JobFeed:
    return request.app.state.console_feed  # type: ignore[no-any-return]


def _info(request: Request) -> StudyInfo:
    return request.app.state.console_info  # type: ignore[no-any-return]


def _accessions(request: Request) -> AccessionBackfill:
    return request.app.state.console_accessions  # type: ignore[no-any-return]


def _history(request: Request) -> OpsHistory:
    history: OpsHistory = request.app.state.console_ops
    history.ensure_running()
    return history


def phi_allowed(request: Request, role: Role) -> bool:
    """Whether sessions of ``role`` see patient details (``console.phi_roles``)."""
    return role.value in _service(request).settings.console.phi_roles


def phi_downloads(request: Request, who: Principal) -> bool:
    """Whether ``who`` may download what names the patient (FHIR Bundle, SEG, SR): an
    API key by its role, a session only with a role in ``console.phi_roles`` (the
    same rule as :func:`radserve.api.auth.check_phi_identifiers`)."""
    return not who.session or phi_allowed(request, who.role)


# --- worklist --------------------------------------------------------------------------
def _stage(record: JobRecord, position: int | None) -> str:
    if record.state is JobState.RECEIVED:
        return "ingest"
    if record.state is JobState.QUEUED:
        return "waiting" if position is None else f"waiting (#{position + 1})"
    if record.state is JobState.RUNNING:
        return f"running (attempt {record.attempts})" if record.attempts > 1 else "running"
    if record.state is JobState.SUCCEEDED:
        if result_removed(record) is not None:
            return "result removed"
        return "cached result" if record.cached_from else "done"
    return record.error_code or record.state.value


def _row(request: Request, who: Principal, record: JobRecord) -> dict[str, Any]:
    """One worklist row for ``who`` (call from a worker thread: may read the study
    header); ``cached_from`` only when ``who`` may see that job."""
    view = _service(request).jobs.view(record)
    out = JobOut.of(view, show_source=source_visible(request, who, record)).model_dump(mode="json")
    accession = record.accession  # None: not on the row yet (radserve.console.accessions)
    if accession is None:
        accession = _info(request).get(record.id, record.study_path).accession
    out["accession"] = accession
    out["stage"] = _stage(record, view.position)
    out.pop("links", None)
    if out.get("error"):  # a refusal of every series quotes their descriptions
        out["error"]["message"] = without_descriptions(out["error"]["message"])
    return out


def _visible(request: Request, who: Principal, records: list[JobRecord]) -> list[JobRecord]:
    access = read_access(request)
    if access.visibility == "all" or who.allows(Role.ADMIN):
        return records
    reader = who.reader
    return [r for r in records if access.visible(reader, r.api_key_id)]


@router.get("/console/api/worklist")
async def worklist(
    request: Request,
    who: Reader,
    state: Annotated[list[StateName] | None, Query()] = None,
    priority_class: Annotated[list[ClassName] | None, Query()] = None,
    date_from: dt.date | None = None,
    date_to: dt.date | None = None,
    accession: Annotated[str | None, Query(max_length=ACCESSION_SEARCH_LENGTH)] = None,
    limit: Annotated[int, Query(ge=1, le=job_rows.MAX_PAGE)] = 200,
    cursor: Annotated[str | None, Query(max_length=512)] = None,
) -> Response:
    """The newest ``limit`` jobs ``who`` may see, after ``cursor`` (the ``next`` of the
    page before): the visibility rule (that of ``GET /v1/jobs``), states, classes, dates
    and the accession number (any part of it, in any case) in the query, over every job.
    Filtered after it, a site's own jobs (or the URGENT ones) vanished behind ``limit``
    newer others, and a search looked only through the newest 1,000 jobs. ``has_more``:
    older jobs match too, and ``next`` pages to them (keyset on arrival and id: a page
    never repeats or skips a job, whatever arrives meanwhile)."""
    _history(request)
    _accessions(request).ensure_running()
    service = _service(request)
    feed = _feed(request)
    seq = feed.seq  # before the read: a change after it arrives through the feed
    created_after = _day_start(date_from, "date_from") if date_from is not None else None
    # the day after date_to; none after 9999-12-31 (every job arrived before it)
    created_before = _day_start(date_to, "date_to", days=1) if date_to is not None else None

    def read() -> tuple[list[dict[str, Any]], str | None]:
        page = job_rows.list_jobs(
            service.store,
            state=state or None,
            priority_class=priority_class or None,
            created_after=created_after,
            created_before=created_before,
            accession=accession,
            limit=limit,
            cursor=cursor or None,
            visible_to=visible_to(request, who),
        )
        return [_row(request, who, r) for r in page.items], page.next_cursor

    rows, next_cursor = await run_in_threadpool(read)
    return JSONResponse(
        {
            "seq": seq,
            "items": rows,
            "has_more": next_cursor is not None,
            "next": next_cursor,
            "now": dt.datetime.now(dt.UTC).isoformat(),
        }
    )


def _day_start(day: dt.date, name: str, *, days: int = 0) -> dt.datetime | None:
    """Midnight UTC ``days`` after ``day``; None past the last representable day (no
    bound: ``date_to=9999-12-31`` overflowed, a 500)."""
    try:
        return dt.datetime.combine(day + dt.timedelta(days=days), dt.time(), dt.UTC)
    except OverflowError:
        if days > 0:
            return None
        raise InvalidRequestError(f"{name}: {day.isoformat()} is out of range") from None


def _etas(request: Request, who: Principal) -> dict[str, dict[str, Any] | None]:
    """The ETAs of the unfinished jobs ``who`` may see, to the second (they move with
    every scheduler event; the worklist gets them without re-reading rows); None for a
    job that has none, so the worklist drops one it showed (every Ray worker lost)."""
    service = _service(request)
    _, order = service.scheduler.queue_order()
    out: dict[str, dict[str, Any]] = {}
    for queued in order:
        record = service.jobs.cached(queued.job_id)
        if record is None or not _visible(request, who, [record]):
            continue
        eta = EtaOut.of(service.jobs.eta(record))
        if eta is None:  # none (any more): nothing can run its work now (waiting_for)
            out[record.id] = None
            continue
        body = eta.model_dump(mode="json")
        body.pop("computed_at", None)
        for name in ("predicted_start", "predicted_finish", "predicted_finish_late"):
            body[name] = body[name][:19] + "Z" if body[name] else None
        out[record.id] = body
    return out


@router.get("/console/api/events")
async def events(
    request: Request, who: Reader, since: Annotated[int | None, Query(ge=0)] = None
) -> StreamingResponse:
    """Server-sent events: ``job`` (a changed worklist row, ``id`` = its number),
    ``positions`` (queue positions when they change), ``reset`` (reload the list),
    ``ended`` (the session ended: signed out, expired or its key revoked, on any
    replica; looked at every ``SESSION_CHECK_S``, and the stream ends)."""
    _history(request)
    feed = _feed(request)
    by_session = token_of(request) is None
    # a reconnect's Last-Event-ID: one of the feed's numbers, else ignored (a header of
    # other digits, "²" or 5,000 of them, made int() raise: a 500)
    last = request.headers.get("last-event-id") or ""
    start = int(last) if last.isascii() and last.isdigit() and len(last) <= 19 else since
    service = _service(request)
    loop = asyncio.get_running_loop()

    async def stream() -> AsyncIterator[bytes]:
        wake, close = feed.waiter()
        try:
            yield b"retry: 500\n\n"
            seq = feed.seq if start is None else start
            if start is None:
                yield f"id: {seq}\nevent: hello\ndata: {{}}\n\n".encode()
            positions: dict[str, int] = {}
            sent_etas: dict[str, dict[str, Any] | None] = {}
            waiting = WaitingEvents()  # what blocks all work here (no job event says it)
            # shorter than server.request_timeout_s, so the timeout middleware never cuts
            # a stream mid-event (a cut one would reconnect and lose nothing anyway)
            ends = loop.time() + min(STREAM_S, 0.8 * service.settings.server.request_timeout_s)
            check_at = loop.time() + SESSION_CHECK_S
            while loop.time() < ends:
                if by_session and loop.time() >= check_at:
                    check_at = loop.time() + SESSION_CHECK_S
                    if await current_session(request) is None:
                        yield b"event: ended\ndata: {}\n\n"
                        return
                changes = feed.after(seq)
                if changes is None:
                    seq = feed.seq
                    yield f"id: {seq}\nevent: reset\ndata: {{}}\n\n".encode()
                    changes = []
                if changes:
                    seq = changes[-1][0]
                    latest = {r.id: (n, r) for n, r in changes}
                    records = [r for _, r in latest.values()]

                    def rows(records: list[JobRecord] = records) -> list[dict[str, Any]]:
                        return [_row(request, who, r) for r in _visible(request, who, records)]

                    for row in await run_in_threadpool(rows):
                        data = json.dumps(row)
                        yield f"id: {seq}\nevent: job\ndata: {data}\n\n".encode()
                now = await run_in_threadpool(lambda: dict(service.scheduler.snapshot().positions))
                if now != positions:
                    positions = now
                    shown = {
                        job_id: p
                        for job_id, p in now.items()
                        if (r := service.jobs.cached(job_id)) is not None
                        and _visible(request, who, [r])
                    }
                    yield f"event: positions\ndata: {json.dumps(shown)}\n\n".encode()
                etas = await run_in_threadpool(_etas, request, who)
                if etas != sent_etas:
                    sent_etas = etas
                    yield f"event: etas\ndata: {json.dumps(etas)}\n\n".encode()
                if (block := waiting.event(service.jobs.waits_for())) is not None:
                    yield block
                wake.clear()
                try:
                    await asyncio.wait_for(wake.wait(), timeout=min(2.0, STREAM_S))
                except TimeoutError:
                    yield b": ping\n\n"
                if await request.is_disconnected():
                    return
        finally:
            close()

    return StreamingResponse(
        stream(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


# --- study view ------------------------------------------------------------------------
# payload fields of an audit record that say who acted (with its actor and address)
_ACTOR_FIELDS = ("key_name", "user")
# payload fields that name another job
_JOB_FIELDS = ("cached_from",)


def _trail(request: Request, who: Principal, job_id: str) -> list[dict[str, Any]]:
    """The job's audit records as ``who`` may see them (call from a worker thread): who
    acted (key id or ``user:<name>``, its name, its client address) only where the
    visibility rule lets ``who`` see that actor, and a job named in a payload (the
    earlier job a cached result came from) only where ``who`` may see that job; the
    rest of each record (action, time, what was read or changed) stays."""
    service = _service(request)
    with service.store.engine.connect() as connection:
        rows = connection.execute(
            select(
                AuditEntry.seq,
                AuditEntry.ts,
                AuditEntry.action,
                AuditEntry.actor_key_id,
                AuditEntry.client_address,
                AuditEntry.payload,
            )
            .where(AuditEntry.subject == job_id)
            .order_by(AuditEntry.seq)
            .limit(_TRAIL_LIMIT)
        ).all()
    out = []
    for r in rows:
        # the stored canonical JSON text, as the object it is (as text the page showed
        # it JSON-encoded twice: every quote escaped)
        payload = json.loads(r.payload)
        shown = actor_visible(request, who, r.actor_key_id)
        if not shown:
            payload = {k: v for k, v in payload.items() if k not in _ACTOR_FIELDS}
        for name in _JOB_FIELDS:
            named = payload.get(name)
            if named is not None and not job_visible(request, who, str(named)):
                payload = {k: v for k, v in payload.items() if k != name}
        out.append(
            {
                "seq": r.seq,
                "ts": r.ts.isoformat() if r.ts else None,
                "action": r.action,
                "actor_key_id": r.actor_key_id if shown else None,
                "client": r.client_address if shown else None,
                # true: someone acted whom this reader may not see (another site's key
                # or user, or an admin's); the page says so instead of a blank
                "actor_hidden": not shown,
                "payload": payload,
            }
        )
    return out


async def _job(request: Request, job_id: str, who: Principal) -> JobRecord:
    from radserve.api.auth import check_visible

    record = await run_in_threadpool(_service(request).jobs.get, job_id)
    await check_visible(request, who, record)
    return record


@router.get("/console/api/jobs/{job_id}")
async def job_detail(request: Request, job_id: str, who: Reader) -> Response:
    """The study view's data. A job whose result the retention policy removed has no
    report: its page shows the job, the removal (as the job's ``error``, which the page
    shows where a report would be) and the audit trail."""
    service = _service(request)
    record = await _job(request, job_id, who)
    report: Any = None
    files: list[str] = []
    removed: str | None = None
    if record.state is JobState.SUCCEEDED:

        def read(record: JobRecord) -> tuple[bytes, list[str]]:
            data = service.jobs.report_bytes(record)  # may be in memory: list the folder too
            folder = service.jobs.result_dir(record)
            try:
                names = sorted(p.name for p in folder.iterdir() if _RESULT_FILE.match(p.name))
            except FileNotFoundError as exc:  # a report held in memory, its folder gone
                raise OutputNotFoundError(f"job {record.id}: its result folder is missing") from exc
            return data, names

        try:
            data, files = await from_result(service.jobs, record, read)
        except ResultRemovedError as exc:
            removed = exc.message
            record = await run_in_threadpool(service.jobs.get, job_id)
        else:
            await audited_read(request, who, record, "report", {"via": "console"})
            # no quoted Series Description in the rejected series' reasons (free text)
            report = report_without_descriptions(json.loads(data))
            if report_needs_care(request, who, record):  # a cached job's report: jobs it names
                report = await run_in_threadpool(shown_report_json, request, who, record, report)
            if not phi_downloads(request, who):  # not offered: they would be refused
                files = [f for f in files if not f.endswith(_PHI_FILE)]
    refused = await run_in_threadpool(
        refused_series,
        record,
        service.catalog,
        IngestPolicy.from_settings(service.settings.ingest),
    )
    row = await run_in_threadpool(_row, request, who, record)
    if removed is not None:
        row["error"] = {"code": ResultRemovedError.code, "message": removed}
    trail = await run_in_threadpool(_trail, request, who, record.id)
    return JSONResponse(
        {
            "job": row,
            "report": report,
            # a failed job's series, all refused by its pipeline (no report says so)
            "refused": [s.model_dump(mode="json") for s in refused],
            "files": files,
            "trail": trail,
            "phi_allowed": phi_allowed(request, who.role),
            # the FHIR Bundle and the DICOM results: the page offers them only when true
            "phi_downloads": phi_downloads(request, who),
        }
    )


@router.get("/console/api/jobs/{job_id}/patient")
async def job_patient(request: Request, job_id: str, who: Reader) -> Response:
    """Patient name, ID, birth date and sex, for roles in ``console.phi_roles`` only."""
    if not phi_allowed(request, who.role):
        roles = ", ".join(_service(request).settings.console.phi_roles)
        raise ForbiddenError(f"patient details are shown only to the roles: {roles}")
    record = await _job(request, job_id, who)
    await audited_read(request, who, record, "patient", {"via": "console"})
    fields = await run_in_threadpool(_info(request).get, record.id, record.study_path)
    if fields == PatientFields() and not await run_in_threadpool(Path(record.study_path).exists):
        # the retention sweep removed the study the fields are read from: empty fields
        # were shown as "Patient: —", a study without a patient
        raise SourceRemovedError(
            "the study's source images are no longer stored (storage.source_retention_days), "
            "and the patient details are read from them"
        )
    return JSONResponse(
        {
            "name": fields.name,
            "patient_id": fields.patient_id,
            "birth_date": fields.birth_date,
            "sex": fields.sex,
        },
        headers={"Cache-Control": "no-store"},
    )


@router.get("/console/api/jobs/{job_id}/files/{name}")
async def job_file(request: Request, job_id: str, name: str, who: Reader) -> Response:
    if not _RESULT_FILE.match(name):
        raise OutputNotFoundError(f"no result file {quoted(name[:80])}")
    if name.endswith(_PHI_FILE):
        check_phi_identifiers(request, who, f"the DICOM result {quoted(name)}")
    record = await _job(request, job_id, who)

    def find(record: JobRecord) -> Path:
        folder = _service(request).jobs.result_dir(record)
        path = folder / name
        try:
            found = path.is_file()
        except OSError:  # a name the file system refuses is no file of the job's
            found = False
        if not found:
            raise OutputNotFoundError(f"job {job_id} has no result file {quoted(name)}")
        return path

    path = await from_result(_service(request).jobs, record, find)  # 410 once retention removed it
    await audited_read(request, who, record, "result_file", {"file": name})
    media = "application/dicom" if name.endswith(".dcm") else "application/octet-stream"
    if name == REPORT_FILE and report_needs_care(request, who, record):
        # a cached job's report.json is the earlier job's: as GET /v1/jobs/{id}/report
        # shows it to this reader (no job it may not see); the whole file, no ranges
        data = await run_in_threadpool(path.read_bytes)
        shown = await run_in_threadpool(shown_report_bytes, request, who, record, data)
        if shown is not data:
            disposition = f'attachment; filename="{job_id}-{name}"'
            return Response(shown, media_type=media, headers={"Content-Disposition": disposition})
    return FileAnswer(path, media_type=media, filename=f"{job_id}-{name}")


@api_router.get(
    "/v1/jobs/{job_id}/volume",
    response_class=FileAnswer,
    responses={
        200: {"content": {"application/gzip": {}}},
        **RANGE_RESPONSES,
        **{c: {"model": ErrorOut} for c in (401, 403, 404, 409)},
    },
    summary="The job's analysed series (NIfTI)",
)
async def job_volume(request: Request, job_id: str, who: Reader) -> FileAnswer:
    """The series the job read (a CT as int16 HU; another modality as int16 where its
    values fit, else float32) as NIfTI on the label maps' grid; audited as ``phi.read``
    (resource ``volume``)."""
    service = _service(request)
    record = await _job(request, job_id, who)
    # 409 unless succeeded; 410 when the retention policy removed the result
    report = await from_result(service.jobs, record, service.jobs.report)
    await audited_read(request, who, record, "volume")
    path = await run_in_threadpool(
        ct_volume,
        record,
        report,
        service.settings.data_dir,
        IngestPolicy.from_settings(service.settings.ingest),
    )
    return FileAnswer(path, media_type="application/gzip", filename=f"{job_id}-ct.nii.gz")


# --- operations ------------------------------------------------------------------------
def _peers(service: Service) -> list[dict[str, Any]]:
    status = {s.destination: s for s in service.outbox.status()}
    out = []
    for peer in service.settings.gateway.allowed_peers:
        st = status.get(peer.ae_title)
        with service.store.engine.connect() as connection:
            last = connection.execute(
                select(func.max(OutboxDelivery.sent_at)).where(
                    OutboxDelivery.destination == peer.ae_title
                )
            ).scalar_one_or_none()
        out.append(
            {
                "ae_title": peer.ae_title,
                "host": peer.host,
                "port": peer.port,
                "tls": peer.tls,
                "last_delivery": last.isoformat() if last is not None else None,
                "failing_since": st.failing_since.isoformat() if st and st.failing_since else None,
                "last_error": st.last_error if st else None,
                "pending": (st.pending + st.retrying) if st else 0,
            }
        )
    return out


@router.get("/console/api/ops")
async def ops(request: Request, who: Reader) -> Response:
    service = _service(request)
    history = _history(request)

    def read() -> dict[str, Any]:
        return {
            "now": current(service),
            "history": history.history(),
            "peers": _peers(service),
            "gateway": {
                "enabled": service.settings.gateway.enabled,
                "ae_title": service.settings.gateway.ae_title,
                "address": list(service.gateway_address) if service.gateway_address else None,
            },
            "admin": who.allows(Role.ADMIN),
        }

    return JSONResponse(await run_in_threadpool(read))


__all__ = ["api_router", "phi_allowed", "phi_downloads", "router"]

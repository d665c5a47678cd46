"""Jobs: status, listing, cancellation, and their results (report JSON, label maps,
key images, FHIR bundle).

A result the retention policy removed (``storage.result_retention_days``) answers 410
``result_removed`` naming the policy and the date, not the 404 of a missing file: the
sweep records it on the job (:mod:`radserve.service.job_view`), as a removed source
answers the FHIR Bundle 410 ``source_removed``.

Status and report reads are the hot path (clients poll): they are answered from memory
(job cache, report cache) on the event loop; only a miss goes to a worker thread.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

from fastapi import APIRouter, Depends, Query, Request, Response
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from radserve.api.auth import (
    Principal,
    audited_read,
    check_phi_identifiers,
    check_visible,
    require_read,
    require_submit,
    shows_source,
    source_visible,
    visible_to,
)
from radserve.api.errors import ForbiddenError
from radserve.api.files import RANGE_RESPONSES, FileAnswer
from radserve.api.job_names import shown_report
from radserve.api.negotiation import NegotiatedRoute
from radserve.api.schemas import ErrorOut, JobDeliveriesOut, JobOut, JobPageOut, OutboxItemOut
from radserve.api.status_bodies import StatusBodies, status_body
from radserve.errors import InvalidRequestError
from radserve.security.keys import Role
from radserve.service.errors import OutputNotFoundError, ResultNotReadyError
from radserve.service.job_view import result_removed, result_removed_error
from radserve.service.jobs import JobAccess
from radserve.store import JobRecord
from radserve.store import jobs as job_rows
from radserve.store.models import ACCESSION_SEARCH_LENGTH

if TYPE_CHECKING:
    # not imported at run time: an API reader process (radserve.api.reader) imports this
    # module for its two reads and never runs the service
    from radserve.service import Service

router = APIRouter(tags=["jobs"], route_class=NegotiatedRoute)

Reader = Annotated[Principal, Depends(require_read)]
Submitter = Annotated[Principal, Depends(require_submit)]
_ERRORS: dict[int | str, dict[str, Any]] = {c: {"model": ErrorOut} for c in (401, 403, 404, 409)}
# a job's result files: 410 once the retention policy removed them
_RESULT_ERRORS: dict[int | str, dict[str, Any]] = {
    **_ERRORS,
    410: {"model": ErrorOut, "description": "`result_removed`: the retention policy removed it"},
}
StateName = Literal["received", "queued", "running", "succeeded", "failed", "cancelled"]
ClassName = Literal["URGENT", "INPATIENT", "OUTPATIENT"]


def _jobs(request: Request) -> JobAccess:
    service: Service = request.app.state.service
    return service.jobs


async def _record(jobs: JobAccess, job_id: str) -> JobRecord:
    record = jobs.cached(job_id)
    if record is None:
        record = await run_in_threadpool(jobs.get, job_id)
    return record


T = TypeVar("T")


async def from_result(jobs: JobAccess, record: JobRecord, read: Callable[[JobRecord], T]) -> T:
    """``read(record)`` in a worker thread, or 410 ``result_removed`` when the retention
    policy removed the job's result. The record at hand says so when it is the newest;
    a finished record held in memory may predate the removal, so a result found missing
    asks the store once (only then: no read on the hot path) and keeps its answer."""
    removed = result_removed(record)
    if removed is not None:
        raise result_removed_error(record, removed)
    try:
        return await run_in_threadpool(read, record)
    except OutputNotFoundError as exc:
        fresh = await run_in_threadpool(jobs.store.get_job, record.id)
        removed = result_removed(fresh)
        if removed is None:
            raise  # missing for another reason: 404, as before
        jobs.cache.put(fresh)  # GET /v1/jobs/{id} lists the removal from now on
        raise result_removed_error(fresh, removed) from exc


@router.get("/v1/jobs/{job_id}", response_model=JobOut, responses=_ERRORS, summary="A job")
async def get_job(request: Request, job_id: str, who: Reader) -> Response:
    jobs = _jobs(request)
    record = await _record(jobs, job_id)
    await check_visible(request, who, record)  # status only: no patient data, not audited
    view = jobs.view(record)
    # cached_from only when the caller may see that job (it may be another site's)
    show = await shows_source(request, who, view.record)
    # serialised here: the model is already valid, FastAPI need not validate it again;
    # a reader process reuses the body while the published view is unchanged
    bodies: StatusBodies | None = getattr(request.app.state, "status_bodies", None)
    if bodies is None:
        body = status_body(view, show_source=show)
    else:
        body = bodies.body(view, show_source=show)
    return Response(body, media_type="application/json")


@router.get("/v1/jobs", response_model=JobPageOut, responses=_ERRORS, summary="List jobs")
async def list_jobs(
    request: Request,
    who: Reader,
    state: Annotated[list[StateName] | None, Query(description="repeat for several")] = None,
    priority_class: ClassName | None = None,
    pipeline: str | None = None,
    created_after: dt.datetime | None = None,
    created_before: dt.datetime | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    cursor: str | None = None,
    accession: Annotated[
        str | None,
        Query(
            max_length=ACCESSION_SEARCH_LENGTH,
            description="the jobs whose study's Accession Number is exactly this (case "
            "as stored; surrounding spaces, DICOM's padding, ignored); under "
            "security.visibility only the jobs the caller may see",
        ),
    ] = None,
) -> JobPageOut:
    number = None
    if accession is not None:
        number = accession.strip()
        if not number:
            raise InvalidRequestError("accession: empty; give the Accession Number to match")
        # jobs from before revision 0020 get their number on the row in the background
        backfill = getattr(request.app.state, "console_accessions", None)
        if backfill is not None:
            backfill.ensure_running()
    # the visibility rule in the query: full pages, and a cursor naming a visible job
    page = await run_in_threadpool(
        lambda: job_rows.list_jobs(
            _jobs(request).store,
            state=state or None,
            priority_class=priority_class,
            pipeline=pipeline,
            created_after=created_after,
            created_before=created_before,
            limit=limit,
            cursor=cursor,
            visible_to=visible_to(request, who),
            accession_is=number,
        )
    )
    items = page.items
    jobs = _jobs(request)

    def outs() -> list[JobOut]:
        # each waiting job's queue position too: the list left it null, unlike GET
        # /v1/jobs/{id}; cached_from only where the caller may see that job
        return [JobOut.of(jobs.view(r), show_source=source_visible(request, who, r)) for r in items]

    return JobPageOut(items=await run_in_threadpool(outs), next_cursor=page.next_cursor)


@router.delete(
    "/v1/jobs/{job_id}",
    response_model=JobOut,
    status_code=202,
    responses=_ERRORS,
    summary="Cancel a job",
    description="A waiting job is cancelled at once, a running one at its next batch. "
    "Submit keys may cancel the jobs they submitted; admin keys any job.",
)
async def cancel_job(request: Request, job_id: str, principal: Submitter) -> JobOut:
    jobs = _jobs(request)
    record = await _record(jobs, job_id)
    await check_visible(request, principal, record)  # 404: not a 403 that says it exists
    if not principal.allows(Role.ADMIN) and record.api_key_id != principal.key_id:
        raise ForbiddenError("a submit key may cancel only the jobs it submitted")
    record = await run_in_threadpool(
        jobs.cancel, job_id, key_id=principal.key_id, client=principal.client
    )
    return JobOut.of(jobs.view(record), show_source=await shows_source(request, principal, record))


class PriorityIn(BaseModel):
    priority_class: str = Field(
        description="urgent | inpatient | outpatient (case-insensitive; stat = urgent)",
        max_length=32,
    )


@router.post(
    "/v1/jobs/{job_id}/priority",
    response_model=JobOut,
    responses=_ERRORS,
    summary="Re-prioritise a waiting job",
    description="File a job that is still waiting under another priority class. Its "
    "deadline becomes its arrival + the new class's turnaround target (not now + the "
    "target: the clock started when the study arrived), and it takes its place in the "
    "queue at once. 409 once it has started or finished. Audited as job.reprioritised "
    "(who, old and new class and deadline). Submit keys may re-prioritise the jobs they "
    "submitted; admin keys any job.",
)
async def reprioritise_job(
    request: Request, job_id: str, body: PriorityIn, principal: Submitter
) -> JobOut:
    from radserve.service.intake import parse_priority  # not with the module: see above

    jobs = _jobs(request)
    cls = parse_priority(body.priority_class)
    if cls is None:
        raise InvalidRequestError("priority_class: give urgent (or stat), inpatient or outpatient")
    record = await _record(jobs, job_id)
    await check_visible(request, principal, record)  # 404: not a 403 that says it exists
    if not principal.allows(Role.ADMIN) and record.api_key_id != principal.key_id:
        raise ForbiddenError("a submit key may re-prioritise only the jobs it submitted")
    record = await run_in_threadpool(
        jobs.reprioritise, job_id, cls, key_id=principal.key_id, client=principal.client
    )
    return JobOut.of(jobs.view(record), show_source=await shows_source(request, principal, record))


@router.get(
    "/v1/jobs/{job_id}/report",
    responses={200: {"content": {"application/json": {}}}, **_RESULT_ERRORS},
    summary="The job's report (JSON)",
)
async def get_report(request: Request, job_id: str, who: Reader) -> Response:
    jobs = _jobs(request)
    record = await _record(jobs, job_id)
    await audited_read(request, who, record, "report")
    data = None if result_removed(record) else jobs.report_cached(record)
    if data is None:
        data = await from_result(jobs, record, jobs.report_bytes)
    # a cached job's report is the earlier job's: it names that job only to who may see it
    data = await shown_report(request, who, record, data)
    return Response(data, media_type="application/json")


@router.get(
    "/v1/jobs/{job_id}/labels",
    response_class=FileAnswer,
    responses={200: {"content": {"application/gzip": {}}}, **RANGE_RESPONSES, **_RESULT_ERRORS},
    summary="A label map (NIfTI)",
)
async def get_labels(
    request: Request,
    job_id: str,
    who: Reader,
    kind: Annotated[Literal["organs", "structures", "findings"] | None, Query()] = None,
) -> FileAnswer:
    jobs = _jobs(request)
    record = await _record(jobs, job_id)
    await audited_read(request, who, record, "labels", {"kind": kind or "default"})
    path = await from_result(jobs, record, lambda r: jobs.label_map(r, kind))
    return FileAnswer(path, media_type="application/gzip", filename=f"{job_id}-{path.name}")


@router.get(
    "/v1/jobs/{job_id}/images/{number}",
    response_class=FileAnswer,
    responses={200: {"content": {"image/png": {}}}, **RANGE_RESPONSES, **_RESULT_ERRORS},
    summary="Key image number N (PNG, 1-based)",
)
async def get_image(request: Request, job_id: str, number: int, who: Reader) -> FileAnswer:
    jobs = _jobs(request)
    record = await _record(jobs, job_id)
    await audited_read(request, who, record, "key_image", {"number": str(number)})
    path = await from_result(jobs, record, lambda r: jobs.key_image(r, number))
    return FileAnswer(path, media_type="image/png")


@router.get(
    "/v1/jobs/{job_id}/fhir",
    responses={200: {"content": {"application/fhir+json": {}}}, **_RESULT_ERRORS},
    summary="The report as a FHIR R4 Bundle",
    description="409 `no_dicom_study` for a job whose input was no DICOM study (a NIfTI "
    "volume): a FHIR ImagingStudy is identified by its Study Instance UID; such a job's "
    "`links` offer no `fhir`.",
)
async def get_fhir(request: Request, job_id: str, who: Reader) -> Response:
    check_phi_identifiers(request, who, "the FHIR Bundle (its Patient resource)")
    jobs = _jobs(request)
    record = await _record(jobs, job_id)
    await audited_read(request, who, record, "fhir_bundle")
    bundle = await from_result(jobs, record, lambda r: _fhir_bundle(jobs, r))
    return Response(json.dumps(bundle), media_type="application/fhir+json")


def _fhir_bundle(jobs: JobAccess, record: JobRecord) -> dict[str, Any]:
    """The job's Bundle, or 409 when its report describes no DICOM study (not a 500 from
    the Bundle's builder: the request, not the server, is at odds with the job)."""
    from radserve.report.fhir.resources import describes_dicom_study  # not with the module

    if not describes_dicom_study(jobs.report(record)):
        raise ResultNotReadyError(
            f"job {record.id} analysed a volume that is no DICOM study (a NIfTI upload): it "
            "has no FHIR Bundle, whose ImagingStudy needs a Study Instance UID; read its "
            "report instead",
            code="no_dicom_study",
        )
    return jobs.fhir_bundle(record)


@router.get(
    "/v1/jobs/{job_id}/deliveries",
    response_model=JobDeliveriesOut,
    responses=_ERRORS,
    summary="Which results reached which destination: state, attempts, last error",
)
async def get_deliveries(request: Request, job_id: str, who: Reader) -> JobDeliveriesOut:
    record = await _record(_jobs(request), job_id)
    # like the status, not audited: UIDs and the peers' redacted errors, no patient data
    await check_visible(request, who, record)
    service: Service = request.app.state.service
    items = await run_in_threadpool(service.outbox.items, job_id=record.id, limit=1000)
    return JobDeliveriesOut(
        job_id=record.id, deliveries=[OutboxItemOut.from_item(i) for i in items]
    )


__all__ = ["router"]

"""``POST /v1/studies`` (one study) and ``POST /v1/studies/batch`` (several).

Multipart uploads are parsed by Starlette, which spools each file to a temporary file
past 1 MiB, or from its first byte once the request's files in memory reach 64 MiB
(:mod:`radserve.api.forms`); the body limit middleware stops an upload past
``server.max_upload_bytes``. The service then stores the study durably, commits its job
row and schedules it, on a worker thread, before the 202.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData, UploadFile

from radserve.api.auth import Principal, require_submit, shows_source, submitter_sees
from radserve.api.errors import status_for
from radserve.api.forms import read_form
from radserve.api.negotiation import NegotiatedRoute
from radserve.api.schemas import BatchItemOut, BatchOut, ErrorBody, ErrorOut, JobOut
from radserve.api.server_paths import without_server_paths
from radserve.api.state import service_of as _service
from radserve.errors import EmptyUploadError, InvalidRequestError, RadserveError
from radserve.scheduling import PriorityClass
from radserve.service import Origin, ResolvedPipeline, parse_priority
from radserve.service.errors import UnsupportedMediaError

router = APIRouter(tags=["studies"], route_class=NegotiatedRoute)

MAX_FILES = 100_000  # instances in one request (a thin-slice CT has thousands)
# studies in one batch: each is stored and admitted in turn before the answer (2,000
# one-file studies kept a request busy past a client's 20 s time-out)
MAX_BATCH_STUDIES = 100
_MULTIPART_DOC: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "properties": {
                        "files": {
                            "type": "array",
                            "items": {"type": "string", "format": "binary"},
                            "description": "DICOM files, zip archives of them, or one NIfTI",
                        },
                        "priority": {
                            "type": "string",
                            "enum": ["urgent", "inpatient", "outpatient", "stat"],
                        },
                        "pipeline": {"type": "string"},
                    },
                    "required": ["files"],
                }
            }
        },
    }
}
_BATCH_DOC: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "additionalProperties": {
                        "type": "array",
                        "items": {"type": "string", "format": "binary"},
                    },
                    "description": "one form field per study: its files share the field name",
                }
            }
        },
    }
}
PriorityQuery = Annotated[
    str | None, Query(description="urgent | inpatient | outpatient (default: DICOM rules)")
]
PipelineQuery = Annotated[str | None, Query(description="pipeline name (default: configured)")]
_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorOut} for code in (400, 401, 403, 413, 415, 422, 503)
}


def _read_form(request: Request) -> AbstractAsyncContextManager[FormData]:
    """The parsed multipart form; ``async with`` closes its temporary files."""
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise UnsupportedMediaError(
            "send the study as multipart/form-data (files in the `files` field)"
        )
    return read_form(request, max_files=MAX_FILES, max_fields=100)


def _options(
    form: FormData, priority: str | None, pipeline: str | None
) -> tuple[str | None, str | None]:
    """Query parameters win over form fields of the same name."""

    def field(name: str) -> str | None:
        value = form.get(name)
        return value if isinstance(value, str) else None

    return priority or field("priority"), pipeline or field("pipeline")


def _job_response(response: Response, out: JobOut, cached: bool) -> JobOut:
    response.status_code = 200 if cached else 202
    response.headers["Location"] = out.links["self"]
    return out


@router.post(
    "/v1/studies",
    response_model=JobOut,
    status_code=202,
    summary="Submit one study",
    description=(
        "202 with the job once the study's files are fsynced and its job row committed; "
        "200 with a succeeded job marked `cached` when the same study already has a "
        "result from the same pipeline and models; 202 with the unfinished job of the "
        "same study, pipeline and models when it is sent again while that job waits or "
        "runs (and the key may see it), no second job, also when the queue is full (a "
        "more urgent class raises that job). 503 queue_full for a new study once its "
        "class's queue is full, decided after the upload is read."
    ),
    responses=_ERRORS,
    openapi_extra=_MULTIPART_DOC,
)
async def submit_study(
    request: Request,
    response: Response,
    principal: Annotated[Principal, Depends(require_submit)],
    priority: PriorityQuery = None,
    pipeline: PipelineQuery = None,
) -> JobOut:
    service = _service(request)
    # cheap refusals first, before a byte of the upload is read
    cls = parse_priority(priority)
    resolved = await run_in_threadpool(service.intake.precheck, pipeline, cls)
    async with _read_form(request) as form:
        in_form = _options(form, priority, pipeline)
        if in_form != (priority, pipeline):  # priority or pipeline sent as form fields
            cls = parse_priority(in_form[0])
            resolved = await run_in_threadpool(service.intake.precheck, in_form[1], cls)
        files = [v for _, v in form.multi_items() if isinstance(v, UploadFile)]
        if not files:
            raise EmptyUploadError("the upload holds no files (use the `files` field)")
        origin = Origin(principal.key_id, principal.client, sees=submitter_sees(request, principal))
        submission = await run_in_threadpool(
            service.intake.submit_upload,
            [f.file for f in files],
            resolved=resolved,
            priority=cls,
            origin=origin,
        )
    # with its ETA from the start (a walk now: it was always null in the 202)
    eta = await run_in_threadpool(service.jobs.eta, submission.job)
    # a cached answer names the earlier job only to a caller who may see it (under
    # security.visibility it may be another site's)
    show = await shows_source(request, principal, submission.job)
    out = JobOut.from_record(submission.job, submission.position, eta, show_source=show)
    return _job_response(response, out, submission.cached)


@router.post(
    "/v1/studies/batch",
    response_model=BatchOut,
    status_code=202,
    summary="Submit several studies",
    description=(
        f"Each form field is one study (its files share the field name), at most "
        f"{MAX_BATCH_STUDIES} per batch. Every study is "
        "admitted on its own: 202 when all were accepted, 207 when some were refused "
        "(each item carries the status a single submission would have had)."
    ),
    responses={**_ERRORS, 207: {"model": BatchOut}},
    openapi_extra=_BATCH_DOC,
)
async def submit_batch(
    request: Request,
    response: Response,
    principal: Annotated[Principal, Depends(require_submit)],
    priority: PriorityQuery = None,
    pipeline: PipelineQuery = None,
) -> BatchOut:
    service = _service(request)
    cls = parse_priority(priority)
    resolved: ResolvedPipeline = await run_in_threadpool(service.intake.precheck, pipeline, cls)
    origin = Origin(principal.key_id, principal.client, sees=submitter_sees(request, principal))
    items: list[BatchItemOut] = []
    async with _read_form(request) as form:
        studies: dict[str, list[UploadFile]] = {}
        for name, value in form.multi_items():
            if isinstance(value, UploadFile):
                studies.setdefault(name, []).append(value)
        if not studies:
            raise EmptyUploadError("the upload holds no files")
        if len(studies) > MAX_BATCH_STUDIES:
            raise InvalidRequestError(
                f"the batch holds {len(studies)} studies (form fields with files); at most "
                f"{MAX_BATCH_STUDIES} go in one batch: send the rest in another"
            )
        for name, files in studies.items():
            items.append(await _one(request, principal, name, files, resolved, cls, origin))
    refused = sum(1 for i in items if i.job is None)
    response.status_code = 207 if refused else 202
    return BatchOut(accepted=len(items) - refused, refused=refused, items=items)


async def _one(
    request: Request,
    principal: Principal,
    name: str,
    files: list[UploadFile],
    resolved: ResolvedPipeline,
    cls: PriorityClass | None,
    origin: Origin,
) -> BatchItemOut:
    service = _service(request)
    try:
        submission = await run_in_threadpool(
            service.intake.submit_upload,
            [f.file for f in files],
            resolved=resolved,
            priority=cls,
            origin=origin,
        )
    except RadserveError as exc:
        service.metrics.errors.labels(exc.code).inc()
        message = without_server_paths(exc.message)
        error = ErrorBody(code=exc.code, message=message, retryable=exc.retryable)
        return BatchItemOut(study=name, status=status_for(exc), error=error)
    eta = await run_in_threadpool(service.jobs.eta, submission.job)
    show = await shows_source(request, principal, submission.job)
    job = JobOut.from_record(submission.job, submission.position, eta, show_source=show)
    return BatchItemOut(study=name, status=200 if submission.cached else 202, job=job)


__all__ = ["router"]

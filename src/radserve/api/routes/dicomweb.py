"""DICOMweb (PS3.18) under ``/dicomweb``: STOW-RS to submit studies, WADO-RS to retrieve
the DICOM results radserve wrote (SEG, SR, SC key images), QIDO-RS to search them. API
keys as everywhere: submit role to store, read role to retrieve and search.

STOW-RS answers the Store Instances Response in DICOM JSON with 200 (all stored), 202
(some failed), 409 (none stored); 415 for another media type, 400 for a malformed body,
406 when the client accepts no DICOM JSON. A ``Link`` header names each job started.
WADO-RS serves instances, series and studies as ``multipart/related;
type="application/dicom"`` and their metadata as ``application/dicom+json``; 404 for
UIDs it does not know, 406 for an Accept it cannot satisfy. QIDO-RS answers
``application/dicom+json`` (an empty array when nothing matches), 400 for a query it
cannot run, with a ``Warning`` header for ignored fuzzy matching and for results past
the server's maximum.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from radserve.api.auth import (
    Principal,
    audited_read,
    audited_results,
    check_phi_identifiers,
    require_read,
    require_submit,
    restricted,
    result_reader_job,
    submitter_sees,
)
from radserve.api.negotiation import NegotiatedRoute
from radserve.api.schemas import ErrorOut
from radserve.api.state import service_of as _service
from radserve.errors import InvalidRequestError
from radserve.gateway.dicomweb.multipart import (
    new_boundary,
    read_related,
    related_boundary,
    related_parts,
)
from radserve.gateway.dicomweb.qido import Level, parse_query
from radserve.gateway.dicomweb.stow import DICOM_MEDIA, StowPart
from radserve.gateway.dicomweb.wado import ResultFile
from radserve.media_types import MediaType, NotAcceptableError, accepted_types
from radserve.service import Origin, parse_priority
from radserve.service.intake import DICOMWEB_SOURCE
from radserve.store import JobRecord

router = APIRouter(prefix="/dicomweb", tags=["dicomweb"], route_class=NegotiatedRoute)

DICOM_JSON = "application/dicom+json"
_UID = re.compile(r"[0-9]+(\.[0-9]+)*")  # as the gateway checks (leading zeros tolerated)
_JSON_RANGES = ("*/*", "application/*", DICOM_JSON, "application/json")
_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorOut} for code in (400, 401, 403, 404, 406, 413, 415, 503)
}
_STOW_DOC: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            'multipart/related; type="application/dicom"': {
                "schema": {"type": "string", "format": "binary"},
                "example": "one DICOM Part-10 instance per part",
            }
        },
    }
}
_STOW_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "all instances stored", "content": {DICOM_JSON: {}}},
    202: {"description": "some instances stored, some failed", "content": {DICOM_JSON: {}}},
    409: {"description": "no instance stored", "content": {DICOM_JSON: {}}},
    422: {"description": "unknown or invalid pipeline", "model": ErrorOut},
    **{c: v for c, v in _ERRORS.items() if c not in (404,)},
}
_MULTIPART_DICOM = 'multipart/related; type="application/dicom"'
_RETRIEVE_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"content": {_MULTIPART_DICOM: {}}},
    **_ERRORS,
}
_METADATA_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"content": {DICOM_JSON: {}}},
    **_ERRORS,
}
Submitter = Annotated[Principal, Depends(require_submit)]
Reader = Annotated[Principal, Depends(require_read)]
CompleteQuery = Annotated[
    bool | None,
    Query(
        description="true: this request is the whole study (its job starts now); false: "
        "wait for the quiet period (default: dicomweb.completeness)"
    ),
]


def _check_json_accept(request: Request) -> None:
    if not any(m.type in _JSON_RANGES for m in accepted_types(request.headers.get("accept"))):
        raise NotAcceptableError(
            f"radserve answers DICOMweb metadata and store responses as {DICOM_JSON}; "
            "accept it (or application/json, */*)"
        )


def _dicom_json(content: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(
        json.dumps(content, ensure_ascii=False, separators=(",", ":")).encode(),
        status_code=status,
        media_type=DICOM_JSON,
        headers=headers,
    )


# --- STOW-RS -------------------------------------------------------------------------------
@router.post(
    "/studies",
    summary="STOW-RS: store instances (one or more studies)",
    responses=_STOW_RESPONSES,
    openapi_extra=_STOW_DOC,
)
async def stow(
    request: Request,
    principal: Submitter,
    priority: str | None = None,
    pipeline: str | None = None,
    complete: CompleteQuery = None,
) -> Response:
    return await _stow(request, principal, None, priority, pipeline, complete)


@router.post(
    "/studies/{study}",
    summary="STOW-RS: store instances of one study",
    responses=_STOW_RESPONSES,
    openapi_extra=_STOW_DOC,
)
async def stow_study(
    request: Request,
    study: str,
    principal: Submitter,
    priority: str | None = None,
    pipeline: str | None = None,
    complete: CompleteQuery = None,
) -> Response:
    return await _stow(request, principal, study, priority, pipeline, complete)


async def _stow(
    request: Request,
    principal: Principal,
    study: str | None,
    priority: str | None,
    pipeline: str | None,
    complete: bool | None,
) -> Response:
    service = _service(request)
    _check_json_accept(request)
    if study is not None and not (len(study) <= 64 and _UID.fullmatch(study)):
        raise InvalidRequestError(
            "the study in the path is not a valid UID (digits and dots, at most 64 characters)"
        )
    boundary, _ = related_boundary(request.headers.get("content-type"), root_types=(DICOM_MEDIA,))
    quiet = (
        not complete if complete is not None else service.settings.dicomweb.completeness == "quiet"
    )
    if quiet and (priority or pipeline):
        raise InvalidRequestError(
            "priority and pipeline apply to complete studies only (complete=true); a study "
            "completed by the quiet period gets the configured pipeline and priority rules"
        )
    cls = parse_priority(priority)
    resolved = await run_in_threadpool(service.intake.precheck, pipeline, cls)
    origin = Origin(
        principal.key_id,
        principal.client,
        source=DICOMWEB_SOURCE,
        sees=submitter_sees(request, principal),
    )
    async with read_related(request.stream(), boundary) as parts:
        result = await run_in_threadpool(
            service.stow.store,
            [StowPart(p.media_type, p.file) for p in parts],
            target_study=study,
            resolved=resolved,
            priority=cls,
            origin=origin,
            quiet=quiet,
        )
    headers = {}
    if result.jobs:
        headers["Link"] = ", ".join(f'</v1/jobs/{s.job.id}>; rel="related"' for s in result.jobs)
    return _dicom_json(result.response().to_json_dict(), result.http_status, headers)


# --- WADO-RS -------------------------------------------------------------------------------
def _check_dicom_accept(request: Request, files: list[ResultFile]) -> None:
    """406 unless the client accepts multipart/related application/dicom in the stored
    transfer syntax (radserve does not transcode)."""
    stored = {f.transfer_syntax_uid for f in files}
    for media in accepted_types(request.headers.get("accept")):
        if media.type in ("*/*", "multipart/*"):
            return
        if media.type == "multipart/related" and _dicom_part_ok(media, stored):
            return
    raise NotAcceptableError(
        f"radserve serves result instances as {_MULTIPART_DICOM} in their stored transfer "
        f"syntax ({', '.join(sorted(stored))}); accept that (transfer-syntax=* is fine)"
    )


def _dicom_part_ok(media: MediaType, stored: set[str]) -> bool:
    if media.params.get("type", DICOM_MEDIA).lower() != DICOM_MEDIA:
        return False
    wanted = media.params.get("transfer-syntax", "*")
    return wanted == "*" or stored == {wanted}


def _level(series: str | None, instance: str | None) -> str:
    return "instance" if instance else "series" if series else "study"


async def _retrieve(
    request: Request,
    who: Principal,
    study: str,
    series: str | None = None,
    instance: str | None = None,
) -> StreamingResponse:
    check_phi_identifiers(request, who, "a DICOM result instance")
    wado = _service(request).wado
    found = await run_in_threadpool(wado.find, study, series, instance)
    readable = await audited_results(request, who, found, "wado_instances", study)
    files = await run_in_threadpool(wado.files, readable, _level(series, instance))
    _check_dicom_accept(request, files)
    boundary = new_boundary()
    body = related_parts([(f.path, f.transfer_syntax_uid) for f in files], boundary)
    media = f'multipart/related; type="{DICOM_MEDIA}"; boundary={boundary}'
    return StreamingResponse(body, media_type=media)


async def _metadata(
    request: Request,
    who: Principal,
    study: str,
    series: str | None = None,
    instance: str | None = None,
) -> Response:
    _check_json_accept(request)
    check_phi_identifiers(request, who, "DICOM result metadata")
    wado = _service(request).wado
    found = await run_in_threadpool(wado.find, study, series, instance)
    readable = await audited_results(request, who, found, "wado_metadata", study)
    content = await run_in_threadpool(wado.metadata, readable, _level(series, instance))
    return _dicom_json(content)


@router.get(
    "/studies/{study}",
    summary="WADO-RS: the study's result instances",
    response_class=StreamingResponse,
    responses=_RETRIEVE_RESPONSES,
)
async def retrieve_study(request: Request, study: str, who: Reader) -> StreamingResponse:
    return await _retrieve(request, who, study)


@router.get(
    "/studies/{study}/metadata",
    summary="WADO-RS: metadata of the study's result instances",
    responses=_METADATA_RESPONSES,
)
async def study_metadata(request: Request, study: str, who: Reader) -> Response:
    return await _metadata(request, who, study)


@router.get(
    "/studies/{study}/series/{series}",
    summary="WADO-RS: a result series",
    response_class=StreamingResponse,
    responses=_RETRIEVE_RESPONSES,
)
async def retrieve_series(
    request: Request, study: str, series: str, who: Reader
) -> StreamingResponse:
    return await _retrieve(request, who, study, series)


@router.get(
    "/studies/{study}/series/{series}/metadata",
    summary="WADO-RS: metadata of a result series",
    responses=_METADATA_RESPONSES,
)
async def series_metadata(request: Request, study: str, series: str, who: Reader) -> Response:
    return await _metadata(request, who, study, series)


@router.get(
    "/studies/{study}/series/{series}/instances/{instance}",
    summary="WADO-RS: one result instance",
    response_class=StreamingResponse,
    responses=_RETRIEVE_RESPONSES,
)
async def retrieve_instance(
    request: Request, study: str, series: str, instance: str, who: Reader
) -> StreamingResponse:
    return await _retrieve(request, who, study, series, instance)


@router.get(
    "/studies/{study}/series/{series}/instances/{instance}/metadata",
    summary="WADO-RS: metadata of one result instance",
    responses=_METADATA_RESPONSES,
)
async def instance_metadata(
    request: Request, study: str, series: str, instance: str, who: Reader
) -> Response:
    return await _metadata(request, who, study, series, instance)


# --- QIDO-RS -------------------------------------------------------------------------------
_SEARCH_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "the matching results (an empty array when none match)",
        "content": {DICOM_JSON: {"schema": {"type": "array", "items": {"type": "object"}}}},
    },
    **{c: v for c, v in _ERRORS.items() if c not in (413, 415, 503)},
}
_MATCH_KEYS = (
    "StudyInstanceUID", "SeriesInstanceUID", "SOPInstanceUID", "PatientID", "PatientName",
    "AccessionNumber", "StudyDate", "StudyDescription", "ModalitiesInStudy", "Modality",
    "SOPClassUID",
)  # fmt: skip


def _search_doc(level: str) -> dict[str, Any]:
    """The query parameters in the OpenAPI document (any other DICOM keyword or tag
    matches too; they are read from the query string, not declared one by one)."""
    described = [
        {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 0}},
        {"name": "offset", "in": "query", "schema": {"type": "integer", "minimum": 0}},
        {"name": "fuzzymatching", "in": "query", "schema": {"type": "boolean"}},
        {
            "name": "includefield",
            "in": "query",
            "description": "attribute keywords or tags, comma-separated, or all",
            "schema": {"type": "array", "items": {"type": "string"}},
        },
    ]
    described += [{"name": key, "in": "query", "schema": {"type": "string"}} for key in _MATCH_KEYS]
    return {
        "parameters": described,
        "description": f"QIDO-RS search for {level} of radserve's results: match keys are "
        "DICOM attribute keywords or tags (PS3.18 8.3.4, PS3.4 C.2.2.2).",
    }


async def _search(
    request: Request,
    who: Principal,
    level: Level,
    study: str | None = None,
    series: str | None = None,
) -> Response:
    """A QIDO-RS search: only the results of jobs the key may see (``security.visibility``),
    and a ``phi.read`` audit record for each job whose results are answered."""
    _check_json_accept(request)
    check_phi_identifiers(request, who, "a QIDO-RS search (patient names and IDs)")
    for name, uid in (("study", study), ("series", series)):
        # as STOW-RS checks its study, and QIDO-RS its UID match keys: `..` or a 4,000
        # character name in the path was searched for and answered 200 with nothing
        if uid is not None and not (len(uid) <= 64 and _UID.fullmatch(uid)):
            raise InvalidRequestError(
                f"the {name} in the path is not a valid UID (digits and dots, at most 64 "
                "characters)"
            )
    service = _service(request)
    query = parse_query(request.query_params.multi_items(), level, study, series)
    base = str(request.base_url).rstrip("/") + router.prefix
    readers: dict[str, JobRecord | None] = {}  # result job id -> the job it is read through
    visible = None
    if restricted(request, who):

        def visible(job_id: str) -> bool:
            if job_id not in readers:
                readers[job_id] = result_reader_job(request, who, job_id)
            return readers[job_id] is not None

    answer = await run_in_threadpool(service.qido.search, query, base, visible)
    for job_id in sorted(answer.job_ids):
        job = readers.get(job_id) or await run_in_threadpool(service.jobs.get, job_id)
        await audited_read(request, who, job, "qido_search", {"level": level})
    headers = {"Warning": ", ".join(answer.warnings)} if answer.warnings else None
    return _dicom_json(answer.results, headers=headers)


@router.get(
    "/studies",
    summary="QIDO-RS: search for studies",
    responses=_SEARCH_RESPONSES,
    openapi_extra=_search_doc("studies"),
)
async def search_studies(request: Request, who: Reader) -> Response:
    return await _search(request, who, "study")


@router.get(
    "/series",
    summary="QIDO-RS: search for series (all studies)",
    responses=_SEARCH_RESPONSES,
    openapi_extra=_search_doc("series"),
)
async def search_all_series(request: Request, who: Reader) -> Response:
    return await _search(request, who, "series")


@router.get(
    "/instances",
    summary="QIDO-RS: search for instances (all studies)",
    responses=_SEARCH_RESPONSES,
    openapi_extra=_search_doc("instances"),
)
async def search_all_instances(request: Request, who: Reader) -> Response:
    return await _search(request, who, "instance")


@router.get(
    "/studies/{study}/series",
    summary="QIDO-RS: search for a study's series",
    responses=_SEARCH_RESPONSES,
    openapi_extra=_search_doc("series"),
)
async def search_series(request: Request, study: str, who: Reader) -> Response:
    return await _search(request, who, "series", study)


@router.get(
    "/studies/{study}/instances",
    summary="QIDO-RS: search for a study's instances",
    responses=_SEARCH_RESPONSES,
    openapi_extra=_search_doc("instances"),
)
async def search_study_instances(request: Request, study: str, who: Reader) -> Response:
    return await _search(request, who, "instance", study)


@router.get(
    "/studies/{study}/series/{series}/instances",
    summary="QIDO-RS: search for a series' instances",
    responses=_SEARCH_RESPONSES,
    openapi_extra=_search_doc("instances"),
)
async def search_series_instances(
    request: Request, study: str, series: str, who: Reader
) -> Response:
    return await _search(request, who, "instance", study, series)


__all__ = ["router"]

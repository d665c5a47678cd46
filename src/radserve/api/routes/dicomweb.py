"""DICOMweb (PS3.18) under ``/dicomweb``: STOW-RS to submit studies, WADO-RS to retrieve
the DICOM SEG and SR radserve wrote. API keys as everywhere: submit role to store, read
role to retrieve.

STOW-RS answers the Store Instances Response in DICOM JSON with 200 (all stored), 202
(some failed), 409 (none stored); 415 for another media type, 400 for a malformed body,
406 when the client accepts no DICOM JSON. A ``Link`` header names each job started.
WADO-RS serves instances, series and studies as ``multipart/related;
type="application/dicom"`` and their metadata as ``application/dicom+json``; 404 for
UIDs it does not know, 406 for an Accept it cannot satisfy.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from radserve.api.auth import Principal, require_read, require_submit
from radserve.api.multipart_related import (
    MediaType,
    NotAcceptableError,
    accepted_types,
    new_boundary,
    read_related,
    related_boundary,
    related_parts,
)
from radserve.api.schemas import ErrorOut
from radserve.service import Origin, Service, parse_priority
from radserve.service.errors import InvalidRequestError
from radserve.service.intake import DICOMWEB_SOURCE
from radserve.service.stow import DICOM_MEDIA, StowPart
from radserve.service.wado import ResultFile

router = APIRouter(prefix="/dicomweb", tags=["dicomweb"])

DICOM_JSON = "application/dicom+json"
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


def _service(request: Request) -> Service:
    return request.app.state.service  # type: ignore[no-any-return]


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
    origin = Origin(principal.key_id, principal.client, source=DICOMWEB_SOURCE)
    async with read_related(request, boundary) as parts:
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


async def _retrieve(
    request: Request, study: str, series: str | None = None, instance: str | None = None
) -> StreamingResponse:
    files = await run_in_threadpool(_service(request).wado.files, study, series, instance)
    _check_dicom_accept(request, files)
    boundary = new_boundary()
    body = related_parts([(f.path, f.transfer_syntax_uid) for f in files], boundary)
    media = f'multipart/related; type="{DICOM_MEDIA}"; boundary={boundary}'
    return StreamingResponse(body, media_type=media)


async def _metadata(
    request: Request, study: str, series: str | None = None, instance: str | None = None
) -> Response:
    _check_json_accept(request)
    content = await run_in_threadpool(_service(request).wado.metadata, study, series, instance)
    return _dicom_json(content)


@router.get(
    "/studies/{study}",
    summary="WADO-RS: the study's result instances",
    response_class=StreamingResponse,
    responses=_RETRIEVE_RESPONSES,
)
async def retrieve_study(request: Request, study: str, _: Reader) -> StreamingResponse:
    return await _retrieve(request, study)


@router.get(
    "/studies/{study}/metadata",
    summary="WADO-RS: metadata of the study's result instances",
    responses=_METADATA_RESPONSES,
)
async def study_metadata(request: Request, study: str, _: Reader) -> Response:
    return await _metadata(request, study)


@router.get(
    "/studies/{study}/series/{series}",
    summary="WADO-RS: a result series",
    response_class=StreamingResponse,
    responses=_RETRIEVE_RESPONSES,
)
async def retrieve_series(
    request: Request, study: str, series: str, _: Reader
) -> StreamingResponse:
    return await _retrieve(request, study, series)


@router.get(
    "/studies/{study}/series/{series}/metadata",
    summary="WADO-RS: metadata of a result series",
    responses=_METADATA_RESPONSES,
)
async def series_metadata(request: Request, study: str, series: str, _: Reader) -> Response:
    return await _metadata(request, study, series)


@router.get(
    "/studies/{study}/series/{series}/instances/{instance}",
    summary="WADO-RS: one result instance",
    response_class=StreamingResponse,
    responses=_RETRIEVE_RESPONSES,
)
async def retrieve_instance(
    request: Request, study: str, series: str, instance: str, _: Reader
) -> StreamingResponse:
    return await _retrieve(request, study, series, instance)


@router.get(
    "/studies/{study}/series/{series}/instances/{instance}/metadata",
    summary="WADO-RS: metadata of one result instance",
    responses=_METADATA_RESPONSES,
)
async def instance_metadata(
    request: Request, study: str, series: str, instance: str, _: Reader
) -> Response:
    return await _metadata(request, study, series, instance)


__all__ = ["router"]

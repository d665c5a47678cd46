"""Errors -> HTTP, in one table. Every failure leaves the API as
``{"error": {"code", "message", "retryable"}}`` with the status the code maps to.

Handlers raise :class:`~radserve.errors.RadserveError` subclasses (their own or the
core's); nothing else in the API chooses a status for an error.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from radserve.errors import RadserveError
from radserve.errors import StudyError as _StudyError
from radserve.scheduling import QueueFullError

logger = logging.getLogger(__name__)


class UnauthenticatedError(RadserveError):
    code = "unauthenticated"


class ForbiddenError(RadserveError):
    code = "forbidden"


class RequestTimeoutError(RadserveError):
    code = "request_timeout"


class UploadIncompleteError(RadserveError):
    code = "upload_incomplete"


# The table: stable error code -> HTTP status.
STATUS_BY_CODE: dict[str, int] = {
    # who is asking
    "unauthenticated": 401,
    "forbidden": 403,
    # what was asked
    "invalid_request": 400,
    "invalid_cursor": 400,
    "empty_upload": 400,
    "upload_incomplete": 400,
    "not_found": 404,
    "job_not_found": 404,
    "api_key_not_found": 404,
    "output_not_found": 404,
    "method_not_allowed": 405,
    "not_acceptable": 406,
    "request_timeout": 408,
    "invalid_transition": 409,
    "result_not_ready": 409,
    "upload_too_large": 413,
    "unsupported_media_type": 415,
    # what was sent (detectable at submission)
    "study_invalid": 422,
    "not_dicom": 422,
    "unsupported_modality": 422,
    "geometry_invalid": 422,
    "decode_failed": 422,
    "archive_rejected": 422,
    "nifti_invalid": 422,
    "pipeline_invalid": 422,
    "model_unknown": 422,
    "variant_rejected": 422,
    # the server cannot take it now
    "queue_full": 503,
    "model_unavailable": 503,
    "store_error": 503,
    "model_invalid": 503,
    "report_failed": 500,
    "internal_error": 500,
}


def status_for(exc: RadserveError) -> int:
    """The HTTP status of an error: the table, else 422 for study errors, else 500."""
    status = STATUS_BY_CODE.get(exc.code)
    if status is not None:
        return status
    if isinstance(exc, _StudyError):
        return 422
    return 503 if exc.retryable else 500


def error_body(code: str, message: str, retryable: bool = False) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "retryable": retryable}}


def error_response(exc: RadserveError) -> JSONResponse:
    status = status_for(exc)
    headers: dict[str, str] = {}
    if isinstance(exc, QueueFullError):
        headers["Retry-After"] = str(exc.retry_after)
    elif exc.code == "model_unavailable":
        headers["Retry-After"] = "60"
    if status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="radserve"'
    if status >= 500:
        logger.warning("request failed: %s", exc.code)
    return JSONResponse(
        error_body(exc.code, exc.message, exc.retryable), status_code=status, headers=headers
    )


def install(app: FastAPI, *, on_error: Any = None) -> None:
    """Register the handlers; ``on_error(code)`` counts errors (metrics)."""

    def count(code: str) -> None:
        if on_error is not None:
            on_error(code)

    @app.exception_handler(RadserveError)
    async def _radserve(request: Request, exc: RadserveError) -> JSONResponse:
        count(exc.code)
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        count("invalid_request")
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        return JSONResponse(error_body("invalid_request", problems), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        code = code or ("invalid_request" if exc.status_code < 500 else "internal_error")
        count(code)
        return JSONResponse(
            error_body(code, str(exc.detail)),
            status_code=exc.status_code,
            headers=getattr(exc, "headers", None),
        )

    @app.exception_handler(ClientDisconnect)
    async def _disconnect(request: Request, exc: ClientDisconnect) -> JSONResponse:
        count("upload_incomplete")
        message = "the client closed the connection before the request body was complete"
        return JSONResponse(error_body("upload_incomplete", message), status_code=400)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        count("internal_error")
        logger.error("unexpected %s in %s", type(exc).__name__, request.url.path, exc_info=exc)
        message = "internal error; the server log has the details"
        return JSONResponse(error_body("internal_error", message), status_code=500)


__all__ = [
    "STATUS_BY_CODE",
    "ForbiddenError",
    "RequestTimeoutError",
    "UnauthenticatedError",
    "UploadIncompleteError",
    "error_body",
    "error_response",
    "install",
    "status_for",
]

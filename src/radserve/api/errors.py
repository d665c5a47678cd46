"""Errors -> HTTP. Every failure leaves the API as
``{"error": {"code", "message", "retryable"}}`` with the status of its class in the one
error table (:mod:`radserve.error_table`, shared with STOW-RS, the DICOM SCP and the CLI).

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

from radserve.api.server_paths import without_server_paths
from radserve.error_table import lookup
from radserve.errors import RadserveError, quoted

logger = logging.getLogger(__name__)


class UnauthenticatedError(RadserveError):
    code = "unauthenticated"


class ForbiddenError(RadserveError):
    code = "forbidden"


class RequestTimeoutError(RadserveError):
    code = "request_timeout"


class UploadIncompleteError(RadserveError):
    code = "upload_incomplete"
    # the body was cut short in transit: the same upload sent again can succeed (its
    # message says so; it answered retryable: false until 2026-12-07)
    retryable = True


# the error code of an answer that no RadserveError made (Starlette's and the framework's
# own 4xx/5xx), by its status
_PROBLEMS_NAMED = 5
# Retry-After of a request refused because the database did not answer (an outage met
# outside a wait bounded by server.store_wait_s, which names its own)
STORE_RETRY_AFTER_S = 5

_STATUS_CODES = {
    400: "invalid_request",
    401: "unauthenticated",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    408: "request_timeout",
    413: "upload_too_large",
    415: "unsupported_media_type",
    416: "range_not_satisfiable",
}


def code_for_status(status: int) -> str:
    """The error code for an HTTP error status that no radserve error chose."""
    return _STATUS_CODES.get(status) or ("invalid_request" if status < 500 else "internal_error")


def status_for(exc: RadserveError) -> int:
    """The HTTP status of an error: its class's row in :mod:`radserve.error_table`
    (looked up along the MRO, as Starlette finds a handler)."""
    return lookup(exc).http


def error_body(code: str, message: str, retryable: bool = False) -> dict[str, Any]:
    """The one error body; the message without the server's file paths."""
    message = without_server_paths(message)
    return {"error": {"code": code, "message": message, "retryable": retryable}}


def error_response(exc: RadserveError) -> JSONResponse:
    status = status_for(exc)
    headers: dict[str, str] = {}
    # by its code, not its class: importing radserve.scheduling here loaded the scheduler's
    # dispatch and with it the inference runtime into every API reader process
    retry_after = getattr(exc, "retry_after", None)
    if retry_after is not None:  # a full queue; a database that did not answer in time
        headers["Retry-After"] = str(retry_after)
    elif exc.code == "model_unavailable":
        headers["Retry-After"] = "60"
    elif exc.outage:  # the database did not answer (radserve.store.waiting)
        headers["Retry-After"] = str(STORE_RETRY_AFTER_S)
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
        # a location may be the client's own key (an unknown JSON field): quoted, bounded;
        # and at most a few problems named (a body can hold thousands of unknown keys)
        errors = exc.errors()
        problems = "; ".join(
            f"{quoted('.'.join(str(p) for p in e['loc']))}: {e['msg']}"
            for e in errors[:_PROBLEMS_NAMED]
        )
        if len(errors) > _PROBLEMS_NAMED:
            problems += f"; and {len(errors) - _PROBLEMS_NAMED} more"
        return JSONResponse(error_body("invalid_request", problems), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = code_for_status(exc.status_code)
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
        return JSONResponse(
            error_body("upload_incomplete", message, UploadIncompleteError.retryable),
            status_code=400,
        )

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        count("internal_error")
        return unexpected_response(request, exc)


def unexpected_response(request: Request, exc: Exception) -> JSONResponse:
    """500 for an exception no handler knows (logged with its traceback)."""
    logger.error("unexpected %s in %s", type(exc).__name__, request.url.path, exc_info=exc)
    message = "internal error; the server log has the details"
    return JSONResponse(error_body("internal_error", message), status_code=500)


__all__ = [
    "ForbiddenError",
    "RequestTimeoutError",
    "UnauthenticatedError",
    "UploadIncompleteError",
    "code_for_status",
    "error_body",
    "error_response",
    "install",
    "status_for",
    "unexpected_response",
]

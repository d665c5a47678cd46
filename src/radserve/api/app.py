"""The FastAPI application factory.

``create_app(service)`` wires the routers, the error table, the auth key verifier and
the middleware around one :class:`~radserve.service.Service`. The app's lifespan starts
and stops the service unless the caller manages it (``manage_service=False``).

Middleware, outermost first: answered errors end there (:class:`AnsweredErrors`) ->
response headers (no-store, HSTS) -> JSON error bodies -> HTTP metrics -> request timeout -> body
limit -> control characters -> HEAD as GET -> app.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from radserve import __version__
from radserve.api import errors
from radserve.api.auth import SECURITY_SCHEMES, KeyVerifier
from radserve.api.limits import add_limits
from radserve.api.routes import dicomweb, jobs, models, ops, studies, turnaround
from radserve.service import Service

logger = logging.getLogger(__name__)

DESCRIPTION = """\
On-premise radiology AI inference. Submit a study (DICOM files, a zip of them, or one
NIfTI volume), poll its job, fetch the report as JSON, label maps, key images or a FHIR
R4 Bundle. DICOMweb clients store studies with STOW-RS (`POST /dicomweb/studies`) and
retrieve radserve's DICOM SEG and SR with WADO-RS (`GET /dicomweb/studies/{study}`).
Every endpoint except `/healthz` needs an API key
(`Authorization: Bearer <key>` or `X-API-Key: <key>`); keys have the roles read,
submit and admin (`radserve keys create --role ...`). Errors are
`{"error": {"code", "message", "retryable"}}`.
"""


class AnsweredErrors:
    """Outermost: an unexpected error answered in full (the 500 of
    :func:`radserve.api.errors.unexpected_response`, logged there with its traceback)
    ends with its request. Starlette raises it on to the server, and uvicorn closed the
    connection for it: an API reader's pooled connection to the serving process, whose
    next forwarded request (another client's) then failed. One not answered in full
    still goes on (the server must cut that connection)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        answered = False

        async def sending(message: Message) -> None:
            nonlocal answered
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                answered = True

        try:
            await self.app(scope, receive, sending)
        except Exception:
            if not answered:
                raise


class _App(FastAPI):
    def build_middleware_stack(self) -> ASGIApp:
        return AnsweredErrors(super().build_middleware_stack())


def create_app(
    service: Service, *, manage_service: bool = True, key_ttl_s: float = 10.0
) -> FastAPI:
    """The HTTP API over ``service``."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if manage_service:
            await run_in_threadpool(service.start)
        try:
            yield
        finally:
            if manage_service:
                await run_in_threadpool(service.stop)

    app = _App(
        title="radserve",
        version=__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,  # served by ops.openapi, behind a key
        # no 307 from /v1/jobs/ to /v1/jobs: Starlette built its Location from the
        # client's Host header (a forged Host was sent back as the redirect's host)
        redirect_slashes=False,
    )
    app.state.service = service
    app.state.keys = KeyVerifier(
        service.store, ttl_s=key_ttl_s, wait_s=service.settings.server.store_wait_s
    )
    server = service.settings.server
    errors.install(app, on_error=lambda code: service.metrics.errors.labels(code).inc())
    app.include_router(studies.router)
    app.include_router(jobs.router)
    app.include_router(dicomweb.router)
    app.include_router(ops.router)
    app.include_router(models.router)
    app.include_router(turnaround.router)
    ops.add_metrics_route(app.router, require_key=server.metrics_require_key)
    ops.add_docs_assets(app)

    public = {"/healthz"} | (set() if server.metrics_require_key else {"/metrics"})

    def openapi() -> dict[str, Any]:
        """The generated schema plus the API-key schemes on every non-public operation."""
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title, version=app.version, description=app.description, routes=app.routes
            )
            schema.setdefault("components", {})["securitySchemes"] = SECURITY_SCHEMES
            for path, operations in schema["paths"].items():
                if path not in public:
                    for operation in operations.values():
                        operation["security"] = [{name: []} for name in SECURITY_SCHEMES]
            _document_errors(schema, public)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    add_limits(app, server, service.metrics.observe_http)
    return app


_ERROR_OUT = {"$ref": "#/components/schemas/ErrorOut"}
_FASTAPI_422 = "#/components/schemas/HTTPValidationError"


def _error_response(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _ERROR_OUT}}}


def _document_errors(schema: dict[str, Any], public: set[str]) -> None:
    """Make the document say what the handlers answer: a request that fails validation gets
    **400** with the error body (errors.install), not FastAPI's 422 HTTPValidationError;
    every operation may answer 406 (api.negotiation); one behind a key 401 and 403."""
    for path, operations in schema["paths"].items():
        for operation in operations.values():
            responses = operation.setdefault("responses", {})
            fastapi_422 = responses.get("422", {})
            if _FASTAPI_422 in str(fastapi_422):
                del responses["422"]
            validated = operation.get("parameters") or operation.get("requestBody")
            if validated and "400" not in responses:
                responses["400"] = _error_response("invalid request")
            responses.setdefault(  # api.negotiation, for every operation
                "406", _error_response("the Accept header allows none of the types answered")
            )
            if path not in public:
                responses.setdefault("401", _error_response("no valid API key"))
                responses.setdefault("403", _error_response("the key's role does not allow this"))
    components = schema.get("components", {}).get("schemas", {})
    if _FASTAPI_422 not in str(schema["paths"]):
        components.pop("HTTPValidationError", None)
        components.pop("ValidationError", None)


__all__ = ["AnsweredErrors", "create_app"]

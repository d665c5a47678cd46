"""Operations: liveness, readiness, metrics, the OpenAPI schema and docs, and the
admin action that puts a model back in service after its circuit breaker opened."""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request, Response
from fastapi.responses import HTMLResponse, JSONResponse
from starlette.concurrency import run_in_threadpool

from radserve import __version__
from radserve.api.auth import Principal, read_unless_outage, require_admin, require_read
from radserve.api.files import StaticFileAnswers
from radserve.api.negotiation import NegotiatedRoute
from radserve.api.schemas import (
    DestinationStatusOut,
    ErrorOut,
    HealthOut,
    ModelResetOut,
    OutboxItemOut,
    OutboxOut,
    ReadyOut,
)
from radserve.api.state import service_of as _service
from radserve.service.errors import InvalidRequestError
from radserve.service.metrics import CONTENT_TYPE
from radserve.store.outbox import OutboxKind, OutboxState

router = APIRouter(tags=["operations"], route_class=NegotiatedRoute)
_AUTH_ERRORS: dict[int | str, dict[str, Any]] = {c: {"model": ErrorOut} for c in (401, 403)}


@router.get("/healthz", response_model=HealthOut, summary="Liveness (no key needed)")
async def healthz(request: Request) -> HealthOut:
    service = _service(request)
    return HealthOut(
        model_versions=service.catalog.model_versions(),
        uptime_seconds=round(service.uptime_s, 3),
        version=__version__,
    )


@router.get(
    "/readyz",
    response_model=ReadyOut,
    responses={503: {"model": ReadyOut}, **_AUTH_ERRORS},
    summary="Readiness: models warmed up, store reachable, no open circuit breaker",
)
async def readyz(
    request: Request, principal: Annotated[Principal | None, Depends(read_unless_outage)]
) -> JSONResponse:
    """During a database outage a key that is not remembered cannot be checked: the
    answer comes at once, not ready, with the parts that need no key (it used to wait
    ``server.store_wait_s`` and then answer 503 ``store_error`` without saying why)."""
    state = await run_in_threadpool(_service(request).readiness)
    if principal is None:
        state = state.without_key()
    out = ReadyOut(
        ready=state.ready,
        warmed_up=state.warmed_up,
        store_reachable=state.store_reachable,
        open_models=list(state.open_models),
        failed_models=state.failed_models,
        reasons=state.reasons,
        degraded=state.degraded,
        unreachable_peers=state.unreachable_peers,
        work_held=None if state.held is None else state.held.reason,
        work_held_seconds=round(state.held_s, 3),
    )
    return JSONResponse(out.model_dump(), status_code=200 if state.ready else 503)


async def _metrics(request: Request) -> Response:
    data = await run_in_threadpool(_service(request).metrics.exposition)
    return Response(data, media_type=CONTENT_TYPE)


def add_metrics_route(router_: APIRouter, *, require_key: bool) -> None:
    """``GET /metrics``, behind a read key when ``server.metrics_require_key``."""
    if require_key:

        async def metrics(
            request: Request, _: Annotated[Principal, Depends(require_read)]
        ) -> Response:
            return await _metrics(request)

        responses: dict[int | str, dict[str, Any]] = dict(_AUTH_ERRORS)
    else:

        async def metrics(request: Request) -> Response:  # type: ignore[misc]
            return await _metrics(request)

        responses = {}
    router_.add_api_route(
        "/metrics",
        metrics,
        methods=["GET"],
        summary="Prometheus metrics",
        responses={200: {"content": {CONTENT_TYPE: {}}}, **responses},
        tags=["operations"],
        route_class_override=NegotiatedRoute,
    )


@router.post(
    "/v1/admin/models/{name}/reset",
    response_model=ModelResetOut,
    responses={404: {"model": ErrorOut}, **_AUTH_ERRORS},
    summary="Close a model's circuit breaker (after fixing or reloading it)",
)
async def reset_model(
    request: Request, name: str, principal: Annotated[Principal, Depends(require_admin)]
) -> ModelResetOut:
    was_open = await run_in_threadpool(
        _service(request).reset_model, name, actor_key_id=principal.key_id, client=principal.client
    )
    return ModelResetOut(model=name, was_open=was_open)


@router.get(
    "/v1/ops/outbox",
    response_model=OutboxOut,
    responses={400: {"model": ErrorOut}, **_AUTH_ERRORS},
    summary="Outbox: deliveries per destination and the rows themselves (admin)",
)
async def outbox_list(
    request: Request,
    _: Annotated[Principal, Depends(require_admin)],
    state: Annotated[
        str | None, Query(description="pending|sending|committing|sent|failed_permanent")
    ] = None,
    destination: str | None = None,
    kind: Annotated[str | None, Query(description="dicom | fhir")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> OutboxOut:
    try:
        state_ = OutboxState(state) if state is not None else None
        kind_ = OutboxKind(kind) if kind is not None else None
    except ValueError as exc:
        raise InvalidRequestError(str(exc)) from None
    ops = _service(request).outbox

    def read() -> OutboxOut:
        items = ops.items(state=state_, destination=destination, kind=kind_, limit=limit)
        return OutboxOut(
            destinations=[
                DestinationStatusOut(**{**dataclasses.asdict(d), "kind": d.kind.value})
                for d in ops.status()
            ],
            items=[OutboxItemOut.from_item(i) for i in items],
        )

    return await run_in_threadpool(read)


@router.post(
    "/v1/ops/outbox/{item_id}/retry",
    response_model=OutboxItemOut,
    responses={c: {"model": ErrorOut} for c in (401, 403, 404, 409)},
    summary=(
        "Send a delivery again: failed_permanent or committing -> pending (a committing "
        "one under a new storage commitment transaction), or a pending one now (audited)"
    ),
)
async def outbox_retry(
    request: Request,
    # database row ids are signed 64-bit: a larger number is a bad request, not a 500
    item_id: Annotated[int, Path(ge=1, le=2**63 - 1)],
    principal: Annotated[Principal, Depends(require_admin)],
) -> OutboxItemOut:
    item = await run_in_threadpool(
        _service(request).outbox.retry,
        item_id,
        actor_key_id=principal.key_id,
        client=principal.client,
    )
    return OutboxItemOut.from_item(item)


@router.get("/openapi.json", include_in_schema=False)
async def openapi(request: Request, _: Annotated[Principal, Depends(require_read)]) -> JSONResponse:
    return JSONResponse(request.app.openapi())


# Swagger UI served from this server (radserve/api/static, copied from npm's
# swagger-ui-dist by the console's build): FastAPI's default page loaded its script from
# cdn.jsdelivr.net into radserve's origin, where it ran with a signed-in browser's rights
# (and a hospital network that reaches no CDN showed a blank page)
DOCS_STATIC = pathlib.Path(__file__).resolve().parent.parent / "static"
_DOCS_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>radserve API</title>
<link rel="stylesheet" href="/docs/static/swagger/swagger-ui.css"></head>
<body><div id="swagger-ui"></div>
<script src="/docs/static/swagger/swagger-ui-bundle.js"></script>
<script src="/docs/static/docs.js"></script></body></html>
"""
_DOCS_HEADERS = {
    # nothing from another origin, no inline script (the start is docs.js)
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
        "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


@router.get("/docs", include_in_schema=False, response_class=HTMLResponse)
async def docs(request: Request, _: Annotated[Principal, Depends(require_read)]) -> HTMLResponse:
    return HTMLResponse(_DOCS_PAGE, headers=_DOCS_HEADERS)


def add_docs_assets(app: Any) -> None:
    """Serve Swagger UI's files (and the page's start) at ``/docs/static``: public, as
    any static script; the schema they read is behind a key."""
    app.mount("/docs/static", StaticFileAnswers(directory=DOCS_STATIC), name="docs-static")


__all__ = ["DOCS_STATIC", "add_docs_assets", "add_metrics_route", "router"]

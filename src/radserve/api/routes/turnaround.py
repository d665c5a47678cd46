"""Turnaround operations: the learned service times, and the ETA / deadline-risk view
(how many misses were predicted, how early, what an ETA walk costs)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from starlette.concurrency import run_in_threadpool

from radserve.api.auth import Principal, job_visible, require_read, restricted
from radserve.api.negotiation import NegotiatedRoute
from radserve.api.schemas import ErrorOut, ServiceTimesOut, TurnaroundOut
from radserve.api.state import service_of as _service
from radserve.service.turnaround import MISS_WINDOW_S

router = APIRouter(tags=["operations"], route_class=NegotiatedRoute)
_AUTH_ERRORS: dict[int | str, dict[str, Any]] = {c: {"model": ErrorOut} for c in (401, 403)}


@router.get(
    "/v1/ops/service-times",
    response_model=ServiceTimesOut,
    responses=_AUTH_ERRORS,
    summary="Learned service times per (pipeline, step, device, precision)",
)
async def service_times(
    request: Request, _: Annotated[Principal, Depends(require_read)]
) -> ServiceTimesOut:
    turnaround = _service(request).turnaround
    model = turnaround.model
    lines = await run_in_threadpool(model.describe)
    return ServiceTimesOut(
        device=turnaround.device,
        prior=model.to_json()["prior"],  # type: ignore[arg-type]
        typical_slices=model.typical_size().slices,
        lines=lines,
    )


@router.get(
    "/v1/ops/turnaround",
    response_model=TurnaroundOut,
    responses=_AUTH_ERRORS,
    summary="ETAs and deadline risk: jobs at risk, misses predicted and how early",
)
async def turnaround_view(
    request: Request,
    who: Annotated[Principal, Depends(require_read)],
    window_h: Annotated[
        float,
        Query(gt=0, le=24 * 366, description="misses of the jobs that arrived in these hours"),
    ] = MISS_WINDOW_S / 3600,
) -> TurnaroundOut:
    turnaround = _service(request).turnaround
    settings = turnaround.settings
    misses = await run_in_threadpool(turnaround.miss_report, window_h * 3600)
    at_risk = sorted(r.job_id for r in turnaround.at_risk())
    if restricted(request, who):  # job ids only of the jobs the caller may see
        at_risk = await run_in_threadpool(
            lambda: [j for j in at_risk if job_visible(request, who, j)]
        )
    return TurnaroundOut(
        jobs_with_eta=len(turnaround.etas()),
        last_compute_ms=round(turnaround.last_compute_s * 1000, 3),
        risk_margin_s=settings.risk_margin_s,
        risk_policy=settings.risk_policy,
        at_risk=at_risk,
        risk_events=turnaround.risk_counts(),
        misses=misses.as_dict(),
        eta_bias=turnaround.bias_view(),
        eta_band=turnaround.band_view(),
    )


__all__ = ["router"]

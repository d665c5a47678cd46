"""Other jobs a job's answers name, shown only to who may see them.

A study answered from the result cache (:mod:`radserve.service.intake`) is a new job
that reuses the result folder of an earlier job with the same input, pipeline and
models; under ``security.visibility`` that earlier job may be another site's. Its id
reached the reader three ways: the job's ``cached_from`` (status, lists, the submit
answer, the console's worklist and its event stream; :meth:`JobOut.from_record` gives
it only with ``show_source``), the audit trail's payloads (:mod:`radserve.console.routes`
hides them), and the reused ``report.json`` itself, whose ``job_id`` is the job that
ran and whose ``lineage.supersedes_job_id`` is that job's predecessor. This module
rewrites the report for a reader who may not see those jobs: ``job_id`` becomes the
job the reader asked about, ``supersedes_job_id`` null. Everything else in the report is
the same result.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from radserve.api.auth import Principal, job_visible, restricted
from radserve.store import JobRecord


def report_needs_care(request: Request, principal: Principal, record: JobRecord) -> bool:
    """Whether ``record``'s report may name a job ``principal`` may not see: under a
    rule, any report. A cached job's names the job that ran; a job that ran names as
    ``supersedes_job_id`` the previous result of the same study: since lineages are per
    site (radserve.service.lineage) one of its own site, but a result made before that
    (migration 0019) may name another site's job, and an admin's job a site's."""
    return restricted(request, principal)


def shown_report_json(
    request: Request, principal: Principal, record: JobRecord, report: dict[str, Any]
) -> dict[str, Any]:
    """``report`` (parsed) as ``principal`` may see it (call from a worker thread)."""
    if not report_needs_care(request, principal, record):
        return report
    out = dict(report)
    named = out.get("job_id")
    if named not in (None, record.id) and not job_visible(request, principal, str(named)):
        out["job_id"] = record.id
    lineage = out.get("lineage")
    if isinstance(lineage, dict):
        before = lineage.get("supersedes_job_id")
        if before is not None and not job_visible(request, principal, str(before)):
            out["lineage"] = {**lineage, "supersedes_job_id": None}
    return out


def shown_report_bytes(
    request: Request, principal: Principal, record: JobRecord, data: bytes
) -> bytes:
    """The stored ``report.json`` bytes as ``principal`` may see them: unchanged unless
    :func:`shown_report_json` changed something (call from a worker thread)."""
    if not report_needs_care(request, principal, record):
        return data
    report = json.loads(data)
    shown = shown_report_json(request, principal, record, report)
    if shown == report:
        return data
    # the report's own layout (pydantic's model_dump_json(indent=2))
    return json.dumps(shown, indent=2, ensure_ascii=False).encode()


async def shown_report(
    request: Request, principal: Principal, record: JobRecord, data: bytes
) -> bytes:
    """:func:`shown_report_bytes`, on the event loop when nothing can change."""
    if not report_needs_care(request, principal, record):
        return data
    return await run_in_threadpool(shown_report_bytes, request, principal, record, data)


__all__ = ["report_needs_care", "shown_report", "shown_report_bytes", "shown_report_json"]

"""The actions radserve audits and the payloads it records for jobs (no patient data).

Every action is a member of :class:`Action` (one definition); each has its DICOM audit
event (PS3.15 A.5, for ATNA) in :data:`radserve.audit.atna.EVENTS`.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from radserve.audit.chain import AuditEvent

if TYPE_CHECKING:
    from radserve.store.records import JobRecord


class Action(StrEnum):
    JOB_SUBMITTED = "job.submitted"
    JOB_CACHED = "job.cached"  # answered from the result cache, nothing ran
    # the same study submitted again while its job was unfinished: that job answers it
    JOB_JOINED = "job.joined"
    JOB_STARTED = "job.started"
    JOB_REQUEUED = "job.requeued"  # retry, or restart recovery
    JOB_SUCCEEDED = "job.succeeded"
    JOB_FAILED = "job.failed"
    JOB_CANCELLED = "job.cancelled"
    JOB_REPRIORITISED = "job.reprioritised"  # an operator changed a waiting job's class
    # a job predicted to finish past its deadline minus the margin / back before it
    # (radserve.service.turnaround; the store derives predicted misses from them)
    JOB_DEADLINE_RISK = "job.deadline_risk"
    JOB_DEADLINE_RISK_CLEARED = "job.deadline_risk_cleared"
    KEY_CREATED = "key.created"
    KEY_REVOKED = "key.revoked"
    CONFIG_LOADED = "config.loaded"
    MODEL_CHANGED = "model.changed"
    MODEL_DRIFT = "model.drift"  # a model version's drift state changed (ok/warn/alert)
    OUTBOX_RETRIED = "outbox.retried"  # an operator re-armed a delivery
    # a critical finding's notice queued for a receiver / acknowledged by it (2xx) /
    # refused for good (a 4xx: the receiver's URL or token needs fixing)
    CRITICAL_QUEUED = "critical.queued"
    CRITICAL_ACKNOWLEDGED = "critical.acknowledged"
    CRITICAL_FAILED = "critical.failed"
    # a C-STORE data set passed ingest.max_file_bytes while arriving: association aborted
    GATEWAY_OVERSIZE = "gateway.oversize_aborted"
    PHI_READ = "phi.read"  # a report, result file or study view read (radserve.security)
    EXPORT_DEIDENTIFIED = "export.deidentified"  # `radserve export --deidentify`
    # console sign-in: succeeded / refused / refused while the client is locked out; sign-out
    CONSOLE_SIGNIN = "console.signin"
    CONSOLE_SIGNIN_FAILED = "console.signin_failed"
    CONSOLE_SIGNIN_LOCKED = "console.signin_locked"
    CONSOLE_SIGNOUT = "console.signout"
    # deadline-risk alerts still queued at the server's stop that never reached a receiver
    RISK_ALERTS_DROPPED = "turnaround.risk_alerts_dropped"
    # a retention pass removed stored studies, received copies or results (counts only;
    # radserve.service.retention)
    RETENTION_SWEPT = "retention.swept"


def job_event(
    action: Action | str,
    job: JobRecord,
    *,
    actor_key_id: str | None = None,
    client_address: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> AuditEvent:
    """An audit event about ``job``: input fingerprint, pipeline, models, outcome.

    ``extra`` adds e.g. an outputs summary (``outputs={"findings": 3}``); it must hold
    identifiers, counts and versions only. The job's own submitter is the default actor.
    """
    payload: dict[str, Any] = {
        "fingerprint": job.fingerprint,
        "pipeline": job.pipeline_name,
        "pipeline_version": job.pipeline_version,
        "model_versions": dict(job.model_versions),
        "precision": job.precision,
        "priority_class": str(job.priority_class),
        "state": str(job.state),
        "attempts": job.attempts,
    }
    if job.cached_from:
        payload["cached_from"] = job.cached_from
    if job.error_code:
        payload["error_code"] = job.error_code
    if job.stage_timings:
        payload["timings"] = dict(job.stage_timings)
    payload.update(extra or {})
    return AuditEvent(
        action=str(action),
        subject=job.id,
        payload=payload,
        actor_key_id=actor_key_id if actor_key_id is not None else job.api_key_id,
        client_address=client_address if client_address is not None else job.client_address,
    )

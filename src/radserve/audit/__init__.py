"""Tamper-evident audit log: the hash chain (``chain``) and the events radserve records."""

from radserve.audit.chain import (
    GENESIS_HASH,
    AuditEvent,
    AuditProblem,
    AuditRecord,
    VerifyReport,
    canonical_json,
    record_hash,
    verify_chain,
)
from radserve.audit.events import Action, job_event

__all__ = [
    "GENESIS_HASH",
    "Action",
    "AuditEvent",
    "AuditProblem",
    "AuditRecord",
    "VerifyReport",
    "canonical_json",
    "job_event",
    "record_hash",
    "verify_chain",
]

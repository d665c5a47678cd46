"""The audit chain: canonical JSON, record hashes, and verification. No database code.

Each record's ``hash = sha256(prev_hash + canonical JSON of the record)``, the first
record's ``prev_hash`` is 64 zeros, and a one-row chain head holds the last seq and
hash. Editing a record breaks its own hash; deleting one breaks the next record's
``prev_hash`` and the seq sequence; deleting the newest ones disagrees with the head.
The chain is tamper-*evident* against edits made through the database; an attacker who
rewrites every later hash and the head too is caught only by comparing the head hash
with a copy kept elsewhere (``radserve audit verify`` prints it; ``export`` writes it).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

GENESIS_HASH = "0" * 64
MAX_PROBLEMS = 100


@dataclass(frozen=True)
class AuditEvent:
    """Something to record. Payloads hold identifiers and versions, never patient data."""

    action: str
    subject: str | None = None
    payload: Mapping[str, Any] = field(default_factory=dict)
    actor_key_id: str | None = None
    client_address: str | None = None


@dataclass(frozen=True)
class AuditRecord:
    """One stored link of the chain."""

    seq: int
    ts: dt.datetime
    actor_key_id: str | None
    client_address: str | None
    action: str
    subject: str | None
    payload: Mapping[str, Any]
    prev_hash: str
    hash: str

    def to_json(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "ts": self.ts.isoformat(),
            "actor_key_id": self.actor_key_id,
            "client_address": self.client_address,
            "action": self.action,
            "subject": self.subject,
            "payload": dict(self.payload),
            "prev_hash": self.prev_hash,
            "hash": self.hash,
        }


def canonical_json(value: Any) -> str:
    """Sorted keys, no whitespace, no NaN: one text per value, so hashes are reproducible."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def record_hash(
    prev_hash: str,
    *,
    seq: int,
    ts: dt.datetime,
    actor_key_id: str | None,
    client_address: str | None,
    action: str,
    subject: str | None,
    payload: Mapping[str, Any],
) -> str:
    body = {
        "seq": seq,
        "ts": ts.astimezone(dt.UTC).isoformat(),
        "actor_key_id": actor_key_id,
        "client_address": client_address,
        "action": action,
        "subject": subject,
        "payload": dict(payload),
    }
    return hashlib.sha256((prev_hash + canonical_json(body)).encode()).hexdigest()


@dataclass(frozen=True)
class AuditProblem:
    seq: int | None
    reason: str

    def __str__(self) -> str:
        return f"seq {self.seq}: {self.reason}" if self.seq is not None else self.reason


@dataclass(frozen=True)
class VerifyReport:
    records: int
    head_seq: int
    head_hash: str
    problems: list[AuditProblem]

    @property
    def ok(self) -> bool:
        return not self.problems


def verify_chain(
    records: Iterable[AuditRecord | tuple[int, str | None, AuditRecord]],
    *,
    head_seq: int,
    head_hash: str,
) -> VerifyReport:
    """Check every link of ``records`` (ordered by seq) and the head.

    Items may be an :class:`AuditRecord` or ``(seq, error, record)`` where ``error`` says
    why a stored row could not even be read (e.g. its payload is no longer JSON).
    """
    problems: list[AuditProblem] = []
    expected_seq, prev_hash, count = 1, GENESIS_HASH, 0

    def problem(seq: int | None, reason: str) -> None:
        if len(problems) < MAX_PROBLEMS:
            problems.append(AuditProblem(seq, reason))

    for item in records:
        count += 1
        seq, error, record = item if isinstance(item, tuple) else (item.seq, None, item)
        if seq != expected_seq:
            missing = f"{expected_seq}" if seq == expected_seq + 1 else f"{expected_seq}-{seq - 1}"
            problem(seq, f"record(s) {missing} before it are missing (deleted)")
        if record.prev_hash != prev_hash:
            problem(seq, "prev_hash does not match the record before it (deleted or rewritten)")
        if error is not None:
            problem(seq, f"record is unreadable ({error}); it was edited")
        elif (
            record_hash(
                record.prev_hash,
                seq=record.seq,
                ts=record.ts,
                actor_key_id=record.actor_key_id,
                client_address=record.client_address,
                action=record.action,
                subject=record.subject,
                payload=record.payload,
            )
            != record.hash
        ):
            problem(seq, "content does not match its hash (record was edited)")
        expected_seq, prev_hash = seq + 1, record.hash
    last_seq = expected_seq - 1
    if head_seq != last_seq or head_hash != prev_hash:
        problem(
            head_seq,
            f"chain head is at seq {head_seq} but the last record is seq {last_seq} "
            "(records deleted from the end, or the head was changed)",
        )
    return VerifyReport(records=count, head_seq=head_seq, head_hash=head_hash, problems=problems)

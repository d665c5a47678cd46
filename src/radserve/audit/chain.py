"""The audit chain: canonical JSON, record hashes, and verification. No database code.

Each record's ``hash = HMAC-SHA256(key, prev_hash + canonical JSON of the record)``
with a key kept outside the database (:class:`AuditKey`; its id is stored on the
record), the first record's ``prev_hash`` is 64 zeros, and a one-row chain head holds
the last seq and hash. Editing a record breaks its own hash; deleting one breaks the
next record's ``prev_hash`` and the seq sequence; deleting the newest ones disagrees
with the head. Without the key nobody can compute a valid hash, so a writer of the
database can neither append a forged record nor rehash an edited chain. What a writer
*can* still do — cut the newest records and move the head back, or wipe everything —
is caught against a signed checkpoint kept outside the database
(:mod:`radserve.audit.seal`) or a head the collector saw (``--expect-head``).

Chains written before keys existed hold unkeyed records (``key_id`` empty,
``sha256(prev_hash + JSON)``); they verify as a prefix only: an unkeyed record after a
keyed one is a forgery.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

GENESIS_HASH = "0" * 64
MAX_PROBLEMS = 100


@dataclass(frozen=True, repr=False)
class AuditKey:
    """The chain's HMAC key. ``id`` (16 hex digits, derived from the key) is stored on
    each record so a verifier holding another key says so instead of "all edited"."""

    secret: bytes

    @property
    def id(self) -> str:
        return hmac.new(self.secret, b"radserve audit key id", hashlib.sha256).hexdigest()[:16]

    def mac(self, text: str) -> str:
        return hmac.new(self.secret, text.encode(), hashlib.sha256).hexdigest()

    def __repr__(self) -> str:  # never print the secret
        return f"AuditKey(id={self.id!r})"


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
    key_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "key_id": self.key_id,
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

    def expected_hash(self, key: AuditKey | None) -> str:
        """The hash this record's fields and ``prev_hash`` give under ``key`` (None: the
        unkeyed chain); it differs from ``hash`` where the record was edited."""
        return record_hash(
            self.prev_hash,
            key=key,
            seq=self.seq,
            ts=self.ts,
            actor_key_id=self.actor_key_id,
            client_address=self.client_address,
            action=self.action,
            subject=self.subject,
            payload=self.payload,
        )


def canonical_json(value: Any) -> str:
    """Sorted keys, no whitespace, no NaN: one text per value, so hashes are reproducible."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def record_hash(
    prev_hash: str,
    *,
    key: AuditKey | None = None,
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
    text = prev_hash + canonical_json(body)
    if key is None:  # the unkeyed chains written before keys existed
        return hashlib.sha256(text.encode()).hexdigest()
    return key.mac(text)


@dataclass(frozen=True)
class AuditProblem:
    seq: int | None
    reason: str

    def __str__(self) -> str:
        return f"seq {self.seq}: {self.reason}" if self.seq is not None else self.reason


@dataclass(frozen=True)
class VerifyReport:
    """``problems`` fail verification; ``notes`` are found and said, and fail nothing
    (a checkpoint append a crash cut short)."""

    records: int
    head_seq: int
    head_hash: str
    problems: list[AuditProblem]
    notes: list[str] = field(default_factory=list)
    # the last record's seq (head_seq is what the head row says: they differ once
    # records were cut from the end)
    last_seq: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems


def verify_chain(
    records: Iterable[AuditRecord | tuple[int, str | None, AuditRecord]],
    *,
    head_seq: int,
    head_hash: str,
    key: AuditKey | None = None,
) -> VerifyReport:
    """Check every link of ``records`` (ordered by seq) and the head.

    Items may be an :class:`AuditRecord` or ``(seq, error, record)`` where ``error`` says
    why a stored row could not even be read (e.g. its payload is no longer JSON). Keyed
    records need ``key``; an unkeyed record after a keyed one is reported as forged.
    """
    problems: list[AuditProblem] = []
    expected_seq, prev_hash, count = 1, GENESIS_HASH, 0
    keyed_seen = False

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
        if record.key_id is None and keyed_seen:
            problem(seq, "unkeyed record after keyed ones (forged: written without the key)")
        keyed_seen = keyed_seen or record.key_id is not None
        if record.key_id is not None and key is None:
            problem(seq, "record is keyed (HMAC) and no audit key was given to check it")
        elif record.key_id is not None and key is not None and record.key_id != key.id:
            problem(seq, f"record was hashed with audit key {record.key_id}, not {key.id}")
        elif error is not None:
            problem(seq, f"record is unreadable ({error}); it was edited")
        elif record.expected_hash(key if record.key_id is not None else None) != record.hash:
            problem(seq, "content does not match its hash (record was edited)")
        expected_seq, prev_hash = seq + 1, record.hash
    last_seq = expected_seq - 1
    if head_seq != last_seq or head_hash != prev_hash:
        problem(
            head_seq,
            f"chain head is at seq {head_seq} but the last record is seq {last_seq} "
            "(records deleted from the end, or the head was changed)",
        )
    return VerifyReport(
        records=count,
        head_seq=head_seq,
        head_hash=head_hash,
        problems=problems,
        last_seq=last_seq,
    )

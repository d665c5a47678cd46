"""Storage Commitment Push Model (PS3.4 Annex J) as radserve's outbox uses it: what the
N-ACTION asks and what an N-EVENT-REPORT answers, as plain data.

After a destination with ``storage_commitment`` has stored a batch of results (C-STORE
success), the outbox asks it (N-ACTION, Action Type 1) to commit them under a new
Transaction UID; the destination answers later with an N-EVENT-REPORT listing the
instances it committed (Referenced SOP Sequence) and those it did not (Failed SOP
Sequence, each with a Failure Reason). The report may come on the same association or
on one the destination opens to radserve's SCP (Orthanc 1.10.1 always does the latter).
The rows' fate is decided by :mod:`radserve.gateway.commitment_ledger`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pydicom.dataset import Dataset
from pydicom.uid import UID

from radserve.gateway.conformance import Status

logger = logging.getLogger(__name__)

# PS3.4 J.3.2 / J.3.3
PUSH_MODEL = "1.2.840.10008.1.20.1"
PUSH_MODEL_INSTANCE = "1.2.840.10008.1.20.1.1"
REQUEST_COMMITMENT = 1  # N-ACTION Action Type ID

# PS3.3 C.14.1.1 Failure Reason
FAILURE_REASONS = {
    0x0110: "processing failure",
    0x0112: "no such object instance",
    0x0213: "resource limitation",
    0x0122: "referenced SOP class not supported",
    0x0119: "class / instance conflict",
    0x0131: "duplicate transaction UID",
}


@dataclass(frozen=True)
class CommitmentReport:
    """One N-EVENT-REPORT's content: committed instance UIDs, failed ones with why."""

    transaction_uid: str
    committed: frozenset[str] = frozenset()
    failed: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_event(cls, info: Dataset | None) -> CommitmentReport:
        """From the Event Information; ValueError, naming what is malformed and never
        the peer's values, when it is not a report radserve can act on (before session
        35 a Failure Reason of two values or a sequence that was none raised TypeError
        into pynetdicom's handler, a text one was answered with Python's message quoting
        the value, and a Transaction UID of 20,000 characters was logged whole)."""
        if info is None:
            raise ValueError("the storage commitment report carries no Event Information")
        try:
            uid = str(getattr(info, "TransactionUID", "") or "").strip()
        except Exception as exc:  # a value pydicom cannot convert
            raise ValueError("its Transaction UID cannot be read") from exc
        if not uid:
            raise ValueError("the storage commitment report carries no Transaction UID")
        if not UID(uid).is_valid:
            raise ValueError(
                f"its Transaction UID ({len(uid)} characters) is not a valid UID (at most "
                "64 digits and dots, PS3.5 9.1)"
            )
        committed = {uid for uid, _ in _references(info, "ReferencedSOPSequence", False)}
        failed = dict(_references(info, "FailedSOPSequence", True))
        return cls(uid, frozenset(committed - {""}), {k: v for k, v in failed.items() if k})


def _references(info: Dataset, keyword: str, with_reason: bool) -> list[tuple[str, int]]:
    """(SOP Instance UID, Failure Reason or 0) of each item of the sequence ``keyword``."""
    try:
        items = getattr(info, keyword, None) or []
        if not isinstance(items, Sequence) or isinstance(items, str | bytes):
            raise TypeError
        found = []
        for item in items:
            reason = item.get("FailureReason", 0) if with_reason else 0
            found.append((str(item.get("ReferencedSOPInstanceUID", "") or ""), int(reason or 0)))
    except Exception as exc:  # not a sequence of items, a reason of two values or text
        what = "Failure Reason" if with_reason else "Referenced SOP Instance UID"
        raise ValueError(f"its {keyword} is not a sequence of items with one {what} each") from exc
    return found


def failure_text(reason: int) -> str:
    """A Failure Reason as operators read it: ``0x0112 (no such object instance)``."""
    return f"0x{reason:04X} ({FAILURE_REASONS.get(reason, 'unknown reason')})"


def action_dataset(transaction_uid: str, instances: Sequence[tuple[str, str]]) -> Dataset:
    """The N-ACTION's Action Information: the transaction and every instance in it
    (SOP Class UID, SOP Instance UID)."""
    request = Dataset()
    request.TransactionUID = transaction_uid
    references = []
    for sop_class_uid, sop_instance_uid in instances:
        reference = Dataset()
        reference.ReferencedSOPClassUID = sop_class_uid
        reference.ReferencedSOPInstanceUID = sop_instance_uid
        references.append(reference)
    request.ReferencedSOPSequence = references
    return request


# (calling AE title of the reporting peer, the report) -> (status, error comment)
ReportHandler = Callable[[str, CommitmentReport], tuple[int, str]]


def answer(calling: str, info: Dataset | None, handler: ReportHandler) -> tuple[int, str]:
    """The (status, comment) for one N-EVENT-REPORT received from AE ``calling``,
    whichever association it came on."""
    try:
        report = CommitmentReport.from_event(info)
    except ValueError as exc:
        logger.warning("storage commitment report from %s refused: %s", calling, exc)
        return Status.INVALID_ARGUMENT, str(exc)
    return handler(calling, report)


__all__ = [
    "PUSH_MODEL",
    "PUSH_MODEL_INSTANCE",
    "CommitmentReport",
    "ReportHandler",
    "action_dataset",
    "answer",
    "failure_text",
]

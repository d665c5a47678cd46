"""What the result index holds to bound a QIDO-RS search by patient or date, without a
Patient ID in clear in the database.

* ``patient_key``: HMAC-SHA256 of the Patient ID under :class:`PatientKey`, a key derived
  from the audit key (``audit.key`` / ``audit.key_file``, kept outside the database). Every
  process that holds the chain's key (each replica, each reader process) makes the same
  hashes; a reader of the database alone can neither read the IDs nor test guesses.
* ``match_key_id``: the id of the key a row was hashed with: rows of another key (the
  audit key replaced) or of none (indexed before these columns) are filled in again.
* ``study_date``: the Study Date as ``YYYYMMDD`` (NULL when absent or not a date).

The index only narrows a search: rows it keeps are still matched on their headers, so a
search finds what it found before; a row it leaves out cannot match.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Any, Protocol

from radserve.audit.chain import AuditKey

_LABEL = b"radserve result index: Patient ID"
_DATE_DIGITS = 8


@dataclass(frozen=True, repr=False)
class PatientKey:
    """The HMAC key of the index's Patient ID column."""

    secret: bytes

    @classmethod
    def from_audit_key(cls, key: AuditKey) -> PatientKey:
        return cls(hmac.new(key.secret, _LABEL, hashlib.sha256).digest())

    @property
    def id(self) -> str:
        return hmac.new(self.secret, b"radserve patient key id", hashlib.sha256).hexdigest()[:16]

    def of(self, patient_id: str) -> str | None:
        """The column value for ``patient_id`` (LO: surrounding spaces are padding);
        None for an empty one."""
        text = patient_id.strip()
        if not text:
            return None
        return hmac.new(self.secret, text.encode(), hashlib.sha256).hexdigest()

    def __repr__(self) -> str:  # never print the secret
        return f"PatientKey(id={self.id!r})"


def index_date(value: str) -> str | None:
    """The ``study_date`` column of a DA value (``YYYYMMDD``; ACR-NEMA ``YYYY.MM.DD``
    too), or None when it is not a whole date."""
    text = value.replace(".", "").replace("-", "").strip()
    return text if len(text) == _DATE_DIGITS and text.isdigit() else None


class Header(Protocol):
    """A result's header as pydicom reads it (values by keyword)."""

    def get(self, key: str, default: Any = None) -> Any: ...


def match_columns(header: Header, key: PatientKey | None) -> tuple[str | None, str | None]:
    """(patient_key, study_date) of a result's header: None where it has no value; no
    patient key without ``key``."""
    patient_id = str(header.get("PatientID", "") or "")
    patient_key = key.of(patient_id) if key is not None else None
    return patient_key, index_date(str(header.get("StudyDate", "") or ""))


@dataclass(frozen=True)
class MatchBounds:
    """What a search narrows the index by: one patient's hash, a Study Date range
    (``YYYYMMDD``, both ends inclusive; rows without a date are kept, for their headers
    to decide)."""

    patient_key: str | None = None
    date_from: str | None = None
    date_to: str | None = None

    @property
    def any(self) -> bool:
        return any((self.patient_key, self.date_from, self.date_to))


def date_bounds(wanted: str) -> tuple[str | None, str | None]:
    """The inclusive ``YYYYMMDD`` ends that cover a StudyDate match key (a date or a
    range ``a-b``, ``a-``, ``-b``, as the header match reads it); (None, None) where the
    key cannot be bounded (a partial single date, a malformed one: the headers decide)."""
    low, dash, high = (part.replace(".", "").strip() for part in wanted.partition("-"))
    if not dash:
        exact = index_date(low)
        return exact, exact
    ends = [p for p in (low, high) if p]
    if not ends or not all(p.isdigit() and len(p) <= _DATE_DIGITS for p in ends):
        return None, None
    # a shorter end covers everything it is a prefix of (2026- from 20260000 on)
    return (low.ljust(_DATE_DIGITS, "0") if low else None), (
        high.ljust(_DATE_DIGITS, "9") if high else None
    )


__all__ = ["MatchBounds", "PatientKey", "date_bounds", "index_date", "match_columns"]

"""Clinical priority classes and the configurable rules that derive one from DICOM.

A job's class comes from the request when the caller states it, else from the first
matching :class:`PriorityRule` over the study's DICOM attributes, else OUTPATIENT.
The attribute values (patient location, department, ...) are patient context: they are
matched here and never logged.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from enum import IntEnum
from pathlib import Path

import pydicom
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydicom.dataset import Dataset

logger = logging.getLogger(__name__)


class PriorityClass(IntEnum):
    """Lower value = more urgent; the scheduler sorts on it."""

    URGENT = 0
    INPATIENT = 1
    OUTPATIENT = 2

    @classmethod
    def parse(cls, value: str | PriorityClass) -> PriorityClass:
        """Case-insensitive name ("stat" is accepted for URGENT, as RIS systems send it)."""
        if isinstance(value, PriorityClass):
            return value
        name = value.strip().upper()
        if name == "STAT":
            return cls.URGENT
        try:
            return cls[name]
        except KeyError:
            known = ", ".join(c.name.lower() for c in cls)
            raise ValueError(f"unknown priority class {value!r}; expected one of {known}") from None


class PriorityRule(BaseModel):
    """``attribute`` (a DICOM keyword) matched one way -> ``priority``.

    Exactly one matcher: ``equals`` (any of these values, case-insensitive, trimmed),
    ``matches`` (a regular expression searched case-insensitively) or ``present``
    (the attribute has a non-empty value).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    attribute: str
    priority: PriorityClass
    equals: tuple[str, ...] | None = None
    matches: str | None = None
    present: bool | None = None

    @field_validator("priority", mode="before")
    @classmethod
    def _parse_priority(cls, value: object) -> object:
        return PriorityClass.parse(value) if isinstance(value, str) else value

    @field_validator("attribute")
    @classmethod
    def _known_keyword(cls, value: str) -> str:
        if pydicom.datadict.tag_for_keyword(value) is None:
            raise ValueError(f"{value!r} is not a DICOM keyword (e.g. CurrentPatientLocation)")
        return value

    @model_validator(mode="after")
    def _one_matcher(self) -> PriorityRule:
        given = [m for m in (self.equals, self.matches, self.present) if m is not None]
        if len(given) != 1:
            raise ValueError(
                f"rule on {self.attribute} needs exactly one of equals / matches / present"
            )
        if self.matches is not None:
            re.compile(self.matches)
        return self

    def applies(self, attributes: Mapping[str, str]) -> bool:
        value = str(attributes.get(self.attribute, "") or "").strip()
        if self.present is not None:
            return bool(value) == self.present
        if not value:
            return False
        if self.equals is not None:
            return value.upper() in {v.strip().upper() for v in self.equals}
        return re.search(self.matches or "", value, re.IGNORECASE) is not None


def _default_rules() -> tuple[PriorityRule, ...]:
    """Conservative defaults; a site replaces them with its own location codes."""
    return (
        PriorityRule(
            attribute="RequestedProcedurePriority",
            equals=("STAT", "HIGH"),
            priority=PriorityClass.URGENT,
        ),
        PriorityRule(
            attribute="CurrentPatientLocation",
            matches=r"\b(ED|ER|A&E|EMERG\w*|TRAUMA|RESUS\w*)\b",
            priority=PriorityClass.URGENT,
        ),
        PriorityRule(
            attribute="CurrentPatientLocation",
            matches=r"\b(ICU|ITU|CCU|WARD|INPATIENT|IP)\b",
            priority=PriorityClass.INPATIENT,
        ),
        PriorityRule(attribute="AdmissionID", present=True, priority=PriorityClass.INPATIENT),
    )


class PriorityRules(BaseModel):
    """Ordered rules: the first that applies wins; none applies -> ``default``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rules: tuple[PriorityRule, ...] = Field(default_factory=_default_rules)
    default: PriorityClass = PriorityClass.OUTPATIENT

    @field_validator("default", mode="before")
    @classmethod
    def _parse_default(cls, value: object) -> object:
        return PriorityClass.parse(value) if isinstance(value, str) else value

    @property
    def keywords(self) -> tuple[str, ...]:
        """The DICOM keywords the rules read (what callers need to collect)."""
        return tuple(dict.fromkeys(rule.attribute for rule in self.rules))

    def classify(self, attributes: Mapping[str, str]) -> PriorityClass:
        for index, rule in enumerate(self.rules):
            if rule.applies(attributes):
                logger.debug("priority rule %d (%s) -> %s", index, rule.attribute, rule.priority)
                return rule.priority
        return self.default


def priority_attributes(ds: Dataset, keywords: Iterable[str]) -> dict[str, str]:
    """``keywords`` read from ``ds``, or from its Request Attributes Sequence when absent
    at the top level (modalities copy the order's attributes there)."""
    out: dict[str, str] = {}
    items = list(getattr(ds, "RequestAttributesSequence", None) or [])
    for keyword in keywords:
        for source in (ds, *items):
            value = getattr(source, keyword, None)
            if value not in (None, ""):
                out[keyword] = str(value)
                break
    return out


def read_priority_attributes(path: Path, keywords: Iterable[str]) -> dict[str, str]:
    """The attributes of the first readable DICOM file at ``path`` (a file or a folder).

    Header only. Archives are not opened: callers that hold a dataset (the DICOM
    gateway) use :func:`priority_attributes` directly. Nothing readable -> ``{}``.
    """
    path = Path(path)
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for file in files:
        try:
            ds = pydicom.dcmread(file, stop_before_pixels=True)
        except Exception:  # not DICOM (pydicom raises several types): try the next file
            continue
        return priority_attributes(ds, keywords)
    return {}


__all__ = [
    "PriorityClass",
    "PriorityRule",
    "PriorityRules",
    "priority_attributes",
    "read_priority_attributes",
]

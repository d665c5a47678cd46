"""Clinical priority classes and the rules that derive one from a study's DICOM attributes.

One definition for the whole server: the settings file, the API, the database and the
scheduler all speak :class:`PriorityClass`. Its value is the string stored and served
(``"URGENT"``); the scheduler orders on :attr:`PriorityClass.rank` (0 = most urgent).
It is a ``StrEnum`` on purpose: every member is truthy, so ``priority or default``
cannot silently turn an URGENT request into the default class (as the former
``IntEnum`` with ``URGENT == 0`` did), and comparisons never order by accident.

A job's class comes from the request when the caller states it, else from the first
matching :class:`PriorityRule` over the study's DICOM attributes, else OUTPATIENT. The
attribute values (patient location, department, ...) are patient context: they are
matched here and never logged.
"""

from __future__ import annotations

import difflib
import logging
import re
from collections.abc import Iterator, Mapping
from enum import StrEnum
from functools import cache

from pydantic import BaseModel, ConfigDict, Field, RootModel, field_validator, model_validator

logger = logging.getLogger(__name__)


class PriorityClass(StrEnum):
    """Clinical priority classes; the value is what the database and the API carry."""

    URGENT = "URGENT"
    INPATIENT = "INPATIENT"
    OUTPATIENT = "OUTPATIENT"

    @property
    def rank(self) -> int:
        """Scheduling order: 0 = most urgent. Sort on this, never on the value."""
        return _RANK[self]

    def promoted(self) -> PriorityClass:
        """The class one step more urgent (URGENT stays URGENT): what aging moves to."""
        return _BY_RANK[max(0, self.rank - 1)]

    @classmethod
    def parse(cls, value: str | PriorityClass) -> PriorityClass:
        """Case-insensitive name ("stat" is accepted for URGENT, as RIS systems send it)."""
        if isinstance(value, PriorityClass):
            return value
        name = str(value).strip().upper()
        if name == "STAT":
            return cls.URGENT
        try:
            return cls[name]
        except KeyError:
            known = ", ".join(c.name.lower() for c in cls)
            raise ValueError(
                f"unknown priority class {value!r}; expected one of {known} (or stat, "
                "which is urgent)"
            ) from None


_BY_RANK = (PriorityClass.URGENT, PriorityClass.INPATIENT, PriorityClass.OUTPATIENT)
_RANK = {cls: rank for rank, cls in enumerate(_BY_RANK)}


# The keyword the default rules name, known without pydicom's data dictionary: checking
# it there loaded pydicom in every process importing radserve.domain (each API reader and
# the audit writer, which read no DICOM); tests/unit/test_scheduling_priority.py checks
# that it is one of the dictionary's keywords.
_DEFAULT_KEYWORD = "RequestedProcedurePriority"


@cache
def _keywords() -> tuple[str, ...]:
    from pydicom.datadict import keyword_dict

    return tuple(sorted(keyword_dict))


def check_dicom_keyword(value: str) -> str:
    """``value`` if it is a keyword of pydicom's data dictionary; else ValueError with the
    closest keyword, so a misspelling is caught when the settings load, not at the
    first study."""
    if value == _DEFAULT_KEYWORD:
        return value
    from pydicom.datadict import keyword_dict

    if value in keyword_dict:
        return value
    close = difflib.get_close_matches(value, _keywords(), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else " (e.g. CurrentPatientLocation)"
    raise ValueError(f"{value!r} is not a DICOM keyword{hint}")


class PriorityRule(BaseModel):
    """``attribute`` (a DICOM keyword) matched one way -> ``class``.

    Exactly one matcher: ``values`` (any of these, case-insensitive, trimmed),
    ``matches`` (a regular expression searched case-insensitively) or ``present``
    (whether the attribute has a non-empty value). In a settings file::

        priority_rules:
          - {attribute: RequestedProcedurePriority, values: [STAT], class: URGENT}
          - {attribute: CurrentPatientLocation, matches: '\\b(ED|ER)\\b', class: URGENT}
          - {attribute: AdmissionID, present: true, class: INPATIENT}
    """

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    attribute: str
    priority_class: PriorityClass = Field(alias="class")
    values: tuple[str, ...] | None = Field(default=None, min_length=1)
    matches: str | None = None
    present: bool | None = None

    @field_validator("priority_class", mode="before")
    @classmethod
    def _parse_class(cls, value: object) -> object:
        return PriorityClass.parse(value) if isinstance(value, str) else value

    @field_validator("attribute")
    @classmethod
    def _known_keyword(cls, value: str) -> str:
        return check_dicom_keyword(value)

    @field_validator("matches")
    @classmethod
    def _valid_pattern(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"not a regular expression: {exc}") from None
        return value

    @model_validator(mode="after")
    def _one_matcher(self) -> PriorityRule:
        given = [m for m in (self.values, self.matches, self.present) if m is not None]
        if len(given) != 1:
            raise ValueError(
                f"rule on {self.attribute} needs exactly one of values / matches / present"
            )
        return self

    def applies(self, attributes: Mapping[str, str]) -> bool:
        value = str(attributes.get(self.attribute, "") or "").strip()
        if self.present is not None:
            return (value != "") == self.present
        if value == "":
            return False
        if self.values is not None:
            return value.upper() in {v.strip().upper() for v in self.values}
        return re.search(self.matches or "", value, re.IGNORECASE) is not None


DEFAULT_CLASS = PriorityClass.OUTPATIENT

# The one default rule set: the DICOM Requested Procedure Priority (0040,1003) as the
# modality copies it from the order. STAT is an emergency; HIGH is a ward's request
# ahead of routine work but not an emergency, so it ranks with inpatients. Anything
# else (ROUTINE, MEDIUM, LOW, absent) is OUTPATIENT. Location rules are site-specific
# (their codes differ per hospital), so none is on by default: see the README.
DEFAULT_RULES: tuple[PriorityRule, ...] = (
    PriorityRule(
        attribute=_DEFAULT_KEYWORD,
        values=("STAT",),
        priority_class=PriorityClass.URGENT,
    ),
    PriorityRule(
        attribute=_DEFAULT_KEYWORD,
        values=("HIGH",),
        priority_class=PriorityClass.INPATIENT,
    ),
)


class PriorityRules(RootModel[tuple[PriorityRule, ...]]):
    """Ordered rules: the first that applies wins; none applies -> OUTPATIENT.

    The settings' ``priority_rules`` list is this object (no conversion): the service's
    intake and the scheduler classify with it directly."""

    model_config = ConfigDict(frozen=True)

    root: tuple[PriorityRule, ...] = DEFAULT_RULES

    def __iter__(self) -> Iterator[PriorityRule]:  # type: ignore[override]
        return iter(self.root)

    def __getitem__(self, index: int) -> PriorityRule:
        return self.root[index]

    @property
    def default(self) -> PriorityClass:
        """The class when no rule applies."""
        return DEFAULT_CLASS

    @property
    def keywords(self) -> tuple[str, ...]:
        """The DICOM keywords the rules read (what callers need to collect)."""
        return tuple(dict.fromkeys(rule.attribute for rule in self.root))

    def classify(self, attributes: Mapping[str, str]) -> PriorityClass:
        for index, rule in enumerate(self.root):
            if rule.applies(attributes):
                logger.debug(
                    "priority rule %d (%s) -> %s", index, rule.attribute, rule.priority_class
                )
                return rule.priority_class
        return DEFAULT_CLASS


__all__ = [
    "DEFAULT_CLASS",
    "DEFAULT_RULES",
    "PriorityClass",
    "PriorityRule",
    "PriorityRules",
    "check_dicom_keyword",
]

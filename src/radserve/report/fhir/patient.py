"""The FHIR Patient of a report: whose identifier, in which system, with which names.

**Identifier system.** A DICOM Patient ID means something only together with its
issuer. Sent without ``system``, a FHIR server's conditional create
(``identifier=<value>``) matches any patient with that value — possibly another
hospital's. The system comes, in this order, from

1. ``fhir.issuer_systems``: the operator's map of Issuer of Patient ID -> system URI;
2. the Issuer of Patient ID Qualifiers Sequence: Universal Entity ID of type ISO
   (``urn:oid:``), UUID (``urn:uuid:``) or URI (as is);
3. the Issuer of Patient ID itself when it is an OID (``urn:oid:``) or an absolute URI;
4. ``fhir.patient_identifier_system`` — only when the source names **no** issuer (an
   unknown issuer is another ID space, never folded into the default).

Otherwise there is no system, and radserve says so (a warning in the log, the issuer as
``assigner.display``) instead of inventing one; such a Patient is created without
``ifNoneExist`` (a duplicate Patient can be merged later; a Patient matched to another
issuer's cannot be told apart).

**Names.** DICOM PN has up to three component groups: alphabetic, ideographic and
phonetic. Each becomes one HumanName (``use`` official) with family, given, prefix and
suffix; when there is more than one group, each carries the ISO 21090 representation
extension (``ABC``, ``IDE``, ``SYL``), as JP Core does. ``text`` lists the parts in the
order the name is written: family name first for ideographic and phonetic groups and
for any group in East Asian script (``山田 太郎``, ``홍 길동``), given name first otherwise
(``Tarou Yamada``); parts are separated by one space.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

JSON = dict[str, Any]

REPRESENTATION = "http://hl7.org/fhir/StructureDefinition/iso21090-EN-representation"
_GROUPS = ("ABC", "IDE", "SYL")  # alphabetic, ideographic, phonetic (syllabic)
V2_0203 = "http://terminology.hl7.org/CodeSystem/v2-0203"
_GENDER = {"M": "male", "F": "female", "O": "other"}
_OID = re.compile(r"^[0-2](\.(0|[1-9][0-9]*))+$")
_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:\S+$")
_UUID = re.compile(r"^[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}$")

logger = logging.getLogger(__name__)


class PatientLike(Protocol):
    """What the writers need of :class:`radserve.ingest.PatientInfo`."""

    patient_name: str
    patient_id: str
    patient_birth_date: str
    patient_sex: str
    issuer_of_patient_id: str
    issuer_universal_entity_id: str
    issuer_universal_entity_id_type: str


@dataclass(frozen=True)
class IdentifierSystems:
    """Where a Patient ID's FHIR ``system`` comes from (see the module docstring)."""

    default: str | None = None
    by_issuer: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_settings(cls, fhir: Any) -> IdentifierSystems:
        """From :class:`radserve.config.FhirSettings`."""
        return cls(fhir.patient_identifier_system, dict(fhir.issuer_systems))

    def system_for(self, patient: PatientLike) -> str | None:
        issuer = (getattr(patient, "issuer_of_patient_id", "") or "").strip()
        if issuer and issuer in self.by_issuer:
            return self.by_issuer[issuer]
        universal = _universal_system(
            (getattr(patient, "issuer_universal_entity_id", "") or "").strip(),
            (getattr(patient, "issuer_universal_entity_id_type", "") or "").strip().upper(),
        )
        if universal:
            return universal
        if issuer:
            if _OID.match(issuer):
                return f"urn:oid:{issuer}"
            if _URI.match(issuer) and not issuer.lower().startswith("urn:oid:"):
                return issuer
            if issuer.lower().startswith("urn:oid:") and _OID.match(issuer[8:]):
                return f"urn:oid:{issuer[8:]}"
            return None
        return self.default


def _universal_system(value: str, kind: str) -> str | None:
    if not value:
        return None
    if kind == "ISO" and _OID.match(value):
        return f"urn:oid:{value}"
    if kind == "UUID" and _UUID.match(value):
        return f"urn:uuid:{value.lower()}"
    if kind in ("URI", "URL") and _URI.match(value):
        return value
    return None


def patient_identifier(patient: PatientLike, systems: IdentifierSystems) -> JSON | None:
    """Patient.identifier for the Patient ID, or None without one."""
    if not patient.patient_id:
        return None
    identifier: JSON = {
        "use": "usual",
        "type": {"coding": [{"system": V2_0203, "code": "MR", "display": "Medical record number"}]},
    }
    system = systems.system_for(patient)
    issuer = (getattr(patient, "issuer_of_patient_id", "") or "").strip()
    if system:
        identifier["system"] = system
    else:
        logger.warning(
            "the Patient ID has no FHIR identifier system (%s): Patient sent without "
            "system and without conditional create",
            "its Issuer of Patient ID is not in fhir.issuer_systems and is no OID or URI"
            if issuer
            else "no Issuer of Patient ID and no fhir.patient_identifier_system",
        )
        if issuer:
            identifier["assigner"] = {"display": issuer}
    identifier["value"] = patient.patient_id
    return identifier


def human_names(patient_name: str) -> list[JSON]:
    """HumanNames of a DICOM PN in text form (``groups joined by '='``)."""
    groups = patient_name.split("=")[:3]
    names = []
    for index, group in enumerate(groups):
        name = _human_name(group, east_asian=index > 0 or _east_asian(group))
        if name is None:
            continue
        if len([g for g in groups if g.strip("^ ")]) > 1 or index > 0:
            name["extension"] = [{"url": REPRESENTATION, "valueCode": _GROUPS[index]}]
        names.append(name)
    return names


def _east_asian(text: str) -> bool:
    return any(unicodedata.east_asian_width(c) in ("W", "F", "H") for c in text if c != "^")


def _human_name(group: str, *, east_asian: bool) -> JSON | None:
    """One PN component group (family^given^middle^prefix^suffix) as a HumanName."""
    parts = [p.strip() for p in group.split("^")] + [""] * 5
    family, given, middle, prefix, suffix = parts[:5]
    if not any((family, given, middle, prefix, suffix)):
        return None
    order = (
        (prefix, family, given, middle, suffix)
        if east_asian
        else (prefix, given, middle, family, suffix)
    )
    name: JSON = {"use": "official", "text": " ".join(p for p in order if p)}
    if family:
        name["family"] = family
    if given_names := [g for g in (given, middle) if g]:
        name["given"] = given_names
    if prefix:
        name["prefix"] = [prefix]
    if suffix:
        name["suffix"] = [suffix]
    return name


def gender(patient: PatientLike) -> str:
    return _GENDER.get(patient.patient_sex.strip().upper(), "unknown")


def birth_date(patient: PatientLike) -> str | None:
    """DICOM DA (YYYYMMDD) as a FHIR date; anything else is left out."""
    try:
        return dt.datetime.strptime(patient.patient_birth_date.strip(), "%Y%m%d").date().isoformat()
    except ValueError:
        return None

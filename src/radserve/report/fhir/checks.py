"""Rules fhir.resources does not enforce: required value sets, references, codings.

fhir.resources (R4B) checks types and cardinality only; ``status="bogus"`` passes. These
checks cover what radserve emits: status and gender value sets, bundle/request shape,
that every ``urn:uuid:`` reference resolves inside the bundle, codings with system and
code, UCUM quantities, and Observations that carry a value or members. Problems name the
resource type and entry index, never a value (values may be patient data).
"""

from __future__ import annotations

import math
import re
from typing import Any

STATUS = {
    "Observation": {
        "registered", "preliminary", "final", "amended", "corrected", "cancelled",
        "entered-in-error", "unknown",
    },
    "DiagnosticReport": {
        "registered", "partial", "preliminary", "final", "amended", "corrected", "appended",
        "cancelled", "entered-in-error", "unknown",
    },
    "ImagingStudy": {"registered", "available", "cancelled", "entered-in-error", "unknown"},
    "Communication": {
        "preparation", "in-progress", "not-done", "on-hold", "stopped", "completed",
        "entered-in-error", "unknown",
    },
    "Flag": {"active", "inactive", "entered-in-error"},
}  # fmt: skip
PRIORITIES = {"routine", "urgent", "asap", "stat"}
BUNDLE_TYPES = {"transaction", "collection", "batch", "document", "message", "searchset"}
METHODS = {"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH"}
GENDERS = {"male", "female", "other", "unknown"}
COMPARATORS = ("<", "<=", ">=", ">")
REQUIRED = {
    "Observation": ("status", "code", "subject"),
    "DiagnosticReport": ("status", "code", "subject"),
    "ImagingStudy": ("status", "subject"),
    "Device": (),
    "Patient": (),
    "Communication": ("status",),
    "Flag": ("status", "code", "subject"),
}
_OID = re.compile(r"^urn:oid:[0-2](\.(0|[1-9][0-9]*))+$")
_UCUM = "http://unitsofmeasure.org"


def check_bundle(bundle: dict[str, Any]) -> list[str]:
    """Problems of a Bundle as JSON; empty when it passes."""
    problems: list[str] = []
    if bundle.get("resourceType") != "Bundle":
        return ["not a Bundle"]
    kind = bundle.get("type")
    if kind not in BUNDLE_TYPES:
        problems.append(f"Bundle.type must be one of {sorted(BUNDLE_TYPES)}")
    entries = bundle.get("entry", [])
    urls = [e.get("fullUrl") for e in entries]
    if len(set(urls)) != len(urls):
        problems.append("Bundle.entry.fullUrl values are not unique")
    known = {u for u in urls if u}
    for i, entry in enumerate(entries):
        resource = entry.get("resource") or {}
        where = f"entry[{i}] {resource.get('resourceType', '?')}"
        problems += [f"{where}: {p}" for p in _check_resource(resource)]
        problems += [f"{where}: {p}" for p in _check_request(entry, kind)]
        for ref in _references(resource):
            if ref.startswith("urn:uuid:") and ref not in known:
                problems.append(f"{where}: reference to an entry not in the bundle")
    return problems


def _check_resource(resource: dict[str, Any]) -> list[str]:
    kind = resource.get("resourceType")
    if kind not in REQUIRED:
        return [f"unexpected resource type {kind!r}"]
    problems = [f"{field} is required" for field in REQUIRED[kind] if not resource.get(field)]
    status = resource.get("status")
    if kind in STATUS and status is not None and status not in STATUS[kind]:
        problems.append(f"status must be one of {sorted(STATUS[kind])}")
    if kind == "Communication" and resource.get("priority") not in (None, *PRIORITIES):
        problems.append(f"priority must be one of {sorted(PRIORITIES)}")
    if kind == "Patient" and resource.get("gender") not in (None, *GENDERS):
        problems.append(f"gender must be one of {sorted(GENDERS)}")
    if kind == "Observation" and not (
        any(k.startswith("value") for k in resource)
        or resource.get("hasMember")
        or resource.get("dataAbsentReason")
    ):
        problems.append("an Observation needs a value, members or a dataAbsentReason")
    if (
        kind == "Observation"
        and resource.get("dataAbsentReason")
        and any(k.startswith("value") for k in resource)
    ):
        problems.append("dataAbsentReason only where there is no value (obs-6)")
    for identifier in resource.get("identifier", []):
        value = identifier.get("value", "")
        if identifier.get("system") == "urn:dicom:uid" and not _OID.match(value):
            problems.append("a urn:dicom:uid identifier must be urn:oid:<DICOM UID>")
    problems += _check_values(resource)
    return problems


def _check_request(entry: dict[str, Any], kind: str | None) -> list[str]:
    request = entry.get("request")
    if kind in ("transaction", "batch"):
        if not request or request.get("method") not in METHODS or not request.get("url"):
            return ["a transaction entry needs request.method and request.url"]
    elif request is not None:
        return [f"a {kind} bundle must not carry entry.request"]
    return []


def _check_values(node: Any) -> list[str]:
    """Codings need system and code; UCUM quantities need a code and a finite value."""
    problems: list[str] = []
    if isinstance(node, dict):
        if "coding" in node:
            for c in node["coding"]:
                if not c.get("system") or not c.get("code"):
                    problems.append("a coding needs system and code")
        if "value" in node and "unit" in node:
            value = node["value"]
            if not isinstance(value, int | float) or not math.isfinite(value):
                problems.append("a quantity needs a finite numeric value")
            if node.get("system") == _UCUM and not node.get("code"):
                problems.append("a UCUM quantity needs a code")
            if node.get("comparator") not in (None, *COMPARATORS):
                problems.append(f"a quantity comparator must be one of {COMPARATORS}")
        for child in node.values():
            problems += _check_values(child)
    elif isinstance(node, list):
        for child in node:
            problems += _check_values(child)
    return problems


def _references(node: Any) -> list[str]:
    if isinstance(node, dict):
        refs = [node["reference"]] if isinstance(node.get("reference"), str) else []
        return refs + [r for child in node.values() for r in _references(child)]
    if isinstance(node, list):
        return [r for child in node for r in _references(child)]
    return []

"""A critical finding as FHIR R4: a Communication (category ``alert``, priority ``stat``)
and, optionally, a Flag, sent in a small transaction Bundle.

The Communication references the Patient, ImagingStudy, the finding's Observation and
the model's Device that :func:`~radserve.report.fhir.build_fhir_bundle` builds for the
same report. The critical push goes *ahead* of that Bundle's delivery, so it carries
those resources itself — exactly the entries the Communication references, and what they
reference in turn (the Observation's members, the ImagingStudy's Patient), built by the
same :class:`~radserve.report.fhir.bundle.ReportResources` as the job's Bundle (not copied
from it: the push does not wait for the whole report to be built and validated):
conditional creates on their identifiers, so the job's Bundle sent later
finds them and creates nothing twice. The DiagnosticReport is referenced by its
identifier only (a logical reference): carrying it would create it without its other
results, and the job's Bundle, finding one, would not create the complete one. The
Communication and Flag carry the notice id as identifier (``ifNoneExist``): a re-sent
push is one Communication. A report with many findings thus gives small Bundles, one
per critical finding, not a copy of the whole report each.

The report's caveats (``caveats``: the warnings that bear on trusting the finding, the
study outside the models' input domain or not checkable, lossy compressed images; as the
webhook and syslog notices carry them, :func:`radserve.critical.push.caveats_of`) go with
the finding: one ``Communication.payload`` ``contentString`` each after the finding's own
text, and in the text of the finding's concept (``Communication.reasonCode``,
``Flag.code``), so a receiver that shows only the Flag or the reason still shows them.
Before, the FHIR push carried none: a FHIR receiver paged a finding of a study outside
the models' domain with nothing to say so, while the webhook's notice (since session 36)
said it.

The Bundle names the patient (Patient.identifier, name, birth date): it is for a clinical
receiver; radserve's logs never carry it.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from radserve.errors import ReportError
from radserve.report.dicom import common
from radserve.report.fhir import resources as r
from radserve.report.fhir.bundle import ReportResources, validate_bundle
from radserve.report.wording import site_text

COMMUNICATION_CATEGORY = "http://terminology.hl7.org/CodeSystem/communication-category"
FLAG_CATEGORY = "http://terminology.hl7.org/CodeSystem/flag-category"
_NAMESPACE = uuid.UUID("5a0f3c4e-9b1d-4f6a-8e2c-7d3b1a9e4c20")


def critical_bundle(
    resources: ReportResources,
    *,
    finding_id: int,
    notice_id: str,
    rule: str,
    sent: dt.datetime,
    flag: bool = False,
    caveats: Sequence[Mapping[str, str]] = (),
) -> dict[str, Any]:
    """The finding's Communication (and Flag) with the Patient, ImagingStudy, Device and
    Observations it references, built from ``resources`` (the same definition as the
    report's Bundle) as a transaction Bundle; validated like every Bundle radserve sends.
    ``caveats``: the notice's ``{code, message}`` caveats (module docstring).

    Raises:
        ReportError: the finding is not in the report, or the Bundle breaks a FHIR rule.
    """
    report = resources.report
    finding = next((f for f in report.findings if f.finding_id == finding_id), None)
    if finding is None:
        raise ReportError(
            f"a critical finding's FHIR push needs finding {finding_id} in its report"
        )
    observations = resources.finding(finding)
    device_entry = resources.devices[(finding.model, finding.model_version)]
    patient, study = resources.subject.ref, resources.study.ref
    diagnostic = resources.diagnostic_report_reference()
    observation, device = observations[0].ref, device_entry.ref
    where = site_text(finding, common.organ_concepts(report))
    least = "at least " if finding.coverage == "partial" else ""
    text = (
        f"Critical finding: {common.lesion_name(finding_id)} ({finding.concept.meaning}{where}),"
        f" {least}{finding.longest_diameter_mm:.1f} mm, {finding.volume_ml:.2f} ml; rule met:"
        f" {rule}. AI result by radserve; not verified by a radiologist."
    )
    warned = [caveat_text(c) for c in caveats]
    concept = {"coding": [r.coding(finding.concept)], "text": " ".join([text, *warned])}
    when = sent.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")
    identifier = {"system": r.URI, "value": f"urn:uuid:{notice_id}"}
    communication: dict[str, Any] = {
        "resourceType": "Communication",
        "id": str(uuid.uuid5(_NAMESPACE, f"{notice_id}/communication")),
        "identifier": [identifier],
        "status": "completed",
        "category": [
            {"coding": [{"system": COMMUNICATION_CATEGORY, "code": "alert", "display": "Alert"}]}
        ],
        "priority": "stat",
        "subject": patient,
        "about": [diagnostic, observation, study],
        "sent": when,
        "reasonCode": [concept],
        "payload": [{"contentString": line} for line in (text, *warned)],
        "sender": device,
    }
    entries = [_post(communication)]
    if flag:
        flag_resource: dict[str, Any] = {
            "resourceType": "Flag",
            "id": str(uuid.uuid5(_NAMESPACE, f"{notice_id}/flag")),
            "identifier": [{**identifier, "value": f"urn:uuid:{notice_id}:flag"}],
            "status": "active",
            "category": [
                {"coding": [{"system": FLAG_CATEGORY, "code": "clinical", "display": "Clinical"}]}
            ],
            "code": concept,
            "subject": patient,
            "period": {"start": when},
            "author": device,
        }
        entries.append(_post(flag_resource))
    carried = [resources.subject, device_entry, resources.study, *observations]
    bundle = {
        "resourceType": "Bundle",
        "id": str(uuid.uuid5(_NAMESPACE, f"{notice_id}/bundle")),
        "type": "transaction",
        "timestamp": when,
        "entry": [*map(resources.transaction_entry, carried), *entries],
    }
    validate_bundle(bundle)
    return bundle


def caveat_text(caveat: Mapping[str, str]) -> str:
    """One caveat as a reader sees it: ``Caveat (<code>): <message>`` (report warnings
    hold no patient data)."""
    message = str(caveat.get("message", "")).strip()
    code = str(caveat.get("code", "")).strip()
    return f"Caveat ({code}): {message}" if message else f"Caveat: {code}"


def _post(resource: dict[str, Any]) -> dict[str, Any]:
    identifier = resource["identifier"][0]
    return {
        "fullUrl": f"urn:uuid:{resource['id']}",
        "resource": resource,
        "request": {
            "method": "POST",
            "url": resource["resourceType"],
            "ifNoneExist": r.identifier_search(identifier),
        },
    }


__all__ = ["caveat_text", "critical_bundle"]

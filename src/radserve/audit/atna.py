"""Audit records as DICOM PS3.15 A.5 audit messages (the XML IHE ATNA carries over syslog)
and as FHIR R4 AuditEvent resources.

Each radserve action maps onto a DICOM event (DCM code system, PS3.16 CID 400-403):
job submissions are instances received (110104 DICOM Instances Transferred, Create),
results are instances created (110103, Create), reads of patient data are 110110 Patient
Record / 110103 Instances Accessed (Read), de-identified exports 110106 Export, key and
model changes 110113 Security Alert, console sign-in and sign-out 110114 User
Authentication (Login / Logout), critical notices acknowledged or refused 110106 Export,
alerts dropped at the stop 110100 Application Activity (Application Stop), a retention
pass's removals 110105 DICOM Study Deleted (Delete), the rest 110100
Application Activity. The record's
seq, hash and prev_hash travel as ParticipantObjectDetail of the audit log object, so a
collector can rebuild and check the chain head. Payload values are identifiers, counts
and hashes (never patient data), also carried as details.
"""

from __future__ import annotations

import base64
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from typing import Any

from radserve.audit.chain import AuditRecord, canonical_json
from radserve.audit.events import Action


@dataclass(frozen=True)
class EventCode:
    code: str
    meaning: str
    action: str  # C R U D E
    type_code: tuple[str, str] | None = None  # EventTypeCode (DCM)


_APP = EventCode("110100", "Application Activity", "E")
_SECURITY_CONFIG = ("110129", "Security Configuration")
_APP_START = ("110120", "Application Start")
_APP_STOP = ("110121", "Application Stop")
_SOFTWARE_CONFIG = ("110131", "Software Configuration")
_LOGIN = ("110122", "Login")
_LOGOUT = ("110123", "Logout")
_RECEIVED = EventCode("110104", "DICOM Instances Transferred", "C")
_EXPORT = EventCode("110106", "Export", "R")
_SIGN_IN = EventCode("110114", "User Authentication", "E", _LOGIN)
_SECURITY_ALERT = EventCode("110113", "Security Alert", "E")
# every Action, explicitly (tests/unit/test_audit_atna.py holds this to the enum)
EVENTS: dict[str, EventCode] = {
    Action.JOB_SUBMITTED: _RECEIVED,
    Action.JOB_CACHED: _RECEIVED,
    Action.JOB_JOINED: _RECEIVED,
    Action.JOB_STARTED: _APP,
    Action.JOB_REQUEUED: _APP,
    Action.JOB_SUCCEEDED: EventCode("110103", "DICOM Instances Accessed", "C"),
    Action.JOB_FAILED: _APP,
    Action.JOB_CANCELLED: _APP,
    Action.JOB_REPRIORITISED: _APP,
    Action.JOB_DEADLINE_RISK: _APP,
    Action.JOB_DEADLINE_RISK_CLEARED: _APP,
    Action.KEY_CREATED: EventCode("110113", "Security Alert", "E", _SECURITY_CONFIG),
    Action.KEY_REVOKED: EventCode("110113", "Security Alert", "E", _SECURITY_CONFIG),
    Action.CONFIG_LOADED: EventCode("110100", "Application Activity", "E", _APP_START),
    Action.MODEL_CHANGED: EventCode("110113", "Security Alert", "E", _SOFTWARE_CONFIG),
    Action.MODEL_DRIFT: _APP,
    Action.OUTBOX_RETRIED: _APP,
    # a critical notice carries the study's identifiers out of radserve to a receiver
    Action.CRITICAL_QUEUED: _APP,
    Action.CRITICAL_ACKNOWLEDGED: _EXPORT,
    Action.CRITICAL_FAILED: _EXPORT,
    Action.GATEWAY_OVERSIZE: _SECURITY_ALERT,
    Action.PHI_READ: EventCode("110110", "Patient Record", "R"),
    Action.EXPORT_DEIDENTIFIED: _EXPORT,
    Action.CONSOLE_SIGNIN: _SIGN_IN,
    Action.CONSOLE_SIGNIN_FAILED: _SIGN_IN,
    Action.CONSOLE_SIGNIN_LOCKED: _SIGN_IN,
    Action.CONSOLE_SIGNOUT: EventCode("110114", "User Authentication", "E", _LOGOUT),
    Action.RISK_ALERTS_DROPPED: EventCode("110100", "Application Activity", "E", _APP_STOP),
    Action.RETENTION_SWEPT: EventCode("110105", "DICOM Study Deleted", "D"),
}  # fmt: skip
# 0 success, 4 minor failure (PS3.15 A.5.3 EventOutcomeIndicator)
_OUTCOME = {
    Action.JOB_FAILED: "4",
    Action.CRITICAL_FAILED: "4",
    Action.GATEWAY_OVERSIZE: "4",
    Action.CONSOLE_SIGNIN_FAILED: "4",
    Action.CONSOLE_SIGNIN_LOCKED: "4",
    Action.RISK_ALERTS_DROPPED: "4",  # alerts lost at the stop
}


def event_code(action: str) -> EventCode:
    return EVENTS.get(action, _APP)


def dicom_audit_message(record: AuditRecord, *, source_id: str) -> bytes:
    """The PS3.15 A.5.1 ``AuditMessage`` XML of ``record`` (UTF-8, no declaration)."""
    event = event_code(record.action)
    root = ET.Element("AuditMessage")
    ident = ET.SubElement(
        root,
        "EventIdentification",
        EventActionCode=event.action,
        EventDateTime=record.ts.isoformat(),
        EventOutcomeIndicator=_OUTCOME.get(record.action, "0"),
    )
    ET.SubElement(
        ident,
        "EventID",
        **{"csd-code": event.code},
        codeSystemName="DCM",
        originalText=event.meaning,
    )
    if event.type_code is not None:
        ET.SubElement(
            ident,
            "EventTypeCode",
            **{"csd-code": event.type_code[0]},
            codeSystemName="DCM",
            originalText=event.type_code[1],
        )
    ET.SubElement(
        ident,
        "EventTypeCode",
        **{"csd-code": record.action},
        codeSystemName="radserve",
        originalText=record.action,
    )
    requestor = record.actor_key_id or "radserve"
    participant = ET.SubElement(
        root,
        "ActiveParticipant",
        UserID=requestor,
        UserIsRequestor="true" if record.actor_key_id else "false",
    )
    if record.client_address:
        participant.set("NetworkAccessPointID", record.client_address)
        participant.set("NetworkAccessPointTypeCode", "2")  # IP address
    if record.actor_key_id:
        participant.set("AlternativeUserID", "api-key")
    source = ET.SubElement(root, "AuditSourceIdentification", AuditSourceID=source_id)
    ET.SubElement(source, "AuditSourceTypeCode", **{"csd-code": "4"}, codeSystemName="DCM",
                  originalText="Application Server Process")  # fmt: skip
    if record.subject:
        subject = ET.SubElement(
            root,
            "ParticipantObjectIdentification",
            ParticipantObjectID=record.subject,
            ParticipantObjectTypeCode="2",  # system object
            ParticipantObjectTypeCodeRole="3",  # report
        )
        ET.SubElement(
            subject,
            "ParticipantObjectIDTypeCode",
            **{"csd-code": "radserve-" + _kind(record)},
            codeSystemName="radserve",
            originalText=_kind(record),
        )
        for name, value in sorted(record.payload.items()):
            _detail(subject, name, value)
    log = ET.SubElement(
        root,
        "ParticipantObjectIdentification",
        ParticipantObjectID=str(record.seq),
        ParticipantObjectTypeCode="2",
        ParticipantObjectTypeCodeRole="13",  # security resource
    )
    ET.SubElement(log, "ParticipantObjectIDTypeCode", **{"csd-code": "radserve-audit-seq"},
                  codeSystemName="radserve", originalText="audit record")  # fmt: skip
    for name, value in (("hash", record.hash), ("prev_hash", record.prev_hash),
                        ("key_id", record.key_id or "")):  # fmt: skip
        _detail(log, name, value)
    return ET.tostring(root, encoding="utf-8", xml_declaration=False)


def _kind(record: AuditRecord) -> str:
    return record.action.split(".", 1)[0]


def _text(value: Any) -> str:
    return value if isinstance(value, str) else canonical_json(value)


def _detail(parent: ET.Element, name: str, value: Any) -> None:
    text = _text(value)
    ET.SubElement(
        parent,
        "ParticipantObjectDetail",
        type=name,
        value=base64.b64encode(text.encode()).decode("ascii"),
    )


def fhir_audit_event(record: AuditRecord, *, source_id: str) -> bytes:
    """The record as a FHIR R4 AuditEvent (JSON), validated by fhir.resources."""
    from fhir.resources.R4B.auditevent import AuditEvent

    event = event_code(record.action)
    agent: dict[str, Any] = {
        "who": {"identifier": _identifier("api-key", record.actor_key_id or "radserve")},
        "requestor": record.actor_key_id is not None,
    }
    if record.client_address:
        agent["network"] = {"address": record.client_address, "type": "2"}
    entities: list[dict[str, Any]] = [
        {
            "what": {"identifier": _identifier("audit-seq", str(record.seq))},
            "detail": [
                {"type": "hash", "valueString": record.hash},
                {"type": "prev_hash", "valueString": record.prev_hash},
            ],
        }
    ]
    if record.subject:
        details = [
            {
                "type": name,
                "valueString": value if isinstance(value, str) else canonical_json(value),
            }
            for name, value in sorted(record.payload.items())
        ]
        entities.append(
            {"what": {"identifier": _identifier(_kind(record), record.subject)}, "detail": details}
        )
    resource = AuditEvent.model_validate(
        {
            "resourceType": "AuditEvent",
            "type": {
                "system": "http://dicom.nema.org/resources/ontology/DCM",
                "code": event.code,
                "display": event.meaning,
            },
            "subtype": [{"system": "urn:radserve:audit-action", "code": record.action}],
            "action": event.action,
            "recorded": record.ts.isoformat(),
            "outcome": _OUTCOME.get(record.action, "0"),
            "agent": [agent],
            "source": {"observer": {"display": source_id}},
            "entity": entities,
        }
    )
    return resource.model_dump_json(exclude_none=True).encode()


def _identifier(kind: str, value: str) -> dict[str, str]:
    return {"system": f"urn:radserve:{kind}", "value": value}


__all__ = ["EVENTS", "EventCode", "dicom_audit_message", "event_code", "fhir_audit_event"]

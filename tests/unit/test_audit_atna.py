"""Every audited action has its own DICOM audit event (PS3.15 A.5) for an ATNA
repository, and each record reads back as that event, in XML and as a FHIR AuditEvent."""

from __future__ import annotations

import datetime as dt
import json
import xml.etree.ElementTree as ET

import pytest

from radserve.audit.atna import EVENTS, dicom_audit_message, fhir_audit_event
from radserve.audit.chain import GENESIS_HASH, AuditRecord
from radserve.audit.events import Action


def record(action: str) -> AuditRecord:
    return AuditRecord(
        seq=7,
        ts=dt.datetime(2026, 12, 2, 18, 0, tzinfo=dt.UTC),
        actor_key_id=None,
        client_address=None,
        action=action,
        subject=None,
        payload={"total": 2},
        prev_hash=GENESIS_HASH,
        hash="ab" * 32,
        key_id="0123456789abcdef",
    )


def test_every_action_has_a_dicom_audit_event_and_nothing_else_does() -> None:
    assert set(EVENTS) == {action.value for action in Action}


@pytest.mark.parametrize("action", list(Action), ids=str)
def test_each_action_reads_back_as_its_event_in_xml_and_fhir(action: Action) -> None:
    event = EVENTS[action]
    root = ET.fromstring(dicom_audit_message(record(action), source_id="radserve-test"))
    ident = root.find("EventIdentification")
    assert ident is not None and ident.get("EventActionCode") == event.action
    assert ident.find("EventID").get("csd-code") == event.code  # type: ignore[union-attr]
    types = [t.get("csd-code") for t in ident.findall("EventTypeCode")]
    assert types == [*([event.type_code[0]] if event.type_code else []), action.value]
    fhir = json.loads(fhir_audit_event(record(action), source_id="radserve-test"))
    assert fhir["type"]["code"] == event.code and fhir["subtype"][0]["code"] == action.value


def test_risk_alerts_dropped_at_the_stop_is_an_application_stop_with_a_minor_failure() -> None:
    xml = dicom_audit_message(record(Action.RISK_ALERTS_DROPPED), source_id="radserve-test")
    ident = ET.fromstring(xml).find("EventIdentification")
    assert ident is not None and ident.get("EventOutcomeIndicator") == "4"
    codes = [(t.get("csd-code"), t.get("originalText")) for t in ident.findall("EventTypeCode")]
    assert ("110121", "Application Stop") in codes

"""Critical-finding receivers other than webhooks: a syslog collector and a FHIR server.

Each takes the bytes the outbox row points at and says what became of them, as a
:class:`~radserve.gateway.scu.SendResult` the outbox settles like any delivery:

- :class:`SyslogReceiver`: the JSON notice in one RFC 5424 message (severity alert,
  MSGID ``RADSERVE-CRITICAL``, the notice id in its structured data so a collector can drop
  a repeat), octet-counted over TLS (RFC 5425) or plain TCP (RFC 6587), through the audit
  exporter's :class:`~radserve.audit.syslog.SyslogClient`. Syslog has no acknowledgement:
  ``sent`` means written in full to a connected stream that the collector had not closed
  or reset when checked right after the write (on a new connection, watched for a moment:
  one that accepts and closes at once takes nothing). A connection the collector closed is
  noticed and replaced before writing. A refused, broken or closed connection is retried.
  Nothing proves that the collector read the message.
- :class:`FhirReceiver`: a transaction Bundle (the job's resources + Communication [+
  Flag], :mod:`radserve.report.fhir.critical`) POSTed with the FHIR delivery's client
  (:class:`~radserve.fhir.delivery.FhirClient`: bearer token, no redirects, answers
  classified with OperationOutcome issue codes); the server's 2xx acknowledges it. A file
  that is not a JSON Bundle, a 4xx other than 408/429, or a 5xx whose OperationOutcome
  refuses the content (``invalid``, ``structure``...) is permanent: it stops, and is
  audited and counted like every receiver's permanent failure.
"""

from __future__ import annotations

import json
import ssl
from dataclasses import dataclass, field
from typing import ClassVar

from radserve.audit.syslog import (
    ALERT,
    FACILITY_LOCAL0,
    FRESH_WATCH_S,
    CollectorClosedError,
    SyslogClient,
    SyslogEndpoint,
    frame,
    rfc5424,
)
from radserve.fhir.delivery import FhirClient, FhirDestination
from radserve.gateway.outbox import utc_now
from radserve.gateway.scu import Outcome, SendResult

MSGID = "RADSERVE-CRITICAL"


@dataclass
class SyslogReceiver:
    """A syslog collector that takes critical-finding notices (see the module docstring)."""

    name: str
    endpoint: SyslogEndpoint
    app_name: str = "radserve"
    facility: int = FACILITY_LOCAL0
    payload: ClassVar[str] = "notice"
    _client: SyslogClient = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._client = SyslogClient(self.endpoint)

    @property
    def destination(self) -> str:
        return f"critical:{self.name}"

    @property
    def attempt_s(self) -> float:
        """The longest one attempt takes: connect, TLS handshake and write, each within
        the endpoint's ``timeout_s``, and a new connection's watch after its write."""
        timeout_s = self.endpoint.timeout_s
        return 3 * timeout_s + min(FRESH_WATCH_S, timeout_s)

    def message(self, body: bytes) -> bytes:
        notice = json.loads(body)
        finding = notice.get("finding") or {}
        structured = {
            "notice": str(notice.get("id", "")),
            "job": str(notice.get("job_id", "")),
            "label": str(finding.get("label", "")),
        }
        return rfc5424(
            body,
            msgid=MSGID,
            ts=utc_now(),
            app_name=self.app_name,
            structured=structured,
            severity=ALERT,
            facility=self.facility,
        )

    def send(self, body: bytes) -> SendResult:
        try:
            message = frame(self.message(body))
        except (ValueError, UnicodeDecodeError):
            return SendResult(Outcome.PERMANENT, "the notice file is not a JSON notice")
        try:
            self._client.send([message])
        except CollectorClosedError:
            where = self.endpoint.describe()
            return SendResult(
                Outcome.RETRY,
                f"the syslog collector {where} closed the connection the notice was written "
                "to: not delivered",
            )
        except (OSError, ssl.SSLError) as exc:
            where = self.endpoint.describe()
            return SendResult(
                Outcome.RETRY, f"cannot reach the syslog collector {where}: {type(exc).__name__}"
            )
        transport = "TLS" if self.endpoint.tls is not None else "TCP"
        return SendResult(
            Outcome.SENT,
            f"written to the {transport} stream, not closed by the collector (syslog: no ack)",
        )

    def close(self) -> None:
        self._client.close()


@dataclass
class FhirReceiver:
    """A FHIR server that takes each critical finding as a Communication (+ Flag)."""

    name: str
    server: FhirDestination
    flag: bool = False
    payload: ClassVar[str] = "fhir"
    _client: FhirClient = field(init=False, repr=False, default_factory=FhirClient)

    @property
    def destination(self) -> str:
        return f"critical:{self.name}"

    @property
    def attempt_s(self) -> float:
        """The longest one attempt takes (the POST's total deadline)."""
        return self.server.timeout_s

    def send(self, body: bytes) -> SendResult:
        """POST the Bundle file's ``body`` (without its Flag unless ``flag``). A file that
        is not a JSON Bundle can never be taken: permanent, as the syslog receiver does."""
        bundle = _bundle(body)
        if bundle is None:
            return SendResult(Outcome.PERMANENT, "the notice file is not a FHIR JSON Bundle")
        if not self.flag:  # the file carries a Flag when any FHIR receiver wants one
            entries = bundle.get("entry") or []
            kept = [e for e in entries if _resource_type(e) != "Flag"]
            if len(kept) != len(entries):
                body = json.dumps({**bundle, "entry": kept}, separators=(",", ":")).encode()
        return self._client.post(self.server, body)

    def close(self) -> None:
        self._client.close()


def _bundle(body: bytes) -> dict[str, object] | None:
    """``body`` as a FHIR Bundle (a JSON object, resourceType Bundle, a list of entries
    that are objects), or None."""
    try:
        bundle = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(bundle, dict) or bundle.get("resourceType") != "Bundle":
        return None
    entries = bundle.get("entry", [])
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        return None
    return bundle


def _resource_type(entry: dict[str, object]) -> object:
    resource = entry.get("resource")
    return resource.get("resourceType") if isinstance(resource, dict) else None


__all__ = ["MSGID", "FhirReceiver", "SyslogReceiver"]

"""FHIR Bundles -> a FHIR server, through the same durable outbox as the DICOM results.

Each job's Bundle (a ``transaction``, see :mod:`radserve.report.fhir.bundle`) is written
as a JSON file beside the job's other results, and one outbox row of kind ``fhir`` is
committed for it, keyed by the Bundle id. :class:`FhirOutbox` POSTs due rows to the
server's base URL (the FHIR ``transaction`` interaction) and records each outcome with
the same back-off and states as the DICOM deliveries (:func:`~radserve.gateway.outbox.settle`):

- 2xx: ``sent``, committed at once, so a delivered Bundle is not sent again;
- 408, 429, 5xx, connection refused or reset, timeout: retried with back-off;
- any other answer (400, 401, 403, 404, 409, 412, 422, a redirect), and a 2xx that is a
  web page (a login page or a proxy's, not a FHIR answer): ``failed_permanent`` with the
  status and the OperationOutcome's issue codes — a person must fix the Bundle, the token
  or the URL, then ``rearm`` the row.

A crash between the server's 2xx and the ``sent`` commit sends that Bundle once more
after the row's lease expires; so may the one Bundle in flight when another sender takes
a batch's rows over (each row is read back before its POST and one no longer this
sender's is left to the other:
:meth:`~radserve.gateway.lease_keeper.LeaseKeeper.still_ours`). The Bundle creates every
resource with ``ifNoneExist`` on its identifier, so a server that implements conditional
create keeps one copy.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx

from radserve import durable
from radserve.gateway.errors import GatewayError
from radserve.gateway.lease_keeper import LeaseKeeper, covering_lease
from radserve.gateway.outbox import (
    AttemptClock,
    DeliveryReport,
    RetryPolicy,
    retry_as_asked,
    settle,
)
from radserve.gateway.scu import Outcome, SendResult
from radserve.http_answer import Answer
from radserve.http_answer import post as post_for_answer
from radserve.http_deadline import deadline_client, total_deadline
from radserve.store.outbox import NewDelivery, OutboxItem, OutboxKind, OutboxStore, Scope

logger = logging.getLogger(__name__)

FHIR_JSON = "application/fhir+json"
BUNDLE_FILE = "fhir-bundle-{id}.json"
_RETRYABLE_STATUS = frozenset({408, 429})
_MAX_ISSUES = 3


@dataclass(frozen=True)
class FhirDestination:
    """A FHIR server: its base URL, an optional bearer token, the request timeout.
    ``url_setting``, ``timeout_setting``: the settings they come from, named in errors
    (a critical receiver's timeout is its own ``timeout_s``, not ``fhir.timeout_s``)."""

    url: str
    name: str = "fhir"
    bearer_token: str | None = field(default=None, repr=False)
    timeout_s: float = 30.0
    url_setting: str = "fhir.url"
    timeout_setting: str = "fhir.timeout_s"


def unusable_url(exc: Exception, whose: str) -> str:
    """The reason for a URL the HTTP client refuses outright (httpx's InvalidURL, or a
    scheme it does not speak): it fails the same way at every attempt. Not the
    exception's text: it quotes the URL, which may carry a password."""
    return f"the HTTP client refuses the URL of {whose} ({type(exc).__name__}): fix it, then rearm"


class BundlePoster(Protocol):
    """What sends one Bundle (:class:`FhirClient`)."""

    def post(self, destination: FhirDestination, body: bytes) -> SendResult: ...


class FhirClient:
    """POSTs a Bundle with httpx and classifies the answer into an outbox outcome: by its
    status line and an error's OperationOutcome, of a body read to 64 KiB at most
    (:mod:`radserve.http_answer`): a huge answer is never held in memory, and a 2xx whose
    body drips is acknowledged (by the attempt's deadline at the latest)."""

    def __init__(self) -> None:
        self._clients: dict[tuple[str, float], httpx.Client] = {}

    def post(self, destination: FhirDestination, body: bytes) -> SendResult:
        headers = {"Content-Type": FHIR_JSON, "Accept": FHIR_JSON}
        if destination.bearer_token:
            headers["Authorization"] = f"Bearer {destination.bearer_token}"
        try:
            with total_deadline(destination.timeout_s):  # not per read: a drip ends too
                answer = post_for_answer(
                    self._client(destination),
                    destination.url,
                    content=body,
                    headers=headers,
                )
        except httpx.TimeoutException:
            return SendResult(
                Outcome.RETRY,
                f"no answer within {destination.timeout_s:g} s ({destination.timeout_setting}, "
                "the attempt's total)",
            )
        except (httpx.InvalidURL, httpx.UnsupportedProtocol) as exc:
            return SendResult(Outcome.PERMANENT, unusable_url(exc, destination.url_setting))
        except httpx.TransportError as exc:
            return SendResult(Outcome.RETRY, f"cannot reach the FHIR server: {type(exc).__name__}")
        return classify(answer, url_setting=destination.url_setting)

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()

    def _client(self, destination: FhirDestination) -> httpx.Client:
        key = (destination.url, destination.timeout_s)
        client = self._clients.get(key)
        if client is None:
            # no redirects: a moved endpoint is a configuration error, not a detour
            client = self._clients[key] = deadline_client(timeout_s=destination.timeout_s)
        return client


def classify(response: Answer, *, url_setting: str = "fhir.url") -> SendResult:
    """An HTTP answer -> sent, retry later, or a permanent failure with its reason.

    The reason holds the status and the OperationOutcome's issue codes, never its
    free-text diagnostics (a server may quote patient data there). An OperationOutcome
    longer than the bounded read (:data:`~radserve.http_answer.ANSWER_BODY_LIMIT`) cannot
    be read: the status alone decides, and the reason says the body was cut."""
    status = response.status_code
    if 200 <= status < 300:
        page = _web_page(response)
        if page:
            # a login page or a proxy's: the Bundle never reached a FHIR server
            return SendResult(
                Outcome.PERMANENT,
                f"HTTP {status} with a web page ({page}), not a FHIR answer: {url_setting} "
                "reaches a login page, a proxy or a web site, not the FHIR server's base "
                "URL; nothing was stored: fix it, then rearm",
                status,
            )
        return SendResult(Outcome.SENT, f"HTTP {status}", status)
    reason = f"HTTP {status} {response.reason_phrase}".strip() + _issues(response)
    reason += response.cut_note()
    if status >= 500 and _content_refused(response):
        # the server read the Bundle and refuses its content (some answer a parse or
        # validation error with a 5xx): the same bytes can never succeed
        return SendResult(Outcome.PERMANENT, reason + "; the server refuses the content", status)
    if status in _RETRYABLE_STATUS or status >= 500:
        return retry_as_asked(response, reason)
    if 300 <= status < 400:
        reason += f"; the FHIR server moved: configure its final URL ({url_setting})"
    return SendResult(Outcome.PERMANENT, reason, status)


def _web_page(response: Answer) -> str:
    """The media type of a 2xx answer that is a web page (HTML), else ``""``. A FHIR
    server answers a transaction with a Bundle (``application/fhir+json``, or JSON or
    XML); an HTML 200 is a single sign-on page, a proxy's or a web server's default page
    in front of a wrong or protected URL. Before, such an answer counted as delivered:
    the row went ``sent`` and nobody learnt that no FHIR server had the report."""
    media = response.headers.get("Content-Type", "").split(";", 1)[0].strip().lower()
    return media if media in ("text/html", "application/xhtml+xml") else ""


# OperationOutcome issue codes that say the request's content is wrong, not the server
_CONTENT_ISSUES = frozenset({"invalid", "structure", "required", "value", "invariant"})
# what an issue's severity, code or details code may be to be quoted: a FHIR code token
# (``error``, ``invalid``, ``MSG_PARAM_INVALID``), never free text or an object
_CODE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:\-]{0,63}")


def _outcome_issues(response: Answer) -> list[dict[str, Any]]:
    """The issues of an error answer's OperationOutcome that are objects; none when the
    body is no OperationOutcome or its ``issue`` is no list. Before, a malformed one
    (``issue`` null, a number or an object; an issue's ``details`` no object, its
    ``coding`` null) raised TypeError here: the answer was retried as an "internal error"
    whatever its status (a 400 for three days), the status named nowhere."""
    try:
        outcome = response.json()
    except ValueError:
        return []
    if not isinstance(outcome, dict) or outcome.get("resourceType") != "OperationOutcome":
        return []
    issues = outcome.get("issue")
    if not isinstance(issues, list):
        return []
    return [issue for issue in issues if isinstance(issue, dict)]


def _code(value: object) -> str | None:
    """``value`` if it is a FHIR code token, else None: a server's free text (it may
    quote patient data) or an object is never quoted."""
    return value if isinstance(value, str) and _CODE.fullmatch(value) else None


def _content_refused(response: Answer) -> bool:
    """Whether an error answer's OperationOutcome has only error issues about the
    request's content (``invalid`` and its sub-codes), so resending cannot help."""
    codes = {
        _code(issue.get("code"))
        for issue in _outcome_issues(response)
        if issue.get("severity") in ("error", "fatal")
    }
    return bool(codes) and codes <= _CONTENT_ISSUES


def _issues(response: Answer) -> str:
    parts = []
    for issue in _outcome_issues(response)[:_MAX_ISSUES]:
        details = issue.get("details")
        coding = details.get("coding") if isinstance(details, dict) else None
        codes = [
            code
            for c in (coding if isinstance(coding, list) else [])
            if isinstance(c, dict) and (code := _code(c.get("code")))
        ]
        detail = f" ({', '.join(codes)})" if codes else ""
        severity = _code(issue.get("severity")) or "?"
        parts.append(f"{severity} {_code(issue.get('code')) or '?'}{detail}")
    return f"; OperationOutcome: {'; '.join(parts)}" if parts else ""


class FhirOutbox:
    """Enqueue Bundles for one FHIR server and deliver them; driven by
    :class:`~radserve.gateway.outbox.LaneWorkers` like the DICOM outbox (one sender for
    the FHIR server among replicas sharing PostgreSQL)."""

    kind = OutboxKind.FHIR

    def __init__(
        self,
        store: OutboxStore,
        destination: FhirDestination,
        poster: BundlePoster | None = None,
        *,
        policy: RetryPolicy | None = None,
        batch_size: int = 20,
        lease: dt.timedelta = dt.timedelta(minutes=15),
    ) -> None:
        self.store = store
        self.destination = destination
        self.poster = poster or FhirClient()
        self.policy = policy or RetryPolicy()
        self.batch_size = batch_size
        # covers one POST at least, renewed as a batch goes out (radserve.gateway.lease_keeper)
        self.lease = covering_lease(lease, destination.timeout_s)

    def enqueue(
        self,
        bundle: Mapping[str, Any],
        *,
        folder: Path,
        job_id: str | None = None,
        study_instance_uid: str = "",
        now: dt.datetime | None = None,
        held_for: str | None = None,
    ) -> OutboxItem:
        """Write ``bundle`` durably into ``folder`` and queue it; committed on return.

        The same Bundle (same id) queued again returns the existing row: a Bundle is
        delivered once however often it is enqueued."""
        bundle_id = str(bundle.get("id") or "")
        if not bundle_id or bundle.get("resourceType") != "Bundle":
            raise GatewayError("only a FHIR Bundle with an id can be queued for a FHIR server")
        path = _write_durably(Path(folder) / BUNDLE_FILE.format(id=bundle_id), bundle)
        delivery = NewDelivery(
            destination=self.destination.name,
            path=str(path.absolute()),
            sop_class_uid="",
            sop_instance_uid=bundle_id,
            study_instance_uid=study_instance_uid,
            transfer_syntax_uid="",
            job_id=job_id,
            kind=OutboxKind.FHIR,
            held_for=held_for,
        )
        (item,) = self.store.add([delivery], now=now or self.store.now())
        logger.info("outbox: FHIR bundle %s queued for %s", bundle_id, self.destination.name)
        return item

    def deliver_pending(
        self, now: dt.datetime | None = None, scope: Scope | None = None
    ) -> DeliveryReport:
        """POST every Bundle due at ``now`` (of ``scope``'s destinations, if given); each
        ends sent, rescheduled or failed. ``now``: the database's time (default: the
        store's clock)."""
        now = now or self.store.now()
        claimed = self.store.claim_due(
            now, limit=self.batch_size, lease=self.lease, kind=OutboxKind.FHIR, scope=scope
        )
        tally = {Outcome.SENT: 0, Outcome.RETRY: 0, Outcome.PERMANENT: 0}
        clock = AttemptClock(now)  # each outcome at its POST's end (a 30 s timeout)
        lease = LeaseKeeper(  # the batch's lease kept ahead of its POSTs
            self.store, claimed, lease=self.lease, attempt_s=self.destination.timeout_s, now=now
        )
        taken = 0
        for item in claimed:
            # its row read back: one another sender took over meanwhile is left to it
            if not lease.still_ours(item):
                taken += 1
                continue
            result = self._send(item)
            tally[settle(self.store, self.policy, item, result, clock())] += 1
        report = DeliveryReport(
            claimed=len(claimed),
            sent=tally[Outcome.SENT],
            retried=tally[Outcome.RETRY],
            failed=tally[Outcome.PERMANENT],
            taken_over=taken,
        )
        if claimed:
            logger.info("outbox (FHIR): %s", report)
        return report

    def next_due(self, scope: Scope | None = None) -> dt.datetime | None:
        return self.store.next_due(OutboxKind.FHIR, scope)

    def close(self) -> None:
        close = getattr(self.poster, "close", None)
        if close is not None:
            close()

    def _send(self, item: OutboxItem) -> SendResult:
        if item.destination != self.destination.name:
            return SendResult(
                Outcome.PERMANENT, f"FHIR destination {item.destination!r} is no longer configured"
            )
        try:
            body = Path(item.path).read_bytes()
        except OSError:
            return SendResult(Outcome.PERMANENT, f"bundle file {item.path} is gone")
        try:
            return self.poster.post(self.destination, body)
        except Exception as exc:  # the poster's bug must not strand the row in "sending"
            logger.exception("outbox: posting FHIR bundle %s failed", item.sop_instance_uid)
            return SendResult(Outcome.RETRY, f"internal error: {type(exc).__name__}")


def _write_durably(path: Path, bundle: Mapping[str, Any]) -> Path:
    """The Bundle as compact JSON at ``path``, durably (:mod:`radserve.durable`)."""
    return durable.write_json(path, bundle, ensure_ascii=False, separators=(",", ":"))


__all__ = [
    "BundlePoster",
    "FhirClient",
    "FhirDestination",
    "FhirOutbox",
    "classify",
    "unusable_url",
]

"""Critical-finding notices -> receivers (webhook here; syslog and FHIR in
:mod:`radserve.critical.receivers`), through the durable outbox (kind ``critical``),
re-sent with back-off until acknowledged.

For a webhook, acknowledgement is the receiver's 2xx answer to the JSON POST, judged by
its status line alone: of the body at most 64 KiB is read, to keep the connection
(:mod:`radserve.http_answer`: a huge one never fills memory, one that drips or breaks off
does not undo the 2xx). The row is then ``sent`` and never posted again. 408/429/5xx,
a refused or reset connection and a timeout are retried with back-off and, unlike other
deliveries, never given up by age (the default policy's ``give_up_after_s`` is infinite):
a critical finding is re-sent until a receiver takes it. Any other answer (400, 401, 404,
a redirect) is ``failed_permanent`` with its status: a person must fix the receiver's URL
or token, then rearm the row.

A notice carries the job, the study instance UID, the finding's label, size, volume and
confidence and the rule it met; never a patient name, ID or birth date. Each notice is
written as JSON beside the job's results (temporary file, fsync, rename) and its row is
committed before the POST; ``result_at`` (when the result existed) and the time of the
2xx give the result -> push latency. A receiver's notices go out one after another without
waiting for each other's commits: its answers are recorded by group commit meanwhile
(:class:`_GroupCommit`). Before each POST the notice's row is read back
(:meth:`~radserve.gateway.lease_keeper.LeaseKeeper.still_ours`), so a notice another
sender took over mid-batch is left to it: at most the one in flight then is paged twice,
and one answered whose group commit had not landed (as after a crash).
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import httpx

from radserve import durable
from radserve.batch_worker import BatchWorker
from radserve.critical.receivers import FhirReceiver, SyslogReceiver
from radserve.domain.critical import CriticalRule
from radserve.domain.findings import Finding
from radserve.fhir.delivery import unusable_url
from radserve.gateway.lease_keeper import LeaseKeeper, covering_lease
from radserve.gateway.outbox import (
    DeliveryReport,
    RetryPolicy,
    decide,
    log_settled,
    retry_as_asked,
)
from radserve.gateway.scu import Outcome, SendResult
from radserve.http_answer import Answer
from radserve.http_answer import post as post_for_answer
from radserve.http_deadline import deadline_client, total_deadline
from radserve.store.outbox import NewDelivery, OutboxItem, OutboxKind, OutboxStore, Scope

logger = logging.getLogger(__name__)

NOTICE_FILE = "critical-{id}.json"
FHIR_FILE = "critical-{id}.fhir.json"
_RETRYABLE_STATUS = frozenset({408, 429})
_NOTICE_NAMESPACE = uuid.UUID("8f2b7c1e-5d0a-4e8b-9a37-2c6f1d4e0b91")

# first retry after 2 s, doubling to at most 60 s, never given up
CRITICAL_RETRY = RetryPolicy(first_delay_s=2.0, max_delay_s=60.0, give_up_after_s=float("inf"))
# (row, outcome recorded, the attempt's result, when it was recorded)
SettledCallback = Callable[[OutboxItem, Outcome, SendResult, dt.datetime], None]


@dataclass(frozen=True)
class Receiver:
    """A webhook that takes critical-finding notices (JSON POST). The token goes out as
    ``<auth_header>: <auth_scheme> <token>`` (``Authorization: Bearer …`` by default;
    an empty scheme sends the token alone, e.g. ``X-Api-Key: …``)."""

    name: str
    url: str
    bearer_token: str | None = field(default=None, repr=False)
    timeout_s: float = 10.0
    auth_header: str = "Authorization"
    auth_scheme: str = "Bearer"
    payload: ClassVar[str] = "notice"

    @property
    def destination(self) -> str:
        return f"critical:{self.name}"

    @property
    def attempt_s(self) -> float:
        """The longest one attempt takes (its total deadline)."""
        return self.timeout_s

    def headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.bearer_token:
            value = f"{self.auth_scheme} {self.bearer_token}".strip()
            headers[self.auth_header] = value
        return headers


AnyReceiver = Receiver | SyslogReceiver | FhirReceiver


def notice_id(job_id: str, finding: Finding) -> str:
    """Stable per (job, finding): the same notice enqueued twice is one row."""
    return str(uuid.uuid5(_NOTICE_NAMESPACE, f"{job_id}/{finding.finding_id}/{finding.label}"))


def build_notice(
    job_id: str,
    study_instance_uid: str,
    rule: CriticalRule,
    finding: Finding,
    result_at: dt.datetime,
    caveats: Sequence[dict[str, str]] = (),
) -> dict[str, Any]:
    """One finding's notice; ``caveats``: the report's warnings that bear on whether to
    trust it (:func:`caveats_of`), so whoever is paged sees them with the finding."""
    return {
        "id": notice_id(job_id, finding),
        "type": "radserve.critical_finding",
        "job_id": job_id,
        "study_instance_uid": study_instance_uid,
        "finding": {
            "finding_id": finding.finding_id,
            "label": finding.label,
            "longest_diameter_mm": round(finding.longest_diameter_mm, 1),
            "volume_ml": round(finding.volume_ml, 2),
            "confidence": round(finding.confidence, 3),
            "model": finding.model,
            "model_version": finding.model_version,
        },
        "rule": rule.describe(),
        "result_at": result_at.isoformat(),
        "caveats": list(caveats),
    }


# report warnings that bear on a finding's trust: the study outside what the model was
# made for (or not checkable), or images that were lossy compressed. A probe's 128x128
# phantom, flagged outside the models' input domain, paged 36 critical lung nodules with
# nothing to say so (session 36).
CAVEAT_CODES = frozenset({"outside_input_domain", "input_domain_unchecked", "lossy_input"})


def caveats_of(warnings: Iterable[Any]) -> list[dict[str, str]]:
    """``{code, message}`` of each report warning in :data:`CAVEAT_CODES` (report
    warnings hold no patient data)."""
    return [{"code": w.code, "message": w.message} for w in warnings if w.code in CAVEAT_CODES]


def classify(response: Answer) -> SendResult:
    status = response.status_code
    if 200 <= status < 300:
        return SendResult(Outcome.SENT, f"HTTP {status} (acknowledged)", status)
    reason = f"HTTP {status} {response.reason_phrase}".strip()
    if status in _RETRYABLE_STATUS or status >= 500:
        return retry_as_asked(response, reason)
    return SendResult(Outcome.PERMANENT, reason, status)


class CriticalOutbox:
    """Enqueue notices for every receiver and POST the due ones; driven by
    :class:`~radserve.gateway.outbox.OutboxWorker`."""

    kind = OutboxKind.CRITICAL

    def __init__(
        self,
        store: OutboxStore,
        receivers: Sequence[AnyReceiver],
        *,
        policy: RetryPolicy = CRITICAL_RETRY,
        batch_size: int = 20,
        lease: dt.timedelta = dt.timedelta(minutes=5),
        on_settled: SettledCallback | None = None,
    ) -> None:
        self.store = store
        # told of each attempt's recorded outcome (audit records, metrics)
        self.on_settled = on_settled
        self.receivers = {r.destination: r for r in receivers}
        self.policy = policy
        self.batch_size = batch_size
        # the longest one attempt takes, to any receiver; the lease covers it, and a
        # batch's lease is renewed as its notices go out (radserve.gateway.lease_keeper)
        self.attempt_s = max((r.attempt_s for r in receivers), default=0.0)
        self.lease = covering_lease(lease, self.attempt_s)
        # each attempt ends within its receiver's timeout_s in all (radserve.http_deadline)
        self._client = deadline_client()
        self.pushed: list[tuple[str, dt.datetime]] = []  # (notice id, acknowledged at)

    def enqueue(
        self,
        notice: dict[str, Any],
        *,
        folder: Path,
        job_id: str | None = None,
        now: dt.datetime | None = None,
        held_for: str | None = None,
        fhir_bundle: dict[str, Any] | None = None,
        payloads: Collection[str] = ("notice", "fhir"),
    ) -> list[OutboxItem]:
        """Write ``notice`` (and ``fhir_bundle``, the FHIR receivers' payload) durably into
        ``folder``; one committed row per receiver. Without ``fhir_bundle`` the FHIR
        receivers get no row (the caller records why). ``payloads``: only the receivers
        that take these (``notice``: webhook and syslog; ``fhir``)."""
        return self.enqueue_all(
            [(notice, fhir_bundle)], folder=folder, job_id=job_id, now=now,
            held_for=held_for, payloads=payloads,
        )  # fmt: skip

    def enqueue_all(
        self,
        notices: Sequence[tuple[dict[str, Any], dict[str, Any] | None]],
        *,
        folder: Path,
        job_id: str | None = None,
        now: dt.datetime | None = None,
        held_for: str | None = None,
        payloads: Collection[str] = ("notice", "fhir"),
    ) -> list[OutboxItem]:
        """:meth:`enqueue` for a study's (notice, FHIR Bundle) pairs, committed in one
        transaction: a study with many critical findings waits for one commit, not one
        per finding, before the first is sent."""
        deliveries = []
        for notice, fhir_bundle in notices:
            paths: dict[str, Path] = {}
            if "notice" in payloads:
                notice_path = Path(folder) / NOTICE_FILE.format(id=notice["id"])
                paths["notice"] = _write_durably(notice_path, notice)
            if fhir_bundle is not None and "fhir" in payloads:
                fhir_path = Path(folder) / FHIR_FILE.format(id=notice["id"])
                paths["fhir"] = _write_durably(fhir_path, fhir_bundle)
            deliveries += [
                NewDelivery(
                    destination=destination,
                    path=str(paths[receiver.payload].absolute()),
                    sop_class_uid="",
                    sop_instance_uid=notice["id"],
                    study_instance_uid=notice.get("study_instance_uid", ""),
                    transfer_syntax_uid="",
                    job_id=job_id,
                    kind=OutboxKind.CRITICAL,
                    held_for=held_for,
                )
                for destination, receiver in self.receivers.items()
                if receiver.payload in paths
            ]
        return self.store.add(deliveries, now=now or self.store.now())

    def deliver_pending(
        self, now: dt.datetime | None = None, scope: Scope | None = None
    ) -> DeliveryReport:
        """Send the due notices (of the receivers in ``scope``, if given), one after
        another, each recorded as soon as the database allows while the next goes out
        (:class:`_GroupCommit`); returns once every one sent is recorded."""
        now = now or self.store.now()  # the database's time: rows of every replica
        claimed = self.store.claim_due(
            now, limit=self.batch_size, lease=self.lease, kind=OutboxKind.CRITICAL,
            scope=scope,
        )  # fmt: skip
        if not claimed:
            return DeliveryReport()
        lease = LeaseKeeper(
            self.store, claimed, lease=self.lease, attempt_s=self.attempt_s, now=now
        )
        commits = _GroupCommit(self)
        taken = 0
        try:
            for item in claimed:
                if commits.failed:
                    break  # the rows cannot be recorded: the rest keep their lease
                # its row read back (the commit thread's writes do not hold this read up):
                # one another sender took over meanwhile is left to it, not paged twice
                if not lease.still_ours(item):
                    taken += 1
                    continue
                result = self._send_settled(item)
                commits.put(item, result, lease.clock())  # the claim's clock
        finally:
            tally = commits.close()
        return DeliveryReport(
            claimed=len(claimed),
            sent=tally[Outcome.SENT],
            retried=tally[Outcome.RETRY],
            failed=tally[Outcome.PERMANENT],
            taken_over=taken,
        )

    def _record(
        self, attempts: Sequence[tuple[OutboxItem, SendResult, dt.datetime]]
    ) -> Counter[Outcome]:
        """Record ``attempts`` (row, answer, when answered) in one transaction, then tell
        :attr:`on_settled` of each row it moved; the outcomes recorded.

        An answer whose row did not move (it was no longer ``sending``: its lease ran out
        during a slow answer and another sender took it and settled it) is logged and
        otherwise ignored. Before, it was told all the same: a receiver that answered
        both sends got two ``critical.acknowledged`` records, two ``sent`` counts and two
        latencies for one notice, and a late failure was audited ``critical.failed``
        for a notice already acknowledged."""
        decided = [(item, *decide(self.policy, item, result, at)) for item, result, at in attempts]
        moved = self.store.settle_all([settlement for _, _, settlement in decided])
        outcomes: Counter[Outcome] = Counter()
        for (item, outcome, settlement), (_, result, at), did in zip(
            decided, attempts, moved, strict=True
        ):
            if not did:
                logger.info(
                    "critical push to %s: an answer (%s) for notice %s, settled by another "
                    "sender meanwhile: not recorded again",
                    item.destination,
                    outcome.value,
                    item.sop_instance_uid,
                )
                continue
            log_settled(item, outcome, settlement)
            outcomes[outcome] += 1
            if outcome is Outcome.SENT:
                self.pushed.append((item.sop_instance_uid, at))
            if self.on_settled is not None:
                try:
                    self.on_settled(item, outcome, result, at)
                except Exception:  # bookkeeping only: the row's state is recorded
                    logger.exception("critical push: the settled-push listener failed")
        return outcomes

    def next_due(self, scope: Scope | None = None) -> dt.datetime | None:
        return self.store.next_due(OutboxKind.CRITICAL, scope)

    def close(self) -> None:
        self._client.close()
        for receiver in self.receivers.values():
            if not isinstance(receiver, Receiver):
                receiver.close()

    def _send_settled(self, item: OutboxItem) -> SendResult:
        """:meth:`_send`, whatever it raises turned into an answer the row is settled
        with: an exception escaping here left the row ``sending`` (the probe's
        ``http://[::1/hook``: httpx's InvalidURL at every attempt), with no error on it and
        the outbox status, metrics and ``/readyz`` all fine, and it stopped the rest of the
        batch. Never the exception's text (it may quote the URL and its password)."""
        try:
            return self._send(item)
        except Exception as exc:
            logger.error(
                "critical push to %s raised %s; the notice is retried",
                item.destination,
                type(exc).__name__,
                exc_info=logger.isEnabledFor(logging.DEBUG),
            )
            return SendResult(Outcome.RETRY, f"internal error: {type(exc).__name__}")

    def _send(self, item: OutboxItem) -> SendResult:
        receiver = self.receivers.get(item.destination)
        if receiver is None:
            reason = f"receiver {item.destination!r} is no longer configured"
            return SendResult(Outcome.PERMANENT, reason)
        try:
            body = Path(item.path).read_bytes()
        except OSError:
            return SendResult(Outcome.PERMANENT, f"notice file {item.path} is gone")
        if not isinstance(receiver, Receiver):
            try:
                return receiver.send(body)
            except Exception as exc:  # a sender's bug must not strand the row in "sending"
                logger.exception("critical push to %s failed", item.destination)
                return SendResult(Outcome.RETRY, f"internal error: {type(exc).__name__}")
        try:
            with total_deadline(receiver.timeout_s):
                answer = post_for_answer(  # judged by its status; 64 KiB of body at most
                    self._client,
                    receiver.url,
                    content=body,
                    headers=receiver.headers(),
                    timeout=receiver.timeout_s,
                )
        except httpx.TimeoutException:
            return SendResult(
                Outcome.RETRY, f"no answer within {receiver.timeout_s:g} s (the attempt's total)"
            )
        except (httpx.InvalidURL, httpx.UnsupportedProtocol) as exc:
            # the same URL is refused at every attempt: a person must fix it, then rearm
            return SendResult(
                Outcome.PERMANENT, unusable_url(exc, f"critical receiver {receiver.name!r}")
            )
        except httpx.TransportError as exc:
            return SendResult(Outcome.RETRY, f"cannot reach the receiver: {type(exc).__name__}")
        return classify(answer)


class _GroupCommit:
    """Records one lane's answered notices on a thread of its own while its sender goes on
    to the next notice: what was answered during one commit is recorded by the next, in
    one transaction. A study's notices then go out back to back instead of each waiting
    for its predecessor's commit (an fsync of SQLite's WAL, a round trip to PostgreSQL,
    behind the other writers). Each notice is still settled on its own row with its own
    answer time; a crash before its commit re-sends it once (its lease expires or the
    lane is taken over), as a crash between a send and its commit always did. After a
    failed commit (database away) nothing more is sent; :meth:`close` raises it."""

    def __init__(self, outbox: CriticalOutbox) -> None:
        self._outbox = outbox
        self._error: BaseException | None = None
        self._tally: Counter[Outcome] = Counter()
        name = f"{threading.current_thread().name}-commit"
        self._worker: BatchWorker[tuple[OutboxItem, SendResult, dt.datetime]] = BatchWorker(
            self._record, name=name
        )

    @property
    def failed(self) -> bool:
        return self._error is not None

    def put(self, item: OutboxItem, result: SendResult, at: dt.datetime) -> None:
        self._worker.put((item, result, at))

    def close(self) -> Counter[Outcome]:
        """Wait until everything put is recorded; the outcomes, or the commit's error."""
        self._worker.close()
        if self._error is not None:
            raise self._error
        return self._tally

    def _record(self, batch: list[tuple[OutboxItem, SendResult, dt.datetime]]) -> None:
        if self._error is not None:
            return  # after a failed commit nothing more is recorded (see the class)
        try:
            self._tally.update(self._outbox._record(batch))
        except Exception as exc:  # the rows stay "sending" under their lease
            self._error = exc


def _write_durably(path: Path, notice: dict[str, Any]) -> Path:
    """The notice (or its Bundle) as compact JSON at ``path``, durably."""
    return durable.write_json(path, notice, separators=(",", ":"))


__all__ = [
    "CRITICAL_RETRY",
    "AnyReceiver",
    "CriticalOutbox",
    "Receiver",
    "SettledCallback",
    "build_notice",
    "caveats_of",
    "classify",
    "notice_id",
]

"""Critical findings of each succeeded job -> the configured receivers, at once.

When a job's result exists (before it is recorded, like the FHIR and DICOM rows), every
finding that meets one of ``critical.rules``, its pipeline's or its models' ``critical:``
rules becomes one notice per receiver in the durable outbox (kind ``critical``), released
at once while the run still holds the job's lease (the other deliveries wait until the
result is recorded, which takes the SEG/SR and FHIR Bundle to be prepared first), and
sent by one sender thread per receiver (a slow receiver delays only its own notices).
Webhook and syslog notices are queued first; the FHIR receivers' Bundles follow once the
resources their Communications reference are built (Patient, ImagingStudy, Devices, the
findings' Observations: the job Bundle's own definition, not the whole Bundle). A receiver's
acknowledgement (2xx; for syslog, written to the stream) settles the notice; anything else
is re-sent with back-off until it is (a 4xx other than 408/429 waits for a person to fix
the receiver and re-arm the row). Each queued notice, acknowledgement and permanent
refusal is an audit record; ``radserve_critical_pushes_total`` counts attempts per
receiver and outcome, ``radserve_critical_push_seconds`` the time from the result to its
acknowledgement.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from prometheus_client import Counter, Histogram

from radserve.audit import Action, AuditEvent
from radserve.audit.syslog import SyslogEndpoint
from radserve.config import Settings
from radserve.critical.push import (
    AnyReceiver,
    CriticalOutbox,
    Receiver,
    build_notice,
    caveats_of,
)
from radserve.critical.receivers import FhirReceiver, SyslogReceiver
from radserve.domain.critical import CriticalRule, critical_findings, declared_rules
from radserve.domain.findings import Finding
from radserve.errors import RadserveError
from radserve.fhir.delivery import FhirDestination
from radserve.gateway.outbox import LaneWorkers, RetryPolicy, utc_now
from radserve.gateway.scu import Outcome, SendResult
from radserve.ingest import IngestPolicy
from radserve.pipeline.study import StudyResult
from radserve.report.fhir.bundle import ReportResources
from radserve.report.fhir.critical import critical_bundle
from radserve.report.fhir.patient import IdentifierSystems
from radserve.report.fhir.resources import describes_dicom_study
from radserve.service.job_fhir import report_resources_for
from radserve.service.metrics import Metrics
from radserve.service.outbox import lane_interval_s
from radserve.store import JobRecord, Store
from radserve.store.outbox import OutboxItem, OutboxStore

logger = logging.getLogger(__name__)

# result -> acknowledgement; 1.5 s is the accreditation limit the issue quotes
_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 0.8, 1.0, 1.5, 2.5, 5, 10, 30, 60, 300, 3600)
RulesFor = Callable[[JobRecord], Sequence[CriticalRule]]


def receivers(settings: Settings) -> list[AnyReceiver]:
    """The configured receivers, each as the sender of its kind."""
    out: list[AnyReceiver] = []
    for r in settings.critical.receivers:
        token = r.token.get_secret_value() if r.token else None
        if r.kind == "syslog":  # the settings validator requires its host
            endpoint = SyslogEndpoint.of_target(r)
            out.append(SyslogReceiver(r.name, endpoint, r.app_name, r.facility))
        elif r.kind == "fhir":
            fhir = settings.fhir
            url = r.url or fhir.url
            assert url is not None  # the settings validator requires one of them
            if r.url is None and token is None and fhir.bearer_token is not None:
                token = fhir.bearer_token.get_secret_value()  # fhir.url's own token
            # errors name the receiver's own settings (its timeout_s; its url, or fhir.url)
            index = settings.critical.receivers.index(r)
            own = f"critical.receivers.{index}"
            destination = FhirDestination(
                url, r.name, token, r.timeout_s,
                url_setting=f"{own}.url" if r.url is not None else "fhir.url",
                timeout_setting=f"{own}.timeout_s (receiver {r.name!r})",
            )  # fmt: skip
            out.append(FhirReceiver(r.name, destination, flag=r.flag))
        else:
            assert r.url is not None
            out.append(Receiver(r.name, r.url, token, r.timeout_s, r.auth_header, r.auth_scheme))
    return out


class CriticalDelivery:
    """Queue and push critical-finding notices. Start after the store is open, stop
    before it closes; ``rules_for(job)`` gives the job's pipeline's own rules."""

    def __init__(
        self, settings: Settings, *, store: Store, metrics: Metrics, rules_for: RulesFor
    ) -> None:
        critical = settings.critical
        self.store = store
        self.rules = tuple(critical.rules)
        self.rules_for = rules_for
        self.outbox = CriticalOutbox(
            OutboxStore(store.engine, instance=settings.outbox.instance_id),
            receivers(settings),
            policy=RetryPolicy(
                first_delay_s=critical.retry_first_s,
                max_delay_s=critical.retry_max_s,
                give_up_after_s=float("inf"),
            ),
            lease=dt.timedelta(seconds=settings.outbox.lease_s),
            on_settled=self._settled,
        )
        # one sender per receiver: a slow or unreachable receiver (a FHIR server taking
        # seconds per transaction, a syslog collector timing out) delays only its own
        # notices, never another receiver's; and one failing the notices of receivers
        # no longer configured (they stayed pending for good)
        self.lanes = LaneWorkers(
            self.outbox,
            self.outbox.receivers,
            prefix="radserve-critical",
            interval_s=lane_interval_s(settings),
        )
        self.fhir_receivers = [
            r for r in self.outbox.receivers.values() if isinstance(r, FhirReceiver)
        ]
        self.identifier_systems = IdentifierSystems.from_settings(settings.fhir)
        self.ingest_policy = IngestPolicy.from_settings(settings.ingest)
        reg = metrics.registry
        self.pushes = Counter(
            "radserve_critical_pushes",
            "Critical-finding push attempts per receiver: sent (acknowledged), retry, failed",
            ["receiver", "outcome"],
            registry=reg,
        )
        self.latency = Histogram(
            "radserve_critical_push_seconds",
            "Time from a job's result to the receiver's acknowledgement of its notice",
            ["receiver"],
            buckets=_LATENCY_BUCKETS,
            registry=reg,
        )
        self.queued = Counter(
            "radserve_critical_findings",
            "Critical findings found in results, per finding label",
            ["label"],
            registry=reg,
        )

    def start(self) -> None:
        self.lanes.start()

    def wake(self, payload: str | None = None) -> None:
        """The senders look at once (a notice was queued or a row re-armed); only the
        receivers taking ``payload`` (``notice`` or ``fhir``), if given."""
        if payload is None:
            self.lanes.wake()
        else:
            self.lanes.wake(lambda name: self.outbox.receivers[name].payload == payload)

    def stop(self) -> None:
        self.lanes.stop()
        self.outbox.close()

    def on_result(self, job: JobRecord, result: StudyResult) -> None:
        """Queue a notice per critical finding and receiver and push it at once.

        Not held until the result is recorded (that waits for the SEG/SR, the FHIR
        Bundle and the other rows to be prepared: seconds): a notice is released as soon
        as it is queued while this run still holds the job's lease. A run that lost it
        holds them for its result (another replica's run takes them over). A notice's id
        is stable per (job, finding), so a re-run of the job adds no second push.
        Webhook and syslog notices go first; the FHIR receivers' Bundles, which need
        the job's FHIR resources built, follow."""
        result_at = utc_now()
        rules = declared_rules(site=self.rules, pipeline=self.rules_for(job))
        hits = critical_findings(rules, result.report.findings) if rules else []
        if not hits:
            return
        uid = result.report.study.study_instance_uid or ""
        held = self._hold(job)
        caveats = caveats_of(result.report.warnings)
        notices = [
            (rule, f, build_notice(job.id, uid, rule, f, result_at, caveats)) for rule, f in hits
        ]
        # the rows are due in the database's time (the outbox's clock), as every sender's
        rows = self.outbox.enqueue_all(
            [(notice, None) for _, _, notice in notices], folder=result.out_dir,
            job_id=job.id, held_for=held, payloads=("notice",),
        )  # fmt: skip
        self.wake("notice")
        for _, finding, _ in notices:
            self.queued.labels(finding.label).inc()
        queued = self._queued_events(job, notices, rows)
        if self.fhir_receivers:
            resources = self._resources(job, result)
            # the first finding's Bundle is queued (and sent) alone, while the others
            # (~10 ms each to build and validate) are built: then one transaction
            for part in [p for p in (notices[:1], notices[1:]) if p]:
                bundles = [
                    (notice, self._fhir_payload(job, resources, notice, rule, f.finding_id))
                    for rule, f, notice in part
                ]
                rows = self.outbox.enqueue_all(
                    [(n, b) for n, b in bundles if b is not None], folder=result.out_dir,
                    job_id=job.id, held_for=held, payloads=("fhir",),
                )  # fmt: skip
                self.wake("fhir")
                queued += self._queued_events(job, part, rows)
        logger.warning("job %s: %d critical finding(s) queued for push", job.id, len(hits))
        try:  # one transaction for the study's records, not one per notice
            self.store.append_audits(queued)
        except Exception as exc:  # the push goes on; its record is what is missing
            logger.error("critical push: queued records not audited (%s)", type(exc).__name__)

    def _hold(self, job: JobRecord) -> str | None:
        """None (push at once) while this run still holds the job's lease; else hold the
        notices for this run's result, like its other deliveries."""
        if job.lease_owner is None:
            return None
        try:
            current = self.store.get_job(job.id)
        except Exception:  # cannot tell: hold, as the other deliveries do
            return job.lease_owner
        return (
            None
            if current is not None and current.lease_owner == job.lease_owner
            else (job.lease_owner)
        )

    @staticmethod
    def _queued_events(
        job: JobRecord,
        notices: Sequence[tuple[CriticalRule, Finding, dict[str, Any]]],
        rows: Sequence[OutboxItem],
    ) -> list[AuditEvent]:
        by_id = {notice["id"]: (rule, finding) for rule, finding, notice in notices}
        events = []
        for row in rows:
            rule, finding = by_id[row.sop_instance_uid]
            events.append(
                AuditEvent(
                    action=Action.CRITICAL_QUEUED,
                    subject=job.id,
                    payload={
                        "notice_id": row.sop_instance_uid,
                        "receiver": row.destination,
                        "outbox_id": row.id,
                        "finding_id": finding.finding_id,
                        "label": finding.label,
                        "rule": rule.describe(),
                    },
                )
            )
        return events

    def _resources(self, job: JobRecord, result: StudyResult) -> ReportResources | None:
        """What the FHIR receivers' Communications reference — Patient, ImagingStudy,
        Devices, the findings' Observations — built by the job Bundle's own definition from
        what exists now, not the whole Bundle (every Observation, the DiagnosticReport with
        report.json, validated) first. None (logged by code) when the study cannot be read:
        those receivers then get a ``critical.failed`` record per finding. A volume that
        is no DICOM study (a NIfTI upload) has no patient or study to name: None, without
        an error (it is the input's nature, not a failure to read it)."""
        if not describes_dicom_study(result.report):
            logger.info("job %s: no FHIR critical push: its input is not a DICOM study", job.id)
            return None
        try:
            return report_resources_for(
                result.report,
                Path(job.study_path),
                result.out_dir,
                self.identifier_systems,
                policy=self.ingest_policy,
                patient=result.patient,
            )
        except RadserveError as exc:
            logger.error("job %s: no FHIR resources for the critical push (%s)", job.id, exc.code)
            return None

    def _fhir_payload(
        self,
        job: JobRecord,
        resources: ReportResources | None,
        notice: dict[str, Any],
        rule: CriticalRule,
        finding_id: int,
    ) -> dict[str, Any] | None:
        flag = any(r.flag for r in self.fhir_receivers)
        problem = "the job's FHIR resources could not be built"
        if not notice.get("study_instance_uid", True):
            problem = "the input is no DICOM study (a NIfTI volume): no patient or study to name"
        if resources is not None:
            try:
                return critical_bundle(
                    resources,
                    finding_id=finding_id,
                    notice_id=notice["id"],
                    rule=rule.describe(),
                    sent=utc_now(),
                    flag=flag,
                    caveats=notice.get("caveats", ()),
                )
            except RadserveError as exc:
                problem = f"the Communication could not be built ({exc.code})"
        for receiver in self.fhir_receivers:
            self._audit(
                Action.CRITICAL_FAILED,
                job.id,
                {"notice_id": notice["id"], "receiver": receiver.destination, "answer": problem},
            )
        return None

    def _settled(
        self, item: OutboxItem, outcome: Outcome, result: SendResult, at: dt.datetime
    ) -> None:
        receiver = item.destination.removeprefix("critical:")
        label = {Outcome.SENT: "sent", Outcome.RETRY: "retry"}.get(outcome, "failed")
        self.pushes.labels(receiver, label).inc()
        payload = {
            "notice_id": item.sop_instance_uid,
            "receiver": item.destination,
            "outbox_id": item.id,
            "attempts": item.attempts,
            "answer": result.message,
        }
        if outcome is Outcome.SENT:
            seconds = max(0.0, (at - item.created).total_seconds())  # created = result time
            self.latency.labels(receiver).observe(seconds)
            self._audit(
                Action.CRITICAL_ACKNOWLEDGED,
                item.job_id,
                {**payload, "result_to_ack_s": round(seconds, 3)},
            )
        elif outcome is Outcome.PERMANENT:
            self._audit(Action.CRITICAL_FAILED, item.job_id, payload)

    def _audit(self, action: Action, job_id: str | None, payload: dict[str, object]) -> None:
        """Through the store's group commit: the sender thread goes on to the next notice
        instead of waiting for a commit per acknowledgement."""
        event = AuditEvent(action=action, subject=job_id, payload=payload)
        try:
            future = self.store.submit_audit(event)
        except Exception as exc:  # the push goes on; its record is what is missing
            logger.error("critical push: %s not audited (%s)", action.value, type(exc).__name__)
            return

        def _done(done: Future[object]) -> None:
            exc = done.exception()
            if exc is not None:
                logger.error("critical push: %s not audited (%s)", action.value, type(exc).__name__)

        future.add_done_callback(_done)


__all__ = ["CriticalDelivery", "receivers"]

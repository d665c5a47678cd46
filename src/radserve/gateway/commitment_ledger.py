"""Where a storage commitment leaves the outbox's rows (see :mod:`radserve.gateway.commitment`).

A row to a destination with ``storage_commitment`` is not ``sent`` on its C-STORE
success: it waits ``committing`` under the batch's Transaction UID (persisted before
the N-ACTION goes out) until one of these settles it, each taking the row exactly once:

- the report lists it committed: ``sent``;
- the report lists it failed (e.g. Orthanc's 0x0112 for an instance a filter dropped
  after answering C-STORE success), or leaves it out: sent again, with the Failure
  Reason on the row, under the outbox's back-off and give-up;
- no report by the destination's ``commitment_timeout_s``: sent again, likewise;
- the N-ACTION itself fails: sent again, or failed for good when the destination does
  not accept Storage Commitment at all.

The report is matched by its Transaction UID in the database (every transaction asked
is kept with its rows: ``outbox_commitment_requests``), so one that arrives after a
restart still settles its rows. One that arrives after its deadline is honoured too, for
the instances it lists committed (the destination holds them): each counts ``sent``; a
re-send not yet made is cancelled, one already made is named on the row as a duplicate
the destination received (it cannot be unsent); the late report is logged and counted
(:attr:`CommitmentLedger.late_reports`, per destination; ``/metrics``
``radserve_storage_commitment_late_reports_total``). Only a Transaction UID radserve never asked, or
one reported by another peer than the rows' destination, is answered 0x0115 and logged.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, runtime_checkable

from pydicom.uid import generate_uid

from radserve.gateway import commitment
from radserve.gateway.commitment import CommitmentReport
from radserve.gateway.config import Destination
from radserve.gateway.conformance import Status
from radserve.gateway.scu import Outcome, OutgoingFile, SendResult
from radserve.store.outbox import OutboxItem, OutboxState, OutboxStore, Scope

logger = logging.getLogger(__name__)

Record = Callable[[OutboxItem, SendResult, dt.datetime], Outcome]


@runtime_checkable
class CommitmentRequester(Protocol):
    """What sends the N-ACTION (:class:`radserve.gateway.scu.StoreSCU`)."""

    def request_commitment(
        self,
        destination: Destination,
        transaction_uid: str,
        files: Sequence[OutgoingFile],
        on_report: commitment.ReportHandler,
        *,
        wait_for_report: bool = True,
    ) -> SendResult: ...


def _utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class CommitmentLedger:
    """Requests commitments and settles ``committing`` rows; ``record`` settles one row
    as the outbox settles any send (:func:`radserve.gateway.outbox.settle`)."""

    def __init__(
        self,
        store: OutboxStore,
        destinations: Mapping[str, Destination],
        record: Record,
        *,
        clock: Callable[[], dt.datetime] = _utc_now,
    ) -> None:
        self.store = store
        self.destinations = destinations
        self.record = record
        self.clock = clock
        # reports that came after their rows stopped waiting, per destination, since start
        self.late_reports: Counter[str] = Counter()
        self._count_lock = threading.Lock()
        # destinations seen reporting on the N-ACTION's own association / on one of their
        # own (to radserve's SCP), since start: see :meth:`waits_for_report`
        self._reported_here: set[str] = set()
        self._reported_apart: set[str] = set()

    def request(
        self,
        requester: CommitmentRequester,
        destination: Destination,
        stored: Sequence[OutgoingFile],
        now: dt.datetime,
    ) -> list[Outcome]:
        """Rows just stored by ``destination`` wait ``committing``; then the N-ACTION.
        Returns the outcomes of rows settled here (a failed request, a report on the
        same association)."""
        transaction_uid = str(generate_uid(prefix=None))
        deadline = now + dt.timedelta(seconds=destination.commitment_timeout_s)
        self.store.await_commitment(
            [f.key for f in stored], transaction_uid=transaction_uid, now=now, deadline=deadline
        )
        logger.info(
            "outbox: %d instance(s) stored by %s, storage commitment %s requested",
            len(stored),
            destination.name,
            transaction_uid,
        )
        outcomes: list[Outcome] = []

        def on_report(calling: str, report: CommitmentReport) -> tuple[int, str]:
            status, comment, settled = self._apply(calling, report, self._reported_here)
            outcomes.extend(settled)
            return status, comment

        try:
            result = requester.request_commitment(
                destination,
                transaction_uid,
                stored,
                on_report,
                wait_for_report=self.waits_for_report(destination),
            )
        except Exception as exc:  # a requester's bug must not leave rows waiting
            logger.exception("outbox: storage commitment request to %s failed", destination.name)
            result = SendResult(Outcome.RETRY, f"internal error: {exc!r}")
        if result.outcome is not Outcome.SENT:
            why = f"storage commitment request (N-ACTION) to {destination} failed: {result.message}"
            for item in self.store.take_committing(now=now, transaction_uid=transaction_uid):
                outcomes.append(self.record(item, SendResult(result.outcome, why), now))
        return outcomes

    def on_report(self, calling: str, report: CommitmentReport) -> tuple[int, str]:
        """An N-EVENT-REPORT received by radserve's SCP: (status, error comment)."""
        status, comment, _settled = self._apply(calling, report, self._reported_apart)
        return status, comment

    def waits_for_report(self, destination: Destination) -> bool:
        """Whether a request keeps the N-ACTION's association open for a report there:
        not once ``destination`` has been seen reporting on an association of its own
        and never on the N-ACTION's (Orthanc 1.10.1: every batch but the first after a
        start is released at once, not held idle for the wait)."""
        name = destination.name
        return name in self._reported_here or name not in self._reported_apart

    def expire(self, now: dt.datetime, scope: Scope | None = None) -> list[Outcome]:
        """Rows whose commitment report did not come by their deadline: sent again."""
        outcomes = []
        for item in self.store.take_committing(now=now, overdue=True, scope=scope):
            destination = self.destinations.get(item.destination)
            waited = f"{destination.commitment_timeout_s:g} s" if destination else "its deadline"
            why = (
                f"no storage commitment report from {item.destination} within {waited} "
                f"(transaction {item.commitment_uid}): stored but not confirmed, sent again"
            )
            outcomes.append(self.record(item, SendResult(Outcome.RETRY, why), now))
        return outcomes

    def _apply(
        self, calling: str, report: CommitmentReport, seen: set[str]
    ) -> tuple[int, str, list[Outcome]]:
        """Settle ``report``'s rows; the destinations it came from join ``seen`` (where
        they report: :meth:`waits_for_report`)."""
        asked = self.store.requested(report.transaction_uid)
        if not asked:
            logger.warning(
                "storage commitment report from %s for transaction %s: radserve never "
                "asked for it; answered 0x%04X",
                calling,
                report.transaction_uid,
                Status.INVALID_ARGUMENT,
            )
            return Status.INVALID_ARGUMENT, "unknown Transaction UID", []
        titles = {
            self.destinations[r.destination].ae_title
            for r in asked
            if r.destination in self.destinations
        }
        if calling not in titles:
            logger.warning(
                "storage commitment report for transaction %s came from %s, not from the "
                "destination it was asked of (%s): refused",
                report.transaction_uid,
                calling,
                ", ".join(sorted(titles)) or "no longer configured",
            )
            return Status.INVALID_ARGUMENT, "transaction not requested of this AE", []
        seen.update(
            r.destination
            for r in asked
            if r.destination in self.destinations
            and self.destinations[r.destination].ae_title == calling
        )
        now = self.clock()
        outcomes = []
        taken = self.store.take_committing(now=now, transaction_uid=report.transaction_uid)
        for item in taken:
            outcomes.append(self.record(item, _result_for(item, report), now))
        if taken:
            failed = sum(1 for item in taken if item.sop_instance_uid not in report.committed)
            log = logger.warning if failed else logger.info
            log(
                "storage commitment %s from %s: %d committed, %d not (sent again)",
                report.transaction_uid,
                calling,
                len(taken) - failed,
                failed,
            )
        settled = {item.id for item in taken}
        late = [i for i in asked if i.id not in settled and i.state is not OutboxState.SENT]
        if late:
            self._apply_late(calling, report, late, now)
        elif not taken:
            logger.info(
                "storage commitment %s from %s again: its instances are delivered already",
                report.transaction_uid,
                calling,
            )
        return Status.SUCCESS, "", outcomes

    def _apply_late(
        self, calling: str, report: CommitmentReport, rows: list[OutboxItem], now: dt.datetime
    ) -> None:
        """A report for rows no longer awaiting it (their deadline passed first, or an
        earlier report settled them): the destination holds what it lists committed, so
        those rows count as delivered (:meth:`OutboxStore.commit_late`); a re-send not
        yet made is cancelled, one already made is recorded as a duplicate."""
        with self._count_lock:
            self.late_reports.update({item.destination for item in rows})
            count = sum(self.late_reports.values())
        cancelled = duplicates = 0
        for item in rows:
            if item.sop_instance_uid not in report.committed:
                continue
            again = item.state in (OutboxState.SENDING, OutboxState.COMMITTING)
            note = (
                f"committed by {item.destination} in transaction {report.transaction_uid}, "
                "whose report came after the row stopped waiting for it (deadline passed, "
                "or retried by an operator): "
                + (
                    f"the instance had already been sent again (attempt {item.attempts}), "
                    "so the destination received this SOP Instance UID twice"
                    if again
                    else "the re-send was cancelled"
                )
            )
            if self.store.commit_late(
                item.id, transaction_uid=report.transaction_uid, now=now, note=note
            ):
                duplicates += again
                cancelled += not again
        logger.warning(
            "storage commitment %s from %s came after its rows stopped waiting (late report "
            "%d since start): %d instance(s) it names counted delivered, %d re-send(s) "
            "cancelled, %d already sent again (duplicates at the destination); %d left as "
            "they were (not listed committed, or failed by a newer transaction)",
            report.transaction_uid,
            calling,
            count,
            cancelled + duplicates,
            cancelled,
            duplicates,
            len(rows) - cancelled - duplicates,
        )


def _result_for(item: OutboxItem, report: CommitmentReport) -> SendResult:
    uid = item.sop_instance_uid
    if uid in report.failed:
        reason = commitment.failure_text(report.failed[uid])
        return SendResult(
            Outcome.RETRY,
            f"{item.destination} answered C-STORE success but did not commit the instance: "
            f"storage commitment failure reason {reason}",
        )
    if uid in report.committed:
        return SendResult(Outcome.SENT, f"committed by {item.destination}")
    return SendResult(
        Outcome.RETRY,
        f"{item.destination}'s storage commitment report left the instance out",
    )


__all__ = ["CommitmentLedger", "CommitmentRequester"]

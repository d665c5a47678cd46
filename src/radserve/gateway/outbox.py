"""The durable outbox: result files -> DICOM destinations, retried until delivered.

(The FHIR Bundle deliveries share the table, the retry policy, :func:`settle` and the
worker: :mod:`radserve.fhir.delivery`.)

Enqueue writes one row per (result instance, destination) and commits; nothing else
needs to stay up. :meth:`Outbox.deliver_pending` sends what is due (testable with any
``now``); :class:`OutboxWorker` calls it from a background thread, one per destination
(:class:`LaneWorkers`), so a peer that never answers holds only its own deliveries for
its timeouts, never another destination's. Delivery semantics:

- nothing lost: rows live in the database, so a restart resumes where it stopped;
- nothing sent twice in normal operation: a row is marked ``sent`` in its own committed
  transaction right after the peer's success status, before the next file goes out (a
  critical-notice lane records its answers by group commit while the next notice goes
  out, its rows under their lease meanwhile: :mod:`radserve.critical.push`);
- at most one duplicate after a crash between the success status and that commit: the
  row's lease expires and it is sent again; likewise for the one file in flight when
  another sender takes a batch's rows over (this one stalled, or its clock behind):
  each row is read back before its C-STORE and one that is no longer this sender's is
  left to the other (:meth:`radserve.gateway.lease_keeper.LeaseKeeper.still_ours`).
  PACSs treat a repeated SOP Instance UID as the same instance (Orthanc, dcm4chee store
  it once), so the result appears once.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from radserve.gateway.attempt_log import FailedAttemptLog
from radserve.gateway.commitment_ledger import CommitmentLedger, CommitmentRequester
from radserve.gateway.config import Destination
from radserve.gateway.errors import GatewayConfigError, GatewayError
from radserve.gateway.lease_keeper import LeaseKeeper, covering_lease
from radserve.gateway.scu import Outcome, OutgoingFile, ResultCallback, SendResult, StillOurs
from radserve.http_answer import Answer
from radserve.ingest.headers import UnreadableHeaderError, read_header
from radserve.loop_failures import LoopFailures
from radserve.store.lane_lock import LaneHold, LaneLock, lane_lock
from radserve.store.lane_share import LaneShare, lane_share
from radserve.store.outbox import (
    NewDelivery,
    OutboxItem,
    OutboxKind,
    OutboxState,
    OutboxStore,
    Scope,
    Settlement,
)

logger = logging.getLogger(__name__)


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class AttemptClock:
    """When an attempt that began at ``now`` ends: ``now`` plus the whole seconds that
    have passed since (monotonic), so ``now`` may be any time (tests pass a fixed one).

    Outcomes are recorded at this time, not at the claim: a send that waits out a
    timeout (a hung PACS holds each association for ``gateway.acse_timeout_s`` or
    ``dimse_timeout_s``) is rescheduled its back-off after it ended. Before, the back-off
    ran from the claim, so with timeouts longer than the delay every retry was due
    before its attempt had ended and a hung PACS was tried back to back (ten
    associations in 100 s with ``retry_max_s: 5``, each logged "retry at" a past time),
    and a late file of a long batch was recorded as sent when the batch began."""

    def __init__(self, now: dt.datetime) -> None:
        self.now = now
        self._started = time.monotonic()

    def __call__(self) -> dt.datetime:
        return self.now + dt.timedelta(seconds=int(time.monotonic() - self._started))


class Deliverer(Protocol):
    """What :class:`OutboxWorker` drives: the DICOM :class:`Outbox` or the FHIR one."""

    batch_size: int

    def deliver_pending(self, now: dt.datetime | None = None) -> DeliveryReport: ...

    def next_due(self) -> dt.datetime | None: ...


class LanedDeliverer(Protocol):
    """An outbox whose deliveries can be sent per destination (DICOM, critical push)."""

    batch_size: int
    kind: OutboxKind
    store: OutboxStore

    def deliver_pending(
        self, now: dt.datetime | None = None, scope: Scope | None = None
    ) -> DeliveryReport: ...

    def next_due(self, scope: Scope | None = None) -> dt.datetime | None: ...


class Sender(Protocol):
    """What delivers files (:class:`radserve.gateway.scu.StoreSCU`, or a test double)."""

    def send(
        self,
        destination: Destination,
        files: Sequence[OutgoingFile],
        on_result: ResultCallback,
        *,
        still_ours: StillOurs | None = None,
    ) -> None: ...


class RetrySettings(Protocol):
    """A settings section with a back-off (``gateway``, ``fhir``)."""

    retry_first_s: float
    retry_max_s: float
    give_up_after_s: float


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential back-off: 30 s, 1 min, 2 min ... capped at 1 h, for up to 3 days."""

    first_delay_s: float = 30.0
    factor: float = 2.0
    max_delay_s: float = 3600.0
    give_up_after_s: float = 72 * 3600.0
    max_attempts: int | None = None

    @classmethod
    def of(cls, section: RetrySettings) -> RetryPolicy:
        """The back-off a settings section configures."""
        return cls(
            first_delay_s=section.retry_first_s,
            max_delay_s=section.retry_max_s,
            give_up_after_s=section.give_up_after_s,
        )

    def delay(self, attempts: int) -> dt.timedelta:
        """Wait after the ``attempts``-th failed attempt (1-based)."""
        seconds = self.first_delay_s * self.factor ** max(attempts - 1, 0)
        return dt.timedelta(seconds=min(seconds, self.max_delay_s))

    def gives_up(self, item: OutboxItem, now: dt.datetime) -> bool:
        too_old = (now - item.created).total_seconds() >= self.give_up_after_s
        too_many = self.max_attempts is not None and item.attempts >= self.max_attempts
        return too_old or too_many


@dataclass(frozen=True)
class DeliveryReport:
    """What one :meth:`Outbox.deliver_pending` call did."""

    claimed: int = 0
    sent: int = 0
    retried: int = 0
    failed: int = 0
    committing: int = 0  # stored, now awaiting the destination's storage commitment
    taken_over: int = 0  # not sent: another sender claimed them meanwhile and sends them


class Outbox:
    """Enqueue results for destinations and deliver them."""

    kind = OutboxKind.DICOM

    def __init__(
        self,
        store: OutboxStore,
        destinations: Iterable[Destination],
        sender: Sender,
        *,
        policy: RetryPolicy | None = None,
        batch_size: int = 100,
        lease: dt.timedelta = dt.timedelta(minutes=15),
    ) -> None:
        self.store = store
        self.destinations: Mapping[str, Destination] = {d.name: d for d in destinations}
        self.sender = sender
        self.policy = policy or RetryPolicy()
        self.batch_size = batch_size
        # one file's C-STORE at most (StoreSCU.attempt_s; 0 for a sender that does not
        # say): the lease covers it and is renewed as a batch's files are stored
        self.attempt_s = float(getattr(sender, "attempt_s", 0.0))
        self.lease = covering_lease(lease, self.attempt_s)
        committing = [d.name for d in self.destinations.values() if d.storage_commitment]
        if committing and not isinstance(sender, CommitmentRequester):
            raise GatewayConfigError(
                f"destinations {committing} use storage commitment, which this sender "
                "cannot request"
            )
        # settles the rows of destinations with storage commitment
        self.commitments = CommitmentLedger(
            self.store, self.destinations, self._record, clock=self.store.now
        )

    def enqueue(
        self,
        paths: Sequence[Path],
        *,
        destinations: Sequence[str] | None = None,
        job_id: str | None = None,
        now: dt.datetime | None = None,
        held_for: str | None = None,
    ) -> list[OutboxItem]:
        """Queue each DICOM file for each destination (default: all configured).

        Committed on return. Enqueueing an instance already queued for a destination
        returns the existing row. Raises for a file that is not DICOM or an unknown
        destination name (a programming or configuration error, not a delivery one)."""
        names = list(self.destinations) if destinations is None else list(destinations)
        unknown = [name for name in names if name not in self.destinations]
        if unknown:
            raise GatewayConfigError(
                f"unknown destination(s) {unknown}; configured: {sorted(self.destinations)}"
            )
        deliveries = [
            NewDelivery(destination=name, job_id=job_id, held_for=held_for, **_describe(Path(path)))
            for path in paths
            for name in names
        ]
        items = self.store.add(deliveries, now=now or self.store.now())
        logger.info("outbox: %d deliveries queued for %s", len(items), ", ".join(names) or "-")
        return items

    def deliver_pending(
        self, now: dt.datetime | None = None, scope: Scope | None = None
    ) -> DeliveryReport:
        """Send every row due at ``now`` (in ``scope`` only, if given); each ends
        ``sent``, rescheduled or failed. ``now``: the database's time (default: the
        store's clock, :meth:`OutboxStore.now`)."""
        now = now or self.store.now()
        clock = AttemptClock(now)
        tally = {Outcome.SENT: 0, Outcome.RETRY: 0, Outcome.PERMANENT: 0}
        expired = self.commitments.expire(now, scope)
        for outcome in expired:
            tally[outcome] += 1
        claimed = self.store.claim_due(now, limit=self.batch_size, lease=self.lease, scope=scope)
        if not claimed and not expired:
            return DeliveryReport()
        by_destination: dict[str, list[OutboxItem]] = {}
        for item in claimed:
            by_destination.setdefault(item.destination, []).append(item)
        lease = LeaseKeeper(
            self.store, claimed, lease=self.lease, attempt_s=self.attempt_s, now=now
        )
        taken: set[int] = set()
        for name, items in by_destination.items():
            self._deliver(name, items, clock, tally, lease, taken)
        settled = sum(tally.values()) - len(expired)
        report = DeliveryReport(
            claimed=len(claimed),
            sent=tally[Outcome.SENT],
            retried=tally[Outcome.RETRY],
            failed=tally[Outcome.PERMANENT],
            committing=max(len(claimed) - settled - len(taken), 0),
            taken_over=len(taken),
        )
        logger.info("outbox: %s", report)
        return report

    def next_due(self, scope: Scope | None = None) -> dt.datetime | None:
        return self.store.next_due(OutboxKind.DICOM, scope)

    def _deliver(
        self,
        name: str,
        items: list[OutboxItem],
        clock: AttemptClock,
        tally: dict[Outcome, int],
        lease: LeaseKeeper,
        taken: set[int],
    ) -> None:
        rows = {item.id: item for item in items}
        unsettled = set(rows)
        destination = self.destinations.get(name)
        committing = destination is not None and destination.storage_commitment
        stored: list[OutgoingFile] = []
        outgoing: dict[int, OutgoingFile] = {}

        def settle(item_id: int, result: SendResult) -> None:
            if item_id in unsettled:
                unsettled.discard(item_id)
                if committing and result.outcome is Outcome.SENT:
                    stored.append(outgoing[item_id])  # delivered once committed
                else:
                    tally[self._record(rows[item_id], result, clock())] += 1
                lease.keep()  # the next file's C-STORE within the lease

        def still_ours(file: OutgoingFile) -> bool:
            """Before each C-STORE: a row another sender took over is left to it."""
            if lease.still_ours(rows[file.key]):
                return True
            unsettled.discard(file.key)
            taken.add(file.key)
            return False

        if destination is None:
            for item_id in list(unsettled):
                reason = f"destination {name!r} is no longer configured"
                settle(item_id, SendResult(Outcome.PERMANENT, reason))
            return
        files = []
        lease.keep()  # an earlier destination's files may have used the lease up
        for item in items:
            if Path(item.path).is_file():
                files.append(outgoing.setdefault(item.id, _outgoing(item)))
            else:
                settle(item.id, SendResult(Outcome.PERMANENT, f"result file {item.path} is gone"))
        try:
            self.sender.send(
                destination, files, lambda f, r: settle(f.key, r), still_ours=still_ours
            )
        except Exception as exc:  # the sender's bug must not strand rows in "sending"
            logger.exception("outbox: sending to %s failed", name)
            for item_id in list(unsettled):
                settle(item_id, SendResult(Outcome.RETRY, f"internal error: {exc!r}"))
        for item_id in list(unsettled):  # a sender that forgot a file
            settle(item_id, SendResult(Outcome.RETRY, "no result reported for this file"))
        if destination is not None and stored and isinstance(self.sender, CommitmentRequester):
            for outcome in self.commitments.request(self.sender, destination, stored, clock()):
                tally[outcome] += 1

    def _record(self, item: OutboxItem, result: SendResult, now: dt.datetime) -> Outcome:
        return settle(self.store, self.policy, item, result, now)


def settle(
    store: OutboxStore,
    policy: RetryPolicy,
    item: OutboxItem,
    result: SendResult,
    now: dt.datetime,
) -> Outcome:
    """Record one send's outcome on its row: ``sent``, rescheduled with back-off, or
    ``failed_permanent`` (a permanent failure, or retries exhausted). Returns the outcome
    recorded. Shared by every kind of delivery, so they all retry the same way."""
    outcome, settlement = decide(policy, item, result, now)
    store.settle_all([settlement])
    log_settled(item, outcome, settlement)
    return outcome


def decide(
    policy: RetryPolicy, item: OutboxItem, result: SendResult, now: dt.datetime
) -> tuple[Outcome, Settlement]:
    """What :func:`settle` records for ``result`` (a retry past the policy's limits is a
    permanent failure), without recording it: a sender that records several attempts in
    one transaction (:meth:`OutboxStore.settle_all`) decides each the same way."""
    outcome = result.outcome
    attempt = item.attempts  # as claimed: a later claim of the row fences this one out
    if outcome is Outcome.SENT:
        warning = result.message if result.warning else None
        return outcome, Settlement.sent(item.id, now=now, warning=warning, attempt=attempt)
    if outcome is Outcome.RETRY and not policy.gives_up(item, now):
        delay = policy.delay(item.attempts)
        if result.not_before_s is not None:  # the peer's Retry-After, up to the longest wait
            asked = dt.timedelta(seconds=min(result.not_before_s, policy.max_delay_s))
            delay = max(delay, asked)
        due = now + delay
        settlement = Settlement.retry(
            item.id, now=now, due=due, error=result.message, attempt=attempt
        )
        return outcome, settlement
    message = result.message
    if outcome is Outcome.RETRY:
        message = f"gave up after {item.attempts} attempts: {message}"
    return Outcome.PERMANENT, Settlement.failed(item.id, now=now, error=message, attempt=attempt)


def retry_as_asked(response: Answer, reason: str) -> SendResult:
    """A retry of an HTTP answer (408, 429, 5xx), not before the wait the peer asked
    for in ``Retry-After`` (:func:`decide` keeps it, up to the policy's longest wait),
    which the reason names."""
    wait = response.retry_after_s()
    if wait is not None:
        reason += f"; the server asks to wait {wait:.0f} s (Retry-After)"
    return SendResult(Outcome.RETRY, reason, response.status_code, not_before_s=wait)


# failed attempts to a destination that keeps failing: one line a minute, not one each
FAILED_ATTEMPTS = FailedAttemptLog()


def log_settled(item: OutboxItem, outcome: Outcome, settlement: Settlement) -> None:
    """The log line of a recorded outcome (no patient data: UIDs, destination, reason);
    a destination's repeated failed attempts are summarised (:data:`FAILED_ATTEMPTS`)."""
    error = settlement.values.get("last_error")
    if outcome is Outcome.SENT:
        held = FAILED_ATTEMPTS.got_through(item.destination)
        if held:
            logger.info(
                "outbox: %s reachable again; %d failed attempts to it were not logged",
                item.destination,
                held,
            )
        if error:  # stored, but maybe not as sent (e.g. coerced)
            logger.warning(
                "outbox: %s stored by %s with a warning: %s",
                item.sop_instance_uid,
                item.destination,
                error,
            )
        else:
            logger.info("outbox: %s sent to %s", item.sop_instance_uid, item.destination)
    elif outcome is Outcome.RETRY:
        due = settlement.values["next_attempt_at"]
        assert isinstance(due, dt.datetime)
        held = FAILED_ATTEMPTS.failed(item.destination)
        if held is None:
            return
        logger.warning(
            "outbox: %s to %s failed (attempt %d), retry at %s: %s%s",
            item.sop_instance_uid,
            item.destination,
            item.attempts,
            due.isoformat(timespec="seconds"),
            error,
            f" ({held} more failed attempts to it not logged since its last line; logged "
            f"at most every {FAILED_ATTEMPTS.repeat_s:g} s)"
            if held
            else "",
        )
    else:
        logger.error(
            "outbox: %s to %s failed permanently: %s",
            item.sop_instance_uid,
            item.destination,
            error,
        )


def _describe(path: Path) -> dict[str, str]:
    """The UIDs an outbox row needs, from the file's header."""
    try:
        header = read_header(path)
        return {
            "path": str(path.absolute()),
            "sop_class_uid": str(header.SOPClassUID),
            "sop_instance_uid": str(header.SOPInstanceUID),
            "study_instance_uid": str(header.StudyInstanceUID),
            "transfer_syntax_uid": str(header.file_meta.TransferSyntaxUID),
        }
    except (OSError, UnreadableHeaderError, AttributeError) as exc:
        raise GatewayError(f"cannot queue {path.name}: not a readable DICOM file ({exc})") from exc


def _outgoing(item: OutboxItem) -> OutgoingFile:
    return OutgoingFile(
        key=item.id,
        path=Path(item.path),
        sop_class_uid=item.sop_class_uid,
        transfer_syntax_uid=item.transfer_syntax_uid,
        sop_instance_uid=item.sop_instance_uid,
    )


class OutboxWorker:
    """A daemon thread delivering due rows: wakes every ``interval_s``, at the next due
    time if sooner, and at once on :meth:`wake` (call it after :meth:`Outbox.enqueue`)."""

    def __init__(
        self,
        outbox: Deliverer,
        *,
        interval_s: float = 30.0,
        clock: Callable[[], dt.datetime] = utc_now,
        name: str = "radserve-outbox",
    ) -> None:
        """``clock``: the time rows are judged in (a lane's: the database's,
        :meth:`OutboxStore.now`)."""
        self.outbox = outbox
        self.interval_s = interval_s
        self._clock = clock
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop after the current delivery (rows being sent finish or keep their lease)."""
        self.ask_to_stop()
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def ask_to_stop(self) -> None:
        """Stop after the current delivery, without waiting for it."""
        self._stop.set()
        self._wake.set()

    def _run(self) -> None:
        failures = LoopFailures(logger, f"outbox delivery ({self._thread.name})")
        while not self._stop.is_set():
            self._wake.clear()
            try:
                report = self.outbox.deliver_pending(self._clock())
                if report.claimed == self.outbox.batch_size:
                    failures.succeeded()
                    continue  # more may be due right now
                wait = self._seconds_to_next_due()
            except Exception as exc:  # database briefly unavailable: try again later
                failures.failed(exc)
                wait = self.interval_s
            else:
                failures.succeeded()
            self._wake.wait(wait)

    def _seconds_to_next_due(self) -> float:
        due = self.outbox.next_due()
        if due is None:
            return self.interval_s
        seconds = (due - self._clock()).total_seconds()
        return min(self.interval_s, max(seconds, 0.05))


class Lane:
    """One destination's deliveries of an outbox, for an :class:`OutboxWorker` of its
    own: a destination that is slow or never answers (a stopped PACS holds each
    association for ``gateway.acse_timeout_s`` / ``dimse_timeout_s``) delays only its own
    deliveries. ``destination`` may also be a :class:`Scope`: the rows of destinations
    no longer configured (failed at once, nothing is sent).

    ``lock`` (PostgreSQL, :func:`radserve.store.lane_lock.lane_lock`): the lane sends
    only while it holds its destination's lock, so one server at a time sends to it
    among replicas sharing the database; a lane that takes the lock first re-queues
    the rows its previous holder left ``sending``. ``share``: the lock is taken and kept
    within this server's share of the destinations (:mod:`radserve.store.lane_share`)."""

    def __init__(
        self,
        outbox: LanedDeliverer,
        destination: str | Scope,
        *,
        lock: LaneLock | None = None,
        share: LaneShare | None = None,
    ) -> None:
        self.outbox = outbox
        self.scope = destination if isinstance(destination, Scope) else Scope(destination)
        self.lock = lock
        self.share = share
        self.taken_over = 0  # rows re-queued from a previous holder, since start
        self._take_over = False  # the lock was taken; its rows not re-queued yet

    @property
    def batch_size(self) -> int:
        return self.outbox.batch_size

    @property
    def sending_here(self) -> bool:
        """Whether this server sends this lane's deliveries (always, without a lock)."""
        return self.lock is None or self.lock.held

    def deliver_pending(self, now: dt.datetime | None = None) -> DeliveryReport:
        now = now or self.outbox.store.now()  # the database's time (rows of every replica)
        if self.lock is not None:
            hold = self.lock.hold() if self.share is None else self.share.hold(self.lock)
            if hold is LaneHold.ELSEWHERE:
                return DeliveryReport()
            self._take_over |= hold is LaneHold.TAKEN
            if self._take_over:  # until it succeeds (the database may be away)
                moved = self.outbox.store.take_over_lane(
                    kind=self.outbox.kind, scope=self.scope, now=now
                )
                self._take_over = False
                self.taken_over += moved
                if moved:
                    logger.warning(
                        "outbox: %d %s deliveries to %s left sending by a previous sender "
                        "are sent again",
                        moved,
                        self.outbox.kind.value,
                        self.scope.destination,
                    )
        return self.outbox.deliver_pending(now, self.scope)

    def next_due(self) -> dt.datetime | None:
        if not self.sending_here:
            return None  # another server sends them: look again after the interval
        return self.outbox.next_due(self.scope)

    def close(self) -> None:
        """Give the destination up (after this lane's worker stopped)."""
        if self.lock is not None:
            self.lock.release()


@dataclass(frozen=True)
class LaneState:
    """One destination's sender as this server sees it (metrics)."""

    kind: str
    destination: str
    sending_here: bool
    taken_over: int
    late_commitment_reports: int = 0  # storage commitment reports after their deadline


class LaneWorkers:
    """A worker thread per destination of ``outbox`` (each keeps its destination's order:
    best class, then oldest), and one for the rows of destinations no longer configured.

    On PostgreSQL each destination's lane holds that destination's lock
    (:mod:`radserve.store.lane_lock`): among replicas sharing the database one sender
    at a time per destination, the others' lanes wait and take it over when its holder
    stops or dies, and each server holds at most its share of the destinations
    (:mod:`radserve.store.lane_share`). ``interval_s``: how often an idle lane looks for
    rows (other replicas enqueue without waking it) and a waiting lane tries to take over."""

    def __init__(
        self,
        outbox: LanedDeliverer,
        destinations: Iterable[str],
        *,
        prefix: str,
        interval_s: float = 30.0,
    ) -> None:
        names = list(destinations)
        self.outbox = outbox
        owner = outbox.store.owner
        engine = outbox.store.engine
        kind = outbox.kind.value
        locks = {name: lane_lock(engine, kind, name, owner=owner) for name in names}
        self.share = lane_share(engine, kind, list(locks.values()), owner=owner)
        self.lanes = {
            name: Lane(outbox, name, lock=lock, share=self.share) for name, lock in locks.items()
        }
        # rows are due, leased and compared in the database's time (any replica's rows)
        clock = outbox.store.now
        self.workers = {
            name: OutboxWorker(lane, interval_s=interval_s, clock=clock, name=f"{prefix}-{name}")
            for name, lane in self.lanes.items()
        }
        self.leftovers = OutboxWorker(
            Lane(outbox, Scope(other_than=tuple(names))),
            clock=clock,
            name=f"{prefix}-unconfigured",
        )

    def _all(self) -> list[OutboxWorker]:
        return [*self.workers.values(), self.leftovers]

    def start(self) -> None:
        for worker in self._all():
            worker.start()

    def wake(self, only: Callable[[str], bool] | None = None) -> None:
        """The lanes look at once: every lane, or only the destinations ``only`` accepts."""
        for name, worker in self.workers.items():
            if only is None or only(name):
                worker.wake()
        if only is None:
            self.leftovers.wake()

    def senders(self) -> list[LaneState]:
        """Per destination: whether this server is its sender now, how many rows it
        re-queued on taking it over, and how many storage commitment reports came late
        (DICOM destinations)."""
        commitments = getattr(self.outbox, "commitments", None)
        late = commitments.late_reports if commitments is not None else {}
        return [
            LaneState(
                lane.outbox.kind.value,
                name,
                lane.sending_here,
                lane.taken_over,
                late.get(name, 0),
            )
            for name, lane in self.lanes.items()
        ]

    def stop(self, timeout: float = 10.0) -> None:
        """Stop every lane after its current delivery (all asked first, then joined),
        then give the destinations up."""
        for worker in self._all():
            worker.ask_to_stop()
        for worker in self._all():
            worker.stop(timeout)
        for name, lane in self.lanes.items():
            if not self.workers[name].alive:  # one still sending keeps it until exit
                lane.close()
        if self.share is not None:
            self.share.release()


__all__ = [
    "AttemptClock",
    "Deliverer",
    "DeliveryReport",
    "Lane",
    "LaneState",
    "LaneWorkers",
    "LanedDeliverer",
    "Outbox",
    "OutboxState",
    "OutboxWorker",
    "RetryPolicy",
    "Sender",
    "decide",
    "log_settled",
    "settle",
    "utc_now",
]

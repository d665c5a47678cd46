"""The lease keeper: renews this replica's job leases and takes over the jobs of
replicas that died (radserve.store.leases has the rules).

One daemon thread. Renewal runs every third of the lease, so a lease survives two
missed renewals (a database restart, a pause); after a failed renewal it is tried
again every second, so the leases are renewed as soon as the database answers. The
take-over poll runs every ``jobs.lease_poll_s`` and only when replicas share the
database. A database error is logged once (:class:`radserve.loop_failures.LoopFailures`)
and the next round tries again.

With replicas, a job must not run on two of them. The fence in the store makes sure
only one run's writes count; two more rules keep the other run from happening at all:

- **No take-over of a lease that could not be renewed.** A lease that ran out while the
  database was away was not let go: its owner could not renew it. So this replica takes
  another replica's job only once, since that owner's last renewal, the database has
  answered this replica's rounds for the owner's lease and one of its renewal intervals
  *in total* (:class:`AnsweredTime`): a live owner renews within a second of the
  database's return, so it has had at least a whole lease of answers to do so. The row
  says when it was renewed and until when (``jobs.lease_renewed``, ``lease_expires``),
  so replicas with different ``jobs.lease_s`` judge each other's leases by the owner's
  length, not their own (before migration 0013 the renewal was worked out as the expiry
  less this replica's lease: an owner with a longer lease could lose its jobs while
  alive). Answered time is the time between consecutive rounds that both reached the
  database; a failed round only stops the count, it does not reset it, so a database
  that fails now and then (a flapping link, restarts every few seconds) delays the
  take-over of a dead replica's jobs by its down time instead of postponing it for good
  (before session 17 it took a whole lease of *uninterrupted* answers). A dead owner
  (no outage) is taken over one renewal interval after its lease expired; a replica
  that just started has no answers yet and takes back only its own instance's jobs
  (also at start: ``Service.recover``).
- **No new work without a proven lease.** The owner side: a lease is *proven* until the
  start of the last renewal that committed plus the lease less one renewal interval.
  Past that (the database away, or this replica cut off from it while the others are
  not) the scheduler hands out no new unit of any job (:meth:`Scheduler.hold`, reason
  :data:`HELD_REASON`: ``/metrics`` ``radserve_scheduler_held``, ``/readyz``); units
  running finish. The next renewal that commits lets work go on, and the jobs this
  replica runs that it did not renew were taken over meanwhile: they are failed here
  with ``lease_lost``, a write the fence refuses, so nothing of them is recorded.

Every lease time is the database's (:mod:`radserve.store.db_clock`): the offset of its
clock from this host's is measured with each renewal, and the answered time and the
take-over's ``now`` are this host's wall clock plus it, so a host whose clock is off
judges the rows' times as the others do. An offset beyond a few seconds is logged once
and is a ``/readyz`` reason (:attr:`LeaseKeeper.config_differences`, degraded);
``radserve_db_clock_offset_seconds`` (:class:`ClockOffsetCollector`) reports it.

A server that stops cleanly lets its leases go once it runs nothing any more
(:meth:`LeaseKeeper.release`): the other replicas take its jobs at their next poll.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from radserve.errors import RadserveError
from radserve.loop_failures import LoopFailures
from radserve.service.schema_watch import SchemaWatch
from radserve.store import Claimed, Lease, LeaseLostError, Store
from radserve.store.replica_config import differences

logger = logging.getLogger(__name__)

RETRY_S = 1.0  # a failed round is tried again this soon (or at its usual time, if sooner)
HELD_REASON = "lease_unproven"  # the scheduler's hold (a metric label)
HELD_MESSAGE = (
    "the job leases could not be renewed (the database does not answer); work goes on "
    "once they are, so that no job runs on two replicas"
)


class Runs(Protocol):
    """What the keeper needs of the scheduler (:class:`radserve.scheduling.Scheduler`)."""

    def hold(self, reason: str, message: str) -> None: ...

    def release(self) -> None: ...

    def unfinished(self) -> set[str]: ...

    def fail(self, job_id: str, error: LeaseLostError) -> bool: ...


class LeaseKeeper:
    def __init__(
        self,
        store: Store,
        lease: Lease,
        *,
        shared: bool,
        poll_s: float,
        on_claimed: Callable[[list[Claimed]], None],
        runs: Runs | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        destinations: Mapping[str, str] | None = None,
        schema: SchemaWatch | None = None,
        on_schema_changed: Callable[[str], None] | None = None,
    ) -> None:
        self.store = store
        # read with each renewal: once a newer radserve migrated the database, no lease
        # is renewed any more and ``on_schema_changed`` stops the server
        # (radserve.service.schema_watch)
        self.schema = schema
        self.on_schema_changed = on_schema_changed
        # this replica's destination digests (radserve.service.replica_config), written
        # with each renewal and compared with the other replicas' (shared only)
        self.destinations = dict(destinations) if destinations is not None else None
        # what /readyz names (degraded): destinations configured differently, then
        # other live servers with this replica's instance id (:meth:`check_twins`)
        self.config_differences: list[str] = []
        self._destination_differences: list[str] = []
        self._twins: list[str] = []
        self._clock: list[str] = []  # this host's clock too far from the database's
        self.lease = lease
        self.shared = shared
        self.poll_s = poll_s
        self.on_claimed = on_claimed
        self.runs = runs if shared else None  # one server alone holds every job
        self.clock = clock
        # the leases' expiries are wall-clock times (UTC), of the database's clock: this
        # one plus the offset the renewals measure (:meth:`database_time`)
        self.wall = wall
        self.lease_s = lease.duration.total_seconds()
        self.renew_s = renew_interval_s(self.lease_s)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.held: set[str] = set()  # job ids whose lease the last renewal extended
        # the lease is proven until then (monotonic): see the module's docstring
        self.proven_until = clock() + self.lease_s - self.renew_s
        # when the database answered this replica's rounds (wall clock): take-over proof
        self.answered = AnsweredTime(keep_s=self.lease_s + self.renew_s)
        self.holding = False  # whether the scheduler holds work for want of a proof
        self._renewals = LoopFailures(logger, "leases: renew")
        self._take_overs = LoopFailures(logger, "leases: take over")

    def start(self) -> None:
        self.proven_until = self.clock() + self.lease_s - self.renew_s
        self._thread = threading.Thread(target=self._run, name="radserve-leases", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def release(self) -> list[str]:
        """Let go of this server's leases on its unfinished jobs, for a clean stop: call
        after :meth:`stop` (no renewal after it) and once no work runs here any more. The
        other replicas take the jobs at their next poll (``job.requeued``, ``reason:
        lease_released``), this instance's next start at once. Returns their ids; a
        database error is logged and the leases then run out as before."""
        try:
            return self.store.release_leases(self.lease)
        except RadserveError as exc:
            logger.warning(
                "leases: not released at stop (%s); other replicas take the jobs once they expire",
                exc.code,
            )
            return []

    def database_time(self) -> float:
        """The database's clock now (seconds since the epoch): this host's wall clock
        plus the offset the last renewal measured (none on SQLite)."""
        return self.wall() + (self.lease.clock.offset_s or 0.0)

    @property
    def clock_offset_s(self) -> float | None:
        """The database's clock less this host's, in seconds, as last measured (None:
        not measured: SQLite, or no renewal yet)."""
        return self.lease.clock.offset_s

    def _run(self) -> None:
        next_renew = next_poll = self.clock()
        while not self._stop.is_set():
            now = self.clock()
            if now >= next_renew:
                renewed = self._round(self._renewals, self.renew)
                next_renew = now + (self.renew_s if renewed else min(self.renew_s, RETRY_S))
            # a server whose schema changed beneath it takes over nobody's jobs
            stopping = self.schema is not None and self.schema.changed is not None
            if self.shared and now >= next_poll and not stopping:
                took = self._round(self._take_overs, self.take_over)
                next_poll = now + (self.poll_s if took else min(self.poll_s, RETRY_S))
            self.check_proof()
            due = [next_renew, next_poll] if self.shared and not stopping else [next_renew]
            if self.runs is not None and not self.holding and not stopping:
                due.append(self.proven_until)
            self._stop.wait(max(0.05, min(due) - self.clock()))

    def renew(self) -> None:
        if self.schema is not None:
            changed = self.schema.check()
            if changed is not None:
                if self.on_schema_changed is not None:
                    self.on_schema_changed(changed)  # the hold first, then readiness
                self.schema.publish(changed)
            if self.schema.changed is not None:  # the newer radserve's replicas take over
                return
        started, runs = self.clock(), self.runs
        running = runs.unfinished() if runs is not None else set()
        self.held = self.store.renew_leases(self.lease)
        self.proven_until = started + self.lease_s - self.renew_s
        problem = self.lease.clock.problem()  # measured with the renewal
        self._clock = [problem] if problem is not None else []
        self._publish()
        if self.shared and self.destinations is not None:
            self.compare_destinations()
        if self.shared:
            self.check_twins()
        if runs is None:
            return
        # every job running here had its row committed before the renewal: one it did
        # not extend is another replica's now (or finished there)
        for job_id in sorted(running - self.held):
            if runs.fail(job_id, _lost(job_id)):
                logger.warning(
                    "job %s: its lease passed to another replica; this run stops", job_id
                )

    def compare_destinations(self) -> None:
        """Write this replica's destination digests and compare them with the other
        replicas' (those that renewed within two leases); a change in what differs is
        logged once. A database error leaves the last comparison (the renewal that
        follows tries again)."""
        assert self.destinations is not None
        try:
            others = self.store.record_destinations(
                self.lease.instance,
                self.destinations,
                within=2 * self.lease.duration,
                now=dt.datetime.fromtimestamp(self.database_time(), dt.UTC),
            )
        except RadserveError as exc:
            logger.debug("leases: destinations not compared (%s)", exc.code)
            return
        found = differences(self.destinations, others)
        if found != self._destination_differences:
            if found:
                logger.warning(
                    "replicas: destinations must be configured the same on every replica: %s",
                    "; ".join(found),
                )
            else:
                logger.warning("replicas: the destinations are configured the same again")
        self._destination_differences = found
        self._publish()

    def check_twins(self) -> None:
        """Name every other server that renews leases under this replica's instance id
        since this one started (radserve.store.leases: a copied config, a frozen server
        started again elsewhere); logged once when what is found changes."""
        try:
            twins = self.store.twins(self.lease)
        except RadserveError as exc:
            logger.debug("leases: servers of this instance id not looked up (%s)", exc.code)
            return
        found = [
            f"another server runs with this replica's instance id {self.lease.instance} "
            f"(as {owner}): give each replica its own outbox.instance_id"
            for owner in sorted(twins)
        ]
        if found != self._twins:
            if found:
                logger.error("replicas: %s", "; ".join(found))
            else:
                logger.warning("replicas: no other server runs with this instance id now")
        self._twins = found
        self._publish()

    def _publish(self) -> None:
        """What ``/readyz`` names: destinations configured differently, other servers
        with this instance id, this host's clock too far from the database's."""
        self.config_differences = self._destination_differences + self._twins + self._clock

    def take_over(self) -> None:
        """Claim the jobs whose owner had its lease and its renewal interval of answered
        time since its last renewal to renew them, and did not (see the module)."""
        claimed = self.store.claim_jobs(
            self.lease,
            shared=True,
            others=True,
            now=dt.datetime.fromtimestamp(self.database_time(), dt.UTC),
            may_take=self.may_take,
        )
        if claimed:
            self.on_claimed(claimed)

    def may_take(self, renewed: dt.datetime, length: dt.timedelta) -> bool:
        """Whether another replica's lease, last renewed at ``renewed`` for ``length`` (its
        own ``jobs.lease_s``, as the row says), may be taken: the database answered this
        replica for that lease and one of its renewal intervals in all since then."""
        lease_s = length.total_seconds()
        need_s = lease_s + renew_interval_s(lease_s)
        self.answered.keep_s = max(self.answered.keep_s, need_s)  # a longer lease seen
        since = self.answered.since(need_s)
        return since is not None and renewed.timestamp() <= since

    def check_proof(self) -> None:
        """Hold the scheduler's work while the lease is not proven; release it after
        (never once the schema changed: that hold stays, radserve.service.schema_watch)."""
        if self.runs is None or (self.schema is not None and self.schema.changed is not None):
            return
        proven = self.clock() < self.proven_until
        if not proven and not self.holding:
            self.holding = True
            self.runs.hold(HELD_REASON, HELD_MESSAGE)
            logger.warning(
                "leases: not renewed for %.0f s (the database does not answer): no new "
                "work starts until they are, so that no job runs on two replicas",
                self.clock() - (self.proven_until - self.lease_s + self.renew_s),
            )
        elif proven and self.holding:
            self.holding = False
            self.runs.release()
            logger.warning("leases: renewed again; work goes on")

    def _round(self, failures: LoopFailures, call: Callable[[], None]) -> bool:
        """One round of ``call``; whether it reached the database."""
        started = self.database_time()
        try:
            call()
        except Exception as exc:  # the keeper must outlive any one round
            failures.failed(exc)
            self.answered.failed()
            return False
        failures.succeeded()
        self.answered.reached(started)
        return True


class ClockOffsetCollector(Collector):
    """``radserve_db_clock_offset_seconds``: the database's clock less this host's, as
    the lease renewals measure it (PostgreSQL; nothing before the first, nor on SQLite)."""

    def __init__(self, keeper: LeaseKeeper) -> None:
        self._keeper = keeper

    def collect(self) -> Iterator[Any]:
        offset = self._keeper.clock_offset_s
        if offset is None:
            return
        gauge = GaugeMetricFamily(
            "radserve_db_clock_offset_seconds",
            "The database's clock less this host's (job leases are dated in the "
            "database's; beyond a few seconds this host's time is not synchronised)",
        )
        gauge.add_metric([], offset)
        yield gauge


class AnsweredTime:
    """For how long the database answered this replica: the spans between consecutive
    rounds that both reached it (wall-clock seconds). Spans end at a failed round; the
    oldest are dropped once the others hold ``keep_s``, so it stays small."""

    def __init__(self, *, keep_s: float) -> None:
        self.keep_s = keep_s
        self.spans: deque[tuple[float, float]] = deque()
        self._last: float | None = None  # the last round, if it reached the database

    def reached(self, at: float) -> None:
        """A round that started at ``at`` reached the database."""
        last, self._last = self._last, at
        if last is None or at <= last:  # after a failure (or the clock went back)
            return
        if self.spans and self.spans[-1][1] == last:
            self.spans[-1] = (self.spans[-1][0], at)
        else:
            self.spans.append((last, at))
        total = sum(end - start for start, end in self.spans)
        while len(self.spans) > 1 and total - _length(self.spans[0]) >= self.keep_s:
            total -= _length(self.spans.popleft())

    def failed(self) -> None:
        self._last = None

    def since(self, need_s: float) -> float | None:
        """The latest time since which the database answered for ``need_s`` in all
        (None: it has not, as far as this replica kept count)."""
        left = need_s
        for start, end in reversed(self.spans):
            if end - start >= left:
                return end - left
            left -= end - start
        return None


def renew_interval_s(lease_s: float) -> float:
    """How often a lease of ``lease_s`` is renewed: a third, so it survives two missed
    renewals."""
    return lease_s / 3.0


def _length(span: tuple[float, float]) -> float:
    return span[1] - span[0]


def _lost(job_id: str) -> LeaseLostError:
    return LeaseLostError(
        f"job {job_id}: its lease was not renewed in time and another replica took it "
        "over; this replica's run is void"
    )


__all__ = [
    "HELD_MESSAGE",
    "HELD_REASON",
    "RETRY_S",
    "AnsweredTime",
    "ClockOffsetCollector",
    "LeaseKeeper",
    "Runs",
    "renew_interval_s",
]

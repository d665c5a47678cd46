"""Active jobs kept in rank order, so admission is O(log n) and dispatch needs no sort.

A job's rank (:meth:`ScheduledJob.rank <radserve.scheduling.state.ScheduledJob.rank>`)
depends on the clock only through aging, and a job ages once, at a time known from its
class and deadline (``deadline - aging_fraction x TAT``); it changes otherwise only when
its class, deadline or promotion changes (:meth:`RankIndex.changed`). So the index keeps
each job's rank key cached in a sorted list (bisect), and a heap of the jobs still to age:
before answering at ``now`` it re-keys the jobs whose aging time passed. Submitting is
then one bisect and one list insertion (a memmove) instead of a sort of the whole queue
with a TAT look-up per job, and the order it gives is exactly ``sorted(jobs,
key=rank(now))``. The scheduler keeps two: the waiting jobs (start order, positions,
per-class counts for the queue limits) and the started ones; dispatch merges the two
sorted lists (O(n), no key computed). ``tests/unit/test_scheduling_waiting.py`` checks
both against the full sort on seeded random mixes.

Clocks never go backwards (MonotonicClock, FakeClock refuses); should a reading still be
earlier than the last one, the index is rebuilt, so aging is undone as the sort would.

The aging heap names jobs by id, never holds them: a job that left (started, finished,
cancelled) has its entry dropped lazily, and until its aging time (22 minutes after
arrival for an outpatient job by default) the entry once kept the whole finished job
alive, its volumes, results and report with it (every job of a burst, for that long;
``tools/memory_per_job.py``). The heap is also compacted once its stale entries
outnumber the jobs here, so it stays within twice the jobs indexed (plus a constant).
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort

from radserve.config import SchedulerSettings
from radserve.domain.priority import PriorityClass
from radserve.scheduling.state import Rank, ScheduledJob

URGENT = PriorityClass.URGENT
# stale aging entries tolerated beyond the jobs indexed before the heap is compacted
_SLACK = 64


class RankIndex:
    """Jobs sorted by their rank at the last ``now`` seen (see module doc)."""

    def __init__(self, config: SchedulerSettings) -> None:
        self.config = config
        # the TAT per class, read once (config.tat goes through a pydantic getattr)
        self._tat = {c: config.tat(c) for c in PriorityClass}
        self._sorted: list[tuple[Rank, ScheduledJob]] = []
        # job id -> (its key in _sorted, the class it is counted under, the job)
        self._keys: dict[str, tuple[Rank, PriorityClass, ScheduledJob]] = {}
        # (age_at, seq, job id): ids, not jobs, so a job that left is not kept alive
        self._aging: list[tuple[float, int, str]] = []
        self._counts: dict[PriorityClass, int] = dict.fromkeys(PriorityClass, 0)
        self._now = float("-inf")

    def __len__(self) -> int:
        return len(self._sorted)

    def __contains__(self, job: ScheduledJob) -> bool:
        return job.id in self._keys

    # --- the rank, computed as ScheduledJob.rank does, with the TAT cached ------------
    def _age_at(self, job: ScheduledJob) -> float | None:
        """When ``job`` ages one class up (None: URGENT, it never does)."""
        if job.cls is URGENT:
            return None
        return job.deadline - self.config.aging_fraction * self._tat[job.cls]

    def _aged(self, job: ScheduledJob, now: float) -> bool:
        if job.cls is URGENT:
            return False
        return job.deadline - now < self.config.aging_fraction * self._tat[job.cls]

    def _key(self, job: ScheduledJob, now: float) -> Rank:
        eff = job.cls.promoted() if self._aged(job, now) else job.cls
        aged_urgent = eff is URGENT and job.cls is not URGENT
        return (eff.rank, aged_urgent, not job.promoted, job.deadline, job.seq)

    # --- changes ---------------------------------------------------------------------
    def add(self, job: ScheduledJob, now: float) -> None:
        """Index ``job`` (O(log n) search + one insertion)."""
        self.catch_up(now)
        self._insert(job, now)
        age_at = self._age_at(job)
        if age_at is not None and not self._aged(job, now):
            heapq.heappush(self._aging, (age_at, job.seq, job.id))

    def discard(self, job: ScheduledJob) -> None:
        """Take ``job`` out (it started or is stopping); no-op if it is not here. Its
        aging entry, if any, is dropped lazily (it names the job, it does not hold it)."""
        entry = self._keys.pop(job.id, None)
        if entry is None:
            return
        key, cls, _ = entry
        del self._sorted[bisect_left(self._sorted, (key,))]
        self._counts[cls] -= 1
        if len(self._aging) > 2 * len(self._keys) + _SLACK:
            self._compact()

    def _compact(self) -> None:
        """Drop the aging entries of jobs no longer here (O(n))."""
        live = [e for e in self._aging if e[2] in self._keys]
        heapq.heapify(live)
        self._aging = live

    def changed(self, job: ScheduledJob, now: float) -> None:
        """``job``'s class, deadline or promotion changed: re-key it (and count it under
        its class now); no-op if it is not here. The one way to tell the index."""
        if job.id not in self._keys:
            return
        self.discard(job)
        self.add(job, now)

    def _insert(self, job: ScheduledJob, now: float) -> None:
        key = self._key(job, now)
        self._keys[job.id] = (key, job.cls, job)
        insort(self._sorted, (key, job))
        self._counts[job.cls] += 1

    def catch_up(self, now: float) -> None:
        """Re-key the jobs that aged by ``now``."""
        if now < self._now:
            self._rebuild(now)
            return
        self._now = now
        recheck: list[tuple[float, int, str]] = []
        # a small tolerance: age_at is rounded once more than the exact predicate
        limit = now + 1e-9 * max(1.0, abs(now))
        while self._aging and self._aging[0][0] <= limit:
            entry = heapq.heappop(self._aging)
            age_at, _, job_id = entry
            indexed = self._keys.get(job_id)
            if indexed is None:
                continue  # gone
            job = indexed[2]
            if self._age_at(job) != age_at:
                continue  # changed since (its current entry is in the heap)
            if not self._aged(job, now):
                recheck.append(entry)
                continue
            self.discard(job)
            self._insert(job, now)
        for entry in recheck:
            heapq.heappush(self._aging, entry)

    def _rebuild(self, now: float) -> None:
        jobs = [job for _, job in self._sorted]
        self._sorted.clear()
        self._keys.clear()
        self._aging.clear()
        self._counts = dict.fromkeys(PriorityClass, 0)
        self._now = now
        for job in jobs:
            self.add(job, now)

    # --- views -----------------------------------------------------------------------
    def entries(self, now: float) -> list[tuple[Rank, ScheduledJob]]:
        """(rank key, job) for every job, best first, as of ``now`` (O(n), no sort)."""
        self.catch_up(now)
        return self._sorted

    def ordered(self, now: float) -> list[ScheduledJob]:
        """Every job in rank order at ``now`` (O(n), no sort)."""
        return [job for _, job in self.entries(now)]

    def position(self, job: ScheduledJob, now: float) -> int | None:
        """``job``'s place in :meth:`ordered` (O(log n)); None if it is not here."""
        self.catch_up(now)
        entry = self._keys.get(job.id)
        return None if entry is None else bisect_left(self._sorted, (entry[0],))

    def count(self, cls: PriorityClass) -> int:
        """Jobs here of ``cls`` (their own class, not the aged one)."""
        return self._counts[cls]


__all__ = ["RankIndex"]

"""The planner simulation's waiting jobs: per class, in arrival order, so a dispatch looks
at each class's first waiting job instead of walking the whole queue
(:mod:`radserve.turnaround.simulate`; before 2026-12-06 every free worker walked every
unfinished job, and a plan of 2,700 jobs at 3,000 an hour spent most of its CPU there).

Why the first one is enough, at every instant:

- Within a class the scheduler's order is the deadline's (then the arrival's), and a
  simulated job's deadline is its arrival plus its class's TAT, the same for the whole
  class: arrival order is the class's order.
- Aging (:func:`radserve.scheduling.state.effective_class`) promotes a job once its
  slack ``deadline - now`` falls below ``aging_fraction`` x the class's TAT: one
  threshold for the whole class, so the aged jobs of a class are always a prefix of it
  in that order, and aging never reorders a class.
- Whether a waiting job may start (:func:`radserve.scheduling.selection.may_start`)
  depends only on its class and on how many routine jobs are started: within one
  dispatch either every waiting job of a class may start or none does. The walk over
  the ranked jobs therefore starts, of each class, the first waiting one or none, in
  the effective class the first one is in: a later one sits in the same or a worse
  effective class (it ages later), behind the first.

So the waiting jobs of a class start in arrival order, and a dispatch needs of each class
only its first waiting job and that job's effective class now: O(classes), not O(queue).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Generic, Protocol, TypeVar

from radserve.config import SchedulerSettings
from radserve.domain.priority import PriorityClass
from radserve.scheduling.state import effective_class


class Queued(Protocol):
    """What the queue reads of a job: its class, deadline and arrival sequence number."""

    @property
    def cls(self) -> PriorityClass: ...

    @property
    def deadline(self) -> float: ...

    @property
    def seq(self) -> int: ...


J = TypeVar("J", bound=Queued)


class WaitingJobs(Generic[J]):
    """Jobs that arrived and have not started, per class in rank order (= arrival)."""

    def __init__(self, scheduler: SchedulerSettings) -> None:
        self._scheduler = scheduler
        self._by_class: dict[PriorityClass, deque[J]] = {c: deque() for c in PriorityClass}

    def add(self, job: J) -> None:
        """Queue ``job`` behind its class; a job that would rank before the class's last
        one is refused (the invariant the shortcut rests on: see the module)."""
        queue = self._by_class[job.cls]
        if queue and (job.deadline, job.seq) < (queue[-1].deadline, queue[-1].seq):
            raise ValueError(
                f"{job.cls.value} job {job.seq} (deadline {job.deadline}) ranks before the "
                f"last waiting one ({queue[-1].seq}, deadline {queue[-1].deadline}): a "
                "class's waiting jobs must arrive in deadline order"
            )
        queue.append(job)

    def first(self, cls: PriorityClass, now: float) -> tuple[J, PriorityClass] | None:
        """The class's next job to start and its effective class at ``now``; None when
        none of the class waits."""
        queue = self._by_class[cls]
        if not queue:
            return None
        job = queue[0]
        return job, effective_class(cls, job.deadline, now, self._scheduler)

    def start(self, job: J) -> None:
        """``job`` starts: it must be its class's first (module: why it always is)."""
        queue = self._by_class[job.cls]
        if not queue or queue[0] is not job:
            raise ValueError(f"job {job.seq} is not the first waiting {job.cls.value} job")
        queue.popleft()

    def __len__(self) -> int:
        return sum(len(q) for q in self._by_class.values())

    def __iter__(self) -> Iterator[J]:
        for queue in self._by_class.values():
            yield from queue


__all__ = ["Queued", "WaitingJobs"]

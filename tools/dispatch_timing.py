"""Median time of ``Scheduler.next_dispatch`` (the dispatch order + batch plan, no batch
ready) over 200 calls with N queued jobs of mixed classes, on a fake clock.

    PYTHONPATH=src:. python tools/dispatch_timing.py 1000

(``PYTHONPATH=<other checkout>/src:<other checkout>`` times another commit the same way.)
"""

import statistics
import sys
import time

from tests.factories.scheduling_fakes import FakeSession, fake_work

from radserve.config import QueueLimits, SchedulerSettings
from radserve.scheduling import FakeClock, JobRequest, PriorityClass, Scheduler

if {"-h", "--help"} & set(sys.argv[1:]):  # the usage is the docstring
    sys.exit(__doc__)
n = int(sys.argv[1])
classes = [PriorityClass.OUTPATIENT] * 6 + [PriorityClass.INPATIENT] * 3 + [PriorityClass.URGENT]
config = SchedulerSettings(
    queue_limits=QueueLimits(inpatient=None, outpatient=None), urgent_exclusive=False
)
clock = FakeClock(1000.0)
s = Scheduler(config, clock=clock)
session = FakeSession()
for i in range(n):
    s.submit(JobRequest(f"j{i}", fake_work(session, 1), classes[i % 10]))
times = []
for _ in range(200):
    clock.advance(0.01)
    t = time.perf_counter()
    s.next_dispatch("cpu")
    times.append(time.perf_counter() - t)
print(f"{n} jobs: next_dispatch median {statistics.median(times) * 1000:.2f} ms")

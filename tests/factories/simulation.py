"""Scheduler settings for the planner's simulation tests (radserve.turnaround.simulate)."""

from __future__ import annotations

from radserve.config import MAX_DURATION_S, ClassTats, SchedulerSettings
from radserve.domain.device_slot import MAX_THREADS

# no aging, no start limit (the most the settings take, more than a test queues), no
# URGENT exclusivity nor yielding: a plain queue in front of the device
PLAIN = SchedulerSettings(
    tat_s=ClassTats(urgent=MAX_DURATION_S, inpatient=MAX_DURATION_S, outpatient=MAX_DURATION_S),
    aging_fraction=0.0,
    max_running=MAX_THREADS,
    urgent_exclusive=False,
    yield_to_urgent=False,
)

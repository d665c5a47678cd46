"""Scheduler settings for the planner's simulation tests (radserve.turnaround.simulate)."""

from __future__ import annotations

from radserve.config import ClassTats, SchedulerSettings

# no aging, no start limit, no URGENT exclusivity nor yielding: a plain queue in front
# of the device
PLAIN = SchedulerSettings(
    tat_s=ClassTats(urgent=1e9, inpatient=1e9, outpatient=1e9),
    aging_fraction=0.0,
    max_running=1_000_000,
    urgent_exclusive=False,
    yield_to_urgent=False,
)

"""The kept ``radserve bench --scenario eta`` traces (``tests/data/eta-traces/``) replayed
under a walk variant and scored as the issue scores them: one place for the replay tests
of several sessions' traces."""

from __future__ import annotations

from pathlib import Path

from radserve.bench.eta_accuracy import arrivals_before, read_summary
from radserve.turnaround.replay import Replayed, Variant, errors, replay

TRACES = Path(__file__).parent.parent / "data" / "eta-traces"


def replayed(path: Path, variant: Variant) -> tuple[list[Replayed], dict]:
    """A kept trace's jobs replayed under ``variant``, and the trace's summary."""
    summary = read_summary(path)
    jobs = replay(
        summary["eta_records"],
        variant,
        summary["service_times_at_start"],
        arrivals_before(summary),
    )
    return jobs, summary


def behind_3(name: str, variant: Variant) -> dict[str, float]:
    """The median error and bias at submission of the measured jobs queued behind >= 3
    others in trace ``eta-<name>.json.gz`` replayed under ``variant``, and their count."""
    jobs, summary = replayed(TRACES / f"eta-{name}.json.gz", variant)
    deep = errors(jobs, set(summary["measured_ids"]))["behind_3"]
    return {"jobs": deep["jobs"], **deep["submission"]}

"""The priority scenario's check that a study's answer does not depend on the studies
batched beside it: what it reports when the scheduled and the lone run differ; and its
summary of how long the routine studies paused for the URGENT one."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from radserve.bench.priority import _answer_difference, paused_summary


def _result(findings: int, **organs: tuple[str, float | None]) -> Any:
    measurements = [
        SimpleNamespace(label=label, coverage=coverage, volume_ml=volume)
        for label, (coverage, volume) in organs.items()
    ]
    report = SimpleNamespace(findings=[object()] * findings, organ_measurements=measurements)
    return SimpleNamespace(report=report)


def test_the_same_answer_to_a_thousandth_of_a_millilitre_is_no_difference() -> None:
    alone = _result(2, liver=("complete", 1520.1234), spleen=("partial", 210.0))
    scheduled = _result(2, liver=("complete", 1520.1231), spleen=("partial", 210.0))
    assert _answer_difference(scheduled, alone) is None


def test_a_difference_names_the_organs_and_the_finding_counts() -> None:
    alone = _result(
        2, liver=("complete", 1520.0), spleen=("partial", 210.0), kidney=("not_found", None)
    )
    scheduled = _result(
        3, liver=("complete", 1520.5), spleen=("partial", 210.0), kidney=("complete", 0.2)
    )
    assert _answer_difference(scheduled, alone) == {
        "findings_scheduled_alone": [3, 2],
        "organs_scheduled_alone": {
            "kidney": [("complete", 0.2), ("not_found", 0.0)],
            "liver": [("complete", 1520.5), ("complete", 1520.0)],
        },
    }
    assert _answer_difference(_result(1), _result(2)) == {
        "findings_scheduled_alone": [1, 2],
        "organs_scheduled_alone": {},
    }


def test_the_paused_summary_counts_the_jobs_that_waited() -> None:
    summary = paused_summary({"routine-0": 0.0, "routine-1": 1.25, "routine-2": 0.5})
    assert summary == {"jobs": 3, "jobs_paused": 2, "total": 1.75, "max": 1.25}
    assert paused_summary({}) == {"jobs": 0, "jobs_paused": 0, "total": 0.0, "max": 0.0}

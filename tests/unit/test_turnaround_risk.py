"""Deadline-risk transitions: raised past deadline - margin, cleared only once the
prediction is back before deadline - margin - clear_s (no flapping in the band), raised
again as a new event, frozen after the deadline, forgotten when the job ends; the replay's
options (a margin growing with the time left, persistence over recomputations)."""

from __future__ import annotations

import pytest

from radserve.domain.priority import PriorityClass
from radserve.turnaround.eta import Eta
from radserve.turnaround.risk import RiskTracker

OUT = PriorityClass.OUTPATIENT
DEADLINE = 1000.0
MARGIN, CLEAR = 30.0, 15.0


def _eta(finish: float, job_id: str = "j") -> Eta:
    return Eta(job_id, 0, 0.0, finish, finish + 20.0, DEADLINE)


def _update(tracker: RiskTracker, finish: float, now: float) -> tuple[list[str], list[str]]:
    raised, cleared = tracker.update([_eta(finish)], {"j": OUT}, now)
    return [r.job_id for r in raised], [c.risk.job_id for c in cleared]


def test_raised_past_the_margin_and_once_only() -> None:
    tracker = RiskTracker(MARGIN, CLEAR)
    assert _update(tracker, DEADLINE - MARGIN, 100.0) == ([], [])  # on the threshold: fine
    assert _update(tracker, DEADLINE - MARGIN + 1, 110.0) == (["j"], [])
    assert _update(tracker, DEADLINE + 50, 120.0) == ([], [])  # still the same risk
    risk = tracker.get("j")
    assert risk is not None and risk.raised_at == 110.0 and risk.lead_s == DEADLINE - 110.0
    assert risk.cls is OUT and "j" in tracker and tracker.raised == 1


def test_no_flapping_inside_the_band_then_cleared_and_raised_again() -> None:
    tracker = RiskTracker(MARGIN, CLEAR)
    assert _update(tracker, DEADLINE - 10, 100.0) == (["j"], [])
    # back under the raising threshold, but not under it by the band: still at risk
    for now, finish in [(101.0, DEADLINE - MARGIN - 1), (102.0, DEADLINE - MARGIN - CLEAR + 1)]:
        assert _update(tracker, finish, now) == ([], [])
        assert "j" in tracker
    raised, cleared = tracker.update([_eta(DEADLINE - MARGIN - CLEAR)], {"j": OUT}, 130.0)
    assert raised == [] and [c.risk.job_id for c in cleared] == ["j"]
    assert cleared[0].held_s == 30.0 and cleared[0].predicted_finish == DEADLINE - 45
    assert "j" not in tracker and tracker.standing() == []
    # recovered predictions inside the band do not raise it again ...
    assert _update(tracker, DEADLINE - MARGIN - 1, 140.0) == ([], [])
    # ... passing the threshold does: a second event, with its own time
    assert _update(tracker, DEADLINE - MARGIN + 5, 150.0) == (["j"], [])
    risk = tracker.get("j")
    assert risk is not None and risk.raised_at == 150.0
    assert (tracker.raised, tracker.cleared) == (2, 1)


def test_nothing_changes_after_the_deadline() -> None:
    tracker = RiskTracker(MARGIN, CLEAR)
    assert _update(tracker, DEADLINE + 100, DEADLINE + 1) == ([], [])  # a miss, not a risk
    assert _update(tracker, DEADLINE + 100, 900.0) == (["j"], [])
    # the deadline passed: a good prediction now does not clear the risk the miss counts
    assert _update(tracker, DEADLINE + 2, DEADLINE + 1) == ([], [])
    assert "j" in tracker


def test_jobs_not_walked_keep_their_state_and_ended_jobs_are_forgotten() -> None:
    tracker = RiskTracker(MARGIN, CLEAR)
    tracker.update([_eta(DEADLINE, "a"), _eta(DEADLINE, "b")], {"a": OUT, "b": OUT}, 100.0)
    assert {r.job_id for r in tracker.standing()} == {"a", "b"}
    assert tracker.update([_eta(0.0, "b")], {"b": OUT}, 110.0)[1][0].risk.job_id == "b"
    assert [r.job_id for r in tracker.standing()] == ["a"]
    tracker.forget("a")
    tracker.forget("unknown")
    assert tracker.standing() == [] and tracker.cleared == 1


def test_zero_band_clears_at_the_threshold_and_negative_values_are_refused() -> None:
    tracker = RiskTracker(MARGIN, 0.0)
    assert _update(tracker, DEADLINE, 100.0) == (["j"], [])
    assert _update(tracker, DEADLINE - MARGIN, 101.0) == ([], ["j"])
    with pytest.raises(ValueError, match="seconds >= 0"):
        RiskTracker(-1.0, 0.0)
    with pytest.raises(ValueError, match="seconds >= 0"):
        RiskTracker(MARGIN, 0.0, hold_s=-1.0)
    with pytest.raises(ValueError, match="fraction"):
        RiskTracker(MARGIN, 0.0, margin_fraction=1.0)


def test_the_margin_grows_with_the_time_left_by_its_fraction() -> None:
    tracker = RiskTracker(10.0, CLEAR, margin_fraction=0.5)
    assert tracker.threshold(DEADLINE, DEADLINE - 100) == DEADLINE - 10 - 50
    assert tracker.threshold(DEADLINE, DEADLINE + 5) == DEADLINE - 10  # none left
    # 100 s before the deadline a finish 55 s early is at risk; 20 s before, it is not yet
    assert _update(tracker, DEADLINE - 55, DEADLINE - 100) == (["j"], [])
    late = RiskTracker(10.0, CLEAR, margin_fraction=0.5)
    assert _update(late, DEADLINE - 25, DEADLINE - 20) == ([], [])
    assert _update(late, DEADLINE - 15, DEADLINE - 18) == (["j"], [])  # past D - 19


def test_a_hold_raises_only_a_risk_that_stood_that_long_over_recomputations() -> None:
    tracker = RiskTracker(MARGIN, CLEAR, hold_s=5.0)
    assert _update(tracker, DEADLINE, 100.0) == ([], [])  # past the threshold: held from now
    assert _update(tracker, DEADLINE, 104.0) == ([], [])
    assert _update(tracker, DEADLINE - MARGIN, 104.5) == ([], [])  # back: the hold restarts
    assert _update(tracker, DEADLINE, 106.0) == ([], [])
    assert _update(tracker, DEADLINE, 110.0) == ([], [])
    assert _update(tracker, DEADLINE, 111.0) == (["j"], [])  # stood 5 s since 106
    risk = tracker.get("j")
    assert risk is not None and risk.raised_at == 111.0
    tracker.forget("j")
    assert _update(tracker, DEADLINE, 120.0) == ([], [])  # a new job's hold starts again


INP = PriorityClass.INPATIENT


def test_a_reprioritised_jobs_events_carry_its_current_class_and_deadline() -> None:
    """Probe of 2026-12-06: raised as INPATIENT (deadline 15 s away), put back to
    OUTPATIENT (deadline 10 min away): the cleared event said INPATIENT and the old
    deadline, taken from the stored raise."""
    tracker = RiskTracker(MARGIN, CLEAR)
    inpatient_deadline, outpatient_deadline = 200.0, DEADLINE
    raised, _ = tracker.update(
        [Eta("j", 0, 0.0, 190.0, 210.0, inpatient_deadline)], {"j": INP}, 100.0
    )
    assert [(r.cls, r.deadline) for r in raised] == [(INP, inpatient_deadline)]
    _, cleared = tracker.update(
        [Eta("j", 1, 0.0, 400.0, 420.0, outpatient_deadline)], {"j": OUT}, 110.0
    )
    assert [(c.risk.cls, c.risk.deadline) for c in cleared] == [(OUT, outpatient_deadline)]
    assert cleared[0].risk.raised_at == 100.0 and cleared[0].held_s == 10.0


def test_a_standing_risk_follows_the_jobs_class_and_deadline() -> None:
    """Re-prioritised while still at risk: the standing risk (the ops view, the miss's
    lead, the later cleared event) names the class and deadline the job has now."""
    tracker = RiskTracker(MARGIN, CLEAR)
    tracker.update([_eta(DEADLINE - 5)], {"j": OUT}, 100.0)
    tighter = 500.0
    raised, cleared = tracker.update([Eta("j", 0, 0.0, 490.0, 510.0, tighter)], {"j": INP}, 110.0)
    assert (raised, cleared) == ([], [])  # the same risk, still standing
    risk = tracker.get("j")
    assert risk is not None and (risk.cls, risk.deadline) == (INP, tighter)
    assert risk.raised_at == 100.0 and risk.lead_s == tighter - 100.0
    assert [(r.cls, r.deadline) for r in tracker.standing()] == [(INP, tighter)]
    _, cleared = tracker.update([Eta("j", 0, 0.0, 300.0, 320.0, tighter)], {"j": INP}, 120.0)
    assert [(c.risk.cls, c.risk.deadline) for c in cleared] == [(INP, tighter)]

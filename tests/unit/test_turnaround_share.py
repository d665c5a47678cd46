"""Each job's share of the server's wall time (radserve.turnaround.share): known answers."""

from __future__ import annotations

import pytest

from radserve.turnaround.share import BesideMeter, ShareMeter


def test_jobs_running_together_split_the_wall_time_and_the_shares_add_up_to_it() -> None:
    """A runs 0-6, B 2-10: A alone for 2 s, both for 4 s (2 s each), B alone for 4 s."""
    meter = ShareMeter()
    meter.started("a", 0.0, urgent=False)
    meter.started("b", 2.0, urgent=False)
    assert meter.so_far("a", 4.0) == pytest.approx(3.0)  # 2 + 2 / 2
    assert meter.finished("a", 6.0) == pytest.approx(4.0)
    assert meter.finished("b", 10.0) == pytest.approx(6.0)  # 2 + 4: 10 s busy in all


def test_urgent_work_under_urgent_exclusive_holds_routine_jobs() -> None:
    """R runs 0-8, U 2-5: routine work is held while U runs, so U gets those 3 s alone
    and R 2 + 3 s; without the hold they split them."""
    held = ShareMeter(urgent_holds=True)
    shared = ShareMeter(urgent_holds=False)
    for meter in (held, shared):
        meter.started("r", 0.0, urgent=False)
        meter.started("u", 2.0, urgent=True)
    assert held.finished("u", 5.0) == pytest.approx(3.0)
    assert held.finished("r", 8.0) == pytest.approx(5.0)
    assert shared.finished("u", 5.0) == pytest.approx(1.5)
    assert shared.finished("r", 8.0) == pytest.approx(6.5)


def test_idle_time_is_nobodys_and_an_unseen_start_has_no_share() -> None:
    meter = ShareMeter()
    meter.started("a", 0.0, urgent=False)
    assert meter.finished("a", 2.0) == pytest.approx(2.0)
    meter.started("b", 5.0, urgent=False)  # 2-5 s: nothing ran
    assert meter.finished("b", 7.0) == pytest.approx(2.0)
    assert meter.finished("never started", 8.0) is None  # e.g. cancelled while queued
    meter.started("c", 9.0, urgent=False)
    meter.started("c", 9.5, urgent=False)  # a second start event (a retry) changes nothing
    assert meter.finished("c", 10.0) == pytest.approx(1.0)


def test_shares_of_runs_split_each_stretch_among_the_runs_in_it() -> None:
    """a 0-6, b 2-10, u (URGENT) 3-4 holding the routine ones: a 2 + 1 / 2 + 2 / 2 = 3.5,
    b 1 / 2 + 2 / 2 + 4 = 5.5, u 1; together the busy 10 s."""
    from radserve.turnaround.share import shares_of_runs

    runs = [("a", 0.0, 6.0, False), ("b", 2.0, 10.0, False), ("u", 3.0, 4.0, True)]
    shares = shares_of_runs(runs, urgent_holds=True)
    assert shares == pytest.approx({"a": 3.5, "b": 5.5, "u": 1.0})
    assert sum(shares.values()) == pytest.approx(10.0)
    # without the hold the URGENT stretch is split three ways
    assert shares_of_runs(runs, urgent_holds=False)["u"] == pytest.approx(1 / 3)


def test_the_beside_meter_counts_what_later_jobs_ranked_with_or_behind_took_of_a_run() -> None:
    """INPATIENT A runs 0-10. OUTPATIENT B (queued at 1) runs 2-6, INPATIENT C (queued
    at 3) from 4 on, OUTPATIENT E is queued at 7 and never starts. The wall time split:
    B 1 + 2/3 s, C 2/3 + 2 s by A's end, 13/3 s beside A in all: 13/6 per job started
    beside it, 13/9 per arrival during its run. B's own run had nothing ranked with or
    behind it start (C ranks ahead), nor did the URGENT job's, which is not counted."""
    shares = ShareMeter()
    meters = {per: BesideMeter(per=per) for per in ("start", "arrival")}
    events = [
        (0.0, "start", "a", 1), (1.0, "queued", "b", 2), (2.0, "start", "b", 2),
        (3.0, "queued", "c", 1), (4.0, "start", "c", 1), (6.0, "end", "b", 2),
        (7.0, "queued", "e", 2), (10.0, "end", "a", 1),
    ]  # fmt: skip
    for at, kind, job, cls in events:
        for meter in meters.values():
            if kind == "queued":
                meter.arrived(cls)
        if kind == "start":
            shares.started(job, at, urgent=False)
            for meter in meters.values():
                meter.started(job, cls)
        elif kind == "end":
            share = shares.finished(job, at)
            for meter in meters.values():
                meter.finished(job, share, lambda k, at=at: shares.so_far(k, at))
    assert meters["start"].mean_s() == pytest.approx(13 / 3 / 2)
    assert meters["arrival"].mean_s() == pytest.approx(13 / 3 / 3)
    urgent = BesideMeter()
    urgent.started("u", 0)
    urgent.started("r", 2)
    urgent.finished("u", 3.0, lambda _: None)
    assert urgent.mean_s() is None  # nothing ended beside which a job could start

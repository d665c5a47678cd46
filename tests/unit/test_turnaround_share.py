"""Each job's share of the server's wall time (radserve.turnaround.share): known answers."""

from __future__ import annotations

import pytest

from radserve.turnaround.share import ShareMeter


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

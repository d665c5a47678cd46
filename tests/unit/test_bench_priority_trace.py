"""The priority bench's account of an URGENT job's window: its own units' time, the gaps
between them, and the routine work beside it (synthetic traces, no timing)."""

from __future__ import annotations

import pytest

from radserve.bench.priority_trace import Unit, urgent_breakdown


def test_window_cut_into_own_units_and_gaps_with_the_routine_work_beside() -> None:
    trace = [
        Unit("ingest", ("r1",), 0.0, 12.0),  # routine ingest straddling the window
        Unit("device batch", ("r2",), 9.0, 11.0),  # on the device when u arrived
        Unit("ingest", ("u",), 10.0, 12.0),
        Unit("prepare", ("u",), 11.5, 12.5),  # overlaps its own ingest: counted once
        Unit("device batch", ("u", "r3"), 13.0, 14.0),  # waited 0.5 s for the device
        Unit("report", ("u",), 14.0, 15.0),
        Unit("report", ("r4",), 14.5, 16.0),  # started inside the window
    ]
    b = urgent_breakdown(trace, "u", 10.0, 15.0, pauses=[(10.5, 11.5), (20.0, 21.0)])
    assert b["window_s"] == pytest.approx(5.0)
    assert b["busy_s"] == pytest.approx(4.5) and b["gap_s"] == pytest.approx(0.5)
    assert b["first_unit_after_s"] == pytest.approx(0.0)
    assert b["own_units_s"] == pytest.approx(
        {"ingest": 2.0, "prepare": 1.0, "device batch": 1.0, "report": 1.0}
    )
    assert b["routine_beside_s"] == pytest.approx(
        {"ingest": 2.0, "device batch": 1.0, "report": 0.5}
    )
    assert b["routine_in_gaps_s"] == pytest.approx(
        {"ingest": 0.0, "device batch": 0.0, "report": 0.0}
    )
    assert b["routine_paused_s"] == pytest.approx(1.0)
    assert b["routine_units_started_inside"] == 1
    assert b["routine_seconds_started_inside"] == pytest.approx(0.5)


def test_a_wait_for_the_device_shows_as_a_gap_beside_the_routine_batch() -> None:
    trace = [
        Unit("device batch", ("r",), 0.0, 3.0),
        Unit("prepare", ("u",), 1.0, 1.5),
        Unit("device batch", ("u",), 3.0, 4.0),
    ]
    b = urgent_breakdown(trace, "u", 1.0, 4.0)
    assert b["gap_s"] == pytest.approx(1.5)
    assert b["routine_in_gaps_s"] == pytest.approx({"device batch": 1.5})
    assert b["routine_paused_s"] == 0

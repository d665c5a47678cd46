"""``tools/eta_drain_signals.py`` (docs/history/turnaround.md, session 39): its signals of
whether the server drains its queue, and its patch of the overtaking window, on a kept
sustainable-load trace: without a signal it replays the server's walk, cut at every walk
it reproduces session 37's figure, and the server's functions are back after it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.factories.eta_traces import TRACES

from radserve.bench.eta_accuracy import read_summary
from radserve.turnaround import eta, replay
from radserve.turnaround.eta import Arrivals, Capacity, Entry
from radserve.turnaround.service_time import JobEstimate

TOOLS = Path(__file__).resolve().parents[2] / "tools"
TRACE = TRACES / "eta-quiet-xeon-d62e8a9-progress-load1-s3.json.gz"
ESTIMATE = JobEstimate(1.0, 0.5, 2.0, 0.1, "test", 1.5)  # share 1.5 s, run 2 s
CAPACITY = Capacity(arrivals=(Arrivals(1, 0.5, ESTIMATE),))


@pytest.fixture(scope="module")
def tool() -> Any:
    spec = importlib.util.spec_from_file_location(
        "eta_drain_signals", TOOLS / "eta_drain_signals.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["eta_drain_signals"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _queued(n: int) -> list[Entry]:
    return [Entry(f"q{i}", 2, False, 1e6, None, ESTIMATE) for i in range(n)]


@pytest.mark.parametrize(
    ("kind", "queues", "expected"),
    [
        # one more queued job (1.5 s of share) per second: the backlog grows 1.5 s per s
        ("btrend", [1, 2, 3, 4], 1.5),
        ("trend", [1, 2, 3, 4], 1.0),
        ("btrend", [4, 4, 4, 4], 0.0),
        # a job queued at 0, 1 and 3 s out of 4: 3 of the last 4 s (window 4 s)
        ("busy", [1, 1, 0, 1], 0.75),
        # the counted load: 0.5 arrivals per s x a 1.5 s share
        ("load", [1, 1, 1, 1], 0.75),
    ],
)
def test_each_signal_reads_what_the_walks_show(
    tool: Any, kind: str, queues: list[int], expected: float
) -> None:
    signal = tool.DrainSignal(kind=kind, window_s=4.0)
    for at, n in enumerate(queues):
        signal.observe(float(at), _queued(n), CAPACITY)
    assert signal.value(4.0 if kind == "busy" else 3.0) == pytest.approx(expected)


def test_a_signal_at_or_under_its_threshold_cuts_the_window(tool: Any) -> None:
    signal = tool.DrainSignal(kind="btrend", window_s=60.0, lo=0.2, hi=0.2)
    assert signal.weight(0.0) == 0.0  # no history yet: the whole horizon
    for at in range(3):
        signal.observe(float(at), _queued(4), CAPACITY)
    assert signal.weight(2.0) == 1.0  # a flat backlog: cut
    for at in range(3, 6):
        signal.observe(float(at), _queued(4 + at), CAPACITY)
    assert signal.weight(5.0) == 0.0  # a growing one: the whole horizon


def test_the_window_cut_reproduces_session_37_and_leaves_the_server_as_it_was(
    tool: Any,
) -> None:
    traces = {TRACE: read_summary(TRACE)}
    server = tool.run(traces, None)[TRACE]["sub"]
    cut = tool.run(traces, {"kind": "always"})[TRACE]["sub"]
    # the server's walk replayed (docs/history/turnaround.md, session 37's table: 48.7 %),
    # and cut at each job's predicted start plus its run: 20.8 %
    assert server == pytest.approx(0.487, abs=0.001)
    assert cut == pytest.approx(0.208, abs=0.001)
    assert eta.overtaking_window is tool._SERVER_WINDOW
    assert replay.walk is eta.walk

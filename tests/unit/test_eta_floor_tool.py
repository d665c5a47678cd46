"""``tools/eta_floor.py`` (docs/history/turnaround.md, session 14) on a kept Zen 4 trace:
its predictor, told every present job's work as spent, is exact when also told the
arrivals that came, gives the present work alone when nothing arrives, and its
weighted median is the prediction with the least mean relative error."""

from __future__ import annotations

import importlib.util
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tests.factories.eta_traces import TRACES

from radserve.bench.eta_accuracy import read_summary

TOOLS = Path(__file__).resolve().parents[2] / "tools"
TRACE = TRACES / "eta-quiet-zen4-7130cc0-s1.json.gz"


@pytest.fixture(scope="module")
def tool() -> Any:
    sys.path.insert(0, str(TOOLS))  # it reuses tools/eta_decompose.py's loaders
    try:
        spec = importlib.util.spec_from_file_location("eta_floor", TOOLS / "eta_floor.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["eta_floor"] = module  # its dataclasses look their module up
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(TOOLS))


@pytest.fixture(scope="module")
def summary() -> dict[str, Any]:
    return read_summary(TRACE)


def test_told_the_arrivals_that_came_it_beats_the_server(tool: Any, summary: Any) -> None:
    deep = tool.deep_jobs(summary)
    assert len(deep) == 15  # as tests/unit/test_turnaround_zen4_traces.py counts them
    for d in deep:  # the shares of the present jobs and the later ones add up to the TAT
        assert d.known + sum(spent for *_, spent in d.came) == pytest.approx(d.tat, abs=1e-6)
    came = [abs(tool.finish_given(d, d.known, tool.as_they_came(d)) - d.tat) / d.tat for d in deep]
    as_run = statistics.median(abs(d.as_run) for d in deep)
    assert as_run == pytest.approx(0.325, abs=0.002)
    assert statistics.median(came) < 0.01 < as_run


def test_with_no_arrivals_the_monte_carlo_is_the_present_work(tool: Any, summary: Any) -> None:
    deep = tool.deep_jobs(summary)
    stream = tool.stream_of(summary, deep)
    assert sum(stream.rates) == pytest.approx(1 / summary["mean_gap_s"])
    rng = np.random.default_rng(0)
    for d in deep:
        quiet = tool.monte_carlo(d, d.known, stream.without_arrivals(), 50, rng)
        assert np.all(quiet == d.known)
        busy = tool.monte_carlo(d, d.known, stream, 50, rng)
        assert np.all(busy >= d.known) and busy.mean() > d.known


def test_the_weighted_median_has_the_least_mean_relative_error(tool: Any) -> None:
    draws = np.random.default_rng(1).lognormal(2.0, 0.6, 301)
    best = tool.weighted_median(draws)

    def loss(p: float) -> float:
        return float(np.mean(np.abs(p - draws) / draws))

    grid = np.linspace(draws.min(), draws.max(), 2001)
    assert loss(best) <= min(loss(p) for p in grid) + 1e-9
    assert best < float(np.median(draws))  # relative error weighs the short ones more

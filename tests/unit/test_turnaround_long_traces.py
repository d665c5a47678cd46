"""The ETA walk replayed on session 41's long recordings: a quiet Zen 5 host (AMD EPYC
family 26), ``radserve bench --scenario eta --load 1.0 --studies 160`` and ``--load 1.5
--studies 120``, seeds 0-2 (``tests/data/eta-traces/eta-long-zen5-3736813-*``), streams
of 3-4 minutes whose deep jobs come mostly after the bench's lead-in.

Deterministic (:mod:`radserve.turnaround.replay`): a regression check of the figures in
docs/history/turnaround.md "Session 41", not a measurement of time. On these streams the
server's ETAs at submission are early on every run, and the goal (median error of the
jobs queued behind >= 3 others <= 20 %) is met on one of six; session 14's allowance for
the later arrivals that run beside a job (``beside="start"``) takes the three
sustainable-load runs from 30-37 % to 19-30 % and leaves the overloaded ones as they
were, but replays the 34 short traces at a median of 31.5 % (21.3 % without it), so it
stays a replay variant.
"""

from __future__ import annotations

import dataclasses

import pytest
from tests.factories.eta_traces import behind_3

from radserve.turnaround.replay import SERVER_WALK

BESIDE = dataclasses.replace(SERVER_WALK, beside="start")


@pytest.mark.parametrize(
    ("name", "jobs", "server", "bias", "beside"),
    [
        ("long-zen5-3736813-load1-s0", 50, 0.3305, -0.2568, 0.2191),
        ("long-zen5-3736813-load1-s1", 39, 0.3024, -0.2171, 0.1862),
        ("long-zen5-3736813-load1-s2", 58, 0.3705, -0.2178, 0.2997),
        ("long-zen5-3736813-s0", 76, 0.1853, -0.1473, 0.1861),
        ("long-zen5-3736813-s1", 67, 0.3346, -0.2109, 0.3248),
        ("long-zen5-3736813-s2", 81, 0.3789, -0.2738, 0.3946),
    ],
)
def test_the_long_traces_replay_to_the_figures_measured(
    name: str, jobs: int, server: float, bias: float, beside: float
) -> None:
    walked = behind_3(name, SERVER_WALK)
    assert walked["jobs"] == jobs
    assert walked["median_rel"] == pytest.approx(server, abs=0.002)
    assert walked["median_signed_rel"] == pytest.approx(bias, abs=0.002)
    assert bias < -0.1  # early on every long run
    with_beside = behind_3(name, BESIDE)
    assert with_beside["median_rel"] == pytest.approx(beside, abs=0.002)
    # the allowance beside removes part of the bias, never all of it
    assert bias < with_beside["median_signed_rel"] < 0.0

"""The ETA walk replayed on the four quiet traces of a Zen 4 host (session 12's 2bd52b1
and session 13's 7130cc0, seeds 0 and 1, ``radserve bench --scenario eta --studies 24``,
kept in ``tests/data/eta-traces/``), and on the Zen 5 quiet traces (5cb504f) beside them.

Deterministic (:mod:`radserve.turnaround.replay`): a regression check of the walk, not a
measurement of time. The goal (median error at submission of jobs queued behind >= 3
others <= 20 %) is missed on these traces with the tree's defaults, the ETAs early; the
shares of the jobs ahead learned per class (``Refit.class_shares``, session 13) help on
two of the four and cost a Zen 5 trace its goal, so they stay a replay variant
(docs/history/turnaround.md, session 13). So does session 14's allowance for the later
arrivals ranked with or behind a job that run beside it (``Variant.beside``): it lowers
two of these six traces and raises the other four, 5cb504f-s1 past the goal.
"""

from __future__ import annotations

import pytest
from tests.factories.eta_traces import behind_3

from radserve.turnaround.rates import ArrivalRates
from radserve.turnaround.replay import Refit, Variant

PER_CLASS = Variant(refit=Refit(lanes="exclusive", shares=True, class_shares=5))
BESIDE = Variant(beside="arrival")


@pytest.mark.parametrize(
    ("name", "jobs", "as_run", "per_class", "beside"),
    [
        ("quiet-zen4-2bd52b1-s0", 12, 0.2830, 0.2320, 0.2500),
        ("quiet-zen4-2bd52b1-s1", 16, 0.2617, 0.2617, 0.4420),
        ("quiet-zen4-7130cc0-s0", 12, 0.3320, 0.1910, 0.3330),
        ("quiet-zen4-7130cc0-s1", 15, 0.3250, 0.3250, 0.4110),
        ("quiet-5cb504f-s0", 13, 0.1820, 0.1500, 0.0940),
        ("quiet-5cb504f-s1", 14, 0.1880, 0.2060, 0.4360),
    ],
)
def test_the_quiet_traces_replay_to_the_figures_measured(
    name: str, jobs: int, as_run: float, per_class: float, beside: float
) -> None:
    recorded = behind_3(name, Variant())
    assert recorded["jobs"] == jobs
    # as the server ran (these recordings are of this walk: share left, rates since the
    # first arrival); the bench's own tables said 28.3, 26.1, 33.2, 32.5, 18.2, 18.8 %
    assert recorded["median_rel"] == pytest.approx(as_run, abs=0.002)
    assert behind_3(name, PER_CLASS)["median_rel"] == pytest.approx(per_class, abs=0.002)
    assert behind_3(name, BESIDE)["median_rel"] == pytest.approx(beside, abs=0.002)


def test_the_zen4_etas_are_early() -> None:
    for name in ("quiet-zen4-2bd52b1-s0", "quiet-zen4-2bd52b1-s1", "quiet-zen4-7130cc0-s0"):
        assert behind_3(name, Variant())["median_signed_rel"] < -0.1


def _under_posterior(rule: str) -> Variant:
    """(c) with the allowance under the counted rates' Gamma posteriors (session 15):
    ``posterior``, its median; ``mean``, its mean (Capacity.rate_posterior)."""
    return Variant(
        drain=False,
        capacity=(("share_left", "measured"), ("rate_posterior", rule)),
        rates=ArrivalRates(),
        refit=Refit(lanes="exclusive", shares=True, class_shares=5),
    )


@pytest.mark.parametrize(
    ("name", "median", "mean"),
    [("quiet-zen4-7130cc0-s1", 0.2700, 0.3630), ("quiet-5cb504f-s1", 0.2560, 0.1980)],
)
def test_the_allowance_under_the_rates_posterior_replays_to_the_figures_measured(
    name: str, median: float, mean: float
) -> None:
    """Not the default: the posterior's median makes these traces' ETAs earlier than
    (c)'s 32.5 / 20.6 % (every job, not only the cold start's late ones), its mean
    later (docs/history/turnaround.md, session 15 cont.)."""
    under_median = behind_3(name, _under_posterior("posterior"))
    assert under_median["median_rel"] == pytest.approx(median, abs=0.002)
    assert under_median["median_signed_rel"] < -0.05
    assert behind_3(name, _under_posterior("mean"))["median_rel"] == pytest.approx(mean, abs=0.002)


CALIBRATED = Variant(bias="class")  # the online bias correction per class (session 16)
RUNNING_SHARES = Variant(present="running", present_rule=(("by", "all"),))


@pytest.mark.parametrize(
    ("name", "as_run", "calibrated", "running_shares"),
    [
        ("quiet-zen4-2fee6cf-s1", 0.4213, 0.3371, 0.4213),
        ("quiet-5cb504f-s0", 0.1823, 0.3204, 0.2059),
    ],
)
def test_an_online_calibration_by_the_finished_jobs_replays_to_the_figures_measured(
    name: str, as_run: float, calibrated: float, running_shares: float
) -> None:
    """Not the default (docs/history/turnaround.md, session 16): the finished jobs'
    actual / predicted time to finish does not predict a deep job's own, so the class
    factor mends only part of 2fee6cf-s1's early ETAs (bias -41 %) and takes a Zen 5
    trace past the goal, early; the running jobs' shares scaled by the finished jobs'
    actual / estimated share change little."""
    assert behind_3(name, Variant())["median_rel"] == pytest.approx(as_run, abs=0.002)
    corrected = behind_3(name, CALIBRATED)
    assert corrected["median_rel"] == pytest.approx(calibrated, abs=0.002)
    assert corrected["median_signed_rel"] < 0
    shares = behind_3(name, RUNNING_SHARES)["median_rel"]
    assert shares == pytest.approx(running_shares, abs=0.002)

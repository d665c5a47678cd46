"""Arrival rates per class for the ETA walk's allowance (radserve.turnaround.rates)."""

from __future__ import annotations

import pytest

from radserve.turnaround.rates import ArrivalRates


def test_nothing_arrived_gives_no_rates() -> None:
    rates = ArrivalRates()
    assert rates.rates(100.0) == {}
    assert rates.span(100.0) is None


def test_rates_count_from_the_first_arrival_not_from_the_start() -> None:
    """A server started at 0 that saw its first arrival at 300 s: 10 arrivals of class 0
    in the 20 s since are 0.5 a second (counted since start, 0.03)."""
    rates = ArrivalRates(prior_arrivals=0.0)
    rates.extend((0, 300.0 + 2.0 * i) for i in range(10))
    assert rates.rates(320.0) == {0: pytest.approx(10 / 20)}


def test_a_young_span_has_a_floor_and_every_class_a_pseudo_arrival() -> None:
    rates = ArrivalRates(min_span_s=10.0, prior_arrivals=1.0)
    rates.arrived(2, 50.0)
    rates.arrived(2, 51.0)
    # 1 s since the first arrival: over the 10 s floor; a class not seen may still come
    assert rates.rates(51.0) == {0: 0.1, 1: 0.1, 2: pytest.approx(0.3)}


def test_an_hour_old_server_counts_the_last_hour_and_the_prior_fades() -> None:
    rates = ArrivalRates(window_s=3600.0, prior_arrivals=1.0)
    rates.extend((1, float(t)) for t in range(0, 7200, 60))  # one a minute for two hours
    got = rates.rates(7200.0)
    assert got[1] == pytest.approx(61 / 3600)  # the last hour's 60 (and the one at 3600 s)
    assert got[0] == pytest.approx(1 / 3600)
    assert rates.seen()[0] == (1, 3600.0)  # older arrivals were dropped


def test_the_posterior_is_the_count_and_the_prior_over_the_span() -> None:
    """Each class's rate as a Gamma posterior: shape = arrivals + prior, rate = span; its
    mean is the point rate, and a class not seen yet has shape 1 (an exponential)."""
    rates = ArrivalRates(min_span_s=10.0, prior_arrivals=1.0)
    rates.extend((1, 100.0 + i) for i in range(6))  # six INPATIENT in 5 s
    assert rates.posterior(105.0) == {0: (1.0, 10.0), 1: (7.0, 10.0), 2: (1.0, 10.0)}
    assert rates.rates(105.0) == {0: 0.1, 1: pytest.approx(0.7), 2: 0.1}
    assert ArrivalRates().posterior(5.0) == {}


def test_pooled_rates_shrink_each_class_towards_the_mean_class_rate() -> None:
    """``pool_s`` seconds of pseudo-observation at the mean class rate: six INPATIENT and
    no other arrivals in a 10 s span are 0.6 a second counted, 0.2 per class pooled; 10 s
    of pooling takes INPATIENT to (6 + 2) / 20 and the others to 2 / 20."""
    rates = ArrivalRates(min_span_s=10.0, prior_arrivals=0.0, pool_s=10.0)
    rates.extend((1, 100.0 + i) for i in range(6))
    assert rates.posterior(110.0) == {
        0: (pytest.approx(2.0), 20.0),
        1: (pytest.approx(8.0), 20.0),
        2: (pytest.approx(2.0), 20.0),
    }


def test_pooling_the_routine_classes_leaves_urgent_on_its_own() -> None:
    """``pooled=(1, 2)``: INPATIENT and OUTPATIENT shrink towards their mean (six and
    none in 10 s: 0.3 a second each), URGENT keeps its own count over the span."""
    rates = ArrivalRates(min_span_s=10.0, prior_arrivals=0.0, pool_s=10.0, pooled=(1, 2))
    rates.extend((1, 100.0 + i) for i in range(6))
    assert rates.posterior(110.0) == {
        1: (pytest.approx(9.0), 20.0),
        2: (pytest.approx(3.0), 20.0),
    }

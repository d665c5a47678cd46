"""Replay the ETAs of saved ``radserve bench --scenario eta --json`` runs offline
(radserve.turnaround.replay): the server's recorded walks again under each variant of
the allowance, the bias correction, the drain rate and the service-time model (refitted
from the recorded ends: window, recency half-life, latency lanes), the walk's options
(a running job's share left, the running jobs ranked behind) and the arrival rates
counted again (session 11), the shares of the jobs ahead per class
(session 13), the later arrivals that run beside a job (session 14), an online
calibration by the finished jobs' actual / predicted times (session 16), a host speed
factor from the finished jobs' service times and the band's coverage (session 18), the
deadline-risk events each variant would raise (session 19: misses predicted ahead, how
early, false alerts; the server's margins), errors over the measured jobs only;
``--variant NAME`` (repeatable) replays only those. Several files: one row per file
and variant, then the median over the files at submission and halfway, and how often
the band's late end held the finish.

    PYTHONPATH=src python tools/eta_replay.py out/eta-seed0.json out/eta-seed1.json
"""

from __future__ import annotations

import argparse
import math
import statistics
from pathlib import Path
from typing import Any

from radserve.bench.eta_accuracy import arrivals_before, read_summary
from radserve.turnaround.bias import KEYS, LEARN, STATISTICS
from radserve.turnaround.rates import ArrivalRates
from radserve.turnaround.replay import (
    SERVER_WALK,
    Refit,
    Speed,
    Variant,
    deadline_alerts,
    errors,
    replay,
)

# "allowance, no bias" (no drain, the model as the server had it) replays the server's
# defaults of the recording; the "refit" rows rebuild the service-time model from the
# one the recording began with and the recorded ends under other settings (session 9)
SESSION_10_WALK = (
    ("share_left", "latency"),
    ("running_behind", False),
    ("chain_allowance", "always"),
)
SESSION_11_WALK = (
    ("share_left", "measured"),
    ("running_behind", False),
    ("chain_allowance", "always"),
)
WITH_RUNNING_BEHIND = (
    ("share_left", "measured"),
    ("running_behind", True),
    ("chain_allowance", "always"),
)
POSTERIOR = (("rate_posterior", "posterior"),)
POSTERIOR_MEAN = (("rate_posterior", "mean"),)
PER_CLASS = Refit(lanes="exclusive", shares=True, class_shares=5)


def _server(
    walk: tuple[tuple[str, Any], ...] = SESSION_11_WALK,
    refit: Refit | None = None,
    beside: str = "",
    calibration: tuple[tuple[str, Any], ...] | None = None,
    present: tuple[str, tuple[tuple[str, Any], ...]] = ("", ()),
) -> Variant:
    """The server's walk since session 11 (rates since the first arrival) with ``walk``'s
    options, the model refitted by ``refit``, the allowance beside (``beside``), the
    online bias correction's ``calibration`` (None: off) and the present work's
    (``present``: scope and rule)."""
    return Variant(
        drain=False,
        capacity=walk,
        rates=ArrivalRates(),
        refit=refit,
        beside=beside,
        bias="off" if calibration is None else "class",
        calibration=calibration or (),
        present=present[0],
        present_rule=present[1],
    )


VARIANTS = {
    "allowance, class bias": Variant(allowance=True, bias="class", drain=False),
    "allowance, no bias": Variant(allowance=True, bias="off", drain=False),
    "allowance, depth bias": Variant(allowance=True, bias="depth", drain=False),
    "no allowance, no bias": Variant(allowance=False, bias="off", drain=False),
    "drain, allowance, no bias": Variant(allowance=True, bias="off", drain=True),
    "drain, allowance, class bias": Variant(allowance=True, bias="class", drain=True),
    "drain, no allowance, no bias": Variant(allowance=False, bias="off", drain=True),
    "refit 200 (session 8's model)": Variant(drain=False, refit=Refit()),
    "refit 20": Variant(drain=False, refit=Refit(window=20)),
    "refit 50, half-life 20": Variant(drain=False, refit=Refit(50, 20)),
    "refit lanes class": Variant(drain=False, refit=Refit(lanes="class")),
    "refit lanes exclusive": Variant(drain=False, refit=Refit(lanes="exclusive")),
    "refit 50, hl 20, lanes class": Variant(drain=False, refit=Refit(50, 20, "class")),
    "refit 50, hl 20, lanes exclusive": Variant(drain=False, refit=Refit(50, 20, "exclusive")),
    # session 10: the throughput bound from each job's measured share of wall time
    "refit lanes exclusive, shares": Variant(
        drain=False, refit=Refit(lanes="exclusive", shares=True)
    ),
    "refit lanes exclusive, shares, no allowance": Variant(
        allowance=False, drain=False, refit=Refit(lanes="exclusive", shares=True)
    ),
    "refit lanes exclusive, shares, drain": Variant(
        drain=True, refit=Refit(lanes="exclusive", shares=True)
    ),
    "refit 50, lanes exclusive, shares": Variant(
        drain=False, refit=Refit(50, 0, "exclusive", shares=True)
    ),
    # session 11: a running job's share left as measured, the running jobs ranked behind
    # a queued one, the arrival rates since the first arrival (counted again: a trace
    # recorded before session 11 has the old rates)
    "session 10's walk": Variant(drain=False, capacity=SESSION_10_WALK),
    "share left": Variant(drain=False, capacity=SESSION_11_WALK),
    "share left, running behind": Variant(drain=False, capacity=WITH_RUNNING_BEHIND),
    "rates since first arrival": Variant(
        drain=False, capacity=SESSION_10_WALK, rates=ArrivalRates()
    ),
    "session 11": Variant(drain=False, capacity=SESSION_11_WALK, rates=ArrivalRates()),
    # session 32: no allowance on the latency chain of a job that starts at once
    # (Capacity.chain_allowance: waiting)
    # (its name as session 32 ran it: the default then)
    "session 32 (default)": Variant(
        drain=False,
        capacity=(*SESSION_11_WALK[:2], ("chain_allowance", "waiting"), ("queued_ahead", "all")),
        rates=ArrivalRates(),
    ),
    # session 36: a running job is not charged the queued jobs ranked ahead of it that
    # wait for its own slot (Capacity.queued_ahead: other_slots)
    "session 36 (default)": SERVER_WALK,
    "session 11, running behind": Variant(
        drain=False, capacity=WITH_RUNNING_BEHIND, rates=ArrivalRates()
    ),
    "session 11, rates without prior": Variant(
        drain=False, capacity=SESSION_11_WALK, rates=ArrivalRates(prior_arrivals=0.0)
    ),
    "session 11, rates from 60 s": Variant(
        drain=False, capacity=SESSION_11_WALK, rates=ArrivalRates(min_span_s=60.0)
    ),
    # session 13: the shares of the jobs ahead learned per class (once a class has 5 jobs;
    # an OUTPATIENT job running beside INPATIENT work is charged wall time it waits through)
    "session 13, shares per class ahead": Variant(
        drain=False,
        capacity=SESSION_11_WALK,
        rates=ArrivalRates(),
        refit=Refit(lanes="exclusive", shares=True, class_shares=5),
    ),
    # session 14: the later arrivals ranked with or behind a job that run beside it once
    # it starts (Capacity.beside_s from the BesideMeter: the wall time per job started
    # beside, or per arrival during the run), alone and with the running jobs ranked
    # behind and the shares per class ahead
    "session 14, beside": _server(beside="start"),
    "session 14, beside per arrival": _server(beside="arrival"),
    "session 14, beside, running behind": _server(WITH_RUNNING_BEHIND, beside="start"),
    "session 14, beside per arrival, running behind": _server(
        WITH_RUNNING_BEHIND, beside="arrival"
    ),
    "session 14, beside, per class": _server(refit=PER_CLASS, beside="start"),
    "session 14, beside per arrival, per class": _server(refit=PER_CLASS, beside="arrival"),
    "session 14, running behind, per class": _server(WITH_RUNNING_BEHIND, PER_CLASS),
    "session 14, beside, behind, per class": _server(WITH_RUNNING_BEHIND, PER_CLASS, "start"),
    # session 15: (c) with the rates counted over at least 30 s, or without the prior
    # pseudo-arrival (the cold start's rates decide the first deep jobs' errors)
    "session 15, per class, rates over 30 s": Variant(
        drain=False, capacity=SESSION_11_WALK, rates=ArrivalRates(min_span_s=30.0), refit=PER_CLASS
    ),
    "session 15, per class, rates without prior": Variant(
        drain=False,
        capacity=SESSION_11_WALK,
        rates=ArrivalRates(prior_arrivals=0.0),
        refit=PER_CLASS,
    ),
    # session 15 (cont.): the allowance under the rates' Gamma posteriors (its median: a
    # class counted from few arrivals is an uncertain rate), with (c), the running jobs
    # ranked behind, the later arrivals beside
    "session 15, rate posterior": _server(SESSION_11_WALK + POSTERIOR),
    "session 15, rate posterior, per class": _server(SESSION_11_WALK + POSTERIOR, PER_CLASS),
    "session 15, rate posterior, per class, behind": _server(
        WITH_RUNNING_BEHIND + POSTERIOR, PER_CLASS
    ),
    "session 15, rate posterior, per class, beside": _server(
        SESSION_11_WALK + POSTERIOR, PER_CLASS, "start"
    ),
    "session 15, rate posterior, per class, behind, beside": _server(
        WITH_RUNNING_BEHIND + POSTERIOR, PER_CLASS, "start"
    ),
    "session 15, rate posterior mean": _server(SESSION_11_WALK + POSTERIOR_MEAN),
    "session 15, rate posterior mean, per class": _server(
        SESSION_11_WALK + POSTERIOR_MEAN, PER_CLASS
    ),
    "session 15, rate posterior mean, per class, behind": _server(
        WITH_RUNNING_BEHIND + POSTERIOR_MEAN, PER_CLASS
    ),
    "session 15, rate posterior mean, per class, beside": _server(
        SESSION_11_WALK + POSTERIOR_MEAN, PER_CLASS, "start"
    ),
    # session 15 (cont.): each class's rate shrunk towards the mean class rate
    # (ArrivalRates.pool_s seconds of pseudo-observation), with (c)
    **{
        f"session 15, per class, rates pooled {pool:.0f} s": Variant(
            drain=False,
            capacity=SESSION_11_WALK,
            rates=ArrivalRates(pool_s=pool),
            refit=PER_CLASS,
        )
        for pool in (15.0, 30.0, 60.0, 120.0)
    },
    **{
        f"session 15, per class, routine rates pooled {pool:.0f} s": Variant(
            drain=False,
            capacity=SESSION_11_WALK,
            rates=ArrivalRates(pool_s=pool, pooled=(1, 2)),
            refit=PER_CLASS,
        )
        for pool in (15.0, 30.0, 60.0)
    },
    # session 16: an online multiplicative calibration of the server's walk, learned from
    # the finished jobs' actual / predicted time to finish (radserve.turnaround.bias:
    # keyed by class, one for all, queue-depth band, class and depth band, or band of the
    # predicted time to finish; learned from each job's first reading or its first under
    # each key; median or mean of the log-ratios), and the present work's shares scaled
    # by the finished jobs' actual / estimated share (the running jobs', or every job's)
    **{
        f"session 16, bias {by} {learn} {statistic}": _server(
            calibration=(("by", by), ("learn", learn), ("statistic", statistic))
        )
        for by in KEYS
        for learn in LEARN
        for statistic in STATISTICS
        if learn == "first" or by not in ("class", "all")  # one key per job: the same
    },
    **{
        f"session 16, present {scope} {by} {statistic}": _server(
            present=(scope, (("by", by), ("statistic", statistic)))
        )
        for scope in ("running", "all")
        for by in ("class", "all")
        for statistic in STATISTICS
    },
    # session 18: the estimates scaled by the host's recent speed, learned from the last
    # finished jobs' run (start to finish) over the run predicted at their start (service
    # times only, not turnarounds): one factor or one per latency lane, applied to the
    # queued and running jobs, or to the expected arrivals too
    **{
        f"session 18, speed {measure} {window} {per} {scope}": Variant(
            drain=False,
            capacity=SESSION_11_WALK,
            rates=ArrivalRates(),
            speed=Speed(window=window, per=per, scope=scope, measure=measure),
        )
        for measure in ("run", "stages")
        for window in (3, 5, 10, 20)
        for per in ("all", "lane", "alone")
        for scope in ("work", "all")
    },
    # session 18: the band (predicted_finish_late) also counts the noise of the work
    # ranked ahead (Capacity.band: ahead); the finish itself is unchanged
    "session 18, band ahead": _server((*SESSION_11_WALK, ("band", "ahead"))),
    # session 30: a running job's share left by its work left (its stage seconds so far,
    # recorded since session 30: on older traces it falls back on the share it has had)
    "session 30, share left by progress": Variant(
        drain=False,
        capacity=(("share_left", "progress"), ("running_behind", False)),
        rates=ArrivalRates(),
    ),
    # session 18: the band as a quantile of the finished jobs' actual / predicted time to
    # finish (split conformal), over the last 10 or 20 jobs
    **{
        f"session 18, conformal band q{quantile:.2f} last {window}": Variant(
            drain=False,
            capacity=SESSION_11_WALK,
            rates=ArrivalRates(),
            band_quantile=quantile,
            band_window=window,
        )
        for quantile in (0.8, 0.9)
        for window in (10, 20)
    },
}


def evaluate(summary: dict[str, Any], names: list[str] | None = None) -> dict[str, dict[str, Any]]:
    measured = set(summary["measured_ids"])
    # the server's model when the recording began (before session 9: the warm-up's)
    base = summary.get("service_times_at_start", summary.get("service_times_solo"))
    before = arrivals_before(summary)
    out = {}
    for name, variant in VARIANTS.items():
        if (variant.refit is None or base is not None) and (not names or name in names):
            jobs = replay(summary["eta_records"], variant, base, before)
            out[name] = errors(jobs, measured) | {"alerts": deadline_alerts(jobs)}
    return out


def _cell(row: dict[str, Any], point: str) -> tuple[float, float] | None:
    got = row.get(point)
    return None if got is None else (got["median_rel"], got["median_signed_rel"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("summaries", type=Path, nargs="+")
    parser.add_argument(
        "--variant", action="append", choices=list(VARIANTS), help="only these (repeatable)"
    )
    args = parser.parse_args()
    table: dict[str, list[tuple[float, float]]] = {name: [] for name in VARIANTS}
    halfway: dict[str, list[float]] = {name: [] for name in VARIANTS}
    coverage: dict[str, list[tuple[float, int]]] = {name: [] for name in VARIANTS}
    widths: dict[str, list[float]] = {name: [] for name in VARIANTS}
    every_band: dict[str, list[tuple[float, int]]] = {name: [] for name in VARIANTS}
    alerts: dict[str, list[dict[str, Any]]] = {name: [] for name in VARIANTS}
    for path in args.summaries:
        result = evaluate(read_summary(path), args.variant)
        for name, figures in result.items():
            deep, every = figures["behind_3"], figures["all"]
            sub, half, all_sub = (
                _cell(deep, "submission"),
                _cell(deep, "halfway"),
                _cell(every, "submission"),
            )

            def fmt(c: tuple[float, float] | None) -> str:
                return "-" if c is None else f"{c[0]:6.1%} ({c[1]:+.1%})"

            covered = deep.get("late_coverage")
            band = "" if covered is None else f"; p90 band covers {covered:.0%}"
            band += f", width {deep['late_width_rel']:.0%}" if covered is not None else ""
            print(
                f"{path.name:24} {name:30} behind>=3 ({deep['jobs']:2}) at submission "
                f"{fmt(sub)}, halfway {fmt(half)}; all ({every['jobs']}) {fmt(all_sub)}{band}"
            )
            alerts[name].append(figures["alerts"])
            if every.get("late_coverage") is not None:
                every_band[name].append((every["late_coverage"], every["jobs"]))
            if covered is not None:
                coverage[name].append((covered, deep["jobs"]))
                widths[name].append(deep["late_width_rel"])
            if sub is not None:
                table[name].append(sub)
            if half is not None:
                halfway[name].append(half[0])
    if len(args.summaries) > 1:
        for name, cells in table.items():
            if cells:
                median = statistics.median(c[0] for c in cells)
                worst = max(c[0] for c in cells)
                half_median = statistics.median(halfway[name]) if halfway[name] else math.nan
                jobs = sum(n for _, n in coverage[name])
                covered = sum(c * n for c, n in coverage[name]) / jobs if jobs else math.nan
                lowest = min((c for c, _ in coverage[name]), default=math.nan)
                width = statistics.median(widths[name]) if widths[name] else math.nan
                print(
                    f"{name:30} behind>=3 at submission: median over runs {median:.1%}, "
                    f"worst {worst:.1%}; halfway: median {half_median:.1%}; p90 band "
                    f"covers {covered:.0%} of {jobs} jobs (lowest {lowest:.0%}), width {width:.0%}"
                )
                print(f"{'':30} {_band_and_alerts(every_band[name], alerts[name])}")


def _band_and_alerts(band: list[tuple[float, int]], alerts: list[dict[str, Any]]) -> str:
    """All jobs' band coverage and the deadline-risk events, summed over the files."""
    jobs = sum(n for _, n in band)
    covered = sum(c * n for c, n in band) / jobs if jobs else math.nan
    lead = [s for a in alerts for s in a["lead_s"]]
    return (
        f"all jobs: p90 band covers {covered:.1%} of {jobs}; deadline misses "
        f"{sum(a['misses'] for a in alerts)}, predicted ahead "
        f"{sum(a['predicted'] for a in alerts)} (lead median "
        f"{statistics.median(lead) if lead else math.nan:.1f} s, min "
        f"{min(lead, default=math.nan):.1f} s), false alerts "
        f"{sum(a['false_alerts'] for a in alerts)}"
    )


if __name__ == "__main__":
    main()

"""Replay the server's ETA computation offline, on what a run recorded.

The server (``Turnaround.recorder``, set by ``radserve bench --scenario eta``) records
every walk's inputs (its clock, the entries in queue order with their service-time
estimates, the capacity with the arrival rates it saw) and every job's end. ETAs are a
pure function of those inputs plus the online bias correction, which learns only from
the recorded ends, so a variant of the walk or of the correction can be tried on a
recorded trace deterministically, without running the server again: :func:`replay`
walks every recorded snapshot again under a :class:`Variant` and returns each job's ETA
at submission (its first walk) and halfway (the walk nearest the middle of its
turnaround), in the scheduler's clock. The recorded run's own scheduling is kept: a
variant changes the predictions, not what the server did (the default ``risk_policy``
``none`` does not act on ETAs).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from radserve.config import TurnaroundSettings
from radserve.domain.priority import PriorityClass
from radserve.turnaround.bias import BiasCorrection
from radserve.turnaround.conformal import ConformalBand
from radserve.turnaround.drain import DrainMeter
from radserve.turnaround.eta import URGENT, Arrivals, Capacity, Entry, Eta, latency_lane, walk
from radserve.turnaround.host_speed import HostSpeed, Speed
from radserve.turnaround.rates import ArrivalRates
from radserve.turnaround.risk import RiskTracker
from radserve.turnaround.service_time import WINDOW, JobEstimate, ServiceTimeModel, StudySize
from radserve.turnaround.share import BesideMeter, ShareMeter, shares_of_runs

# the walk's options an older recording lacks: what that server did (share_left and
# running_behind came in session 11, chain_allowance in session 32, queued_ahead in 36)
_RECORDED_BEFORE = {
    "share_left": "latency",
    "running_behind": False,
    "chain_allowance": "always",
    "queued_ahead": "all",
}


def walk_record(
    now: float,
    entries: Sequence[Entry],
    capacity: Capacity,
    slices: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """One walk's inputs as JSON-ready data (compact: entries as lists; with ``slices``,
    each job's study size, for a replay that refits the service times; then the
    estimate's share of wall time when it has one, since 2026-12-02 session 10)."""
    sizes = slices or {}
    rows = []
    for e in entries:
        row = [e.job_id, e.cls, e.running, e.deadline, e.started, *_estimate(e.estimate)]
        if e.job_id in sizes or e.estimate.share_s is not None or e.share_so_far is not None:
            row.append(sizes.get(e.job_id))
        if e.estimate.share_s is not None or e.share_so_far is not None:
            row.append(e.estimate.share_s)
        if e.share_so_far is not None:  # since 2026-12-02 session 11
            row.append(e.share_so_far)
        if e.worked_s is not None:  # since 2026-12-05 session 30
            row += [None] * (13 - len(row))
            row.append(e.worked_s)
        rows.append(row)
    return {
        "kind": "walk",
        "at": now,
        "entries": rows,
        "capacity": {
            **{f.name: getattr(capacity, f.name) for f in dataclasses.fields(capacity)},
            "arrivals": [
                [a.cls, a.rate_per_s, *_estimate(a.estimate)]
                + ([] if a.estimate.share_s is None else [a.estimate.share_s])
                for a in capacity.arrivals
            ],
            "tat_s": list(capacity.tat_s),
        },
    }


def _estimate(e: JobEstimate) -> list[Any]:
    return [e.cpu_s, e.device_s, e.latency_s, e.spread_s, e.source]


def _job_estimate(values: Sequence[Any], share: Any = None) -> JobEstimate:
    return JobEstimate(
        *(float(v) for v in values[:4]), str(values[4]), None if share is None else float(share)
    )


def walk_inputs(record: Mapping[str, Any]) -> tuple[float, list[Entry], Capacity]:
    """The inverse of :func:`walk_record`."""
    entries = [
        Entry(
            str(r[0]),
            int(r[1]),
            bool(r[2]),
            float(r[3]),
            r[4],
            _job_estimate(r[5:10], r[11] if len(r) > 11 else None),
            None if len(r) <= 12 or r[12] is None else float(r[12]),
            None if len(r) <= 13 or r[13] is None else float(r[13]),
        )
        for r in record["entries"]
    ]
    raw = dict(record["capacity"])
    raw["arrivals"] = tuple(
        Arrivals(int(a[0]), float(a[1]), _job_estimate(a[2:7], a[7] if len(a) > 7 else None))
        for a in raw["arrivals"]
    )
    raw["tat_s"] = tuple(raw["tat_s"])
    for name, before in _RECORDED_BEFORE.items():  # recorded by a server without them
        raw.setdefault(name, before)
    return float(record["at"]), entries, Capacity(**raw)


@dataclass(frozen=True)
class Refit:
    """A service-time model learned again from the recorded ends: ``window`` jobs per
    key, weighted by recency (``half_life_jobs``, 0: equal weights), with a latency per
    lane (``lanes``: :func:`radserve.turnaround.eta.latency_lane`), and with each job's
    share of wall time (``shares``: as recorded, or measured again from the recorded
    starts and ends for a recording made before the server measured them)."""

    window: int = WINDOW
    half_life_jobs: float = 0.0
    lanes: str = "none"
    shares: bool = False
    # a queued or running job's share from its own class's jobs once that class has this
    # many (0: off, the lane's line for every class). Session 13: under priority an
    # OUTPATIENT job running beside INPATIENT work waits at the device while it is
    # charged its equal split, so OUTPATIENT jobs ahead spent 1.2-2.5x the pooled share
    # and INPATIENT ones 0.3-0.9x (docs/history/turnaround.md); arrivals keep the pooled
    # share, the cost of one arrival to the work it overtakes
    class_shares: int = 0


@dataclass(frozen=True)
class Variant:
    """What the replay changes: the allowance for later arrivals of classes ranked ahead
    (``allowance``), and the online bias correction (``bias``: ``off``; ``class``, the
    server's, one factor per class; ``queued``, the class factor applied to queued jobs
    only, as it was learned from queued jobs; ``depth``, one factor per class and queue
    depth at the walk, :class:`radserve.turnaround.bias.BiasCorrection` keyed by both;
    ``calibration``: other fields of it, as (name, value) pairs, session 16), the
    present work's shares scaled by their own learned bias (``present``, session 16:
    ``running``, the running jobs' shares; ``all``, every entry's; each finished job
    teaches actual share / its first estimate, ``present_rule`` the
    :class:`BiasCorrection` fields), and the
    measured drain rate (``drain``: True, learned from the recorded walks and ends as
    the server learns it, :class:`radserve.turnaround.drain.DrainMeter`; False, the
    model's alone; None, as recorded)."""

    allowance: bool = True
    bias: str = "off"  # the server's default (turnaround.bias_window_jobs 0)
    window: int = 20
    calibration: tuple[tuple[str, Any], ...] = ()
    present: str = ""  # "", "running" or "all"
    present_rule: tuple[tuple[str, Any], ...] = ()
    drain: bool | None = None
    refit: Refit | None = None
    # the walk's options changed from those recorded (Capacity fields: share_left,
    # running_behind, chain_allowance, ...), as (name, value) pairs
    capacity: tuple[tuple[str, Any], ...] = ()
    # the allowance's arrival rates: as recorded (None), or counted again from the
    # recorded arrivals (each job's first walk, after ``before``) by this estimator
    rates: ArrivalRates | None = None
    # allow for later arrivals ranked with or behind a job running beside it (session
    # 14): Capacity.beside_s as the server's BesideMeter learns it from the recorded runs
    beside: str = ""  # "start" or "arrival": BesideMeter.per
    # scale the estimates by the host's recent speed (session 18): None, as recorded
    speed: Speed | None = None
    # the band's pessimistic end from the finished jobs' actual / predicted time to
    # finish (session 18): its ``band_quantile`` over the last ``band_window`` (0: the
    # walk's band, as recorded)
    band_quantile: float = 0.0
    band_window: int = 20


# the server's walk (since session 11: a running job's share left as measured, the running
# jobs not ranked behind, the arrival rates counted since the first arrival; since
# session 32: no allowance on the latency chain of a job that starts at once; since
# session 36: a running job not charged the queued jobs waiting for its own slot)
SERVER_WALK = Variant(
    drain=False,
    capacity=(
        ("share_left", "measured"),
        ("running_behind", False),
        ("chain_allowance", "waiting"),
        ("queued_ahead", "other_slots"),
    ),
    rates=ArrivalRates(),
)


@dataclass
class Replayed:
    """One job's ETAs in a replay (scheduler clock) and its recorded end."""

    job_id: str
    cls: int
    arrival: float  # its first walk (the server walks at once on a submission)
    position: int  # jobs ranked ahead of it at submission
    first: float  # predicted finish at submission
    first_late: float | None = None  # the band's pessimistic end at submission
    end: float | None = None
    state: str | None = None
    readings: list[tuple[float, float]] = dataclasses.field(default_factory=list)
    deadline: float = math.inf  # scheduler clock: what a deadline-risk replay reads

    def halfway(self) -> float | None:
        """The predicted finish read nearest the middle of the turnaround."""
        if self.end is None or not self.readings:
            return None
        middle = (self.arrival + self.end) / 2
        return min(self.readings, key=lambda r: abs(r[0] - middle))[1]


class _Refitted:
    """The service-time model of a :class:`Refit` variant as the recording goes on."""

    def __init__(
        self, refit: Refit, base: Mapping[str, Any] | None, records: Sequence[Mapping[str, Any]]
    ) -> None:
        options = {"window": refit.window, "half_life_jobs": refit.half_life_jobs}
        self.model = (
            ServiceTimeModel.from_json(base, **options)
            if base is not None
            else ServiceTimeModel(**options)  # type: ignore[arg-type]
        )
        groups = self.model.groups()
        if not groups:
            raise ValueError("a refit replay needs the base model's (pipeline, device, precision)")
        self.pipeline, self.device, self.precision = groups[0]
        self.lanes = refit.lanes
        walks = [r for r in records if r["kind"] == "walk"]
        self.exclusive = bool(walks[0]["capacity"]["urgent_exclusive"]) if walks else True
        self.classes, self.slices = _job_facts(records)
        self.shares = shares_of(records, self.exclusive) if refit.shares else {}
        self.class_shares = refit.class_shares
        self.by_class = ServiceTimeModel(window=refit.window)  # shares per class lane
        self.counts: dict[int, int] = {}

    def observe(self, end: Mapping[str, Any]) -> None:
        """A recorded end: a succeeded job's timings and size teach the model, as the
        server's model learned them."""
        if end["state"] != "succeeded" or "timings" not in end or not end.get("slices"):
            return
        cls = self.classes.get(str(end["job"]))
        self.model.observe(
            pipeline=self.pipeline,
            device=self.device,
            precision=self.precision,
            size=StudySize(int(end["slices"])),
            timings=end["timings"],
            lane=None if cls is None else latency_lane(cls, self.lanes, self.exclusive),
            share_s=self.shares.get(str(end["job"])),
        )
        share = self.shares.get(str(end["job"]))
        if self.class_shares and cls is not None and share is not None:
            self.by_class.observe(
                pipeline=self.pipeline,
                device=self.device,
                precision=self.precision,
                size=StudySize(int(end["slices"])),
                timings={},
                lane=latency_lane(cls, "class"),
                share_s=share,
            )
            self.counts[cls] = self.counts.get(cls, 0) + 1

    def _estimate(self, cls: int, slices: int | None, own_class: bool = False) -> JobEstimate:
        size = StudySize(slices) if slices else self.model.typical_size()
        estimate = self.model.estimate(
            pipeline=self.pipeline,
            device=self.device,
            precision=self.precision,
            size=size,
            lane=latency_lane(cls, self.lanes, self.exclusive),
        )
        enough = self.class_shares and self.counts.get(cls, 0) >= self.class_shares
        if own_class and enough and estimate.share_s is not None:
            of_class = self.by_class.estimate(
                pipeline=self.pipeline,
                device=self.device,
                precision=self.precision,
                size=size,
                lane=latency_lane(cls, "class"),
            )
            estimate = dataclasses.replace(estimate, share_s=of_class.share_s)
        return estimate

    def estimated(self, entries: list[Entry], capacity: Capacity) -> tuple[list[Entry], Capacity]:
        """The walk's entries and arrivals with this model's estimates (the entries' shares
        per class with :attr:`Refit.class_shares`)."""
        again = [
            dataclasses.replace(
                e, estimate=self._estimate(e.cls, self.slices.get(e.job_id), own_class=True)
            )
            for e in entries
        ]
        arrivals = tuple(
            dataclasses.replace(a, estimate=self._estimate(a.cls, None)) for a in capacity.arrivals
        )
        return again, dataclasses.replace(capacity, arrivals=arrivals)


def _walk_starts(records: Sequence[Mapping[str, Any]]) -> dict[str, tuple[float, bool]]:
    """Each job's start (a walk that saw it running) and whether it is URGENT."""
    starts: dict[str, tuple[float, bool]] = {}
    for r in records:
        if r["kind"] == "walk":
            for row in r["entries"]:
                if row[2] and row[4] is not None:
                    starts.setdefault(str(row[0]), (float(row[4]), int(row[1]) == URGENT))
    return starts


def shares_of(records: Sequence[Mapping[str, Any]], urgent_holds: bool) -> dict[str, float]:
    """Each recorded job's share of wall time: as the server recorded it at its end, else
    measured from the recorded starts (a running entry's ``started``) and ends."""
    recorded = {str(r["job"]): float(r["share"]) for r in records if r.get("share") is not None}
    starts = _walk_starts(records)
    ends = {str(r["job"]): float(r["at"]) for r in records if r["kind"] == "end"}
    runs = [(job, at, ends[job], urgent) for job, (at, urgent) in starts.items() if job in ends]
    return shares_of_runs(runs, urgent_holds) | recorded


class SharesSoFar:
    """Each running job's share of wall time up to a walk, measured again from the
    recorded starts and ends, for walks recorded before the server recorded it (session
    11): a walk's running entries get it when they lack it. With them, what a job
    started beside a running one took of its run (:class:`BesideMeter`, session 14) as
    the server learns it from the same events."""

    def __init__(
        self, records: Sequence[Mapping[str, Any]], urgent_holds: bool, beside_per: str = "start"
    ) -> None:
        starts = _walk_starts(records)
        for r in records:  # a succeeded job's start is exact in its end record
            run = (r.get("timings") or {}).get("run") if r["kind"] == "end" else None
            if run is not None and str(r["job"]) in starts:
                starts[str(r["job"])] = (float(r["at"]) - float(run), starts[str(r["job"])][1])
        events = [(at, 0, job, urgent) for job, (at, urgent) in starts.items()]
        events += [(at, -1, job, False) for job, (_, at) in first_seen(records).items()]
        events += [(float(r["at"]), 1, str(r["job"]), False) for r in records if r["kind"] == "end"]
        self._events = sorted(events, key=lambda e: (e[0], e[1]))
        self._next = 0
        self._meter = ShareMeter(urgent_holds=urgent_holds)
        self._classes = _job_facts(records)[0]
        self.beside = BesideMeter(per=beside_per)

    def fill(self, entries: list[Entry], now: float) -> list[Entry]:
        while self._next < len(self._events) and self._events[self._next][0] <= now:
            at, kind, job, urgent = self._events[self._next]
            if kind == -1:
                self.beside.arrived(self._classes.get(job, 2))
            elif kind == 0:
                self._meter.started(job, at, urgent)
                self.beside.started(job, self._classes.get(job, URGENT if urgent else 2))
            else:
                share = self._meter.finished(job, at)
                self.beside.finished(job, share, lambda k, at=at: self._meter.so_far(k, at))
            self._next += 1
        return [
            dataclasses.replace(e, share_so_far=self._meter.so_far(e.job_id, now))
            if e.running and e.share_so_far is None
            else e
            for e in entries
        ]


def first_seen(records: Sequence[Mapping[str, Any]]) -> dict[str, tuple[int, float]]:
    """Each recorded job's class rank and its arrival: the clock of the first walk that
    saw it (the server walks at once on a submission)."""
    seen: dict[str, tuple[int, float]] = {}
    for r in records:
        if r["kind"] == "walk":
            for row in r["entries"]:
                seen.setdefault(str(row[0]), (int(row[1]), float(r["at"])))
    return seen


def _job_facts(records: Sequence[Mapping[str, Any]]) -> tuple[dict[str, int], dict[str, int]]:
    """Each recorded job's class, and its size (slices): from the walk (recorded since
    2026-12-02 session 9), else its end, else a job with the same estimate in the same
    walk (the estimate is a function of the size), else unknown (the typical size)."""
    classes: dict[str, int] = {}
    slices = {str(r["job"]): int(r["slices"]) for r in records if r.get("slices")}
    walks = [r["entries"] for r in records if r["kind"] == "walk"]
    for rows in walks:
        for row in rows:
            classes[str(row[0])] = int(row[1])
            if len(row) > 10 and row[10]:
                slices[str(row[0])] = int(row[10])
    for rows in walks:
        by_estimate = {tuple(r[5:10]): slices[r[0]] for r in rows if r[0] in slices}
        for row in rows:
            if row[0] not in slices and tuple(row[5:10]) in by_estimate:
                slices[str(row[0])] = by_estimate[tuple(row[5:10])]
    return classes, slices


class _Recounted:
    """The allowance's arrival rates counted again (:attr:`Variant.rates`): every job
    arrives at its first walk (the server walks at once on a submission)."""

    def __init__(self, rates: ArrivalRates, before: Iterable[tuple[int, float]]) -> None:
        self.rates = dataclasses.replace(rates, _times={}, _first=None)
        self.rates.extend(before)
        self.seen: set[str] = set()
        self.estimates: dict[int, JobEstimate] = {}

    def capacity(self, now: float, entries: Sequence[Entry], capacity: Capacity) -> Capacity:
        for e in entries:
            if e.job_id not in self.seen:
                self.seen.add(e.job_id)
                self.rates.arrived(e.cls, now)
        for e in entries:  # before any is recorded: a queued job's of the same class
            self.estimates.setdefault(e.cls, e.estimate)
        for a in capacity.arrivals:  # each class's typical estimate, as last recorded
            self.estimates[a.cls] = a.estimate
        arrivals = []
        for cls, (shape, span) in sorted(self.rates.posterior(now).items()):
            # a class never recorded: another class's of the same lane (routine: shared)
            estimate = self.estimates.get(cls) or next(
                (v for c, v in self.estimates.items() if (c == URGENT) == (cls == URGENT)), None
            )
            if estimate is not None:
                arrivals.append(Arrivals(cls, shape / span, estimate, shape))
        return dataclasses.replace(capacity, arrivals=tuple(arrivals))


def _bias_of(variant: Variant) -> BiasCorrection:
    """The variant's bias correction (window 0: off)."""
    rule = {"by": "class-depth"} if variant.bias == "depth" else {}
    rule |= dict(variant.calibration)
    return BiasCorrection(window=variant.window if variant.bias != "off" else 0, **rule)


class _Present:
    """The present work's shares scaled by their learned bias (:attr:`Variant.present`):
    each finished job teaches actual share / the share estimated at its first walk."""

    def __init__(
        self, variant: Variant, records: Sequence[Mapping[str, Any]], exclusive: bool
    ) -> None:
        self.scope = variant.present
        self.bias = BiasCorrection(**dict(variant.present_rule))
        self.actual = shares_of(records, exclusive)
        self.first: dict[str, tuple[int, float]] = {}  # job -> (key, estimated share)

    def scaled(self, entries: list[Entry]) -> list[Entry]:
        out = []
        for e in entries:
            share = e.estimate.share_s
            if share is None:
                out.append(e)
                continue
            key = self.bias.key(e.cls, 0, share)
            self.first.setdefault(e.job_id, (key, share))
            if e.running or self.scope == "all":
                scaled = self.bias.factor(key) * share
                e = dataclasses.replace(e, estimate=dataclasses.replace(e.estimate, share_s=scaled))
            out.append(e)
        return out

    def finished(self, job_id: str, state: str) -> None:
        first = self.first.pop(job_id, None)
        if first is not None and state == "succeeded" and job_id in self.actual:
            self.bias.observe(first[0], first[1], self.actual[job_id])


def replay(
    records: Iterable[Mapping[str, Any]],
    variant: Variant = Variant(),
    base: Mapping[str, Any] | None = None,
    before: Iterable[tuple[int, float]] = (),
) -> list[Replayed]:
    """Walk every recorded snapshot again under ``variant``; each job's ETAs. ``base``:
    the service-time model (``ServiceTimeModel.to_json``) the server had when the
    recording began, for a variant that refits it; ``before``: the arrivals (class rank,
    time) the server had counted when the recording began, for a variant that counts
    the rates again."""
    records = sorted(records, key=lambda r: (r["at"], r["kind"] != "end"))
    recount = None if variant.rates is None else _Recounted(variant.rates, before)
    refit = None if variant.refit is None else _Refitted(variant.refit, base, records)
    walks = [r for r in records if r["kind"] == "walk"]
    exclusive = bool(walks[0]["capacity"]["urgent_exclusive"]) if walks else True
    bias = _bias_of(variant)
    present = _Present(variant, records, exclusive) if variant.present else None
    speed = None if variant.speed is None else HostSpeed(variant.speed)
    band = ConformalBand(variant.band_quantile, variant.band_window)
    meter = DrainMeter()
    so_far = SharesSoFar(records, exclusive, variant.beside or "start")
    saturated = False
    work: dict[str, float] = {}  # job -> its model work as the walk counts it
    jobs: dict[str, Replayed] = {}
    for record in records:
        if record["kind"] == "end":
            if refit is not None:
                refit.observe(record)
            if present is not None:
                present.finished(str(record["job"]), str(record["state"]))
            if speed is not None:
                speed.finished(record)
            job = jobs.get(record["job"])
            if job is None:
                continue
            job.end, job.state = float(record["at"]), str(record["state"])
            if job.state == "succeeded" and job.job_id in work:
                meter.completed(job.end, work[job.job_id], saturated)
            bias.finished(job.job_id, job.end, job.state == "succeeded")
            band.finished(job.job_id, job.end, job.state == "succeeded")
            continue
        now, entries, capacity = walk_inputs(record)
        # the band is the variant's: the walk's own, or band_quantile's learned here
        capacity = dataclasses.replace(capacity, late_ratio=None)
        entries = so_far.fill(entries, now)
        if recount is not None:
            capacity = recount.capacity(now, entries, capacity)
        if variant.capacity:
            capacity = dataclasses.replace(capacity, **dict(variant.capacity))
        if variant.beside:
            capacity = dataclasses.replace(capacity, beside_s=so_far.beside.mean_s() or 0.0)
        if refit is not None:
            entries, capacity = refit.estimated(entries, capacity)
        if present is not None:
            entries = present.scaled(entries)
        if speed is not None:
            entries, capacity = speed.scaled(entries, capacity)
        if not variant.allowance:
            capacity = dataclasses.replace(capacity, arrivals=())
        saturated = any(not e.running for e in entries)
        meter.saturation(now, saturated)
        for e in entries:
            work[e.job_id] = capacity.model_work_s(e.estimate.cpu_s, e.estimate.device_s)
        if variant.drain is not None:
            drain = meter.factor() if variant.drain else 1.0
            capacity = dataclasses.replace(capacity, drain=drain)
        for eta, entry in zip(walk(entries, now, capacity), entries, strict=True):
            key = bias.key(entry.cls, eta.position, eta.finish - now)
            bias.reading(eta.job_id, key, now, eta.finish)
            finish = eta.finish
            if variant.bias != "queued" or not entry.running:
                finish = bias.correct(key, now, eta.finish)
            job = jobs.get(eta.job_id)
            if job is None:
                job = jobs[eta.job_id] = Replayed(
                    eta.job_id, entry.cls, now, eta.position, finish, deadline=entry.deadline
                )
                job.first_late = eta.finish_late
                if variant.band_quantile:
                    job.first_late = band.late(job.job_id, now, finish, eta.finish_late)
            job.readings.append((now, finish))
    return list(jobs.values())


def errors(
    jobs: Sequence[Replayed], measured: Collection[str] | None = None, behind: int = 3
) -> dict[str, Any]:
    """Median relative error (|predicted - end| / TAT) and bias (signed) at submission
    and halfway, over succeeded ``measured`` jobs: all, and those behind >= ``behind``."""
    done = [
        j
        for j in jobs
        if j.state == "succeeded"
        and j.end is not None
        and j.end > j.arrival
        and (measured is None or j.job_id in measured)
    ]
    out: dict[str, Any] = {}
    deep = [j for j in done if j.position >= behind]
    for name, subset in (("all", done), (f"behind_{behind}", deep)):
        row: dict[str, Any] = {"jobs": len(subset)}
        for point in ("submission", "halfway"):
            signed = []
            for j in subset:
                predicted = j.first if point == "submission" else j.halfway()
                if predicted is not None and j.end is not None:
                    signed.append((predicted - j.end) / (j.end - j.arrival))
            if signed:
                row[point] = {
                    "median_rel": round(statistics.median(abs(s) for s in signed), 4),
                    "median_signed_rel": round(statistics.median(signed), 4),
                }
        banded = [j for j in subset if j.first_late is not None and j.end is not None]
        if banded:  # how often the finish came within the band's pessimistic end (p90),
            # and how wide the band is (its late end past the finish, over the TAT)
            covered = sum(j.end <= j.first_late for j in banded)  # type: ignore[operator]
            row["late_coverage"] = round(covered / len(banded), 4)
            widths = [(j.first_late - j.first) / (j.end - j.arrival) for j in banded]  # type: ignore[operator]
            row["late_width_rel"] = round(statistics.median(widths), 4)
        out[name] = row
    return out


_SERVER_RISK = TurnaroundSettings.model_fields  # the server's margins: the replay's default
SERVER_MARGIN_S: float = _SERVER_RISK["risk_margin_s"].default
SERVER_CLEAR_S: float = _SERVER_RISK["risk_clear_s"].default


@dataclass(frozen=True)
class RiskRule:
    """A deadline-risk rule as :class:`RiskTracker` applies it (the server's by default)."""

    margin_s: float = SERVER_MARGIN_S
    clear_s: float = SERVER_CLEAR_S
    margin_fraction: float = 0.0
    hold_s: float = 0.0

    def tracker(self) -> RiskTracker:
        return RiskTracker(
            self.margin_s, self.clear_s, margin_fraction=self.margin_fraction, hold_s=self.hold_s
        )


@dataclass(frozen=True)
class RiskOutcome:
    """What a rule raised for one ended job over its readings, and how the job ended."""

    job: Replayed
    raised_at: tuple[float, ...]  # every raise (scheduler clock)
    standing: float | None  # when the risk standing at the end (or deadline) was raised

    @property
    def missed(self) -> bool:
        return self.job.end is not None and self.job.end > self.job.deadline

    @property
    def lead_s(self) -> float | None:
        """For a miss a risk stood for at the deadline: how long before it that was raised."""
        if not self.missed or self.standing is None or self.standing > self.job.deadline:
            return None
        return self.job.deadline - self.standing


def risk_outcomes(jobs: Sequence[Replayed], rule: RiskRule = RiskRule()) -> list[RiskOutcome]:
    """Each ended job's risk events under ``rule`` (:class:`RiskTracker`, one per job, fed
    that job's readings up to its end). The tracker reads the predicted finish only,
    never the band's late end."""
    cls = PriorityClass.OUTPATIENT  # the tracker's label only
    out = []
    for job in jobs:
        if job.end is None:
            continue
        risk, raised = rule.tracker(), []
        for now, finish in job.readings:
            if now > job.end:
                break
            eta = Eta(job.job_id, job.position, now, finish, finish, job.deadline)
            raised += [r.raised_at for r in risk.update([eta], {job.job_id: cls}, now)[0]]
        standing = risk.get(job.job_id)
        at = None if standing is None else standing.raised_at
        out.append(RiskOutcome(job, tuple(raised), at))
    return out


def deadline_alerts(jobs: Sequence[Replayed], rule: RiskRule = RiskRule()) -> dict[str, Any]:
    """The deadline-risk events of ``rule`` (the server's margins by default) over each
    ended job's readings: misses (ended past the deadline), those a risk stood for at the
    deadline (``predicted``), how long before it that risk was raised (``lead_s``), jobs
    alerted that did not miss (``false_alerts``) and how far before the deadline each of
    those ended (``false_slack_s``: a near miss is a fair warning), raise events
    (``raised``) and ended jobs (``jobs``)."""
    outcomes = risk_outcomes(jobs, rule)
    false = [o for o in outcomes if o.raised_at and not o.missed]
    leads = [o.lead_s for o in outcomes if o.lead_s is not None]
    return {
        "jobs": len(outcomes),
        "misses": sum(o.missed for o in outcomes),
        "predicted": len(leads),
        "lead_s": leads,
        "false_alerts": len(false),
        "false_slack_s": [o.job.deadline - o.job.end for o in false if o.job.end is not None],
        "raised": sum(len(o.raised_at) for o in outcomes),
    }


def log_ratio_spread(jobs: Sequence[Replayed]) -> float:
    """Median |log(actual / predicted)| of the time to finish at submission (a scale-free
    figure of how far the walk is from the truth)."""
    logs = [
        abs(math.log((j.end - j.arrival) / (j.first - j.arrival)))
        for j in jobs
        if j.end is not None and j.first > j.arrival and j.end > j.arrival
    ]
    return statistics.median(logs) if logs else float("nan")


__all__ = [
    "SERVER_CLEAR_S",
    "SERVER_MARGIN_S",
    "SERVER_WALK",
    "Refit",
    "Replayed",
    "RiskOutcome",
    "RiskRule",
    "SharesSoFar",
    "Speed",
    "Variant",
    "deadline_alerts",
    "errors",
    "first_seen",
    "replay",
    "risk_outcomes",
    "shares_of",
    "walk_inputs",
    "walk_record",
]

"""The server's turnaround view: service times learned online, an ETA for every
unfinished job, and deadline-risk events raised before a miss.

- Every succeeded job teaches :class:`ServiceTimeModel` its stage timings and study size
  (slices from the report's geometry); at start the last ``turnaround.history_jobs``
  succeeded jobs are read back (their timings from the store, their size from the report
  file), so a restart does not forget. The host's one device names the device key.
- Every job's share of the server's wall time (:class:`~radserve.turnaround.share.
  ShareMeter`: wall time split among the jobs running together, from the scheduler's
  start and end events) is learned with it (``turnaround.throughput: shares``); the
  walk's throughput bound adds those up once measured (not kept in the store: after a
  restart, until new jobs finish, the bound falls back to the stage timings).
- ETAs are recomputed on a thread of their own: scheduler events (the scheduler's
  listener) only set a flag; the thread walks the queue order at most every
  ``recompute_interval_s`` and every 2 s regardless (running jobs age); a newly queued
  job is walked at once, so a risk present at submission is raised then. One walk is
  O(n) after the scheduler's sort; its cost is exported (``radserve_eta_compute_seconds``).
- Every ETA's time to finish is scaled by its class's learned bias
  (:class:`~radserve.turnaround.bias.BiasCorrection`): each succeeded job teaches its
  class actual / predicted time from its first walk (at submission) to its finish.
- The band's late end (``predicted_finish_late``) is, with ``turnaround.band:
  conformal`` (the default), the 90th percentile of the last ``band_window_jobs``
  finished jobs' actual / predicted time to finish from their first walk
  (:class:`~radserve.turnaround.conformal.ConformalBand`; the walk's own band covered
  81 % of the deep jobs' finishes in the replay). Like the bias it is not kept across a
  restart: the walk's own band answers until 3 jobs have finished.
- A job whose predicted finish passes ``deadline - turnaround.risk_margin_s`` raises one
  risk event: an audit record ``job.deadline_risk``, ``radserve_deadline_risk_total``,
  a JSON POST to ``turnaround.risk_webhook_url`` and a syslog message to
  ``turnaround.risk_syslog`` when set, and with ``risk_policy: promote`` the scheduler
  runs it ahead of the rest of its class; with ``reserve`` a waiting job also holds the
  next free routine slot (:meth:`Scheduler.reserve`). A risk whose prediction recovers
  (back before ``deadline - risk_margin_s - risk_clear_s``: hysteresis) is cleared:
  ``job.deadline_risk_cleared``, ``radserve_deadline_risk_cleared_total``, the same
  alert receivers; it may be raised again (:mod:`radserve.turnaround.risk`). When a
  deadline is then missed, the miss counts as predicted (with how long before the
  deadline the alert came) or not: ``radserve_deadline_misses_predicted_total`` (this
  process) and ``GET /v1/ops/turnaround`` (from the store: the jobs' deadlines and ends
  and the risk events' audit records, so it survives a restart and every replica says
  the same; :mod:`radserve.store.misses`).

Queued studies' sizes are estimated from their stored instance count (one file per
slice for single-frame DICOM); a NIfTI file or an unreadable folder gets the median
size seen. Times inside are the scheduler's clock (monotonic seconds); :meth:`wall`
converts for the API.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import datetime as dt
import heapq
import itertools
import json
import logging
import math
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from radserve.audit import AuditEvent
from radserve.audit.events import Action
from radserve.audit.syslog import NOTICE, WARNING, SyslogClient, SyslogEndpoint, frame, rfc5424
from radserve.config import RiskSyslogSettings, Settings
from radserve.gateway.attempt_log import FailedAttemptLog
from radserve.host import usable_cores
from radserve.http_answer import post
from radserve.http_deadline import deadline_client, total_deadline
from radserve.loop_failures import LoopFailures
from radserve.scheduling import DeadlineMiss, JobEvent, JobState, PriorityClass, Scheduler
from radserve.service.job_view import JobEta
from radserve.service.metrics import Metrics
from radserve.store import JobRecord, Store
from radserve.store import JobState as StoredState
from radserve.turnaround.bias import BiasCorrection
from radserve.turnaround.conformal import ConformalBand
from radserve.turnaround.eta import (
    Arrivals,
    Capacity,
    Entry,
    Eta,
    latency_lane,
    on_host_cores,
    walk,
)
from radserve.turnaround.rates import ArrivalRates
from radserve.turnaround.replay import walk_record
from radserve.turnaround.risk import RiskCleared, RiskEvent, RiskTracker
from radserve.turnaround.service_time import Prior, ServiceTimeModel, StudySize, work_done
from radserve.turnaround.share import ShareMeter, shares_of_runs

logger = logging.getLogger(__name__)

DEADLINE_RISK = Action.JOB_DEADLINE_RISK.value
DEADLINE_RISK_CLEARED = Action.JOB_DEADLINE_RISK_CLEARED.value
MISS_WINDOW_S = 24 * 3600.0  # the miss report's default window: jobs of the last day
# alerts that never reached a receiver by the server's stop (count per receiver and reason)
RISK_ALERTS_DROPPED = Action.RISK_ALERTS_DROPPED.value
_REFRESH_S = 2.0  # recompute at least this often (running jobs' remaining time shrinks)
RISK_MSGID = "RADSERVE-RISK"
_ALERT_QUEUE = 1000
_ALERT_RETRIES = (1.0, 5.0, 30.0)
_ALERT_ATTEMPT_S = 5.0  # one delivery attempt's timeout (the webhook's; syslog's own)
# an attempt in flight this long is shown in /readyz (a syslog collector that accepted
# and does not answer holds it for risk_syslog.timeout_s, up to a year)
_ALERT_STALLED_S = 2 * _ALERT_ATTEMPT_S
_LEAD_BUCKETS = (0, 5, 15, 30, 60, 120, 300, 600, 1800, 3600)


@dataclass(frozen=True)
class MissReport:
    """Deadline misses of the jobs that arrived since ``since``, and how many the risk
    events saw coming (from the store: :meth:`radserve.store.Store.deadline_misses`)."""

    misses: int
    predicted: int
    lead_s: tuple[float, ...]  # per predicted miss: deadline - alert time
    since: dt.datetime
    false_alerts: int = 0  # jobs alerted that ended by their deadline (session 20)

    def as_dict(self) -> dict[str, Any]:
        lead = np.asarray(self.lead_s) if self.lead_s else None
        return {
            "since": self.since.isoformat(),
            "misses": self.misses,
            "predicted": self.predicted,
            "predicted_fraction": round(self.predicted / self.misses, 4) if self.misses else None,
            "lead_s_p50": round(float(np.median(lead)), 3) if lead is not None else None,
            "lead_s_min": round(float(lead.min()), 3) if lead is not None else None,
            "false_alerts": self.false_alerts,
        }


class Turnaround:
    """Service-time learning, ETAs and deadline risk for one server."""

    def __init__(
        self,
        settings: Settings,
        *,
        store: Store,
        scheduler: Scheduler,
        metrics: Metrics,
        lookup: Callable[[str], JobRecord | None],
        device: str,
        cpu_workers: int,
        devices: int = 1,
    ) -> None:
        self.settings = settings.turnaround
        self.store = store
        self.scheduler = scheduler
        self.lookup = lookup
        self.device = device
        t = self.settings
        self.model = ServiceTimeModel(
            Prior(t.prior_fixed_s, t.prior_per_slice_s, t.prior_device_share),
            window=t.window_jobs,
            half_life_jobs=t.half_life_jobs,
        )
        self.capacity = Capacity(
            cpu_workers=cpu_workers,
            devices=devices,
            max_running=scheduler.config.max_running,
            urgent_exclusive=scheduler.config.urgent_exclusive,
            tat_s=tuple(scheduler.config.tat(c) for c in PriorityClass),
            aging_fraction=scheduler.config.aging_fraction,
            # a CPU device's batches and the CPU pool's stages share the host's cores
            host_cores=usable_cores() if on_host_cores(device) else None,
            share_left=t.share_left,
            running_behind=t.running_behind,
            chain_allowance=t.chain_allowance,
        )
        self._lock = threading.Lock()
        self._etas: dict[str, Eta] = {}
        self._sizes: dict[str, StudySize] = {}
        self._records: dict[str, JobRecord] = {}  # unfinished jobs' (immutable) facts
        self._basis: dict[str, str] = {}  # job id -> its estimate's source
        # arrival times per class (the last hour's): the rates of overtaking arrivals
        self._rates = ArrivalRates(  # under the lock
            classes=tuple(c.rank for c in PriorityClass),
            min_span_s=t.arrival_min_span_s,
            prior_arrivals=t.arrival_prior,
        )
        self._risk = RiskTracker(t.risk_margin_s, t.risk_clear_s)  # under the lock
        self._shares = ShareMeter(urgent_holds=scheduler.config.urgent_exclusive)  # lock
        self.bias = BiasCorrection(window=t.bias_window_jobs)
        # the late end learned from the finished jobs (turnaround.band: conformal); None:
        # the walk's own band
        self.band = ConformalBand(0.9, t.band_window_jobs) if t.band == "conformal" else None
        self.last_compute_s = 0.0
        self.computed_at: float | None = None
        # a benchmark's recorder (radserve bench --scenario eta): every walk's inputs and
        # every job's end, to replay ETA variants offline (radserve.turnaround.replay)
        self.recorder: Callable[[dict[str, Any]], None] | None = None
        self._dirty = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._metrics(metrics)
        self._alerts: list[_Alerts] = []
        if t.risk_webhook_url:
            self._alerts.append(_Alerts(_WebhookTarget(t.risk_webhook_url), self.alerts_dropped))
        if t.risk_syslog is not None:
            self._alerts.append(_Alerts(_SyslogTarget(t.risk_syslog), self.alerts_dropped))
        scheduler.add_listener(self._dirty.set)

    def _metrics(self, metrics: Metrics) -> None:
        reg = metrics.registry
        self.risk_total = Counter(
            "radserve_deadline_risk",
            "Deadline-risk events: jobs predicted to finish past deadline minus the margin",
            ["cls"],
            registry=reg,
        )
        self.risk_cleared = Counter(
            "radserve_deadline_risk_cleared",
            "Deadline-risk events cleared: the predicted finish recovered before the deadline",
            ["cls"],
            registry=reg,
        )
        self.predicted_misses = Counter(
            "radserve_deadline_misses_predicted",
            "Deadline misses a risk event had announced, per class",
            ["cls"],
            registry=reg,
        )
        self.risk_lead = Histogram(
            "radserve_deadline_risk_lead_seconds",
            "For predicted misses: seconds between the risk event and the deadline",
            buckets=_LEAD_BUCKETS,
            registry=reg,
        )
        self.alerts_dropped = Counter(
            "radserve_deadline_risk_alerts_dropped",
            "Deadline-risk alerts a receiver never got: queue_full, failed (retries "
            "exhausted, or the one attempt at stop), stopped (still queued after the "
            "stop's grace)",
            ["receiver", "reason"],
            registry=reg,
        )
        self.compute_seconds = Gauge(
            "radserve_eta_compute_seconds",
            "Wall time of the last ETA recomputation (queue order + walk)",
            registry=reg,
        )
        reg.register(_EtaCollector(self))

    # --- life cycle -------------------------------------------------------------------
    def start(self) -> None:
        """Learn from the store's recent history, then keep ETAs fresh on a thread."""
        learned = self.learn_history(self.settings.history_jobs)
        if learned:
            logger.info("service times: learned from %d finished job(s)", learned)
        self._thread = threading.Thread(target=self._run, name="radserve-eta", daemon=True)
        self._thread.start()
        for alerts in self._alerts:
            alerts.start()

    def stop(self) -> None:
        """Stop the ETA thread; alerts still queued get ``risk_alert_grace_s`` to be
        delivered (one attempt each), and those that are not are counted, logged and
        audited (``turnaround.risk_alerts_dropped``), never lost silently."""
        self._stop.set()
        self._dirty.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        grace = self.settings.risk_alert_grace_s
        grace_end = time.monotonic() + grace
        for alerts in self._alerts:  # every receiver's grace runs at once
            alerts.begin_stop(grace_end)
        dropped = {alerts.target.kind: alerts.finish_stop() for alerts in self._alerts}
        dropped = {receiver: counts for receiver, counts in dropped.items() if counts}
        if not dropped:
            return
        total = sum(sum(counts.values()) for counts in dropped.values())
        logger.warning(
            "deadline-risk alerts: %d not delivered by the stop (grace %g s): %s",
            total,
            grace,
            "; ".join(
                f"{receiver} " + ", ".join(f"{n} {why}" for why, n in sorted(counts.items()))
                for receiver, counts in sorted(dropped.items())
            ),
        )
        payload = {"dropped": dropped, "total": total, "grace_s": grace}
        try:
            self.store.append_audit(AuditEvent(action=RISK_ALERTS_DROPPED, payload=payload))
        except Exception as exc:  # the count is in the log and the metric
            logger.error("%s not audited (%s)", RISK_ALERTS_DROPPED, type(exc).__name__)

    def _run(self) -> None:
        interval = self.settings.recompute_interval_s
        failures = LoopFailures(logger, "ETA recomputation")
        while not self._stop.is_set():
            self._dirty.wait(_REFRESH_S)
            if self._stop.is_set():
                return
            self._dirty.clear()
            try:
                self.recompute()
            except Exception as exc:  # an ETA bug (or the database away) must not stop it
                failures.failed(exc)
            else:
                failures.succeeded()
            self._stop.wait(interval)

    # --- learning ---------------------------------------------------------------------
    def learn_history(self, limit: int) -> int:
        """Teach the model the last ``limit`` succeeded jobs (oldest first), with their
        shares of wall time measured again from the store's start and finish times."""
        holds = None if self.settings.throughput != "shares" else self.capacity.urgent_exclusive
        return learn_from_store(
            self.model, self.store, self.device, limit, self.lane, shares_urgent_holds=holds
        )

    def lane(self, cls: PriorityClass) -> str | None:
        """A job's service-time lane (turnaround.latency_lanes)."""
        return latency_lane(cls.rank, self.settings.latency_lanes, self.capacity.urgent_exclusive)

    def _observe(
        self, record: JobRecord, size: StudySize, timings: Any, share_s: float | None
    ) -> None:
        self.model.observe(
            pipeline=record.pipeline_name,
            device=self.device,
            precision=record.precision,
            size=size,
            timings=dict(timings),
            lane=self.lane(record.priority_class),
            share_s=share_s,
        )

    # --- the scheduler's events (called from ServiceHooks) ---------------------------
    def on_state(self, event: JobEvent) -> None:
        if event.state is JobState.QUEUED:
            with self._lock:
                self._rates.arrived(event.cls.rank, event.at)
            # a new job: its ETA (and a risk already at submission) at once, O(n)
            self._recompute_now()
        elif event.state is JobState.RUNNING:
            with self._lock:
                self._shares.started(event.job_id, event.at, event.cls is PriorityClass.URGENT)
        if not event.state.terminal:
            return
        with self._lock:
            share = self._shares.finished(event.job_id, event.at)
        geometry = getattr(getattr(event.result, "report", None), "geometry", None)
        if self.recorder is not None:  # with what the model learns, to replay it too
            end = {"kind": "end", "at": event.at, "job": event.job_id, "state": event.state.value}
            if geometry is not None:
                end["slices"] = StudySize.from_shape(geometry.shape).slices
                end["timings"] = dict(event.timings)
            if share is not None:
                end["share"] = share
            self.recorder(end)
        if event.state is JobState.SUCCEEDED:
            record = self._record(event.job_id)
            if record is not None and geometry is not None and not record.cached_from:
                size = StudySize.from_shape(geometry.shape)
                learned = share if self.settings.throughput == "shares" else None
                self._observe(record, size, event.timings, learned)
        with self._lock:
            self.bias.finished(event.job_id, event.at, event.state is JobState.SUCCEEDED)
            if self.band is not None:
                self.band.finished(event.job_id, event.at, event.state is JobState.SUCCEEDED)
            self._records.pop(event.job_id, None)
            self._sizes.pop(event.job_id, None)
            self._etas.pop(event.job_id, None)
            self._risk.forget(event.job_id)
        self._dirty.set()

    def _recompute_now(self) -> None:
        try:
            self.recompute()
        except Exception:  # an ETA bug must not fail a submission
            logger.exception("ETA recomputation failed")

    def on_batch(self, event: object) -> None:
        pass

    def on_deadline_miss(self, miss: DeadlineMiss) -> None:
        """This process's metrics; the report (:meth:`miss_report`) reads the store."""
        with self._lock:
            risk = self._risk.get(miss.job_id)  # the one standing at the miss
        if risk is not None:
            self.predicted_misses.labels(miss.cls.value).inc()
            self.risk_lead.observe(max(0.0, risk.lead_s))

    # --- ETAs -------------------------------------------------------------------------
    def recompute(self) -> list[Eta]:
        """Walk the scheduler's order once; raise risk events for jobs newly at risk."""
        began = time.perf_counter()
        now, order = self.scheduler.queue_order()
        entries = []
        slices: dict[str, int] = {}
        with self._lock:  # each running job's share of the wall time so far
            so_far = {j.job_id: self._shares.so_far(j.job_id, now) for j in order if j.running}
        for job in order:
            record = self._record(job.job_id)
            if record is None:
                continue
            size = self._size(job.job_id, record)
            estimate = self.model.estimate(
                pipeline=record.pipeline_name,
                device=self.device,
                precision=record.precision,
                size=size,
                lane=self.lane(job.cls),
            )
            facts = (job.job_id, job.cls.rank, job.running, job.deadline, job.started)
            worked = work_done(job.timings) if job.running else None
            entries.append(Entry(*facts, estimate, so_far.get(job.job_id), worked))
            slices[job.job_id] = size.slices
        # walked outside the lock: job events and API readers wait on it
        capacity = self._capacity(now)
        if self.band is not None:
            with self._lock:
                capacity = dataclasses.replace(capacity, late_ratio=self.band.ratio())
        raw = walk(entries, now, capacity)
        if self.recorder is not None:
            self.recorder(walk_record(now, entries, capacity, slices))
        with self._lock:
            etas = [
                self._corrected(eta, entry.cls, now)
                for eta, entry in zip(raw, entries, strict=True)
            ]
            # a job past its last batch (writing its results) has left the scheduler's
            # order but is still running: it keeps its last ETA, not before now (the
            # API showed it running with no ETA for its last seconds)
            walked = {e.job_id: e for e in etas}
            finishing = {
                job_id: dataclasses.replace(
                    eta, finish=max(eta.finish, now), finish_late=max(eta.finish_late, now)
                )
                for job_id, eta in self._etas.items()
                if job_id in self._records and job_id not in walked
            }
            self._etas = {**finishing, **walked}
            self._basis = {e.job_id: e.estimate.source for e in entries}
            self.computed_at = now
        self.last_compute_s = time.perf_counter() - began
        self.compute_seconds.set(self.last_compute_s)
        self._check_risk(etas, {j.job_id: j.cls for j in order}, now)
        return etas

    def _corrected(self, eta: Eta, cls: int, now: float) -> Eta:
        """``eta`` scaled by its class's learned bias (the conformal band's late end, a
        ratio of the time to finish, scales with it); its raw walk and its first finish
        are kept to learn from when the job finishes. Called under the lock."""
        key = self.bias.key(cls, eta.position, eta.finish - now)
        self.bias.reading(eta.job_id, key, now, eta.finish)
        if self.bias.factor(key) != 1.0:
            eta = dataclasses.replace(
                eta,
                start=eta.start if eta.start <= now else self.bias.correct(key, now, eta.start),
                finish=self.bias.correct(key, now, eta.finish),
                finish_late=self.bias.correct(key, now, eta.finish_late),
            )
        if self.band is not None:  # the walk applied its ratio (Capacity.late_ratio)
            self.band.reading(eta.job_id, now, eta.finish)
        return eta

    def bias_view(self) -> dict[str, dict[str, float | int]]:
        """Per class: jobs the bias was learned from and the factor applied now."""
        with self._lock:
            seen = self.bias.describe()
        return {
            cls.value: seen.get(self.bias.label(cls.rank), {"jobs": 0, "factor": 1.0})
            for cls in PriorityClass
        }

    def band_view(self) -> dict[str, Any]:
        """The band's late end: ``own`` (the walk's) or ``conformal``, with the jobs it
        learned from and its ratio now (None until 3 have finished)."""
        if self.band is None:
            return {"band": "own"}
        with self._lock:
            return {"band": "conformal", **self.band.describe()}

    def _capacity(self, now: float) -> Capacity:
        """The capacity with each class's arrival rate over the last hour, or since the
        first arrival (:class:`~radserve.turnaround.rates.ArrivalRates`)."""
        with self._lock:
            rates = self._rates.rates(now)
        by_rank = {c.rank: c for c in PriorityClass}
        if not any(r > 0 for c, r in rates.items() if by_rank[c] is not PriorityClass.OUTPATIENT):
            return self.capacity
        pipeline, size = self._any_pipeline(), self.model.typical_size()
        arrivals = tuple(
            Arrivals(
                rank,
                rate,
                self.model.estimate(
                    pipeline=pipeline,
                    device=self.device,
                    precision="fp32",
                    size=size,
                    lane=self.lane(by_rank[rank]),
                ),
            )
            for rank, rate in sorted(rates.items())
        )
        return dataclasses.replace(self.capacity, arrivals=arrivals)

    def arrivals_seen(self) -> list[tuple[int, float]]:
        """Every arrival counted for the rates (class rank, scheduler clock), oldest
        first: what a replay of a recording started now needs to count them again."""
        with self._lock:
            return self._rates.seen()

    def _any_pipeline(self) -> str:
        lines = self.model.describe()
        return str(lines[0]["pipeline"]) if lines else ""

    def _record(self, job_id: str) -> JobRecord | None:
        """The job's pipeline, precision and study folder (they never change)."""
        with self._lock:
            record = self._records.get(job_id)
        if record is None:
            try:
                record = self.lookup(job_id)
            except Exception:  # e.g. the database is briefly away: no ETA this round
                return None
            if record is not None:
                with self._lock:
                    self._records[job_id] = record
        return record

    def _size(self, job_id: str, record: JobRecord) -> StudySize:
        with self._lock:
            size = self._sizes.get(job_id)
        if size is None:
            size = _study_size(Path(record.study_path)) or self.model.typical_size()
            with self._lock:
                self._sizes[job_id] = size
        return size

    def eta(self, job_id: str) -> Eta | None:
        with self._lock:
            return self._etas.get(job_id)

    def job_eta(self, job_id: str) -> JobEta | None:
        """The job's ETA for the API; a job the last walk did not see (just submitted)
        triggers a walk now."""
        with self._lock:  # the ETA and its walk's time together
            eta, computed = self._etas.get(job_id), self.computed_at
        if eta is None:
            if self.scheduler.job_info(job_id) is None:
                return None  # not (or no longer) in the scheduler
            eta = next((e for e in self.recompute() if e.job_id == job_id), None)
            if eta is None:
                return None
            with self._lock:  # that walk's time, unless another has ended since
                computed = self.computed_at
        with self._lock:
            at_risk = job_id in self._risk
            basis = self._basis.get(job_id, "prior")
        offset = self.wall(0.0)  # one reading: the three times keep their order
        return JobEta(
            predicted_start=_utc(offset + eta.start),
            predicted_finish=_utc(offset + eta.finish),
            predicted_finish_late=_utc(offset + eta.finish_late),
            order_position=eta.position,
            deadline_risk=at_risk,
            computed_at=_utc(offset + (computed if computed is not None else eta.start)),
            basis=basis,
        )

    def etas(self) -> list[Eta]:
        with self._lock:
            return list(self._etas.values())

    def wall(self, t: float) -> float:
        """A scheduler clock reading -> POSIX seconds."""
        return time.time() + (t - self.scheduler.clock.now())

    # --- deadline risk ----------------------------------------------------------------
    def _check_risk(self, etas: list[Eta], classes: dict[str, PriorityClass], now: float) -> None:
        with self._lock:
            raised, cleared = self._risk.update(etas, classes, now)
        for risk in raised:
            self._raise(risk)
        for recovered in cleared:
            self._clear(recovered)

    def _raise(self, risk: RiskEvent) -> None:
        self.risk_total.labels(risk.cls.value).inc()
        policy = self.settings.risk_policy
        reserved = policy == "reserve" and self.scheduler.reserve(risk.job_id)
        promoted = reserved or (policy != "none" and self.scheduler.promote(risk.job_id))
        late_by = risk.predicted_finish - risk.deadline
        logger.warning(
            "job %s (%s) at risk: predicted to finish %.0f s %s its deadline (margin %g s)",
            risk.job_id,
            risk.cls.value,
            abs(late_by),
            "after" if late_by > 0 else "before",
            self.settings.risk_margin_s,
        )
        payload = self._payload(risk, risk.predicted_finish, risk.predicted_finish_late)
        payload |= {
            "predicted_late_by_s": _seconds(late_by),
            "policy": policy,
            "promoted": promoted,
            "reserved": reserved,  # the next free routine slot is held for it
        }
        self._announce(DEADLINE_RISK, risk.job_id, payload)

    def _clear(self, cleared: RiskCleared) -> None:
        risk = cleared.risk
        self.risk_cleared.labels(risk.cls.value).inc()
        early_by = risk.deadline - cleared.predicted_finish
        logger.info(
            "job %s (%s) no longer at risk: predicted to finish %.0f s before its deadline",
            risk.job_id,
            risk.cls.value,
            early_by,
        )
        payload = self._payload(risk, cleared.predicted_finish, cleared.predicted_finish_late)
        payload |= {
            "predicted_early_by_s": _seconds(early_by),
            "raised_at": _iso(self.wall(risk.raised_at)),
            "at_risk_s": _seconds(cleared.held_s),
            "clear_s": self.settings.risk_clear_s,
        }
        self._announce(DEADLINE_RISK_CLEARED, risk.job_id, payload)

    def _payload(self, risk: RiskEvent, finish: float, finish_late: float) -> dict[str, Any]:
        """What a risk record and alert say (job times and class: no patient data)."""
        offset = self.wall(0.0)
        deadline = self._stored_deadline(risk)
        return {
            "priority_class": risk.cls.value,
            "deadline": (_iso(offset + risk.deadline) if deadline is None else _utc_iso(deadline)),
            "predicted_finish": _iso(offset + finish),
            "predicted_finish_late": _iso(offset + finish_late),
            "margin_s": self.settings.risk_margin_s,
        }

    def _stored_deadline(self, risk: RiskEvent) -> dt.datetime | None:
        """The job's deadline as its row has it, which is what the job API shows: one
        source of truth. The scheduler's own deadline (``risk.deadline``, its monotonic
        clock) counts from when the job entered the scheduler, tens of ms after its row
        was written, and converting it to wall time at the event moved it again: events
        named a deadline 10-30 ms off the API's (session 37). A job re-prioritised since
        its row was read is read again (its row holds the new class's deadline); while
        its row is being updated, the row's own rule (its arrival + the class's TAT,
        :meth:`radserve.service.jobs.JobAccess.reprioritise`). None: no row (the event
        then converts the scheduler's deadline)."""
        record = self._record(risk.job_id)
        if record is not None and record.priority_class is not risk.cls:
            try:
                fresh = self.lookup(risk.job_id)
            except Exception:  # the database is briefly away: the rule below
                fresh = None
            if fresh is not None:
                record = fresh
                with self._lock:
                    if risk.job_id in self._records:
                        self._records[risk.job_id] = fresh
        if record is None:
            return None
        if record.priority_class is risk.cls:
            return record.deadline
        return record.arrival + dt.timedelta(seconds=self.scheduler.config.tat(risk.cls))

    def _announce(self, action: str, job_id: str, payload: dict[str, Any]) -> None:
        """The audit record, then the alerts (queued to every receiver: never blocks)."""
        try:
            self.store.append_audit(AuditEvent(action=action, subject=job_id, payload=payload))
        except Exception as exc:  # the alert still goes out
            logger.error("job %s: %s not audited (%s)", job_id, action, exc)
        for alerts in self._alerts:
            alerts.send({"event": action, "job_id": job_id, **payload})

    def alert_problems(self) -> dict[str, str]:
        """The alert receivers whose last alert failed (``risk:webhook``, ``risk:syslog``)
        -> what to tell an operator; merged into ``/readyz``'s unreachable peers, as a
        critical receiver's failed notices are. Empty once one gets through."""
        out = {}
        for alerts in self._alerts:
            problem = alerts.problem()
            if problem is not None:
                out[f"risk:{alerts.target.kind}"] = problem
        return out

    def risk_counts(self) -> dict[str, int]:
        """Risk events raised and cleared since start."""
        with self._lock:
            return {"raised": self._risk.raised, "cleared": self._risk.cleared}

    def miss_report(self, window_s: float = MISS_WINDOW_S) -> MissReport:
        """The misses of the jobs that arrived in the last ``window_s``, from the store
        (the same after a restart and on every replica); blocking: a database read."""
        now = dt.datetime.now(dt.UTC)
        since = now - dt.timedelta(seconds=window_s)
        misses = self.store.deadline_misses(since=since, now=now)
        leads = tuple(m.lead_s for m in misses if m.lead_s is not None)
        false_alerts = self.store.false_alerts(since=since, now=now)
        return MissReport(len(misses), len(leads), leads, since, false_alerts)

    def at_risk(self) -> list[RiskEvent]:
        with self._lock:
            return self._risk.standing()


class _EtaCollector(Collector):
    """Per class: jobs, the largest predicted finish from now, jobs at risk (at scrape)."""

    def __init__(self, owner: Turnaround) -> None:
        self.owner = owner

    def collect(self) -> Iterator[Any]:
        owner = self.owner
        etas = owner.etas()
        now = owner.scheduler.clock.now()
        eta_max = GaugeMetricFamily(
            "radserve_job_eta_seconds",
            "Largest predicted time to finish among unfinished jobs, per class",
            labels=["cls"],
        )
        at_risk = GaugeMetricFamily(
            "radserve_jobs_at_deadline_risk",
            "Unfinished jobs a deadline-risk event was raised for, per class",
            labels=["cls"],
        )
        classes = {r.job_id: r.cls for r in owner.at_risk()}
        by_class: dict[str, float] = {}
        cls_of = {j.job_id: j.cls for j in owner.scheduler.queue_order()[1]}
        for eta in etas:
            cls = cls_of.get(eta.job_id)
            if cls is None:
                continue
            name = cls.value
            by_class[name] = max(by_class.get(name, 0.0), eta.finish - now)
        for cls in PriorityClass:
            name = cls.value
            eta_max.add_metric([name], round(by_class.get(name, 0.0), 3))
            at_risk.add_metric([name], sum(1 for c in classes.values() if c is cls))
        yield eta_max
        yield at_risk


class _Alerts:
    """Risk alerts delivered on a thread of their own: bounded queue, a few retries,
    never blocking the scheduler (not the durable outbox: an alert is worth less once
    late). A retry waits beside the new alerts, not in front of them: before session 42
    each failing alert held the thread for its retry waits (1 + 5 + 30 s), so with a
    receiver answering 500 an URGENT job's alert went out a minute after its risk was
    seen. A job's alerts keep their order (its "cleared" never overtakes its "risk" in
    retry). An alert that does not reach its receiver is logged and counted by reason
    (``radserve_deadline_risk_alerts_dropped_total``): the queue was full, its retries
    ran out or its receiver's answer can never be got past (``failed``), or the server
    stopped before it went out. One per receiver, so a collector that is down does not
    delay the webhook.

    Whatever an attempt raises settles it (:meth:`_attempt`): an answer no retry gets
    past (:class:`_Refused`: a redirect, a 4xx other than 408/429, a URL or body the
    client refuses) fails the alert at once, anything else is retried. Before, only
    httpx's and socket errors were caught: any other exception (httpx refusing to encode
    an infinite ETA) ended the thread, the alert in hand was lost uncounted, every later
    one waited in the queue until the stop, and health said nothing. While the
    receiver's last alert failed, or an attempt has waited :data:`_ALERT_STALLED_S` for
    it, :meth:`problem` says so (``/readyz``). At the stop, an attempt still blocked
    once the grace (and one webhook attempt) is over is aborted (a syslog handshake or
    write on a collector that accepted and does not answer held the thread for up to
    its ``timeout_s``, a year at most, with the alert in hand neither sent nor counted);
    one that does not end then is counted ``stopped``."""

    def __init__(self, target: _WebhookTarget | _SyslogTarget, dropped: Counter) -> None:
        self.target = target
        self.queue: queue.Queue[dict[str, Any] | None] = queue.Queue(_ALERT_QUEUE)
        self.thread: threading.Thread | None = None
        self._stop = threading.Event()  # ends a retry's wait: stopping never waits 30 s
        self._grace_end: float | None = None  # monotonic; set by begin_stop
        self._before_stop: collections.Counter[str] = collections.Counter()
        self._metric = dropped
        self._lock = threading.Lock()
        self.sent = 0
        self.dropped: collections.Counter[str] = collections.Counter()  # by reason
        # alerts failed since the last delivered one, when the first of them failed
        # (wall clock) and why the last did: None while the receiver takes them
        self._failing: tuple[int, dt.datetime, str] | None = None
        # a receiver that keeps failing: one error line a minute, counting the others
        self._failure_lines = FailedAttemptLog()
        self._attempt_since: float | None = None  # monotonic: an attempt in flight
        self._holding = False  # an alert taken from the queue and not settled yet
        self._abandoned = False  # the stop counted the alert in hand: never again
        # alerts waiting for a retry (due, order, alert), earliest first; a job with one
        # there has its later alerts waiting behind it (job id -> alerts, oldest first)
        self._retries: list[tuple[float, int, _Pending]] = []
        self._behind: dict[str, collections.deque[dict[str, Any]]] = {}
        self._order = itertools.count()

    def start(self) -> None:
        name = f"radserve-risk-{self.target.kind}"
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def begin_stop(self, grace_end: float) -> None:
        """Alerts queued now may go out until ``grace_end`` (monotonic), one attempt
        each, no retry waits; later ones are only counted (:meth:`finish_stop`)."""
        with self._lock:
            self._before_stop = collections.Counter(self.dropped)
        self._grace_end = grace_end
        self._stop.set()
        with contextlib.suppress(queue.Full):  # full: the thread ends once it is empty
            self.queue.put_nowait(None)

    def finish_stop(self) -> dict[str, int]:
        """Wait for the thread (the grace, plus one attempt in flight), count what it
        did not take as dropped; returns what was dropped during the stop, by reason
        (empty: everything queued went out)."""
        grace_end = self._grace_end if self._grace_end is not None else time.monotonic()
        if self.thread is not None:
            self.thread.join(max(0.0, grace_end - time.monotonic()) + _ALERT_ATTEMPT_S)
            if self.thread.is_alive():  # blocked on a receiver that does not answer
                self.target.abort()
                self.thread.join(_ALERT_ATTEMPT_S)
            with self._lock:
                stuck = self.thread.is_alive() and self._holding
                self._abandoned = stuck
            if stuck:
                self._drop("stopped")  # the alert in hand: neither sent nor failed
                # the thread is blocked in that attempt: what waits for a retry or behind
                # another alert of its job is not sent either
                waiting = len(self._retries) + sum(len(q) for q in self._behind.values())
                if waiting:
                    self._drop("stopped", waiting)
        left = 0  # the thread never started, or did not end in time
        while True:
            try:
                body = self.queue.get_nowait()
            except queue.Empty:
                break
            left += body is not None
        if left:
            self._drop("stopped", left)
        with self._lock:
            return dict(self.dropped - self._before_stop)

    def send(self, body: dict[str, Any]) -> None:
        try:
            self.queue.put_nowait(body)
        except queue.Full:
            self._drop("queue_full")
            logger.error(
                "deadline-risk %s: queue full, alert for %s dropped",
                self.target.kind,
                body["job_id"],
            )

    def problem(self) -> str | None:
        """What to tell an operator while the receiver's last alert failed or an attempt
        waits long for it, else None."""
        with self._lock:
            failing, since_attempt = self._failing, self._attempt_since
        waited = 0.0 if since_attempt is None else time.monotonic() - since_attempt
        if failing is None and waited < _ALERT_STALLED_S:
            return None
        what = f"deadline-risk {self.target.kind}: "
        if failing is not None:
            count, since, reason = failing
            what += (
                f"{count} alert(s) not delivered since "
                f"{since.isoformat(timespec='seconds')} (last: {reason})"
            )
        if waited >= _ALERT_STALLED_S:
            what += "; " if failing is not None else ""
            what += f"an alert has waited {waited:.0f} s for the receiver to take it"
        return what

    def _drop(self, reason: str, count: int = 1) -> None:
        with self._lock:
            self.dropped[reason] += count
        self._metric.labels(self.target.kind, reason).inc(count)

    def _run(self) -> None:
        try:
            while True:
                if self._stop.is_set():
                    self._no_more_retries()
                due = self._retries[0][0] if self._retries else None
                if due is not None and due <= time.monotonic():
                    self._settle(heapq.heappop(self._retries)[2])
                    continue
                # stopping: the marker may not fit a full queue, so also when empty
                wait = None if due is None else due - time.monotonic()
                if self._grace_end is not None:
                    wait = 0.1
                try:
                    body = self.queue.get(timeout=wait)
                except queue.Empty:
                    if self._grace_end is not None and not self._retries:
                        return  # stopping, and nothing is left
                    continue
                if body is None:
                    if not self._retries:
                        return
                    continue  # the first attempts of alerts released at the stop
                job = str(body.get("job_id"))
                if job in self._behind:  # its earlier alert waits for a retry: after it
                    self._behind[job].append(body)
                    continue
                self._settle(_Pending(body))
        finally:
            self.target.close()

    def _settle(self, pending: _Pending) -> None:
        """One attempt at ``pending``; then delivered, failed, or back among the retries."""
        job = str(pending.body.get("job_id"))
        grace_end = self._grace_end
        if grace_end is not None and time.monotonic() >= grace_end:
            self._drop("stopped")  # the stop's grace is over: counted, not sent
            self._next_of(job)
            return
        with self._lock:
            self._holding = True
        try:
            if self._deliver(pending):
                heapq.heappush(self._retries, (pending.due, next(self._order), pending))
                self._behind.setdefault(job, collections.deque())
                return
        except Exception as exc:  # bookkeeping's own failure: the thread goes on
            logger.error(
                "deadline-risk %s: alert not settled (%s)",
                self.target.kind,
                type(exc).__name__,
            )
        finally:
            with self._lock:
                self._holding = False
        self._next_of(job)

    def _next_of(self, job: str) -> None:
        """``job``'s alert is settled: its next one (if any) is due now."""
        waiting = self._behind.get(job)
        if not waiting:
            self._behind.pop(job, None)
            return
        following = _Pending(waiting.popleft())
        heapq.heappush(self._retries, (following.due, next(self._order), following))

    def _no_more_retries(self) -> None:
        """Stopping: an alert that waits for a retry fails (one attempt each at the stop,
        no retry waits); the alerts behind it get their first attempt."""
        tried = [entry for entry in self._retries if entry[2].tries]
        if not tried:
            return
        self._retries = [entry for entry in self._retries if not entry[2].tries]
        heapq.heapify(self._retries)
        for _, _, pending in tried:
            self._failed(pending.reason)
            self._next_of(str(pending.body.get("job_id")))

    def _deliver(self, pending: _Pending) -> bool:
        """One attempt; True when the alert is to be tried again (``pending.due``)."""
        reason = self._attempt(pending.body)
        if reason is None:
            with self._lock:
                self.sent += 0 if self._abandoned else 1
                self._failing = None
            held = self._failure_lines.got_through(self.target.kind)
            if held:
                logger.info(
                    "deadline-risk %s takes alerts again; %d failed alerts were not logged",
                    self.target.kind,
                    held,
                )
            return False
        pending.tries += 1
        pending.reason = str(reason)
        final = isinstance(reason, _Refused)
        if final or pending.tries > len(_ALERT_RETRIES) or self._stop.is_set():
            self._failed(pending.reason)  # stopping: no second try
            return False
        if len(self._retries) >= _ALERT_QUEUE:  # bounded as the queue is
            self._failed(f"{pending.reason}; no room to retry")
            return False
        pending.due = time.monotonic() + _ALERT_RETRIES[pending.tries - 1]
        return True

    def _attempt(self, body: dict[str, Any]) -> _Refused | str | None:
        """One delivery attempt: None (delivered), a :class:`_Refused` (no retry gets
        past it), or why to retry. Never raises; never the exception's text (it may
        quote the URL and its password)."""
        with self._lock:
            self._attempt_since = time.monotonic()
        try:
            self.target.deliver(body)
        except _Refused as refused:
            return refused
        except _Retry as retry:
            return str(retry)
        except Exception as exc:  # httpx's, a socket's, or anything else: retried
            return type(exc).__name__
        finally:
            with self._lock:
                self._attempt_since = None
        return None

    def _failed(self, reason: str) -> None:
        with self._lock:
            abandoned = self._abandoned
        if abandoned:  # counted "stopped" by the stop already
            return
        self._drop("failed")
        with self._lock:
            if self._failing is None:
                self._failing = (1, dt.datetime.now(dt.UTC), reason)
            else:
                count, since, _ = self._failing
                self._failing = (count + 1, since, reason)
        held = self._failure_lines.failed(self.target.kind)
        if held is not None:
            logger.error(
                "deadline-risk %s failed: %s%s",
                self.target.kind,
                reason,
                f" ({held} more failed alerts not logged since the last line)" if held else "",
            )


@dataclass
class _Pending:
    """An alert on its way: the attempts made, why the last failed, when the next is due."""

    body: dict[str, Any]
    tries: int = 0
    reason: str = ""
    due: float = 0.0  # monotonic; 0: at once


class _Refused(Exception):
    """An alert's answer no retry gets past: the alert fails at once."""


class _Retry(Exception):
    """An answer worth another attempt (408, 429, 5xx): its status line."""


class _WebhookTarget:
    """A JSON POST per alert; a 2xx delivers it. The status decides (at most 64 KiB of
    the body is read, :mod:`radserve.http_answer`, as for the critical webhook and FHIR):
    a 2xx whose body cannot be decoded, or that is cut off, is the receiver's
    acknowledgement all the same (both were retried as failures before: the receiver got
    the alert again).
    408, 429 and 5xx are retried; a redirect (none is followed) or another 4xx can never
    be got past (:class:`_Refused`)."""

    kind = "webhook"

    def __init__(self, url: str) -> None:
        self.url = url
        self.client: httpx.Client | None = None  # opened on the alerts' thread

    def deliver(self, body: dict[str, Any]) -> None:
        try:
            content = json.dumps(body, allow_nan=False, separators=(",", ":")).encode()
        except (TypeError, ValueError) as exc:
            raise _Refused(f"the alert cannot be written as JSON ({type(exc).__name__})") from None
        if self.client is None:
            self.client = deadline_client(timeout_s=_ALERT_ATTEMPT_S)
        headers = {"Content-Type": "application/json"}
        try:
            with total_deadline(_ALERT_ATTEMPT_S):  # in all, not per read (a drip ends too)
                answer = post(self.client, self.url, content=content, headers=headers)
            status, phrase = answer.status_code, answer.reason_phrase
        except (httpx.InvalidURL, httpx.UnsupportedProtocol) as exc:
            raise _Refused(f"the HTTP client refuses the URL ({type(exc).__name__})") from None
        if 200 <= status < 300:
            return
        line = f"HTTP {status} {phrase}".strip()
        if status in (408, 429) or status >= 500:
            raise _Retry(line)
        raise _Refused(line)

    def abort(self) -> None:
        """Nothing to end: an attempt ends within ``_ALERT_ATTEMPT_S`` in all."""

    def close(self) -> None:
        if self.client is not None:
            self.client.close()


class _SyslogTarget:
    """An RFC 5424 message per alert through the audit exporter's syslog client (MSGID
    ``RADSERVE-RISK``, severity warning for a risk, notice for a clearing; the event and
    job id also in its structured data); written in full to the stream delivers it
    (syslog has no acknowledgement)."""

    kind = "syslog"

    def __init__(self, settings: RiskSyslogSettings) -> None:
        self.settings = settings
        self.client = SyslogClient(SyslogEndpoint.of_target(settings))

    def message(self, body: dict[str, Any]) -> bytes:
        event = str(body["event"])
        return rfc5424(
            json.dumps(body, separators=(",", ":"), allow_nan=False).encode(),
            msgid=RISK_MSGID,
            ts=dt.datetime.now(dt.UTC),
            app_name=self.settings.app_name,
            structured={
                "event": event,
                "job": str(body["job_id"]),
                "cls": str(body["priority_class"]),
            },
            severity=WARNING if event == DEADLINE_RISK else NOTICE,
            facility=self.settings.facility,
        )

    def deliver(self, body: dict[str, Any]) -> None:
        try:
            message = frame(self.message(body))
        except (TypeError, ValueError, KeyError) as exc:
            what = f"the alert cannot be written as a message ({type(exc).__name__})"
            raise _Refused(what) from None
        self.client.send([message])

    def abort(self) -> None:
        """From the stopping thread: end a handshake or write blocked on a collector
        that accepted and does not answer (:meth:`SyslogClient.abort`)."""
        self.client.abort()

    def close(self) -> None:
        self.client.close()


def learn_from_store(
    model: ServiceTimeModel,
    store: Store,
    device: str,
    limit: int,
    lane: Callable[[PriorityClass], str | None] | None = None,
    *,
    shares_urgent_holds: bool | None = None,
) -> int:
    """Teach ``model`` the last ``limit`` succeeded jobs in ``store`` (oldest first): their
    stage timings, and their size from the report file; the jobs ran on ``device``;
    ``lane``: each job's service-time lane by its class. With ``shares_urgent_holds``
    (the server's ``urgent_exclusive``), also each job's share of the server's wall time,
    measured again from the start and finish of the last ``limit`` jobs of any end
    (:func:`~radserve.turnaround.share.shares_of_runs`): the store keeps no shares, and
    without them a restarted server's throughput bound fell back to the stage timings
    until new jobs finished (session 10)."""
    if limit <= 0:
        return 0
    shares: dict[str, float] = {}
    try:
        page = store.list_jobs(state=StoredState.SUCCEEDED, limit=limit)
        if shares_urgent_holds is not None:
            every = store.list_jobs(limit=limit).items
            shares = shares_of_runs(_runs(every), shares_urgent_holds)
    except Exception as exc:  # the server runs without history
        logger.warning("service times: no history read (%s)", type(exc).__name__)
        return 0
    return learn_records(model, reversed(page.items), device, lane, shares)


def _runs(records: Iterable[JobRecord]) -> list[tuple[str, float, float, bool]]:
    """The stored jobs that ran: (id, started, finished POSIX s, URGENT or not)."""
    urgent = PriorityClass.URGENT
    return [
        (r.id, r.started.timestamp(), r.finished.timestamp(), r.priority_class is urgent)
        for r in records
        if r.started is not None and r.finished is not None and not r.cached_from
    ]


def learn_records(
    model: ServiceTimeModel,
    records: Iterable[JobRecord],
    device: str,
    lane: Callable[[PriorityClass], str | None] | None = None,
    shares: Mapping[str, float] | None = None,
    size_of: Callable[[JobRecord], StudySize | None] | None = None,
) -> int:
    """Teach ``model`` these succeeded jobs (in order): their stage timings, and their
    size from the report file; the jobs ran on ``device`` (``lane``: as
    :func:`learn_from_store`; ``shares``: job id -> its share of wall time, if known;
    ``size_of``: each job's size where the caller has read it already)."""
    learned = 0
    for record in records:
        if record.cached_from or not record.result_path or not record.stage_timings:
            continue
        if size_of is not None:
            size = size_of(record)
        else:
            size = StudySize.of_report(Path(record.result_path))
        if size is None:
            continue
        model.observe(
            pipeline=record.pipeline_name,
            device=device,
            precision=record.precision,
            size=size,
            timings=dict(record.stage_timings),
            lane=None if lane is None else lane(record.priority_class),
            share_s=None if shares is None else shares.get(record.id),
        )
        learned += 1
    return learned


@dataclass(frozen=True)
class HistoryArrivals:
    """A trace ``radserve plan --replay`` runs again: the arrivals (seconds from the
    first) and classes, oldest first, of the jobs read that the server ran; the cache
    answers among them are counted, not replayed (they took no server time), so that
    the plan can say why it replays fewer jobs than were asked for."""

    arrivals: list[tuple[float, PriorityClass]]
    cache_answers: int


def history_arrivals(store: Store, limit: int) -> HistoryArrivals:
    """The last ``limit`` jobs as a :class:`HistoryArrivals`."""
    page = store.list_jobs(limit=min(limit, 1000))
    items, cursor = list(page.items), page.next_cursor
    while cursor is not None and len(items) < limit:
        page = store.list_jobs(limit=min(1000, limit - len(items)), cursor=cursor)
        items += page.items
        cursor = page.next_cursor
    jobs = sorted((r for r in items if not r.cached_from), key=lambda r: r.arrival)
    cache_answers = len(items) - len(jobs)
    if not jobs:
        return HistoryArrivals([], cache_answers)
    first = jobs[0].arrival
    arrivals = [((r.arrival - first).total_seconds(), r.priority_class) for r in jobs]
    return HistoryArrivals(arrivals, cache_answers)


def _study_size(folder: Path) -> StudySize | None:
    """Slices of a stored study, counted as its instance files (None: unknown)."""
    try:
        with os.scandir(folder) as it:
            count = sum(1 for entry in it if entry.is_file() and not entry.name.endswith(".gz"))
    except OSError:
        return None
    return StudySize(count) if count > 1 else None


_LAST_POSIX = dt.datetime(9999, 12, 31, 23, 59, 59, tzinfo=dt.UTC).timestamp()


def _utc(posix: float) -> dt.datetime:
    """A walk's time as a datetime; one past the calendar's end (before session 32 a
    service-time prior set absurdly high made ETAs that large; the settings now refuse
    it) is its last second, not an OverflowError in the job API."""
    if not math.isfinite(posix) or posix > _LAST_POSIX:
        posix = _LAST_POSIX
    return dt.datetime.fromtimestamp(max(posix, 0.0), dt.UTC)


def _iso(posix: float) -> str:
    return _utc(posix).isoformat()


def _seconds(value: float) -> float | None:
    """A duration for a risk record or alert, None when not finite: an ETA past the
    calendar (infinite) made ``Infinity``, which JSON has not (httpx refused to encode
    the alert and the alert thread died; the audit record was lost)."""
    return round(value, 3) if math.isfinite(value) else None


def _utc_iso(when: dt.datetime) -> str:
    """A stored (aware) time as :func:`_iso` writes one."""
    return when.astimezone(dt.UTC).isoformat()


__all__ = [
    "DEADLINE_RISK",
    "DEADLINE_RISK_CLEARED",
    "RISK_ALERTS_DROPPED",
    "RISK_MSGID",
    "HistoryArrivals",
    "JobEta",
    "MissReport",
    "RiskEvent",
    "Turnaround",
    "history_arrivals",
    "learn_from_store",
    "learn_records",
]

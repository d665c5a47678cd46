"""Prometheus metrics of one server: queues, turnaround, stages, batches, devices,
errors and HTTP requests, in a registry of its own (several servers in one test process
must not share counters).

Counters and histograms are fed by the scheduler hooks and the HTTP middleware; queue
depths, open breakers and device gauges are read when scraped (a collector), so they
are never stale and cost nothing between scrapes. GPU figures come from NVML
(``nvidia-ml-py``) when it and a GPU are present; otherwise the host's CPU utilisation
and memory (``psutil``) describe the CPU device.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from radserve.gateway.outbox import LaneState
from radserve.scheduling import PriorityClass, SchedulerSnapshot
from radserve.store.outbox import DestinationStatus

logger = logging.getLogger(__name__)

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
_TAT_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200)
_STAGE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
_HTTP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10)


class _LiveCollector(Collector):
    """Queue depth per class, running jobs, open breakers, the scheduler's hold and
    devices, read at scrape."""

    def __init__(self, snapshot: Callable[[], SchedulerSnapshot]) -> None:
        self._snapshot = snapshot
        self._nvml = _init_nvml()

    def collect(self) -> Iterator[Any]:
        snap = self._snapshot()
        queued = GaugeMetricFamily(
            "radserve_queue_depth", "Jobs waiting to start, per priority class", labels=["cls"]
        )
        running = GaugeMetricFamily(
            "radserve_jobs_running", "Jobs started and unfinished, per class", labels=["cls"]
        )
        for cls in PriorityClass:
            queued.add_metric([cls.name], snap.queued.get(cls, 0))
            running.add_metric([cls.name], snap.running.get(cls, 0))
        yield queued
        yield running
        breakers = GaugeMetricFamily(
            "radserve_model_breaker_open",
            "1 while a model's circuit breaker is open",
            labels=["model"],
        )
        for model in snap.open_models:
            breakers.add_metric([model], 1)
        yield breakers
        held = GaugeMetricFamily(
            "radserve_scheduler_held",
            "1 while the scheduler starts no new work, by reason (lease_unproven: this "
            "replica cannot renew its job leases, e.g. the database does not answer)",
            labels=["reason"],
        )
        if snap.held is not None:
            held.add_metric([snap.held.reason], 1)
        yield held
        yield GaugeMetricFamily(
            "radserve_scheduler_held_seconds",
            "How long the scheduler has started no new work (0 while work goes on)",
            value=snap.held_s,
        )
        yield from self._devices()

    def _devices(self) -> Iterator[Any]:
        util = GaugeMetricFamily(
            "radserve_device_utilization_ratio", "Device busy fraction (0-1)", labels=["device"]
        )
        used = GaugeMetricFamily(
            "radserve_device_memory_used_bytes", "Device memory in use", labels=["device"]
        )
        total = GaugeMetricFamily(
            "radserve_device_memory_total_bytes", "Device memory size", labels=["device"]
        )
        if self._nvml is not None:
            nvml, count = self._nvml
            for index in range(count):
                try:
                    handle = nvml.nvmlDeviceGetHandleByIndex(index)
                    rates = nvml.nvmlDeviceGetUtilizationRates(handle)
                    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                except Exception:  # a GPU that fell off the bus must not break /metrics
                    logger.warning("NVML could not read GPU %d", index)
                    continue
                util.add_metric([f"cuda:{index}"], rates.gpu / 100.0)
                used.add_metric([f"cuda:{index}"], float(memory.used))
                total.add_metric([f"cuda:{index}"], float(memory.total))
        try:
            import psutil
        except ImportError:  # optional: the CPU device is then not described
            psutil = None
        if psutil is not None:
            memory = psutil.virtual_memory()
            util.add_metric(["cpu"], psutil.cpu_percent(interval=None) / 100.0)
            used.add_metric(["cpu"], float(memory.total - memory.available))
            total.add_metric(["cpu"], float(memory.total))
        yield util
        yield used
        yield total


class _OutboxCollector(Collector):
    """Outbox deliveries per (kind, destination), read from the store at scrape."""

    def __init__(self, status: Callable[[], list[DestinationStatus]]) -> None:
        self._status = status

    def collect(self) -> Iterator[Any]:
        labels = ["kind", "destination"]
        pending = GaugeMetricFamily(
            "radserve_outbox_pending",
            "Deliveries not yet delivered (pending, being sent, or stored and awaiting "
            "the destination's storage commitment)",
            labels=labels,
        )
        age = GaugeMetricFamily(
            "radserve_outbox_oldest_pending_age_seconds",
            "Age of the oldest undelivered delivery (0 when none)",
            labels=labels,
        )
        failing = GaugeMetricFamily(
            "radserve_outbox_failing",
            "Deliveries that failed: retrying (will try again) or failed_permanent",
            labels=[*labels, "state"],
        )
        try:
            statuses = self._status()
        except Exception:  # the database is away: /metrics still answers
            logger.warning("metrics: cannot read the outbox")
            statuses = []
        now = dt.datetime.now(dt.UTC)
        for st in statuses:
            key = [st.kind.value, st.destination]
            pending.add_metric(key, st.pending + st.sending + st.committing)
            oldest = 0.0 if st.oldest_pending is None else (now - st.oldest_pending).total_seconds()
            age.add_metric(key, max(0.0, oldest))
            failing.add_metric([*key, "retrying"], st.retrying)
            failing.add_metric([*key, "failed_permanent"], st.failed_permanent)
        yield pending
        yield age
        yield failing


class SenderCollector(Collector):
    """Which destinations this server sends to (replicas: one sender per destination)."""

    def __init__(self, senders: Callable[[], list[LaneState]]) -> None:
        self._senders = senders

    def collect(self) -> Iterator[Any]:
        labels = ["kind", "destination"]
        sender = GaugeMetricFamily(
            "radserve_outbox_sender",
            "1 while this server sends the destination's deliveries, 0 while another "
            "replica does (one sender per destination on a shared PostgreSQL)",
            labels=labels,
        )
        taken = CounterMetricFamily(
            "radserve_outbox_taken_over",
            "Deliveries a previous sender left being sent, queued again when this server "
            "took the destination over",
            labels=labels,
        )
        late = CounterMetricFamily(
            "radserve_storage_commitment_late_reports",
            "Storage commitment reports that came after their rows stopped waiting "
            "(deadline passed, or retried by an operator), since start",
            labels=labels,
        )
        for lane in self._senders():
            key = [lane.kind, lane.destination]
            sender.add_metric(key, 1 if lane.sending_here else 0)
            taken.add_metric(key, lane.taken_over)
            late.add_metric(key, lane.late_commitment_reports)
        yield sender
        yield taken
        yield late


ProcessList = Callable[[], list[tuple[str, int]]]


class ProcessesCollector(Collector):
    """The standard ``process_*`` series (CPU seconds, resident and virtual memory, start
    time, open and max file descriptors) of each of the server's processes, labelled
    ``process``: ``server`` (the serving process), and those the sources add (the API
    readers ``reader-0``... and their ``audit_writer``), read from ``/proc`` at scrape.
    One series per process and name, so ``sum(process_cpu_seconds_total)`` is the
    server's whole CPU time with nothing counted twice. ``radserve_process_pss_bytes``:
    each one's proportional set size (shared pages divided among their sharers, so
    the sum is the server's memory; resident sizes count shared pages once per process);
    ``radserve_process_pid``: which PID a label is now."""

    def __init__(self) -> None:
        self._sources: list[ProcessList] = [lambda: [("server", os.getpid())]]
        self._readers: dict[int, ProcessCollector] = {}

    def add(self, source: ProcessList) -> None:
        """More processes: ``source`` names them (label, PID) at each scrape."""
        self._sources.append(source)

    def collect(self) -> Iterator[Any]:
        families: dict[str, Any] = {}
        pids = GaugeMetricFamily(
            "radserve_process_pid", "PID of each of the server's processes", labels=["process"]
        )
        pss = GaugeMetricFamily(
            "radserve_process_pss_bytes",
            "Proportional set size of each of the server's processes (sums without "
            "counting shared pages twice)",
            labels=["process"],
        )
        seen: set[int] = set()
        for source in self._sources:
            try:
                processes = source()
            except Exception:  # a pool stopping: its processes are left out
                logger.warning("metrics: cannot list the server's processes", exc_info=True)
                continue
            for name, pid in processes:
                seen.add(pid)
                reader = self._readers.get(pid)
                if reader is None:
                    reader = self._readers[pid] = ProcessCollector(
                        pid=lambda pid=pid: pid, registry=None
                    )
                read = list(reader.collect())
                if not read:  # exited meanwhile
                    continue
                pids.add_metric([name], pid)
                for family in read:
                    merged = families.get(family.name)
                    if merged is None:
                        merged = families[family.name] = type(family)(
                            family.name, family.documentation, labels=["process"]
                        )
                    merged.add_metric([name], family.samples[0].value)
                size = rollup_bytes(pid)
                if size is not None:
                    pss.add_metric([name], size)
        for gone in set(self._readers) - seen:
            del self._readers[gone]
        yield from families.values()
        yield pss
        yield pids


def rollup_bytes(pid: int, field: str = "Pss") -> float | None:
    """``field`` of ``/proc/<pid>/smaps_rollup`` in bytes: ``Pss`` (what
    ``radserve_process_pss_bytes`` reports), ``Rss``, ... (None: unreadable, not Linux).
    The one reader of that file (``tools/layout_cost.py`` uses it too)."""
    prefix = f"{field}:".encode()
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as rollup:
            for line in rollup:
                if line.startswith(prefix):
                    return float(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _init_nvml() -> tuple[Any, int] | None:
    """NVML and the GPU count, or None (no nvidia-ml-py, no driver, no GPU)."""
    try:
        import pynvml  # provided by nvidia-ml-py
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        count = int(pynvml.nvmlDeviceGetCount())
    except Exception:  # NVMLError when there is no driver: a CPU host
        return None
    return (pynvml, count) if count else None


class Metrics:
    """Every metric the server exports, in its own registry."""

    def __init__(
        self,
        snapshot: Callable[[], SchedulerSnapshot],
        *,
        outbox: Callable[[], list[DestinationStatus]] | None = None,
    ) -> None:
        self.registry = CollectorRegistry()
        reg = self.registry
        self.tat = Histogram(
            "radserve_job_turnaround_seconds",
            "Arrival to final state of succeeded jobs, per priority class",
            ["cls"],
            buckets=_TAT_BUCKETS,
            registry=reg,
        )
        self.deadline_misses = Counter(
            "radserve_deadline_misses", "Jobs that passed their deadline", ["cls"], registry=reg
        )
        self.stage = Histogram(
            "radserve_stage_seconds",
            "Time per job stage (queue, ingest, inference, postprocess, report)",
            ["stage"],
            buckets=_STAGE_BUCKETS,
            registry=reg,
        )
        self.paused = Counter(
            "radserve_paused_for_urgent_seconds",
            "Seconds finished routine jobs' CPU stages spent paused while URGENT work ran "
            "(inside radserve_stage_seconds), per priority class",
            ["cls"],
            registry=reg,
        )
        self.batch_size = Histogram(
            "radserve_batch_size",
            "Items per device call",
            ["model"],
            buckets=_BATCH_BUCKETS,
            registry=reg,
        )
        self.batch_seconds = Histogram(
            "radserve_batch_seconds",
            "Device call latency",
            ["model", "device"],
            buckets=_STAGE_BUCKETS,
            registry=reg,
        )
        self.jobs = Counter(
            "radserve_jobs", "Jobs reaching a state", ["state", "cls"], registry=reg
        )
        self.failure_notices = Counter(
            "radserve_failure_notices",
            "Notices of failed jobs queued for the sender's side, per channel",
            ["channel"],
            registry=reg,
        )
        self.errors = Counter(
            "radserve_errors", "Errors by stable code (jobs and HTTP)", ["code"], registry=reg
        )
        self.api_process_restarts = Counter(
            "radserve_api_process_restarts",
            "API reader processes and audit writer processes started again after one died",
            ["process"],
            registry=reg,
        )
        self.own_results_ignored = Counter(
            "radserve_own_results_ignored",
            "radserve's own results received back (SEG/SR/SC) and not processed, per intake",
            ["intake"],
            registry=reg,
        )
        self.http_requests = Counter(
            "radserve_http_requests",
            "HTTP requests by route template and status",
            ["method", "route", "status"],
            registry=reg,
        )
        self.http_seconds = Histogram(
            "radserve_http_request_seconds",
            "HTTP request latency by route template",
            ["method", "route"],
            buckets=_HTTP_BUCKETS,
            registry=reg,
        )
        reg.register(_LiveCollector(snapshot))
        if outbox is not None:
            reg.register(_OutboxCollector(outbox))
        self.processes = ProcessesCollector()
        reg.register(self.processes)

    def observe_http(self, method: str, route: str, status: int, seconds: float) -> None:
        """One HTTP request, by route template (whichever API process answered it)."""
        self.http_requests.labels(method, route, str(status)).inc()
        self.http_seconds.labels(method, route).observe(seconds)

    def observe_stages(self, timings: dict[str, float]) -> None:
        """Stage timings of a finished job (``queue``, ``ingest``, ``<model>: infer``...;
        bounded by the installed models)."""
        for name, seconds in timings.items():
            if name not in ("total", "run", "paused"):
                self.stage.labels(name).observe(seconds)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


__all__ = ["CONTENT_TYPE", "Metrics", "ProcessesCollector", "SenderCollector", "rollup_bytes"]

"""``radserve bench --scenario priority``: an URGENT study's turnaround under load.

One process, warm sessions, the same phantom studies throughout:

1. sequential: every study through :func:`~radserve.pipeline.run_study`, one after
   another (a server without a queue) -> ``sequential_s``;
2. then ``repeats`` rounds of: solo, the URGENT study alone through the scheduler ->
   ``urgent_solo_s``; load, ``n_routine`` OUTPATIENT studies submitted and, once the
   device has run a routine batch, the URGENT one (its class comes from its DICOM
   Requested Procedure Priority, STAT) -> ``urgent_tat_s`` (its submission to its
   report), once per scheduler policy (:data:`POLICIES`: routine CPU stages running on
   beside the URGENT study, ``before``, or pausing at their checkpoints, ``after``),
   their order alternating between rounds. The last ``after`` run drains the queue ->
   ``drain_s`` (first submission to last report).

The goal is ``urgent_tat_ratio`` = urgent_tat_s / urgent_solo_s <= 1.3 (the median over
rounds), with ``drain_s`` no worse than ``sequential_s``. The drained run's reports are
checked against the sequential ones (same findings and organ volumes). Every load run
also reports where the URGENT study's time went (:mod:`radserve.bench.priority_trace`).
"""

from __future__ import annotations

import logging
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from radserve.bench import PIPELINE
from radserve.bench.errors import BenchError
from radserve.bench.priority_trace import TracingExecutor, TracingScheduler, urgent_breakdown
from radserve.config import SchedulerSettings
from radserve.inference.providers import usable_cores
from radserve.models.registry import ModelRegistry
from radserve.phantom import PhantomSpec, generate_phantom, write_dicom_series
from radserve.pipeline import SessionPool, StudyRequest
from radserve.pipeline.spec import PipelineSpec, load_pipeline
from radserve.pipeline.study import StudyResult, run_study
from radserve.scheduling import (
    BatchEvent,
    DeadlineMiss,
    JobEvent,
    JobState,
    JobTicket,
    PriorityClass,
)

logger = logging.getLogger(__name__)


URGENT_SEED = 100  # held out from training (training seeds are >= 1000)
GOAL_RATIO = 1.3


def ensure_studies(cache_dir: Path, n_routine: int, n_slices: int) -> tuple[Path, list[Path]]:
    """The URGENT study (priority STAT) and ``n_routine`` routine ones, written once."""

    def study(seed: int, priority: str) -> Path:
        folder = Path(cache_dir) / f"priority-{n_slices}-{seed}"
        marker = folder / ".complete"
        if not marker.exists():
            # Native slice spacing, fewer slices: a shorter scan, not a coarser one.
            phantom = generate_phantom(PhantomSpec.random(seed).with_slices(n_slices))
            write_dicom_series(phantom, folder, priority=priority)
            marker.write_text("ok\n")
        return folder

    urgent = study(URGENT_SEED, "STAT")
    return urgent, [study(URGENT_SEED + 1 + n, "ROUTINE") for n in range(n_routine)]


def paused_summary(paused: dict[str, float]) -> dict[str, object]:
    """The routine jobs' ``paused`` timings (seconds their CPU stages waited at
    checkpoints while URGENT work ran): how many paused, in all, the longest."""
    waited = [v for v in paused.values() if v > 0]
    return {
        "jobs": len(paused),
        "jobs_paused": len(waited),
        "total": round(sum(waited), 3),
        "max": round(max(waited), 3) if waited else 0.0,
    }


class _Stopwatch:
    """Hooks that note when each job ended (scheduler clock) and count batches."""

    def __init__(self) -> None:
        self.ended: dict[str, float] = {}  # scheduler clock
        self.results: dict[str, StudyResult] = {}
        self.paused: dict[str, float] = {}  # seconds paused for URGENT work, per ended job
        self.failures: list[str] = []
        self.batches = 0
        self._cond = threading.Condition()

    def on_state(self, event: JobEvent) -> None:
        if not event.state.terminal:
            return
        with self._cond:
            self.ended[event.job_id] = event.at
            self.paused[event.job_id] = event.timings.get("paused", 0.0)
            if event.state is JobState.SUCCEEDED and isinstance(event.result, StudyResult):
                self.results[event.job_id] = event.result
            elif event.state is not JobState.CANCELLED:  # the bench cancels what it not needs
                self.failures.append(f"{event.job_id}: {event.error_code} {event.error_message}")
            self._cond.notify_all()

    def on_deadline_miss(self, miss: DeadlineMiss) -> None:
        pass

    def on_batch(self, event: BatchEvent) -> None:
        with self._cond:
            self.batches += 1
            self._cond.notify_all()

    def wait_for(self, predicate: Callable[[], bool], timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(predicate, timeout)


class _Run:
    """One scheduler + executor over warm sessions; studies submitted by name."""

    def __init__(
        self,
        pipeline: PipelineSpec,
        registry: ModelRegistry,
        sessions: SessionPool,
        out_dir: Path,
        precision: str,
        cpu_workers: int,
        settings: SchedulerSettings | None = None,
    ) -> None:
        self.watch = _Stopwatch()
        self.scheduler = TracingScheduler(settings, hooks=self.watch)
        self.executor = TracingExecutor(
            self.scheduler, devices=(sessions.runtime.device,), cpu_workers=cpu_workers
        )
        self._args = (pipeline, registry, sessions, out_dir, precision)
        self.submitted: dict[str, float] = {}

    def submit(self, job_id: str, study: Path, priority: PriorityClass | None) -> JobTicket:
        pipeline, registry, sessions, out_dir, precision = self._args
        request = StudyRequest(
            job_id=job_id,
            source=study,
            pipeline=pipeline,
            out_dir=out_dir / job_id,
            rules=self.scheduler.rules,
            priority=priority,
            precision=precision,  # type: ignore[arg-type]
            key_images=False,
        ).job(registry=registry, sessions=sessions)
        self.submitted[job_id] = self.scheduler.clock.now()
        return self.scheduler.submit(request)

    def __enter__(self) -> _Run:
        self.executor.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.executor.stop()

    def finish(self, timeout: float) -> None:
        if not self.executor.wait_idle(timeout):
            raise BenchError(f"scheduled studies did not finish within {timeout:.0f} s")
        if self.watch.failures:
            raise BenchError("scheduled studies failed: " + "; ".join(self.watch.failures))

    def tat(self, job_id: str) -> float:
        return self.watch.ended[job_id] - self.submitted[job_id]

    def breakdown(self, job_id: str) -> dict[str, object]:
        """Where ``job_id``'s turnaround went (:func:`urgent_breakdown`)."""
        return urgent_breakdown(
            self.scheduler.trace,
            job_id,
            self.submitted[job_id],
            self.watch.ended[job_id],
            self.executor.pauses,
        )


def _answer_difference(scheduled: StudyResult, alone: StudyResult) -> dict[str, Any] | None:
    """How a study's answer through the scheduler (its slices batched with other studies')
    differs from the same study run alone: None when the finding count and each organ's
    coverage and volume (to 0.001 ml) agree. On a GPU a batch of another shape may run on
    other kernels (session 23's H200 differed here; the CPUs have not)."""

    def organs(result: StudyResult) -> dict[str, tuple[str, float]]:
        return {
            m.label: (m.coverage, round(m.volume_ml or 0.0, 3))
            for m in result.report.organ_measurements
        }

    a, b = organs(scheduled), organs(alone)
    differing = {
        k: [a.get(k), b.get(k)] for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)
    }
    findings = [len(scheduled.report.findings), len(alone.report.findings)]
    if not differing and findings[0] == findings[1]:
        return None
    return {"findings_scheduled_alone": findings, "organs_scheduled_alone": differing}


POLICIES: dict[str, SchedulerSettings] = {
    # the scheduler before issue 19's goal 7: routine CPU stages already running went on
    "before": SchedulerSettings(yield_to_urgent=False),
    # the default: they pause at their next checkpoint while the URGENT job is unfinished
    "after": SchedulerSettings(),
}


def _median(values: list[float]) -> float:
    return float(statistics.median(values))


def run_priority_bench(
    *,
    n_routine: int = 8,
    n_slices: int = 300,
    precision: str = "fp32",
    cache_dir: Path | None = None,
    pipeline: str | Path = PIPELINE,
    registry: ModelRegistry | None = None,
    cpu_workers: int | None = None,
    repeats: int = 1,
    timeout_s: float = 3600.0,
    log: Callable[[str], None] = logger.info,
) -> dict[str, Any]:
    """Run the measurements; returns the JSON summary.

    Each of ``repeats`` rounds measures the URGENT study alone, then under load with each
    of :data:`POLICIES` (their order alternating from round to round), so before and after
    are measured side by side on the same machine state. A load run ends once the URGENT
    study is done (the routine ones are cancelled), except the last ``after`` run, which
    drains the queue for ``drain_s`` and the check against the sequential results.
    The headline ``urgent_tat_ratio`` is the median over rounds of ``after`` / solo.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    cache_dir = Path(cache_dir or Path(tempfile.gettempdir()) / "radserve-bench")
    registry = registry or ModelRegistry()
    spec = load_pipeline(pipeline)
    workers = cpu_workers or max(2, min(8, usable_cores() // 2))
    log(f"preparing {n_routine + 1} phantom studies of {n_slices} slices")
    urgent, routine = ensure_studies(cache_dir, n_routine, n_slices)
    sessions = SessionPool()
    load_before = os.getloadavg()[0]
    solo: list[float] = []
    tats: dict[str, list[float]] = {name: [] for name in POLICIES}
    breakdowns: dict[str, list[dict[str, object]]] = {name: [] for name in POLICIES}
    drain_s = 0.0
    finished_before_urgent, urgent_class = 0, ""
    routine_paused = paused_summary({})
    differences: dict[str, dict[str, Any]] = {"not compared": {}}
    with tempfile.TemporaryDirectory(prefix="radserve-priority-") as tmp:
        out = Path(tmp)

        def sequential(study: Path, name: str) -> StudyResult:
            return run_study(
                study,
                pipeline=spec,
                out_dir=out / "sequential" / name,
                registry=registry,
                sessions=sessions,
                precision=precision,  # type: ignore[arg-type]
                key_images=False,
            )

        log("warm-up: sessions and file cache")
        sequential(urgent, "warm-up")
        log("sequential: every study, one after another")
        t0 = time.perf_counter()
        reference = {f"routine-{n}": sequential(s, f"routine-{n}") for n, s in enumerate(routine)}
        reference["urgent"] = sequential(urgent, "urgent")
        sequential_s = time.perf_counter() - t0

        def one_run(r: int, name: str | None) -> _Run:
            settings = POLICIES[name] if name else None
            return _Run(spec, registry, sessions, out / f"{r}-{name}", precision, workers, settings)

        for r in range(repeats):
            log(f"round {r + 1} of {repeats}: the URGENT study alone through the scheduler")
            with one_run(r, None) as run:
                run.submit("urgent", urgent, None)
                run.finish(timeout_s)
                solo.append(run.tat("urgent"))
            order = list(POLICIES) if r % 2 == 0 else list(POLICIES)[::-1]
            for name in order:
                drain = r == repeats - 1 and name == "after"
                log(f"round {r + 1}: {n_routine} OUTPATIENT studies, then the URGENT one ({name})")
                with one_run(r, name) as run:
                    for n, study in enumerate(routine):
                        run.submit(f"routine-{n}", study, PriorityClass.OUTPATIENT)
                    if not run.watch.wait_for(lambda: run.watch.batches > 0, timeout_s):
                        raise BenchError("the device never started on the routine studies")
                    ticket = run.submit("urgent", urgent, None)  # class from its DICOM priority
                    urgent_class = ticket.cls.name
                    if not drain:
                        run.watch.wait_for(lambda: "urgent" in run.watch.ended, timeout_s)
                        for n in range(n_routine):
                            run.scheduler.cancel(f"routine-{n}")
                    run.finish(timeout_s)
                    tats[name].append(run.tat("urgent"))
                    breakdowns[name].append(run.breakdown("urgent"))
                    if drain:
                        drain_s = max(run.watch.ended.values()) - min(run.submitted.values())
                        urgent_end = run.watch.ended["urgent"]
                        finished_before_urgent = sum(
                            1 for t in run.watch.ended.values() if t < urgent_end
                        )
                        routine_paused = paused_summary(
                            {k: v for k, v in run.watch.paused.items() if k != "urgent"}
                        )
                        differences = {
                            k: d
                            for k, v in reference.items()
                            if (d := _answer_difference(run.watch.results[k], v)) is not None
                        }
    ratios = {name: [t / s for t, s in zip(tats[name], solo, strict=True)] for name in POLICIES}
    ratio = _median(ratios["after"])
    return {
        "urgent_tat_s": _median(tats["after"]),
        "urgent_solo_s": _median(solo),
        "urgent_tat_ratio": ratio,
        "goal_ratio": GOAL_RATIO,
        "meets_goal": ratio <= GOAL_RATIO,
        "before": {
            "policy": "scheduler.yield_to_urgent: false",
            "urgent_tat_s": _median(tats["before"]),
            "urgent_tat_ratio": _median(ratios["before"]),
        },
        "rounds": {
            "solo_s": solo,
            **{f"{name}_tat_s": tats[name] for name in POLICIES},
            **{f"{name}_ratio": ratios[name] for name in POLICIES},
        },
        # where the URGENT study's time went, per run (radserve.bench.priority_trace)
        "urgent_breakdown": breakdowns,
        "drain_s": drain_s,
        "sequential_s": sequential_s,
        "drain_over_sequential": drain_s / sequential_s,
        "urgent_class": urgent_class,
        "routine_finished_before_urgent": finished_before_urgent,
        # the drained run's routine jobs: how long their CPU stages paused for the URGENT one
        "routine_paused_s": routine_paused,
        "results_match_sequential": not differences,
        "result_differences": differences,  # study -> what differed (scheduled, alone)
        "n_routine": n_routine,
        "repeats": repeats,
        "load_average_1min": [load_before, os.getloadavg()[0]],
        "study": {"shape": [n_slices, 512, 512]},
        "device": sessions.runtime.device,
        "providers": list(sessions.runtime.providers),
        "cpu_workers": workers,
        "precision": precision,
        "pipeline": spec.name,
    }


__all__ = ["POLICIES", "ensure_studies", "run_priority_bench"]

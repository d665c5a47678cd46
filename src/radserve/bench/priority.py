"""``radserve bench --scenario priority``: an URGENT study's turnaround under load.

One process, warm sessions, the same phantom studies in three runs:

1. sequential: every study through :func:`~radserve.study.run_study`, one after
   another (a server without a queue) -> ``sequential_s``;
2. solo: the URGENT study alone through the scheduler -> ``urgent_solo_s``;
3. load: ``n_routine`` OUTPATIENT studies submitted, then, once the device has run a
   routine batch, the URGENT one (its class comes from its DICOM Requested Procedure
   Priority, STAT) -> ``urgent_tat_s`` (its submission to its report) and ``drain_s``
   (first submission to last report).

The goal is ``urgent_tat_ratio`` = urgent_tat_s / urgent_solo_s <= 1.3, with
``drain_s`` no worse than ``sequential_s``. The scheduled reports are checked against
the sequential ones (same findings and organ volumes).
"""

from __future__ import annotations

import logging
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from radserve.inference.providers import usable_cores
from radserve.models.registry import ModelRegistry
from radserve.phantom import PhantomSpec, generate_phantom, write_dicom_series
from radserve.pipeline import SessionPool
from radserve.pipelines.spec import PipelineSpec, load_pipeline
from radserve.scheduling import (
    BatchEvent,
    DeadlineMiss,
    InProcessExecutor,
    JobEvent,
    JobState,
    JobTicket,
    PriorityClass,
    Scheduler,
    SchedulerConfig,
)
from radserve.scheduling.study_work import study_request
from radserve.study import StudyResult, run_study

logger = logging.getLogger(__name__)

PIPELINE = "ct-chest-abdomen"
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


class _Stopwatch:
    """Hooks that note when each job ended (``time.perf_counter``) and count batches."""

    def __init__(self) -> None:
        self.ended: dict[str, float] = {}
        self.results: dict[str, StudyResult] = {}
        self.failures: list[str] = []
        self.batches = 0
        self._cond = threading.Condition()

    def on_state(self, event: JobEvent) -> None:
        if not event.state.terminal:
            return
        with self._cond:
            self.ended[event.job_id] = time.perf_counter()
            if event.state is JobState.SUCCEEDED and isinstance(event.result, StudyResult):
                self.results[event.job_id] = event.result
            else:
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
    ) -> None:
        self.watch = _Stopwatch()
        self.scheduler = Scheduler(SchedulerConfig(), hooks=self.watch)
        self.executor = InProcessExecutor(
            self.scheduler, devices=(sessions.runtime.device,), cpu_workers=cpu_workers
        )
        self._args = (pipeline, registry, sessions, out_dir, precision)
        self.submitted: dict[str, float] = {}

    def submit(self, job_id: str, study: Path, priority: PriorityClass | None) -> JobTicket:
        pipeline, registry, sessions, out_dir, precision = self._args
        request = study_request(
            job_id,
            study,
            pipeline=pipeline,
            out_dir=out_dir / job_id,
            registry=registry,
            sessions=sessions,
            rules=self.scheduler.config.rules,
            priority=priority,
            precision=precision,  # type: ignore[arg-type]
            key_images=False,
        )
        self.submitted[job_id] = time.perf_counter()
        return self.scheduler.submit(request)

    def __enter__(self) -> _Run:
        self.executor.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.executor.stop()

    def finish(self, timeout: float) -> None:
        if not self.executor.wait_idle(timeout):
            raise RuntimeError(f"scheduled studies did not finish within {timeout:.0f} s")
        if self.watch.failures:
            raise RuntimeError("scheduled studies failed: " + "; ".join(self.watch.failures))

    def tat(self, job_id: str) -> float:
        return self.watch.ended[job_id] - self.submitted[job_id]


def _same_answer(a: StudyResult, b: StudyResult) -> bool:
    ra, rb = a.report, b.report
    volumes_a = [round(m.volume_ml, 3) for m in ra.organ_measurements]
    volumes_b = [round(m.volume_ml, 3) for m in rb.organ_measurements]
    return len(ra.findings) == len(rb.findings) and volumes_a == volumes_b


def run_priority_bench(
    *,
    n_routine: int = 8,
    n_slices: int = 300,
    precision: str = "fp32",
    cache_dir: Path | None = None,
    pipeline: str | Path = PIPELINE,
    registry: ModelRegistry | None = None,
    cpu_workers: int | None = None,
    timeout_s: float = 3600.0,
    log: Callable[[str], None] = logger.info,
) -> dict[str, object]:
    """Run the three measurements; returns the JSON summary."""
    cache_dir = Path(cache_dir or Path(tempfile.gettempdir()) / "radserve-bench")
    registry = registry or ModelRegistry()
    spec = load_pipeline(pipeline)
    workers = cpu_workers or max(2, min(8, usable_cores() // 2))
    log(f"preparing {n_routine + 1} phantom studies of {n_slices} slices")
    urgent, routine = ensure_studies(cache_dir, n_routine, n_slices)
    sessions = SessionPool()
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

        log("solo: the URGENT study alone through the scheduler")
        with _Run(spec, registry, sessions, out / "solo", precision, workers) as run:
            run.submit("urgent", urgent, None)
            run.finish(timeout_s)
            urgent_solo_s = run.tat("urgent")

        log(f"load: {n_routine} OUTPATIENT studies, then the URGENT one")
        with _Run(spec, registry, sessions, out / "load", precision, workers) as run:
            for n, study in enumerate(routine):
                run.submit(f"routine-{n}", study, PriorityClass.OUTPATIENT)
            if not run.watch.wait_for(lambda: run.watch.batches > 0, timeout_s):
                raise RuntimeError("the device never started on the routine studies")
            ticket = run.submit("urgent", urgent, None)  # class from its DICOM priority
            run.finish(timeout_s)
            urgent_tat_s = run.tat("urgent")
            drain_s = max(run.watch.ended.values()) - min(run.submitted.values())
            urgent_end = run.watch.ended["urgent"]
            finished_before_urgent = sum(1 for t in run.watch.ended.values() if t < urgent_end)
            identical = all(_same_answer(run.watch.results[k], v) for k, v in reference.items())
    ratio = urgent_tat_s / urgent_solo_s
    return {
        "urgent_tat_s": urgent_tat_s,
        "urgent_solo_s": urgent_solo_s,
        "urgent_tat_ratio": ratio,
        "goal_ratio": GOAL_RATIO,
        "meets_goal": ratio <= GOAL_RATIO,
        "drain_s": drain_s,
        "sequential_s": sequential_s,
        "drain_over_sequential": drain_s / sequential_s,
        "urgent_class": ticket.cls.name,
        "routine_finished_before_urgent": finished_before_urgent,
        "results_match_sequential": identical,
        "n_routine": n_routine,
        "study": {"shape": [n_slices, 512, 512]},
        "device": sessions.runtime.device,
        "providers": list(sessions.runtime.providers),
        "cpu_workers": workers,
        "precision": precision,
        "pipeline": spec.name,
    }


__all__ = ["ensure_studies", "run_priority_bench"]

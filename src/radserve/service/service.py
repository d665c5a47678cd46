"""The composition root: one object that builds and runs everything a server needs.

store -> model catalog + session pool -> scheduler (with hooks that persist its events)
-> in-process executor -> intake (uploads, the DICOM gateway) -> results. ``start``
cleans interrupted uploads, records the configuration in the audit chain, resumes the
jobs a previous run left unfinished, starts the workers and warms the models up on a
background thread (``/readyz`` says ready only after it ran). Everything here is
synchronous; the API calls it from worker threads.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from radserve.audit import Action, AuditEvent
from radserve.config import Settings
from radserve.errors import RadserveError
from radserve.pipeline import SessionPool
from radserve.scheduling import InProcessExecutor, Scheduler
from radserve.service.catalog import Catalog
from radserve.service.fhir import FhirDelivery, fhir_destination
from radserve.service.gateway import GatewayBridge
from radserve.service.hooks import ServiceHooks
from radserve.service.intake import DICOMWEB_SOURCE, Intake
from radserve.service.jobcache import JobCache
from radserve.service.jobs import JobAccess
from radserve.service.mapping import priority_rules, scheduler_config
from radserve.service.metrics import Metrics
from radserve.service.results import ResultIndexer
from radserve.service.stow import StowIntake
from radserve.service.wado import WadoAccess
from radserve.store import JobRecord, Store, init_store
from radserve.store.files import remove_stale_staging
from radserve.store.results import ResultIndex
from radserve.study import StudyResult

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Readiness:
    ready: bool
    warmed_up: bool
    store_reachable: bool
    open_models: tuple[str, ...]
    failed_models: dict[str, str] = field(default_factory=dict)

    @property
    def reasons(self) -> list[str]:
        out = []
        if not self.warmed_up:
            out.append("models are warming up")
        out += [f"model {m} failed to load: {why}" for m, why in self.failed_models.items()]
        if not self.store_reachable:
            out.append("the database does not answer")
        out += [f"model {m} circuit breaker is open" for m in self.open_models]
        return out


class Service:
    """Everything one radserve server runs. ``start`` once, ``stop`` once."""

    def __init__(
        self,
        settings: Settings,
        *,
        sessions: SessionPool | None = None,
        cpu_workers: int = 2,
        worker_nice: int = 0,
        gateway_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.settings = settings
        self.store: Store = init_store(settings.effective_database_url)
        self.catalog = Catalog.from_settings(settings, sessions)
        self.cache = JobCache()
        # the metrics read the scheduler when scraped; the scheduler reports to the hooks
        self.metrics = Metrics(lambda: self.scheduler.snapshot())
        self.hooks = ServiceHooks(self.store, self.cache, self.metrics)
        self.scheduler = Scheduler(
            scheduler_config(settings, self.catalog.sessions.runtime.max_batch_size),
            hooks=self.hooks,
        )
        self.intake = Intake(
            settings,
            store=self.store,
            scheduler=self.scheduler,
            catalog=self.catalog,
            cache=self.cache,
            rules=priority_rules(settings),
            policy=settings.ingest.to_policy(),
        )
        self.jobs = JobAccess(self.store, self.cache, self.scheduler, self.hooks)
        self.results = ResultIndex(self.store.engine)
        self.stow = StowIntake(
            self.intake, data_dir=settings.data_dir, quiet_s=settings.dicomweb.quiet_s
        )
        self.wado = WadoAccess(self.results)
        self.gateway: GatewayBridge | None = None
        if settings.gateway.enabled:
            self.gateway = GatewayBridge(
                settings, intake=self.intake, store=self.store, scp_options=gateway_options
            )
        destination = fhir_destination(settings)
        self.fhir = FhirDelivery(settings, destination, store=self.store) if destination else None
        self.hooks.on_result = self._on_result
        self.intake.dicom_results = self.wants_dicom_results
        device = self.catalog.sessions.runtime.device
        self.executor = InProcessExecutor(
            self.scheduler, devices=(device,), cpu_workers=cpu_workers
        )
        self.worker_nice = worker_nice
        self._started: float | None = None
        self._warmup_thread: threading.Thread | None = None
        self.gateway_address: tuple[str, int] | None = None

    # --- life cycle -------------------------------------------------------------------
    def start(self, *, warm_up: bool = True) -> None:
        if self._started is not None:
            raise RuntimeError("the service is already started")
        self._started = time.monotonic()
        remove_stale_staging(self.settings.data_dir)
        self.store.append_audit(
            AuditEvent(
                action=Action.CONFIG_LOADED,
                subject="settings",
                payload={"fingerprint": self.settings.fingerprint()},
            )
        )
        resumed = self.recover()
        _in_lowered_thread(self.executor.start, self.worker_nice)
        if warm_up:
            self._warmup_thread = threading.Thread(
                target=_lowered(self._warm_up, self.worker_nice),
                name="radserve-warmup",
                daemon=True,
            )
            self._warmup_thread.start()
        if self.gateway is not None:
            self.gateway_address = self.gateway.start()
        if self.fhir is not None:
            self.fhir.start()
        self.stow.start()
        logger.info("service started: %d unfinished job(s) resumed", resumed)

    def stop(self) -> None:
        """Stop taking work; running units finish their batch; unfinished jobs stay in
        the store and resume at the next start."""
        if self.gateway is not None:
            self.gateway.stop()
        self.stow.stop()
        if self.fhir is not None:
            self.fhir.stop()
        self.executor.stop(wait=True)
        if self._warmup_thread is not None:
            self._warmup_thread.join(timeout=60)
        self.store.close()
        logger.info("service stopped")

    def wait_warm(self, timeout: float | None = None) -> bool:
        if self._warmup_thread is None:
            return self.catalog.warmup.done
        self._warmup_thread.join(timeout)
        return self.catalog.warmup.done

    def _warm_up(self) -> None:
        state = self.catalog.warm_up()
        try:
            self.store.append_audit(
                AuditEvent(
                    action=Action.MODEL_CHANGED,
                    subject="models",
                    payload={
                        "event": "loaded",
                        "models": self.catalog.model_versions(),
                        "failed": sorted(state.failed),
                    },
                )
            )
        except RadserveError as exc:
            logger.error("could not audit the loaded models: %s", exc.code)

    def recover(self) -> int:
        """Restart recovery: jobs left received, queued or running are scheduled again,
        keeping their deadlines; a job interrupted more than ``jobs.max_retries`` times
        fails instead of crashing the server in a loop."""
        resumed = 0
        for record in self.store.requeue_unfinished():
            self.cache.put(record)
            if record.attempts > self.settings.jobs.max_retries:
                self.intake.fail(
                    record.id,
                    "job_interrupted",
                    f"the server stopped {record.attempts} times while this job ran; "
                    "it is not retried again (resubmit it to try once more)",
                )
                continue
            try:
                resolved = self.catalog.resolve(record.pipeline_name)
                if (
                    resolved.spec.version != record.pipeline_version
                    or dict(resolved.model_versions) != dict(record.model_versions)
                    or resolved.precision != record.precision
                ):
                    self.intake.fail(
                        record.id,
                        "pipeline_changed",
                        "the pipeline or its models changed while the server was down; "
                        "resubmit the study to run it with the models now installed",
                    )
                    continue
                self.intake.schedule(record, resolved, resume=True)
                resumed += 1
            except RadserveError as exc:
                logger.error("job %s cannot resume: %s", record.id, exc.code)
                if not self.jobs.get(record.id).terminal:
                    self.intake.fail(record.id, exc.code, exc.message)
        return resumed

    # --- results out ------------------------------------------------------------------
    def wants_dicom_results(self, job: JobRecord) -> bool:
        """DICOM SEG + SR are written for studies that came over DICOMweb (a client that
        retrieves them with WADO-RS) and for those the gateway sends back to a PACS;
        every written instance is then retrievable with WADO-RS."""
        if job.queue_meta.get("source") == DICOMWEB_SOURCE:
            return True
        return self.gateway is not None and self.gateway.wants_dicom_results(job)

    def _on_result(self, job: JobRecord, result: StudyResult) -> None:
        """A job's result is about to be recorded: index its DICOM results, queue them for
        the PACS and its Bundle for the FHIR server. Each step fails on its own."""
        steps: list[tuple[str, Callable[[JobRecord, StudyResult], None]]] = [
            ("index", ResultIndexer(self.results).on_result)
        ]
        if self.gateway is not None:
            steps.append(("dicom", self.gateway.on_result))
        if self.fhir is not None:
            steps.append(("fhir", self.fhir.on_result))
        failed = []
        for name, step in steps:
            try:
                step(job, result)
            except Exception as exc:  # the others still run; the result stands
                code = getattr(exc, "code", type(exc).__name__)
                logger.error("job %s: %s delivery step failed (%s)", job.id, name, code)
                failed.append(name)
        if failed:
            raise RuntimeError(f"result steps failed: {', '.join(failed)}")

    # --- operations -------------------------------------------------------------------
    @property
    def uptime_s(self) -> float:
        return 0.0 if self._started is None else time.monotonic() - self._started

    def readiness(self) -> Readiness:
        warm = self.catalog.warmup
        open_models = self.scheduler.open_models()
        reachable = self.store.ping()
        ready = warm.done and not warm.failed and reachable and not open_models
        return Readiness(ready, warm.done, reachable, open_models, dict(warm.failed))

    def reset_model(self, name: str, *, actor_key_id: str | None, client: str | None) -> bool:
        """Close a model's circuit breaker (after fixing or reloading it); audited."""
        was_open = self.scheduler.reset_model(name)
        self.store.append_audit(
            AuditEvent(
                action=Action.MODEL_CHANGED,
                subject=name,
                payload={"event": "breaker_reset", "was_open": was_open},
                actor_key_id=actor_key_id,
                client_address=client,
            )
        )
        return was_open


def _lowered(call: Callable[[], None], nice: int) -> Callable[[], None]:
    """``call`` run with this thread's CPU priority lowered by ``nice`` (Linux: niceness
    is per thread and inherited by the threads it starts, onnxruntime's pools too)."""

    def run() -> None:
        if nice > 0:
            try:
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
            except (AttributeError, OSError) as exc:  # not Linux, or not permitted
                logger.warning("cannot lower the workers' CPU priority: %s", exc)
        call()

    return run


def _in_lowered_thread(call: Callable[[], None], nice: int) -> None:
    """Run ``call`` on a short-lived thread with lowered priority, so every thread it
    starts (the executor's workers) inherits that priority; the caller keeps its own."""
    if nice <= 0:
        call()
        return
    errors: list[BaseException] = []

    def guarded() -> None:
        try:
            call()
        except BaseException as exc:  # re-raised on the calling thread
            errors.append(exc)

    thread = threading.Thread(target=_lowered(guarded, nice), name="radserve-starter")
    thread.start()
    thread.join()
    if errors:
        raise errors[0]


__all__ = ["Readiness", "Service"]

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
from radserve.domain.critical import CriticalRule, declared_rules
from radserve.errors import RadserveError
from radserve.gateway.dicomweb.index import ResultIndexer
from radserve.gateway.dicomweb.qido import QidoSearch
from radserve.gateway.dicomweb.wado import WadoAccess
from radserve.gateway.outbox import LaneState, LaneWorkers
from radserve.gateway.own_results import OwnResults
from radserve.ingest.decode import shutdown_decode_workers
from radserve.ingest.policy import IngestPolicy
from radserve.lifecycle.install import remove_interrupted_installs
from radserve.lifecycle.install_tasks import InstallTasks
from radserve.pipeline import SessionPool
from radserve.pipeline.checks import critical_rule_problem
from radserve.pipeline.study import StudyResult
from radserve.report.fhir.patient import IdentifierSystems
from radserve.scheduling import Hold, Scheduler
from radserve.security.access import ReadAccess, local_scopes
from radserve.service.cached import CachedDelivery
from radserve.service.catalog import Catalog
from radserve.service.critical import CriticalDelivery
from radserve.service.dicomweb import StowBridge
from radserve.service.drift import DriftCollector, DriftService
from radserve.service.errors import ModelNotFoundError
from radserve.service.executors import (
    executor_collector,
    keep_signal_handlers,
    make_executor,
    warm_runner,
    workers_down,
)
from radserve.service.failover import SharedStorage
from radserve.service.failure_notice import FailureNotices
from radserve.service.fhir import FhirDelivery, fhir_destination
from radserve.service.gateway import GatewayBridge
from radserve.service.hooks import ServiceHooks, retry_store
from radserve.service.install_queue import BackgroundInstalls
from radserve.service.intake import DICOMWEB_SOURCE, RESULTS_DIR, Intake
from radserve.service.job_warnings import JobWarnings, chain
from radserve.service.jobcache import JobCache
from radserve.service.jobs import JobAccess
from radserve.service.leases import ClockOffsetCollector, LeaseKeeper
from radserve.service.lifecycle import LifecycleCollector, ModelLifecycle
from radserve.service.lineage import ResultLineage
from radserve.service.metrics import Metrics, SenderCollector
from radserve.service.outbox import OutboxOps
from radserve.service.replica_config import destination_digests
from radserve.service.retention import Retention
from radserve.service.row_classes import RowClasses
from radserve.service.schema_watch import HELD_REASON as SCHEMA_HELD_REASON
from radserve.service.schema_watch import SchemaWatch
from radserve.service.storage import StorageProbe
from radserve.service.turnaround import Turnaround
from radserve.service.unclaimed import UnclaimedStudies
from radserve.service.voided_runs import VoidedRunFolders
from radserve.service.work_waits import WorkWaits
from radserve.store import (
    Claimed,
    DatabaseUnavailableError,
    JobRecord,
    Lease,
    LeaseLostError,
    Store,
)
from radserve.store.audited import open_audited
from radserve.store.files import remove_stale_staging
from radserve.store.leases import result_folder_name
from radserve.store.outbox import OutboxStore, instance_id
from radserve.store.results import ResultIndex

logger = logging.getLogger(__name__)
# how much further than the clinical workers a variant build's thread is lowered
INSTALL_NICE = 10


@dataclass(frozen=True)
class Readiness:
    ready: bool
    warmed_up: bool
    store_reachable: bool
    open_models: tuple[str, ...]
    failed_models: dict[str, str] = field(default_factory=dict)
    # outbox destinations failing past ``outbox.unreachable_after_s``: name -> why
    unreachable_peers: dict[str, str] = field(default_factory=dict)
    # why the data folder cannot be written (radserve.service.storage), or None
    storage_problem: str | None = None
    # whether studies and results then go to a local fallback (storage.fallback_dir)
    fallback: bool = False
    # why the scheduler starts no new work (radserve.service.leases), and for how long
    held: Hold | None = None
    held_s: float = 0.0
    # the caller's key could not be checked (the database does not answer): see below
    key_unchecked: bool = False
    # destinations configured differently on another replica (radserve.store.replica_config)
    config_differences: tuple[str, ...] = ()
    # Ray device workers lost and not back yet: name -> seconds (not ready when all are)
    devices_down: dict[str, float] = field(default_factory=dict)
    # model steps whose deployment is not applied (files changed since install, a version
    # that does not load): step -> why; the step serves what it served before
    unapplied_deployments: dict[str, str] = field(default_factory=dict)
    # a newer radserve migrated the database beneath this server: why it stops, or None
    schema_changed: str | None = None

    def without_key(self) -> Readiness:
        """What ``/readyz`` tells a caller whose key could not be checked because the
        database does not answer: never ready, and nothing a key guards (models, outbox
        destinations, the data folder) -- only warm-up, the database and held work."""
        return Readiness(
            False,
            self.warmed_up,
            self.store_reachable,
            (),
            held=self.held,
            held_s=self.held_s,
            key_unchecked=True,
            schema_changed=self.schema_changed,
        )

    @property
    def degraded(self) -> bool:
        """Serving, but results do not reach some destination, the data folder is away
        and the local fallback holds new studies and results, or another replica
        configures the destinations differently."""
        return (
            bool(self.unreachable_peers)
            or self.storage_problem is not None
            or bool(self.config_differences)
            or bool(self.devices_down)
            or bool(self.unapplied_deployments)
        )

    @property
    def reasons(self) -> list[str]:
        out = []
        if self.schema_changed is not None:
            out.append(self.schema_changed)
        if not self.warmed_up:
            out.append("models are warming up")
        out += [f"model {m} failed to load: {why}" for m, why in self.failed_models.items()]
        if not self.store_reachable:
            out.append("the database does not answer")
        out += [f"model {m} circuit breaker is open" for m in self.open_models]
        out += list(self.unreachable_peers.values())
        out += list(self.config_differences)
        out += [why for _, why in sorted(self.unapplied_deployments.items())]
        out += [
            f"device worker {name} was lost {down:.0f} s ago and is not back yet (Ray "
            "restarts or replaces it; its batches run on the other workers)"
            for name, down in sorted(self.devices_down.items())
        ]
        if self.held is not None:
            out.append(f"no new work starts, for {self.held_s:.0f} s now: {self.held.message}")
        if self.storage_problem is not None:
            out.append(
                f"the data folder cannot be written: {self.storage_problem}"
                + ("; writing to the local fallback" if self.fallback else "")
            )
        if self.key_unchecked:
            out.append(
                "the API key could not be checked (the database does not answer): "
                "models, destinations and storage are shown once it can be"
            )
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
        # the audit chain's key, checkpoints and syslog export (radserve.audit.trail)
        self.store: Store
        self.store, self.audit = open_audited(settings, export=True, upgrade=True)
        self.catalog = Catalog.from_settings(settings, sessions)
        self.cache = JobCache(settings.jobs.cache_records)
        # the metrics read the scheduler when scraped; the scheduler reports to the hooks
        self.outbox = OutboxOps(settings, self.store, wake=self._wake_senders)
        self.metrics = Metrics(lambda: self.scheduler.snapshot(), outbox=self.outbox.status)
        self.hooks = ServiceHooks(
            self.store, self.cache, self.metrics, outage_wait_s=settings.jobs.store_outage_wait_s
        )
        # this server's job lease (radserve.store.leases): held on the jobs it accepts
        # and runs, renewed while it lives; with replicas, expired ones are taken over
        self.lease = Lease.new(instance_id(settings.outbox.instance_id), settings.jobs.lease_s)
        self.hooks.owner = self.lease.owner
        if settings.outbox.replicas <= 1:
            # alone by its settings: refused where live replicas hold jobs in this
            # database (it took all their jobs at start; radserve.store.leases)
            self.store.check_alone(self.lease)
        # the settings sections are the scheduler's configuration (no mapping layer);
        # only the batch size is capped by what the runtime's device is worth sending
        self.scheduler = Scheduler(
            settings.scheduler.capped(self.catalog.sessions.runtime.max_batch_size),
            jobs=settings.jobs,
            rules=settings.priority_rules,
            hooks=self.hooks,
        )
        self.results = ResultIndex(self.store.engine, audit_key=self.store.audit_key)
        # a study's results are one lineage per group of submitters who see each other's
        # jobs (security.visibility: a site never supersedes another site's result); the
        # console's users count with the scopes they had when the server started
        users = local_scopes(settings.console.users)
        self.lineage_scopes = ReadAccess(
            self.store, settings.security.visibility, local_scopes=lambda: users
        )
        # radserve's own SEG/SR/SC coming back (a PACS re-sending the study): never input
        self.own_results = OwnResults(
            known=self.results.contains,
            on_ignored=lambda intake, _reason: self.metrics.own_results_ignored.labels(
                intake
            ).inc(),
        )
        # whether the data folder can be written (shared storage): part of readiness; and
        # where studies and results go meanwhile (storage.fallback_dir)
        self.storage = StorageProbe(
            settings.data_dir,
            interval_s=settings.storage.probe_interval_s,
            timeout_s=settings.storage.probe_timeout_s,
        )
        self.shared = SharedStorage(
            settings.data_dir,
            settings.storage.fallback_dir,
            self.storage,
            self.store,
            on_moved=self._refresh_jobs,
        )
        if self.shared.enabled:
            self.storage.on_healthy = self._reconcile_storage
        # studies stored for submissions that got no job: deleted unless a job names them
        self.unclaimed = UnclaimedStudies(settings.data_dir, self.store)
        # result folders of runs the fence voided, deleted once the job is final
        self.voided_runs = VoidedRunFolders(settings.data_dir / RESULTS_DIR, self.store)
        # what the data folder keeps, and for how long (storage.*_retention_days)
        self.retention = Retention(
            settings.data_dir, settings.storage, self.store, on_result_removed=self.cache.put
        )
        self.metrics.registry.register(self.retention.collector)
        self.intake = Intake(
            settings,
            store=self.store,
            scheduler=self.scheduler,
            catalog=self.catalog,
            cache=self.cache,
            rules=settings.priority_rules,
            policy=IngestPolicy.from_settings(settings.ingest),
            own_results=self.own_results,
            storage=self.shared,
        )
        self.jobs = JobAccess(
            self.store,
            self.cache,
            self.scheduler,
            self.hooks,
            IdentifierSystems.from_settings(settings.fhir),
            policy=IngestPolicy.from_settings(settings.ingest),
        )
        # a job's class changed in its row elsewhere (another replica): this queue follows
        self.row_classes = RowClasses(
            self.store,
            self.scheduler,
            self.cache,
            every_s=settings.jobs.lease_poll_s,
            owner=self.lease.owner,
        )
        self.stow = StowBridge(
            self.intake,
            data_dir=settings.data_dir,
            group_of=self.lineage_scopes.group_of,
            quiet_s=settings.dicomweb.quiet_s,
        )
        self.wado = WadoAccess(self.results)
        self.qido = QidoSearch(self.results)
        self.gateway: GatewayBridge | None = None
        if settings.gateway.enabled:
            self.gateway = GatewayBridge(
                settings, intake=self.intake, store=self.store, scp_options=gateway_options
            )
        destination = fhir_destination(settings)
        self.fhir = FhirDelivery(settings, destination, store=self.store) if destination else None
        # critical findings pushed to their receivers ahead of the other deliveries
        self.critical: CriticalDelivery | None = None
        if settings.critical.receivers:
            self.critical = CriticalDelivery(
                settings, store=self.store, metrics=self.metrics, rules_for=self._critical_rules
            )
        self._warn_unfireable_site_rules()
        self.hooks.on_result = self._on_result
        self.hooks.on_recorded = self._wake_senders
        self.notices = FailureNotices(
            settings,
            metrics=self.metrics,
            fhir=self.fhir,
            results_root=self.intake.results_root,
            gateway=self.gateway,
            results=self.results,
            group_of=self.lineage_scopes.group_of,
        )
        self.hooks.on_failed = self.notices.on_failed
        self.intake.dicom_results = self.wants_dicom_results
        # a result reused from the cache by a job of another route: that route's SEG/SR
        # (and FHIR) made from the cached result and queued, no model run
        self.intake.cached_delivery = CachedDelivery(
            settings,
            results=self.results,
            gateway=self.gateway,
            fhir=self.fhir,
            sends_dicom=self.route_wants_dicom,
        )
        # a re-run of a study supersedes its earlier result (SR predecessor, FHIR amended)
        # ... and the job's gateway warnings (late instances, cut-off transfer) go into it
        # (both need the database: while it is away the job waits at this step,
        # radserve.errors.RadserveError.outage)
        lineage = ResultLineage(self.store, self.results, group_of=self.lineage_scopes.group_of)
        self.intake.lineage = chain(lineage.assign, JobWarnings(self.store).apply)
        # deployments per step: routing, hot swap, comparison runs, guardrails
        self.lifecycle = ModelLifecycle(
            settings,
            store=self.store,
            catalog=self.catalog,
            scheduler=self.scheduler,
            policy=IngestPolicy.from_settings(settings.ingest),
            results_root=self.intake.results_root,
        )
        self.intake.router = self.lifecycle
        self.intake.lease = self.lease
        # the schema revision, read with each lease renewal (radserve.service.schema_watch)
        self.schema_watch = SchemaWatch(self.store.engine)
        self.leases = LeaseKeeper(
            self.store,
            self.lease,
            shared=settings.outbox.replicas > 1,
            poll_s=settings.jobs.lease_poll_s,
            on_claimed=self._resume_all,
            runs=self.scheduler,  # no new work while the leases are not proven
            destinations=destination_digests(settings),
            schema=self.schema_watch,  # a newer radserve migrated the database: stop
            on_schema_changed=self._schema_changed,
        )
        self.metrics.registry.register(ClockOffsetCollector(self.leases))
        # how the server is told to stop when its schema changed (radserve serve ends the
        # process, exit 2); None: it only stops taking new work and says so
        self.stop_requested: Callable[[str], None] | None = None
        self.metrics.registry.register(SenderCollector(self._senders))
        self.metrics.registry.register(LifecycleCollector(self.lifecycle))
        self.hooks.on_finished = self.lifecycle.on_finished
        # drift of each model version's inputs and outputs against its reference
        self.drift = DriftService(
            settings.lifecycle.drift,
            data_dir=settings.data_dir,
            registry=self.catalog.registry,
            store=self.store,
            replica=(
                instance_id(settings.outbox.instance_id) if settings.outbox.replicas > 1 else None
            ),
        )
        self.metrics.registry.register(DriftCollector(self.drift))
        device = self.catalog.sessions.runtime.device
        self.executor = make_executor(
            settings, self.scheduler, device=device, cpu_workers=cpu_workers
        )
        runner = warm_runner(self.executor)
        if runner is not None:  # warm-up loads and runs each model on every worker
            self.catalog.warm_runner = runner
        workers = executor_collector(self.executor)
        if workers is not None:  # Ray's device workers: up, lost batches
            self.metrics.registry.register(workers)
        # service times, ETAs and deadline-risk events (radserve.service.turnaround)
        self.turnaround = Turnaround(
            settings,
            store=self.store,
            scheduler=self.scheduler,
            metrics=self.metrics,
            lookup=self._job_record,
            device=device,
            cpu_workers=cpu_workers,
        )
        self.hooks.followers.append(self.turnaround)
        self.jobs.eta_of = self.turnaround.job_eta
        # no ETA, and the block named, while nothing can run this server's work
        self.jobs.waits_for = WorkWaits(self.scheduler, self.executor)
        self.worker_nice = worker_nice
        # installs that build variants, run after their request was answered, below the
        # clinical workers' CPU priority
        self.installs = BackgroundInstalls(
            self.lifecycle,
            InstallTasks(settings.data_dir),
            wrap=lambda run: _lowered(run, min(19, worker_nice + INSTALL_NICE)),
        )
        self._started: float | None = None
        self._warmup_thread: threading.Thread | None = None
        self.gateway_address: tuple[str, int] | None = None

    # --- life cycle -------------------------------------------------------------------
    def start(self, *, warm_up: bool = True) -> None:
        if self._started is not None:
            raise RuntimeError("the service is already started")
        self._started = time.monotonic()
        remove_stale_staging(self.settings.data_dir)
        remove_interrupted_installs(self.settings.data_dir)
        self.shared.remove_stale_temporaries()
        self.shared.reconcile(at_start=True)  # before resumed jobs are built from paths
        self.storage.start()
        self.audit.start()
        self.store.append_audit(
            AuditEvent(
                action=Action.CONFIG_LOADED,
                subject="settings",
                payload={"fingerprint": self.settings.fingerprint()},
            )
        )
        self.lifecycle.start()  # deployments first: resumed jobs keep their bound versions
        resumed = self.recover()
        with keep_signal_handlers():  # a Ray executor's ray.init replaces them
            _in_lowered_thread(self.executor.start, self.worker_nice)
        if warm_up:
            self._warmup_thread = threading.Thread(
                target=_lowered(self._warm_up, self.worker_nice),
                name="radserve-warmup",
                daemon=True,
            )
            self._warmup_thread.start()
        self._reclaim_outbox()
        self.leases.start()
        self.unclaimed.start()
        self.voided_runs.start()
        self.retention.start()
        self.row_classes.start()
        self.turnaround.start()
        if self.gateway is not None:
            self.gateway_address = self.gateway.start()
        if self.fhir is not None:
            self.fhir.start()
        if self.critical is not None:
            self.critical.start()
        self.stow.start()
        installs = self.installs.resume()  # model installs the last stop left unfinished
        logger.info(
            "service started: %d unfinished job(s) and %d model install(s) resumed",
            resumed,
            installs,
        )

    def _reclaim_outbox(self) -> None:
        """Deliveries a previous run of this server left ``sending`` (a crash mid-send)
        go out again now rather than after their lease (see :class:`OutboxStore`)."""
        outbox = self.settings.outbox
        store = OutboxStore(self.store.engine, instance=outbox.instance_id)
        taken = store.reclaim(now=store.now(), shared=outbox.replicas > 1)
        if taken:
            logger.warning(
                "outbox: %d delivery(ies) interrupted by the last stop are sent again", taken
            )

    def stop(self) -> None:
        """Stop taking work; running units finish their batch; unfinished jobs stay in
        the store and resume at the next start."""
        if self.gateway is not None:
            self.gateway.stop()
        self.stow.stop()
        if self.fhir is not None:
            self.fhir.stop()
        if self.critical is not None:
            self.critical.stop()
        self.installs.stop()
        self.executor.stop(wait=True)
        self.hooks.deferred.stop()
        self.leases.stop()
        # no work runs here now: the other replicas take its jobs at their next look,
        # not when the leases run out (a scale-down cost URGENT studies a lease's wait)
        self.leases.release()
        self.unclaimed.stop()
        self.voided_runs.stop()
        self.retention.stop()
        self.row_classes.stop()
        self.lifecycle.stop()
        self.turnaround.stop()
        if self._warmup_thread is not None:
            self._warmup_thread.join(timeout=60)
        # no job runs now: the decoding processes (and their fork server and resource
        # tracker) go with the server instead of outliving it
        shutdown_decode_workers(helpers=True)
        self.storage.stop()
        self.audit.stop()
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
        fails instead of crashing the server in a loop. With replicas (``outbox.replicas``
        > 1) only the jobs no live replica holds: its own previous incarnation's, and
        those whose lease expired (radserve.store.leases), and those only once the
        database has answered long enough since their owner's last renewal
        (:class:`LeaseKeeper`): at start this
        server cannot tell whether a lease ran out because its owner died or because the
        database was away, so it takes back only its own instance's jobs now."""
        shared = self.settings.outbox.replicas > 1
        claimed = self.store.claim_jobs(
            self.lease,
            shared=shared,
            others=False,
            # a replica that started after check_alone: its live jobs are not taken (on
            # SQLite a crashed server's jobs under another host name must be)
            spare_live=not shared and self.store.dialect == "postgresql",
        )
        return self._resume_all(claimed)

    def _resume_all(self, claimed: list[Claimed]) -> int:
        """Schedule jobs this server just claimed; returns how many it resumed."""
        resumed = 0
        for item in claimed:
            record = item.record
            self.cache.put(record)
            if record.attempts > self.settings.jobs.max_retries:
                self._fail(
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
                    or set(resolved.model_versions) != set(record.model_versions)
                    or resolved.precision != record.precision
                    or not self._installed(record.model_versions)
                ):
                    self._fail(
                        record.id,
                        "pipeline_changed",
                        "the pipeline or its models changed while the server was down; "
                        "resubmit the study to run it with the models now installed",
                    )
                    continue
                # the versions it was bound to at submission, whatever serves now
                roles = record.queue_meta.get("deployment", {}) or {}
                resolved = resolved.pinned(record.model_versions, roles)
                folder = result_folder_name(record.id, item, self.lease)
                self.intake.schedule(record, resolved, resume=True, folder=folder)
                resumed += 1
            except RadserveError as exc:
                logger.error("job %s cannot resume: %s", record.id, exc.code)
                if not self.jobs.get(record.id).terminal:
                    self._fail(record.id, exc.code, exc.message)
        return resumed

    def _installed(self, versions: Mapping[str, str]) -> bool:
        try:
            for name, version in versions.items():
                self.catalog.registry.get(name, version)
        except RadserveError:
            return False
        return True

    def _job_record(self, job_id: str) -> JobRecord | None:
        return self.cache.get(job_id) or self.store.get_job(job_id)

    def _fail(self, job_id: str, code: str, message: str) -> JobRecord:
        """Fail a job at restart recovery, with the failure notice a run's failure gets."""
        record = self.intake.fail(job_id, code, message)
        self.notices.on_failed(record)
        return record

    # --- results out ------------------------------------------------------------------
    def wants_dicom_results(self, job: JobRecord) -> bool:
        """DICOM SEG + SR are written for studies that came over DICOMweb (a client that
        retrieves them with WADO-RS) and for those the gateway sends back to a PACS;
        every written instance is then retrievable with WADO-RS."""
        return self.route_wants_dicom(str(job.queue_meta.get("source")))

    def route_wants_dicom(self, source: str) -> bool:
        """:meth:`wants_dicom_results` for the jobs of intake route ``source`` (one
        definition for jobs that run and for results reused from the cache)."""
        if source == DICOMWEB_SOURCE:
            return True
        return self.gateway is not None and self.gateway.sends_dicom(source)

    def _lane_groups(self) -> list[LaneWorkers]:
        """The outbox lanes of this server, one group per kind it delivers: DICOM (the
        gateway's destinations), FHIR, critical-finding push. The one list the senders'
        metrics and :meth:`_wake_senders` both read."""
        groups = (
            self.gateway.workers if self.gateway is not None else None,
            self.fhir.lanes if self.fhir is not None else None,
            self.critical.lanes if self.critical is not None else None,
        )
        return [group for group in groups if group is not None]

    def _senders(self) -> list[LaneState]:
        """The destinations' senders of this server (every lane group's)."""
        return [state for group in self._lane_groups() for state in group.senders()]

    def _warn_unfireable_site_rules(self) -> None:
        """Log each of the site's ``critical.rules`` that no installed model can meet
        (``radserve doctor`` says the same): a label typed wrong there would never push,
        and nothing else would say so. Not refused: the model may be installed later."""
        if not self.settings.critical.rules:
            return
        bundles = self.catalog.registry.bundles()
        for i, rule in enumerate(self.settings.critical.rules):
            problem = critical_rule_problem(rule, bundles)
            if problem is not None:
                logger.warning("critical.rules[%d] can never fire: it %s", i, problem)
        if not self.settings.critical.receivers:
            logger.warning("critical.rules are set but no critical.receivers: nothing is pushed")

    def _critical_rules(self, job: JobRecord) -> tuple[CriticalRule, ...]:
        """The ``critical:`` rules of the job's pipeline (as this server resolves it now)
        and of the model versions the job ran (their model.yaml), each model's scoped to
        its findings; the site's ``critical.rules`` are added by the caller. A source
        that no longer resolves gives none (logged by its error code); the others stand."""
        pipeline: tuple[CriticalRule, ...] = ()
        models: dict[str, tuple[CriticalRule, ...]] = {}
        try:
            pipeline = self.catalog.resolve(job.pipeline_name).spec.critical
        except RadserveError as exc:
            logger.warning(
                "job %s: its pipeline's critical rules unavailable (%s)", job.id, exc.code
            )
        for name, version in job.model_versions.items():
            try:
                models[name] = self.catalog.registry.get(name, version).spec.critical
            except RadserveError as exc:
                logger.warning(
                    "job %s: model %s %s critical rules unavailable (%s)",
                    job.id, name, version, exc.code,
                )  # fmt: skip
        return declared_rules(pipeline=pipeline, models=models)

    def _on_result(self, job: JobRecord, result: StudyResult) -> None:
        """A job's result is about to be recorded: queue its critical findings' notices,
        index its DICOM results, queue them for the PACS and its Bundle for the FHIR
        server. Each step fails on its own.
        Its features feed the drift monitors first (never failing the result)."""
        if result.features is not None:
            try:
                self.drift.observe(job.model_versions, result.features)
            except Exception:  # monitoring only: the result stands
                logger.exception("job %s: drift monitoring failed", job.id)
        steps: list[tuple[str, Callable[[JobRecord, StudyResult], None]]] = []
        if self.critical is not None:  # first: pushed before the SEG/SR and FHIR rows
            steps.append(("critical", self.critical.on_result))
        steps.append(("index", ResultIndexer(self.results).on_result))
        if self.gateway is not None:
            steps.append(("dicom", self.gateway.on_result))
        if self.fhir is not None:
            steps.append(("fhir", self.fhir.on_result))
        failed = []
        unavailable: DatabaseUnavailableError | None = None
        for name, step in steps:
            try:  # a database restart is waited out: a step's rows are idempotent
                retry_store(
                    lambda step=step: step(job, result),
                    self.hooks.write_delays(),
                    what=f"job {job.id}: {name} deliveries",
                )
            except LeaseLostError:  # another replica runs the job now: this run is void
                raise
            except Exception as exc:  # the others still run
                code = getattr(exc, "code", type(exc).__name__)
                logger.error("job %s: %s delivery step failed (%s)", job.id, name, code)
                failed.append(name)
                if isinstance(exc, DatabaseUnavailableError):
                    unavailable = exc
        if unavailable is not None:  # the result must not be recorded without them
            raise unavailable
        if failed:  # the result stands
            raise RuntimeError(f"result steps failed: {', '.join(failed)}")

    # --- operations -------------------------------------------------------------------
    @property
    def uptime_s(self) -> float:
        return 0.0 if self._started is None else time.monotonic() - self._started

    def readiness(self) -> Readiness:
        warm = self.catalog.warmup
        open_models = self.scheduler.open_models()
        reachable = self.store.ping()
        storage = self.storage.problem
        snapshot = self.scheduler.snapshot()
        ready = warm.done and not warm.failed and reachable and not open_models
        ready = ready and snapshot.held is None and self.schema_watch.changed is None
        ready = ready and (storage is None or self.shared.enabled)
        down = workers_down(self.executor)
        # every device worker lost: nothing runs a batch until one is back
        ready = ready and not (down and len(down) >= len(getattr(self.executor, "workers", ())))
        unreachable: dict[str, str] = {}
        if reachable:
            try:
                unreachable = self.outbox.unreachable()
            except RadserveError as exc:  # the database went away between the two reads
                logger.warning("readiness: cannot read the outbox (%s)", exc.code)
        unreachable |= self.turnaround.alert_problems()  # deadline-risk alert receivers
        if unreachable and self.settings.outbox.unreachable_is_not_ready:
            ready = False
        return Readiness(
            ready,
            warm.done,
            reachable,
            open_models,
            dict(warm.failed),
            unreachable,
            storage,
            fallback=self.shared.enabled,
            held=snapshot.held,
            held_s=snapshot.held_s,
            config_differences=tuple(self.leases.config_differences),
            devices_down=down,
            unapplied_deployments=self.lifecycle.unapplied(),
            schema_changed=self.schema_watch.changed,
        )

    def _schema_changed(self, why: str) -> None:
        """A newer radserve migrated the database (radserve.service.schema_watch): no new
        work, no new study, not ready; then the server is asked to stop."""
        logger.error("%s", why)
        self.scheduler.hold(SCHEMA_HELD_REASON, why)
        if self.stop_requested is not None:
            self.stop_requested(why)

    def _refresh_jobs(self, job_ids: list[str]) -> None:
        """Rows whose folders moved back from the storage fallback: re-read them."""
        for job_id in job_ids:
            self.cache.put(self.store.get_job(job_id))

    def _reconcile_storage(self) -> None:
        if self.shared.pending():
            self.shared.reconcile()

    def _wake_senders(self) -> None:
        """A delivery was re-armed or a result recorded: the senders look at once."""
        for group in self._lane_groups():
            group.wake()

    def reset_model(self, name: str, *, actor_key_id: str | None, client: str | None) -> bool:
        """Close a model's circuit breaker (after fixing or reloading it); audited.

        A name that is neither installed nor has a breaker raises
        :class:`ModelNotFoundError` before anything is audited."""
        known = set(self.catalog.registry.names()) | set(self.scheduler.open_models())
        if name not in known:
            raise ModelNotFoundError(
                f"no model {name!r} on this server; installed: {', '.join(sorted(known)) or 'none'}"
            )
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

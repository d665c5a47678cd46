"""The server's side of the model lifecycle: which version serves each step now, how a
study is routed, hot swap, canary/shadow comparison runs and automatic rollback.

* **State** is the ``model_deployments`` table (:class:`DeploymentStore`). The server
  reads it at start and every ``lifecycle.poll_s`` (so a change made with the CLI, or by
  another replica, arrives too). A changed step's versions are loaded and warmed first;
  only then do new jobs resolve to them (:meth:`Catalog.set_deployed`).
* **Binding**: a job's versions are fixed when it is submitted (its pipeline steps are
  pinned and stored in the job row): a study in flight finishes on the version it
  started with; batches never mix versions (the scheduler batches by model version).
* **Release**: sessions of versions no deployment serves and no unfinished job uses are
  dropped from the pool after each change and each finished job.
* **Comparison runs** (shadow, or stable re-run beside a canary) run after the primary
  result was recorded, one at a time, only while no clinical job waits, into
  ``<data_dir>/comparisons``; they are never delivered. Their comparison feeds the
  version's record, the API and metrics; a canary crossing a guardrail is rolled back
  (audited, logged as an alert, counted).
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from radserve import durable
from radserve.audit import Action, AuditEvent
from radserve.config import Settings
from radserve.domain.deployment import (
    DeploymentAction,
    Role,
    StepDeployment,
    bucket,
    route,
    shadow_for,
)
from radserve.domain.priority import PriorityClass
from radserve.errors import (
    BundleExistsError,
    DeploymentError,
    ModelError,
    PipelineError,
    RadserveError,
    is_study_fault,
)
from radserve.ingest import IngestPolicy
from radserve.lifecycle.compare import Comparison, compare_results
from radserve.lifecycle.guardrails import VersionRecord, breach, own_seconds
from radserve.lifecycle.install import (
    InstalledBundle,
    StagedBundle,
    finish_install,
    stage_bundle,
    verify_install,
)
from radserve.lifecycle.pending import FairPending
from radserve.lifecycle.requirements import host_facts, unmet_requirements
from radserve.loop_failures import LoopFailures
from radserve.scheduling import Scheduler
from radserve.service.catalog import Catalog, ResolvedPipeline
from radserve.service.failover import COMPARISONS_DIR
from radserve.service.variant_install import VariantRequest, variant_builder, variant_gates
from radserve.store import JobRecord, JobState, Store
from radserve.store.deployments import DeploymentStore

logger = logging.getLogger(__name__)

GUARDRAIL_ACTOR = "radserve-guardrail"


class NoShadowError(DeploymentError):
    """Removing a shadow from a step that has none: a conflict with the step's state
    (409, as every refused deployment change), with a code a client can tell apart."""

    code = "no_shadow"


@dataclass(frozen=True)
class ComparisonTask:
    job: JobRecord
    step: str
    serving_version: str
    candidate_version: str
    candidate_role: str  # shadow | stable
    record_for: str  # the version whose record the comparison feeds


def comparison_tasks(job: JobRecord, roles: Mapping[str, str]) -> list[ComparisonTask]:
    """The comparison runs a finished job asks for: each shadow version it was sampled
    for (filed in the shadow's record) and, for a canary-routed step, the stable version
    (filed in the canary's). A job row written before ``canary_checks`` existed kept one
    map, in which a canary step's entry was its stable check."""
    meta = job.queue_meta
    shadows: Mapping[str, str] = meta.get("shadows", {}) or {}
    checks: Mapping[str, str] = meta.get("canary_checks", {}) or {}
    if "canary_checks" not in meta:  # an older row
        checks = {s: v for s, v in shadows.items() if roles.get(s) == Role.CANARY.value}
        shadows = {s: v for s, v in shadows.items() if s not in checks}
    tasks = []
    for wanted, role in ((shadows, Role.SHADOW), (checks, Role.STABLE)):
        for step, candidate in wanted.items():
            serving = job.model_versions.get(step)
            if serving is None or candidate == serving:
                continue
            shadow = role is Role.SHADOW
            tasks.append(
                ComparisonTask(
                    job=job,
                    step=step,
                    serving_version=serving,
                    candidate_version=candidate,
                    candidate_role=role.value,
                    record_for=candidate if shadow else serving,
                )
            )
    return tasks


class ModelLifecycle:
    """Deployments of one server; thread-safe."""

    def __init__(
        self,
        settings: Settings,
        *,
        store: Store,
        catalog: Catalog,
        scheduler: Scheduler | None,
        policy: IngestPolicy | None,
        results_root: Path,
        on_rollback: Callable[[str, str], None] | None = None,
    ) -> None:
        self.settings = settings
        self.config = settings.lifecycle
        self.store = store
        self.catalog = catalog
        self.scheduler = scheduler
        self.policy = policy
        self.results_root = results_root
        self.on_rollback = on_rollback
        self.deployments = DeploymentStore(
            store.engine, audit_key=store.audit_key, on_audit=store.on_audit
        )
        self._active: dict[str, StepDeployment] = {}
        # step -> why its current deployment is not applied (the step serves what it
        # served before, or its default version): shown by /readyz, not only logged
        self._unapplied: dict[str, str] = {}
        self._records: dict[tuple[str, str], VersionRecord] = {}
        self._lock = threading.RLock()
        self._change_lock = threading.Lock()
        # a deployment change reads the step's state and records the next one: two at
        # once (requests run on a thread pool) both read the same state, and the second
        # row dropped the first's change (a canary lost to a shadow deployed beside it)
        self._deploying = threading.Lock()
        # per (step, version whose record the run feeds): one deployment's comparisons
        # never crowd out another's
        self._tasks: FairPending[tuple[str, str], ComparisonTask] = FairPending(
            self.config.max_pending_comparisons
        )
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.skipped_comparisons: dict[tuple[str, str], int] = {}
        # comparison runs that raised, per (step, version fed): how many, the last code
        self.failed_comparisons: dict[tuple[str, str], tuple[int, str]] = {}
        self.rollbacks: dict[tuple[str, str], int] = {}
        self.swaps = 0
        # per bundle folder: its files' (path, size, mtime) and what verify_install said
        self._verified: dict[Path, tuple[tuple[tuple[str, int, int], ...], list[str]]] = {}

    # --- life cycle -------------------------------------------------------------------
    def start(self) -> None:
        """Read the deployments (warming what they serve), then watch for changes."""
        try:
            self.refresh()
        except RadserveError as exc:
            logger.error("model deployments could not be applied: %s", exc.message)
        for name, target in (("watch", self._watch), ("compare", self._compare_loop)):
            thread = threading.Thread(target=target, name=f"radserve-models-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        self._tasks.close()
        for thread in self._threads:
            thread.join(timeout=30)

    def _watch(self) -> None:
        failures = LoopFailures(logger, "reading model deployments")
        while not self._stop.wait(self.config.poll_s):
            try:
                self.refresh()
            except Exception as exc:  # the next poll tries again; serving goes on unchanged
                failures.failed(exc)
            else:
                failures.succeeded()

    # --- state ------------------------------------------------------------------------
    def unapplied(self) -> dict[str, str]:
        """Steps whose current deployment could not be applied: step -> why."""
        with self._lock:
            return dict(self._unapplied)

    def active(self) -> dict[str, StepDeployment]:
        with self._lock:
            return dict(self._active)

    def refresh(self) -> bool:
        """Apply the store's deployments: warm changed steps' versions, then switch."""
        with self._change_lock:
            current = self.deployments.current()
            active = self.active()
            changed = {s: d for s, d in current.items() if not d.same_serving(active.get(s))}
            if not changed and set(current) == set(active):
                return False
            self.catalog.rescan()
            applied = dict(active)
            unapplied = self.unapplied()
            for step, deployment in changed.items():
                try:
                    for version in deployment.versions():
                        self._refuse_changed_files(step, version)
                        self.catalog.warm_model(step, version)
                except Exception as exc:  # keep serving what served before
                    why = getattr(exc, "message", str(exc))
                    logger.error(
                        "deployment %d of %s not applied: %s", deployment.id or 0, step, why
                    )
                    unapplied[step] = (
                        f"model step {step}: deployment {deployment.id or 0} (stable "
                        f"{deployment.stable}) is not applied, the step serves what it "
                        f"served before: {why}"
                    )
                    continue
                applied[step] = deployment
                unapplied.pop(step, None)
            for step in set(applied) - set(current):
                del applied[step]
            for step in set(unapplied) - set(current):
                del unapplied[step]
            with self._lock:
                self._active = applied
                self._unapplied = unapplied
            self.catalog.set_deployed({s: d.stable for s, d in applied.items()})
            self.swaps += 1
            self._close_breakers(changed, applied, active)
            for step, deployment in changed.items():
                if applied.get(step) is deployment:
                    logger.info(
                        "model step %s now serves stable %s%s%s",
                        step,
                        deployment.stable,
                        f", canary {deployment.canary} {deployment.canary_percent:g}%"
                        if deployment.canary
                        else "",
                        f", shadow {deployment.shadow}" if deployment.shadow else "",
                    )
        self.release_unused()
        return True

    def _close_breakers(
        self,
        changed: dict[str, StepDeployment],
        applied: dict[str, StepDeployment],
        before: dict[str, StepDeployment],
    ) -> None:
        """A step whose stable version changed starts with its circuit breaker closed:
        the failures that opened it were another version's. Before session 42 a bad
        deploy's breaker kept refusing every study after the good version was deployed
        again, until an administrator reset it (which the lifecycle docs never said)."""
        if self.scheduler is None:
            return
        for step, deployment in changed.items():
            was = before.get(step)
            previous = was.stable if was is not None else self._undeployed(step)
            if applied.get(step) is not deployment or previous == deployment.stable:
                continue
            if self.scheduler.reset_model(step):
                logger.warning(
                    "model step %s: circuit breaker closed, it now serves stable %s",
                    step,
                    deployment.stable,
                )

    def release_unused(self) -> list[str]:
        """Drop sessions no deployment serves and no unfinished job needs."""
        keep: set[str] = set()
        wanted: set[tuple[str, str]] = set()
        for step, deployment in self.active().items():
            wanted |= {(step, v) for v in deployment.versions()}
        try:
            resolved = self.catalog.resolve()
            wanted |= set(resolved.model_versions.items())
        except RadserveError:
            pass
        for job in self.store.unfinished_jobs():
            wanted |= set(job.model_versions.items())
        for name, version in wanted:
            try:
                keep.add(str(self.catalog.registry.get(name, version).directory))
            except ModelError:
                continue
        dropped = self.catalog.sessions.release(keep)
        if dropped:
            logger.info("released %d model session(s) no longer in use", len(dropped))
        return dropped

    # --- routing ----------------------------------------------------------------------
    def route(
        self, resolved: ResolvedPipeline, routing_key: str, priority: PriorityClass | None
    ) -> ResolvedPipeline:
        """The versions this study runs: a canary by its bucket, else stable; plus the
        shadow versions it is sampled for (run after its result is delivered)."""
        versions: dict[str, str] = {}
        roles: dict[str, str] = {}
        shadows: dict[str, str] = {}
        checks: dict[str, str] = {}
        active = self.active()
        for model in resolved.model_versions:
            deployment = active.get(model)
            if deployment is None:
                continue
            version, role = route(deployment, routing_key, priority)
            versions[model], roles[model] = version, role.value
            shadow = shadow_for(deployment, routing_key)
            if shadow is not None and shadow != version:
                shadows[model] = shadow
            # both, when a canary study is also sampled for the shadow: before, the shadow
            # took the canary's place and its comparison was filed in the canary's record
            # as one against stable (the canary judged on the shadow's differences)
            if role is Role.CANARY and (
                bucket(routing_key, model, salt="compare") < self.config.compare_canary_percent
            ):
                checks[model] = deployment.stable
        if not versions:
            return resolved
        pinned = resolved.pinned(versions, roles)
        return replace(pinned, shadows=shadows, canary_checks=checks)

    def needs_routing(self) -> bool:
        """Whether any step has a canary or shadow (else routing reads nothing)."""
        return any(d.canary or d.shadow for d in self.active().values())

    # --- install ----------------------------------------------------------------------
    def stage(self, source: Path, *, described_as: str | None = None) -> StagedBundle:
        """Check a bundle folder or zip and stage it for :meth:`complete`
        (:func:`radserve.lifecycle.install.stage_bundle`): what refuses a bundle refuses it
        here, before any variant is built."""
        existing = {
            (name, version)
            for name in self.catalog.registry.names()
            for version in self.catalog.registry.versions(name)
        }
        return stage_bundle(
            source,
            self.settings.data_dir,
            existing=existing,
            described_as=described_as,
            providers=self.catalog.serving_providers,
        )

    def complete(
        self,
        staged: StagedBundle,
        *,
        actor: str | None = None,
        client: str | None = None,
        variants: VariantRequest | None = None,
        trust_shipped_gate: bool = False,
    ) -> InstalledBundle:
        """Install a staged bundle into ``<data_dir>/models``. With ``variants``, its
        precision variants are built and gated first
        (:mod:`radserve.service.variant_install`). A ``gate.json`` in the bundle is set
        aside, untrusted, unless ``trust_shipped_gate``
        (:func:`~radserve.lifecycle.install.finish_install`).

        The audit record is written before the version appears in the store: when the
        trail cannot be written, nothing is installed (the error says so and a retry
        installs it), rather than a version served unaudited whose retry is refused as
        installed already. Should another install of the same version win the race for
        the store after that, the trail records this one as abandoned."""
        prepare = (
            variant_builder(self.settings, self.catalog, variants) if variants is not None else None
        )

        def audited(record: InstalledBundle, folder: Path, event: str = "installed") -> None:
            payload: dict[str, object] = {"event": event, "files": record.files}
            if event == "installed":
                payload["variants"] = variant_gates(folder)
            self.store.append_audit(
                AuditEvent(
                    action=Action.MODEL_CHANGED,
                    subject=f"{record.name}/{record.version}",
                    payload=payload,
                    actor_key_id=actor,
                    client_address=client,
                )
            )

        committing: list[InstalledBundle] = []

        def before_commit(record: InstalledBundle, folder: Path) -> None:
            audited(record, folder)
            committing.append(record)

        try:
            installed = finish_install(
                staged,
                actor=actor,
                prepare=prepare,
                before_commit=before_commit,
                trust_shipped_gate=trust_shipped_gate,
                providers=self.catalog.serving_providers,
            )
        except BundleExistsError:
            if committing:  # audited, then beaten to the store: say so in the trail
                try:
                    audited(committing[0], staged.target, "install_abandoned")
                except RadserveError:
                    logger.exception(
                        "the abandoned install of %s could not be audited", staged.spec.key
                    )
            raise
        self.catalog.rescan()
        return installed

    def install(
        self,
        source: Path,
        *,
        actor: str | None = None,
        client: str | None = None,
        variants: VariantRequest | None = None,
        described_as: str | None = None,
        trust_shipped_gate: bool = False,
    ) -> InstalledBundle:
        """:meth:`stage` then :meth:`complete`, in the caller's thread."""
        staged = self.stage(source, described_as=described_as)
        return self.complete(
            staged,
            actor=actor,
            client=client,
            variants=variants,
            trust_shipped_gate=trust_shipped_gate,
        )

    # --- changes ----------------------------------------------------------------------
    def _base(self, step: str) -> StepDeployment:
        current = self.deployments.current().get(step)
        if current is not None:
            return current
        try:
            stable = self.catalog.resolve().model_versions.get(step)
        except RadserveError:
            stable = None
        stable = stable or self.catalog.undeployed_version(step)
        if stable is None:
            raise DeploymentError(f"no model {step!r} is installed")
        return StepDeployment(step=step, stable=stable)

    def _undeployed(self, step: str) -> str | None:
        """The version ``step`` serves with no deployment recorded (None: none is
        installed or the pipeline cannot be read)."""
        try:
            return self.catalog.without_deployment(step)
        except RadserveError:
            return self.catalog.undeployed_version(step)

    def check_servable(self, step: str, version: str) -> None:
        """Refuse a version that is not installed, changed since install, may not serve
        at the configured precision, needs what this host lacks, or does not fit a
        pipeline that runs the step (labels it needs that no earlier step produces)."""
        self.catalog.rescan()
        bundle = self.catalog.registry.get(step, version)
        precision = self.settings.models.precision or "fp32"
        why = bundle.rejection(precision)
        if why is not None:
            raise DeploymentError(f"{bundle.key} may not serve at {precision}: {why}")
        changed = verify_install(bundle.directory)
        if changed:
            raise DeploymentError(
                f"{bundle.key} changed since it was installed: {'; '.join(changed[:5])}"
            )
        unmet = unmet_requirements(
            bundle.spec, host_facts(), providers=self.catalog.serving_providers
        )
        if unmet:
            raise DeploymentError("; ".join(unmet))
        try:
            self.catalog.check_fits(step, version)
        except PipelineError as exc:
            raise DeploymentError(exc.message) from exc

    def _refuse_changed_files(self, step: str, version: str) -> None:
        """A deployed version is loaded only as installed: a restart (or another
        replica's change read from the database) loaded whatever files lay in its folder,
        so a model.onnx replaced after install served every study under the version the
        deployment and its audit record name."""
        directory = self.catalog.registry.get(step, version).directory
        # a deployment left unapplied is tried again every poll: its files are hashed
        # again only when one of them was written, added or removed since
        signature = tuple(
            (str(path), st.st_size, st.st_mtime_ns)
            for path in sorted(directory.rglob("*"))
            if path.is_file() and (st := path.stat())
        )
        seen = self._verified.get(directory)
        if seen is not None and seen[0] == signature:
            changed = seen[1]
        else:
            changed = verify_install(directory)
            self._verified[directory] = (signature, changed)
        if changed:
            raise DeploymentError(
                f"{step}/{version} changed since it was installed: {'; '.join(changed[:5])}"
            )

    def _warm(self, step: str, version: str) -> None:
        """Load and run ``version`` once, or refuse the change (409): a graph this host
        cannot load (an opset ONNX Runtime lacks) or whose output is not what inference
        needs is the model's fault, not an outage; before session 35 it was answered 503
        ``inference_failed``, retryable, with ONNX Runtime's text as the only reason."""
        try:
            self.catalog.warm_model(step, version)
        except DeploymentError:
            raise
        except RadserveError as exc:
            raise DeploymentError(
                f"{step} {version} does not load and run on this host: {exc.message}"
            ) from exc
        except Exception as exc:  # onnxruntime raises its own types on a graph it refuses
            raise DeploymentError(
                f"{step} {version} does not load and run on this host: "
                f"{type(exc).__name__}: {str(exc)[:300]}"
            ) from exc

    def deploy(
        self,
        step: str,
        version: str,
        *,
        role: Role = Role.STABLE,
        percent: float = 0.0,
        include_urgent: bool = False,
        actor: str | None = None,
        reason: str | None = None,
        client: str | None = None,
    ) -> StepDeployment:
        """Make ``version`` the step's stable, canary (``percent`` of routine studies) or
        shadow (``percent`` of studies sampled): warmed first, then recorded, then live."""
        self.check_servable(step, version)
        if role is not Role.STABLE and not 0 < percent <= 100:
            stop = (
                f" (to stop shadowing {step}: radserve models undeploy {step} --role shadow,"
                f" or POST /v1/models/{step}/undeploy)"
                if role is Role.SHADOW and percent == 0
                else ""
            )
            raise DeploymentError(f"a {role.value} needs a percentage in (0, 100]{stop}")
        self._warm(step, version)  # loads before anything routes to it
        with self._deploying:
            base = self._base(step)
            if role is Role.STABLE:
                new = replace(base, stable=version)
                if new.canary == version:
                    new = replace(new, canary=None, canary_percent=0.0, canary_urgent=False)
            elif role is Role.CANARY:
                if version == base.stable:
                    raise DeploymentError(f"{step} {version} is the stable version already")
                new = replace(
                    base, canary=version, canary_percent=percent, canary_urgent=include_urgent
                )
                self._reset_record(step, version)
            else:
                new = replace(base, shadow=version, shadow_percent=percent)
                self._reset_record(step, version)
            return self._record(new, DeploymentAction.DEPLOY, actor, reason, client)

    def undeploy_shadow(
        self,
        step: str,
        *,
        actor: str | None,
        reason: str | None = None,
        client: str | None = None,
    ) -> StepDeployment:
        """Stop shadowing ``step``: no study is sampled for it from now on (a study
        sampled before may still get its comparison run). Stable and canary are left as
        they are; the shadow's record stays readable until a later deploy resets it.
        Recorded as an ``undeploy`` row (the step's new state, shadow empty)."""
        with self._deploying:
            base = self._base(step)
            if not base.shadow:
                raise NoShadowError(
                    f"{step} has no shadow to remove (deploy one with role shadow first)"
                )
            new = replace(base, shadow=None, shadow_percent=0.0)
            return self._record(new, DeploymentAction.UNDEPLOY, actor, reason, client)

    def promote(
        self, step: str, *, actor: str | None, reason: str | None, client: str | None = None
    ) -> StepDeployment:
        """The canary becomes stable (all studies)."""
        with self._deploying:
            base = self._base(step)
            if not base.canary:
                raise DeploymentError(f"{step} has no canary to promote")
            self.check_servable(step, base.canary)
            new = replace(
                base, stable=base.canary, canary=None, canary_percent=0.0, canary_urgent=False
            )
            return self._record(new, DeploymentAction.PROMOTE, actor, reason, client)

    def rollback(
        self,
        step: str,
        *,
        actor: str | None,
        reason: str | None,
        client: str | None = None,
        auto: bool = False,
    ) -> StepDeployment:
        """Drop the canary; without one, go back to the stable version before this one."""
        with self._deploying:
            base = self._base(step)
            if base.canary:
                new = replace(base, canary=None, canary_percent=0.0, canary_urgent=False)
            else:
                earlier = next(
                    (d.stable for d in self.deployments.history(step) if d.stable != base.stable),
                    None,
                )
                if earlier is None and (undeployed := self._undeployed(step)) != base.stable:
                    # the step's first deployment: before it, the version served without
                    # one (before session 42 refused: "no earlier stable version")
                    earlier = undeployed
                if earlier is None:
                    raise DeploymentError(f"{step} has no canary and no earlier stable version")
                try:  # as deploy and promote check it: installed, unchanged, servable here
                    self.check_servable(step, earlier)
                except DeploymentError:
                    raise
                except ModelError as exc:  # gone from the models folders
                    raise DeploymentError(
                        f"{step} cannot go back to {earlier}: {exc.message}"
                    ) from exc
                self._warm(step, earlier)
                new = replace(base, stable=earlier)
            action = DeploymentAction.AUTO_ROLLBACK if auto else DeploymentAction.ROLLBACK
            return self._record(new, action, actor, reason, client)

    def _record(
        self,
        new: StepDeployment,
        action: DeploymentAction,
        actor: str | None,
        reason: str | None,
        client: str | None,
    ) -> StepDeployment:
        saved = self.deployments.record(
            replace(new, action=action, actor=actor, reason=reason, id=None, created=None),
            client_address=client,
        )
        self.refresh()
        return saved

    # --- what happened ----------------------------------------------------------------
    def _reset_record(self, step: str, version: str) -> None:
        with self._lock:
            self._records[(step, version)] = VersionRecord(step, version)

    def record(self, step: str, version: str) -> VersionRecord:
        with self._lock:
            found = self._records.get((step, version))
            if found is None:
                found = self._records[(step, version)] = VersionRecord(step, version)
            return found

    def skipped(self) -> dict[tuple[str, str], int]:
        """Comparison runs not made, per (step, version whose record they feed)."""
        with self._lock:
            return dict(self.skipped_comparisons)

    def records(self) -> list[VersionRecord]:
        with self._lock:
            return list(self._records.values())

    def on_finished(self, job: JobRecord) -> None:
        """A job finished (succeeded or failed): count it for its versions, queue its
        comparison run, judge the canary."""
        roles: Mapping[str, str] = job.queue_meta.get("deployment", {}) or {}
        if not roles:
            return
        ok = job.state is JobState.SUCCEEDED
        if not ok and is_study_fault(job.error_code):
            # a study no version could read (cut-off files, a second study in the upload):
            # counted against the canary, a few of them rolled back a good version
            self.release_unused()
            return
        timings = job.stage_timings or {}
        turnaround, now = timings.get("total"), time.monotonic()
        for step, role in roles.items():
            version = job.model_versions.get(step)
            if version is None:
                continue
            self.record(step, version).add_job(ok, turnaround, own_seconds(timings, step), at=now)
            if role == Role.CANARY.value:
                self._judge(step)
        if ok and job.result_path and not job.cached_from:
            for task in comparison_tasks(job, roles):
                key = (task.step, task.record_for)
                if not self._tasks.put(key, task):
                    with self._lock:
                        self.skipped_comparisons[key] = self.skipped_comparisons.get(key, 0) + 1
        self.release_unused()

    def _judge(self, step: str) -> None:
        deployment = self.active().get(step)
        limits = self.config.guardrails
        if deployment is None or not deployment.canary or not limits.auto_rollback:
            return
        canary = self.record(step, deployment.canary)
        stable = self.record(step, deployment.stable)
        why = breach(canary, stable, limits)
        if why is None:
            return
        logger.error(
            "ALERT: canary %s %s rolled back automatically: %s", step, deployment.canary, why
        )
        try:
            self.rollback(step, actor=GUARDRAIL_ACTOR, reason=why, auto=True)
        except RadserveError as exc:
            logger.error("automatic rollback of %s failed: %s", step, exc.message)
            return
        key = (step, deployment.canary)
        self.rollbacks[key] = self.rollbacks.get(key, 0) + 1
        if self.on_rollback is not None:
            self.on_rollback(step, why)

    # --- comparison runs --------------------------------------------------------------
    def _idle(self) -> bool:
        if self.scheduler is None:
            return True
        snap = self.scheduler.snapshot()
        return not any(snap.queued.values())

    def _compare_loop(self) -> None:
        while not self._stop.is_set():
            task = self._tasks.get()
            if task is None:
                return
            while not self._idle() and not self._stop.wait(0.2):
                pass  # lowest priority: clinical work first
            if self._stop.is_set():
                return
            current = self.against_current_stable(task)
            if current is None:
                continue
            task = current
            try:
                comparison = self.run_comparison(task)
            except Exception as exc:
                code = str(getattr(exc, "code", type(exc).__name__))
                logger.warning(
                    "comparison run for job %s (%s %s) failed: %s",
                    task.job.id,
                    task.step,
                    task.candidate_version,
                    code,
                )
                key = (task.step, task.record_for)
                with self._lock:  # kept, so a missing comparison can be told from a late one
                    count = self.failed_comparisons.get(key, (0, ""))[0]
                    self.failed_comparisons[key] = (count + 1, code)
                continue
            self.record(task.step, task.record_for).comparisons.append(comparison)
            if task.candidate_role == Role.STABLE.value:
                self._judge(task.step)

    def against_current_stable(self, task: ComparisonTask) -> ComparisonTask | None:
        """``task`` as it is to run now: a canary's check against the step's stable
        version of now, not the one the job was routed beside (a comparison waits for an
        idle queue, and the stable version may change meanwhile: a canary was judged on
        its differences from a version no longer serving); None when there is nothing to
        compare any more (the canary became the stable version). A shadow's task is
        returned as it is."""
        if task.candidate_role != Role.STABLE.value:
            return task
        deployment = self.active().get(task.step)
        if deployment is None or deployment.stable == task.candidate_version:
            return task
        if deployment.stable == task.serving_version:
            logger.info(
                "comparison run for job %s dropped: %s %s is the stable version now",
                task.job.id,
                task.step,
                task.serving_version,
            )
            return None
        logger.info(
            "comparison run for job %s (%s %s): against stable %s, not %s (changed since)",
            task.job.id,
            task.step,
            task.serving_version,
            deployment.stable,
            task.candidate_version,
        )
        return replace(task, candidate_version=deployment.stable)

    def run_comparison(self, task: ComparisonTask, *, reuse_upstream: bool = True) -> Comparison:
        """Run the job's study with the candidate version of one step; compare.

        Every comparison is oriented the same way: ``serving_*`` is the stable version's
        side and ``candidate_*`` the version under trial, so a volume or latency
        difference is "the version under trial minus stable" and ``candidate_only`` a
        lesion only it found. A shadow's study was served by stable (the shadow is the
        candidate run); a canary's study was served by the canary and stable is re-run
        beside it, so the two results are swapped (``candidate_role`` "canary"). Before
        2026-12-07 a canary's figures were filed as "stable minus canary", the opposite
        sign of a shadow's.

        Only that step and the steps after it run: the steps before it are read back
        from the serving result (``reuse_upstream=False``, or a result they cannot be
        read from, runs every step)."""
        from radserve.pipeline.inputs import DicomInput, NiftiInput, StudyInput
        from radserve.pipeline.reuse import ReuseUnavailableError
        from radserve.pipeline.study import run_study
        from radserve.service.sniff import input_kind

        job = task.job
        resolved = self.catalog.resolve(job.pipeline_name)
        versions = {**job.model_versions, task.step: task.candidate_version}
        pinned = resolved.pinned(versions, {})
        study_dir = Path(job.study_path)
        source: StudyInput
        if input_kind(study_dir) == "nifti":
            source = NiftiInput(next(p for p in study_dir.iterdir() if p.is_file()))
        else:
            source = DicomInput(study_dir)
        out = self.settings.data_dir / COMPARISONS_DIR / job.id / task.candidate_version
        shutil.rmtree(out, ignore_errors=True)
        t0 = time.perf_counter()

        def run(reuse: tuple[Path, str] | None) -> None:
            run_study(
                source,
                pipeline=pinned.spec,
                out_dir=out,
                registry=self.catalog.registry,
                sessions=self.catalog.local_sessions(),
                precision=pinned.precision,  # type: ignore[arg-type]
                policy=self.policy,
                key_images=False,
                job_id=f"{job.id}-{task.candidate_role}",
                reuse_upstream_of=reuse,
                # the server stopping ends the run at its next batch, and with it the
                # decoding of a JPEG 2000 study still streaming into it
                cancel=self._stop,
            )

        # Only the compared step and the steps after it run: the steps before it are
        # read back from the serving result (same study, same versions).
        reused = reuse_upstream
        step = next(s.step_name for s in pinned.spec.steps if s.model == task.step)
        try:
            run((Path(str(job.result_path)), step) if reuse_upstream else None)
        except ReuseUnavailableError as exc:
            logger.info("comparison run for job %s runs every step: %s", job.id, exc.message)
            reused = False
            shutil.rmtree(out, ignore_errors=True)
            run(None)
        logger.info(
            "comparison run %s %s for job %s took %.2f s (%s)",
            task.step,
            task.candidate_version,
            job.id,
            time.perf_counter() - t0,
            "upstream steps reused" if reused else "every step",
        )
        served = Path(str(job.result_path))
        # every record reads "the version under trial minus stable": a canary's study
        # re-run on stable (``out``) puts the canary's served result on the trial side
        stable, trial = (served, task.serving_version), (out, task.candidate_version)
        role = task.candidate_role
        if task.candidate_role == Role.STABLE.value:
            stable, trial = (out, task.candidate_version), (served, task.serving_version)
            role = Role.CANARY.value
        comparison = compare_results(
            stable[0],
            trial[0],
            job_id=job.id,
            step=task.step,
            serving_version=stable[1],
            candidate_version=trial[1],
            candidate_role=role,
        )
        # durable: the file stays (models.md) and is the only record of the figures
        durable.write_json(
            out.parent / f"{task.candidate_version}.json", comparison.as_json(), indent=2
        )
        shutil.rmtree(out, ignore_errors=True)  # never delivered; the figures are kept
        return comparison

    # --- views ------------------------------------------------------------------------
    def status(self) -> list[dict[str, Any]]:
        """Every installed version of every model: its output labels, where it is
        deployed, its gate state and its record (``GET /v1/models``, ``radserve models
        list``)."""
        self.catalog.rescan()
        active = self.active()
        registry = self.catalog.registry
        out: list[dict[str, Any]] = []
        try:
            pipeline_versions = self.catalog.resolve().model_versions
        except RadserveError:
            pipeline_versions = {}
        for name in registry.names():
            deployment = active.get(name)
            roles: dict[str, list[str]] = {}
            if deployment is not None:
                for version, role in deployment.versions().items():
                    roles.setdefault(version, []).append(role.value)
                shadow = deployment.shadow
                if shadow and shadow in roles and "shadow" not in roles[shadow]:
                    roles[shadow].append("shadow")
            elif name in pipeline_versions:
                roles[pipeline_versions[name]] = ["stable"]
            for version in registry.versions(name):
                try:
                    bundle = registry.get(name, version)
                except ModelError as exc:
                    out.append({"name": name, "version": version, "error": exc.message})
                    continue
                gate = {p: (bundle.rejection(p) or "accepted") for p in bundle.spec.files}
                record = self._records.get((name, version))
                out.append(
                    {
                        "name": name,
                        "version": version,
                        "task": bundle.spec.task,
                        "labels": [{"value": x.value, "name": x.name} for x in bundle.spec.labels],
                        "directory": str(bundle.directory),
                        "installed": (bundle.directory / "install.json").is_file(),
                        "servable": bundle.available_precisions(),
                        "gate": gate,
                        "deployed": roles.get(version, []),
                        "canary_percent": deployment.canary_percent
                        if deployment and deployment.canary == version
                        else None,
                        "shadow_percent": deployment.shadow_percent
                        if deployment and deployment.shadow == version
                        else None,
                        "record": record.summary() if record else None,
                    }
                )
        return out


class LifecycleCollector(Collector):
    """Deployments, comparisons and rollbacks, read at scrape."""

    def __init__(self, lifecycle: ModelLifecycle) -> None:
        self.lifecycle = lifecycle

    def collect(self) -> Iterator[Any]:
        info = GaugeMetricFamily(
            "radserve_model_deployment_info",
            "1 per version serving or shadowing a step, by role",
            labels=["step", "version", "role"],
        )
        percent = GaugeMetricFamily(
            "radserve_model_deployment_percent",
            "Share of studies a canary serves or a shadow samples",
            labels=["step", "version", "role"],
        )
        for step, d in self.lifecycle.active().items():
            info.add_metric([step, d.stable, "stable"], 1)
            if d.canary:
                info.add_metric([step, d.canary, "canary"], 1)
                percent.add_metric([step, d.canary, "canary"], d.canary_percent)
            if d.shadow:
                info.add_metric([step, d.shadow, "shadow"], 1)
                percent.add_metric([step, d.shadow, "shadow"], d.shadow_percent)
        yield info
        yield percent
        jobs = CounterMetricFamily(
            "radserve_model_version_jobs",
            "Jobs finished per step version since it was deployed",
            labels=["step", "version", "outcome"],
        )
        comparisons = CounterMetricFamily(
            "radserve_model_comparisons",
            "Comparison runs (shadow, or stable beside a canary) per step version",
            labels=["step", "version"],
        )
        agreement = GaugeMetricFamily(
            "radserve_model_lesion_agreement_ratio",
            "Mean lesion detection agreement with the version it was compared with",
            labels=["step", "version"],
        )
        dice = GaugeMetricFamily(
            "radserve_model_dice_ratio",
            "Mean per-label Dice with the version it was compared with",
            labels=["step", "version"],
        )
        answers = GaugeMetricFamily(
            "radserve_model_answer_agreement_ratio",
            "Share of compared studies a classification step answered as the version it "
            "was compared with",
            labels=["step", "version"],
        )
        p95 = GaugeMetricFamily(
            "radserve_model_p95_seconds",
            "p95 turnaround of the version's recent jobs",
            labels=["step", "version"],
        )
        step_p95 = GaugeMetricFamily(
            "radserve_model_step_p95_seconds",
            "p95 of the version's own step seconds over its recent jobs (what the canary "
            "guardrail judges)",
            labels=["step", "version"],
        )
        for record in self.lifecycle.records():
            labels = [record.step, record.version]
            jobs.add_metric([*labels, "succeeded"], record.finished - record.failed)
            jobs.add_metric([*labels, "failed"], record.failed)
            comparisons.add_metric(labels, len(record.comparisons))
            if (value := record.mean_lesion_agreement()) is not None:
                agreement.add_metric(labels, value)
            if (value := record.mean_dice()) is not None:
                dice.add_metric(labels, value)
            if (value := record.answer_agreement()) is not None:
                answers.add_metric(labels, value)
            if (value := record.p95()) is not None:
                p95.add_metric(labels, value)
            if (value := record.own_p95()) is not None:
                step_p95.add_metric(labels, value)
        yield from (jobs, comparisons, agreement, dice, answers, p95, step_p95)
        rollbacks = CounterMetricFamily(
            "radserve_model_auto_rollbacks",
            "Canaries rolled back by a guardrail",
            labels=["step", "version"],
        )
        for (step, version), count in self.lifecycle.rollbacks.items():
            rollbacks.add_metric([step, version], count)
        yield rollbacks
        skipped = CounterMetricFamily(
            "radserve_model_comparisons_skipped",
            "Comparison runs not made because max_pending_comparisons for the version "
            "they feed were already waiting",
            labels=["step", "version"],
        )
        for (step, version), count in self.lifecycle.skipped().items():
            skipped.add_metric([step, version], count)
        yield skipped


__all__ = [
    "COMPARISONS_DIR",
    "ComparisonTask",
    "LifecycleCollector",
    "ModelLifecycle",
    "NoShadowError",
    "comparison_tasks",
]

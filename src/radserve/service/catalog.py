"""What the server can run: pipelines by name, the model versions they resolve to, and
the warm-up that loads every model's session before the server says it is ready.

Pipelines are looked up in ``settings.pipelines.dirs`` and then the bundled folder;
models in ``settings.models.dirs`` and then the bundled models. A resolved pipeline
fixes its model versions and precision, which (with the input fingerprint) is the key
of the result cache.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from radserve.config import Settings
from radserve.errors import ModelError, PipelineError, RadserveError
from radserve.inference import choose_runtime
from radserve.inference.probe import (
    PROBE_TIMEOUT_S,
    isolated_probe_refusal,
    output_refusal,
    probe_input_shape,
)
from radserve.lifecycle.install import read_install, site_registry
from radserve.models.registry import MANIFEST, ModelBundle, ModelRegistry, bundled_model_dir
from radserve.pipeline import SessionPool
from radserve.pipeline.checks import check_pipeline
from radserve.pipeline.spec import PipelineSpec, bundled_pipeline_dir, load_pipeline
from radserve.store import CacheKey

logger = logging.getLogger(__name__)

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


@dataclass(frozen=True)
class ResolvedPipeline:
    """A pipeline with its model versions and precision fixed: what a job runs."""

    spec: PipelineSpec
    model_versions: dict[str, str]
    precision: str
    # model -> deployment role that chose its version (stable | canary); empty: the
    # pipeline file's versions, no deployment involved
    roles: Mapping[str, str] = field(default_factory=dict)
    # model -> shadow version to run after the result is delivered, to compare (never
    # sent); its record is the shadow's
    shadows: Mapping[str, str] = field(default_factory=dict)
    # model -> stable version a canary-routed study is run with afterwards, to judge the
    # canary (its record is the canary's); a study may have both for one model
    canary_checks: Mapping[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.spec.name

    def pinned(self, versions: Mapping[str, str], roles: Mapping[str, str]) -> ResolvedPipeline:
        """This pipeline with ``versions`` (model -> version) in its steps: what one job
        runs, bound at submission so a deployment change never reaches it mid-flight."""
        merged = {**self.model_versions, **versions}
        steps = tuple(s.model_copy(update={"version": merged[s.model]}) for s in self.spec.steps)
        spec = self.spec.model_copy(update={"steps": steps})
        return ResolvedPipeline(spec, merged, self.precision, {**self.roles, **roles})

    def cache_key(self, fingerprint: str) -> CacheKey:
        return CacheKey(
            fingerprint=fingerprint,
            pipeline_name=self.spec.name,
            pipeline_version=self.spec.version,
            model_versions=dict(self.model_versions),
            precision=self.precision,
        )


@dataclass
class WarmupState:
    """Where warm-up stands; ``/readyz`` reports it."""

    done: bool = False
    seconds: float | None = None
    # model key -> stable error code and message, for models that failed to load
    failed: dict[str, str] = field(default_factory=dict)


class Catalog:
    """Pipelines and models of one server; thread-safe."""

    def __init__(
        self,
        settings: Settings,
        *,
        registry: ModelRegistry,
        sessions: SessionPool,
        probe_timeout_s: float = PROBE_TIMEOUT_S,
    ) -> None:
        self.settings = settings
        self.registry = registry
        self.sessions = sessions
        self.pipeline_dirs = (*settings.pipelines.dirs, bundled_pipeline_dir())
        self.warmup = WarmupState()
        # runs a warm-up batch wherever the sessions run: here (default), or on every
        # worker of an executor whose workers hold them (the Ray executor's warm_session)
        self.warm_runner: WarmRunner = _run_here
        self._local: SessionPool | None = None if getattr(sessions, "remote", False) else sessions
        self._resolved: dict[str, ResolvedPipeline] = {}
        self._generation = 0  # set_deployed and rescan: a resolution begun before is stale
        # model -> stable version set by a deployment (radserve.lifecycle); overrides
        # the version a pipeline file names
        self._deployed: dict[str, str] = {}
        # model -> the latest version when a pipeline step without a version was first
        # resolved (kept across rescans; a restart looks again)
        self._baseline: dict[str, str] = {}
        self._lock = threading.Lock()
        # a bundle not probed at install is probed in a process of its own before its
        # first load (_PROBED)
        self.probe_timeout_s = probe_timeout_s

    @classmethod
    def from_settings(cls, settings: Settings, sessions: SessionPool | None = None) -> Catalog:
        if sessions is None:
            runtime = choose_runtime(
                prefer=settings.runtime.providers or None, threads=settings.runtime.threads
            )
            # executor: ray -- the workers load and run the sessions, this process never
            sessions = SessionPool(runtime, remote=settings.executor == "ray")
        # the registry judges bf16 on what this server serves with (models list, deploy)
        serving = sessions.runtime.serving
        registry = site_registry(settings.models.dirs, settings.data_dir, serving=serving)
        return cls(settings, registry=registry, sessions=sessions)

    @property
    def serving_providers(self) -> tuple[str, ...]:
        """The execution providers this server's sessions run on, in order (its session
        pool's choice: ``runtime.providers``, else the host's best). Everything that
        judges a model for this server judges it on them, not on the host's default:

        * every probe batch, in its own process: install's and import's
          (:meth:`radserve.service.lifecycle.ModelLifecycle.stage`,
          ``radserve models import --config``) and warm-up's of a bundle not installed
          (:meth:`_probe_unvetted`);
        * a bundle's ``requires.providers`` and ``requires.precision: [bf16]``
          (:func:`radserve.lifecycle.requirements.unmet_requirements`): install, import,
          deploy and promote (``ModelLifecycle.check_servable``), ``radserve doctor``;
        * whether bf16 may serve (:mod:`radserve.models.bf16`): this catalog's registry
          (``ModelBundle.rejection``: ``radserve models list``, deploy, the sessions it
          hands out) and doctor's "servable" column;
        * precision variants, chosen, evaluated and timed on them
          (:func:`radserve.variants.gate_runtime`): ``models install --build-variants``
          and ``POST /v1/models?build_variants=true``
          (:func:`radserve.service.variant_install.variant_builder`), and
          ``radserve models build-variants --config``.

        Before 2026-12-07 the probe took the host's default (OpenVINO) on a server set to
        serve on the CPU provider, so a graph that runs there but that OpenVINO cannot
        compile was refused at install, and a graph failing only on the configured
        provider would have installed."""
        return tuple(self.sessions.runtime.providers)

    def local_sessions(self) -> SessionPool:
        """Sessions that run in this process (comparison runs of shadow and canary
        versions): the pool itself, or, when the executor's workers run the pool's
        sessions, a second pool made on first use."""
        with self._lock:
            if self._local is None:
                self._local = SessionPool(self.sessions.runtime)
            return self._local

    # --- pipelines --------------------------------------------------------------------
    def available(self) -> list[str]:
        names = {p.stem for d in self.pipeline_dirs if d.is_dir() for p in d.glob("*.yaml")}
        return sorted(names)

    def resolve(self, name: str | None = None) -> ResolvedPipeline:
        """The pipeline ``name`` (default: the configured one) with its models resolved.

        Raises:
            PipelineError: unknown or invalid pipeline (a rule of
                :func:`~radserve.pipeline.checks.check_pipeline` broken).
            UnknownModelError: a step names a model (version) that is not installed.
        """
        name = name or self.settings.pipelines.default
        with self._lock:
            cached = self._resolved.get(name)
        if cached is not None:
            return cached
        spec = load_pipeline(self._pipeline_path(name))
        versions: dict[str, str] = {}
        roles: dict[str, str] = {}
        # a deployment's stable, else the pipeline file's version, else the version this
        # server first resolved, chosen so that installing a bundle never changes what
        # serves without a deployment, before or after a restart (undeployed_version);
        # then the rules
        with self._lock:
            deployed = dict(self._deployed)
            baseline = dict(self._baseline)
            generation = self._generation
        spec = spec.model_copy(
            update={
                "steps": tuple(
                    s.model_copy(
                        update={
                            "version": deployed.get(s.model)
                            or s.version
                            or baseline.get(s.model)
                            or self.undeployed_version(s.model)
                        }
                    )
                    for s in spec.steps
                )
            }
        )
        for step, bundle in zip(spec.steps, check_pipeline(spec, self.registry), strict=True):
            if step.version is None:
                with self._lock:
                    self._baseline.setdefault(step.model, bundle.spec.version)
            versions[bundle.spec.name] = bundle.spec.version
            if step.model in deployed:
                roles[step.model] = "stable"
        precision = self.settings.models.precision or spec.precision
        # every step pinned: a job never picks up a version installed while it runs
        steps = tuple(s.model_copy(update={"version": versions[s.model]}) for s in spec.steps)
        spec = spec.model_copy(update={"steps": steps})
        resolved = ResolvedPipeline(spec, versions, precision, roles)
        with self._lock:
            # not kept when a deployment or a rescan came while this resolved: it was
            # read before them (a warm-up resolving beside a deploy cached the old stable
            # for every later job)
            if generation == self._generation:
                self._resolved[name] = resolved
        return resolved

    def without_deployment(self, model: str) -> str | None:
        """The version ``model`` serves in the configured pipeline when no deployment
        names one, as :meth:`resolve` chooses it: the pipeline file's pin, else the
        version this server first resolved, else :meth:`undeployed_version` (a step's
        first deployment rolls back to it). Raises what :meth:`resolve` raises for a
        pipeline it cannot read."""
        spec = load_pipeline(self._pipeline_path(self.settings.pipelines.default))
        pinned = next((s.version for s in spec.steps if s.model == model and s.version), None)
        with self._lock:
            first = self._baseline.get(model)
        return pinned or first or self.undeployed_version(model)

    def undeployed_version(self, model: str) -> str | None:
        """The version a step without one serves when no deployment names one: the
        latest placed in a models folder (shipped, or the site's ``models.dirs``), never
        one ``models install`` added: installing does not deploy, and that must hold after
        a restart too, when this server resolves its pipelines anew (before, the latest
        installed version then served every study). A model that was only ever
        installed serves its first install until a deployment says otherwise. None: not
        installed at all (the pipeline check names it)."""
        placed: list[str] = []
        installed: dict[str, str] = {}  # version -> when installed, in version order
        for v in self.registry.versions(model):
            try:
                record = read_install(self.registry.get(model, v).directory)
            except (ModelError, OSError, ValueError, KeyError):
                continue  # a broken bundle or install record is no candidate
            if record is None:
                placed.append(v)
            else:
                installed[v] = record.installed_at
        if placed:
            return placed[-1]
        # the earliest install; min keeps the lower version of two installed in one second
        return min(installed, key=installed.__getitem__) if installed else None

    def check_fits(self, model: str, version: str) -> None:
        """Refuse ``version`` of ``model`` where a pipeline running that model would not
        load with it (:func:`~radserve.pipeline.checks.check_pipeline`: a label the earlier
        steps do not produce, a modality the pipeline does not select): deployed, every
        job it is routed to would fail at its first step. A pipeline that does not load
        as it is now is not this version's doing and is passed over.

        Raises:
            PipelineError: naming the pipeline and the rule the version breaks there.
        """
        for name in self.available():
            try:
                current = self.resolve(name)
            except RadserveError:
                continue
            if model not in current.model_versions:
                continue
            candidate = current.pinned({model: version}, {})
            try:
                check_pipeline(candidate.spec, self.registry)
            except RadserveError as exc:
                raise PipelineError(
                    f"{model}/{version} does not fit pipeline {name!r}: {exc.message}"
                ) from exc

    def set_deployed(self, stable: Mapping[str, str]) -> None:
        """Serve ``stable`` (model -> version) from now on: new jobs resolve to it; jobs
        already submitted keep the versions they were bound to."""
        with self._lock:
            self._deployed = dict(stable)
            self._resolved.clear()
            self._generation += 1

    def rescan(self) -> None:
        """See bundles installed since the registry last looked."""
        self.registry.rescan()
        with self._lock:
            self._resolved.clear()
            self._generation += 1

    def _pipeline_path(self, name: str) -> Path:
        if not _NAME.match(name) or name.endswith((".yaml", ".yml")):
            raise PipelineError(
                f"invalid pipeline name {name!r}: use the name of a pipeline "
                f"(letters, digits, '.', '_', '-'); available: {', '.join(self.available())}"
            )
        for folder in self.pipeline_dirs:
            path = Path(folder) / f"{name}.yaml"
            if path.is_file():
                return path
        raise PipelineError(
            f"unknown pipeline {name!r}; available: {', '.join(self.available()) or 'none'}"
        )

    def model_versions(self) -> dict[str, str]:
        """Models of every pipeline resolved so far (the default one at least, after
        warm-up): what ``/healthz`` reports."""
        with self._lock:
            resolved = list(self._resolved.values())
        return {m: v for r in resolved for m, v in r.model_versions.items()}

    # --- warm-up ----------------------------------------------------------------------
    def warm_up(self) -> WarmupState:
        """Load the default pipeline's models and run one small batch through each.

        A model that fails is recorded (never raised): the server stays up, ``/readyz``
        says which model is broken, and jobs needing it fail with its error code.
        """
        t0 = time.perf_counter()
        failed: dict[str, str] = {}
        try:
            resolved = self.resolve()
        except RadserveError as exc:
            failed[self.settings.pipelines.default] = f"{exc.code}: {exc.message}"
        else:
            for step in resolved.spec.steps:
                key = f"{step.model}@{resolved.model_versions.get(step.model, '?')}"
                try:
                    self._warm_model(step.model, step.version, resolved.precision)
                except RadserveError as exc:
                    failed[key] = f"{exc.code}: {exc.message}"
                except Exception as exc:  # onnxruntime may raise anything on a bad graph
                    failed[key] = f"model_invalid: {type(exc).__name__}: {exc}"
        self.warmup = WarmupState(done=True, seconds=time.perf_counter() - t0, failed=failed)
        if failed:
            logger.error("warm-up: %d model(s) failed: %s", len(failed), "; ".join(failed))
        else:
            logger.info("warm-up done in %.2f s", self.warmup.seconds)
        return self.warmup

    def warm_model(self, name: str, version: str | None, precision: str | None = None) -> None:
        """Load ``name`` at ``version`` and run one small batch (before it serves)."""
        precision = precision or self.settings.models.precision or "fp32"
        self._warm_model(name, version, precision)

    def _warm_model(self, name: str, version: str | None, precision: str) -> None:
        bundle = self.registry.get(name, version)
        self._probe_unvetted(bundle, precision)
        session = self.sessions.get(bundle, precision)
        spec = bundle.spec
        dummy = np.zeros(probe_input_shape(spec), dtype=np.float32)
        outs = self.warm_runner(session, dummy)
        # what inference will require of every batch (radserve.inference.tasks.check_batch):
        # before session 35 only the batch size was checked, so a graph that strides its
        # output down deployed, and every study routed to it then failed. Install and
        # import run the same probe (radserve.inference.probe), NaN class probabilities
        # included (since session 42: a NaN weight warmed up, then failed every study)
        for out in outs:
            why = output_refusal(spec, dummy.shape, out)
            if why is not None:
                raise ModelError(f"{spec.key}: warm-up: {why}")
        logger.info("warmed up %s (%s) on %d worker(s)", spec.key, precision, len(outs))

    def _probe_unvetted(self, bundle: ModelBundle, precision: str) -> None:
        """Run the install's probe batch in a process of its own, killed after
        ``probe_timeout_s``, on :attr:`serving_providers`, on a file that was never
        probed: one of a bundle copied into ``models.dirs`` by hand, or changed since
        ``models install`` probed it (its SHA-256 is not the one ``install.json``
        records). Warm-up runs its batch in this process, where nothing can stop a
        graph that loops (a ``Loop`` of 10^15 iterations held deploy and startup for
        ever before 2026-12-06). The shipped models are part of radserve and are not
        probed.

        Raises:
            ModelError: the probe's reason (a graph that loops, crashes ONNX Runtime or
                answers off the input's grid), naming the bundle and the precision.
        """
        directory = bundle.directory.resolve()
        if directory.is_relative_to(bundled_model_dir().resolve()):
            return
        path = bundle.onnx_path(precision)
        sha = bundle.sha256(precision)
        record = read_install(bundle.directory)
        relative = path.relative_to(bundle.directory).as_posix()
        if record is not None and record.files.get(relative) == sha:
            # probed by install (or import) before it was hashed, or a variant that
            # `radserve models build-variants` ran through the pipeline and recorded
            return
        manifest = hashlib.sha256((bundle.directory / MANIFEST).read_bytes()).hexdigest()
        providers = self.serving_providers
        key = (sha, manifest, providers)
        with _PROBED_LOCK:
            known = key in _PROBED
            why = _PROBED.get(key)
        if not known:
            logger.info(
                "%s %s was not installed with `radserve models install` (or changed since): "
                "probing it in a separate process before it loads",
                bundle.key,
                precision,
            )
            why = isolated_probe_refusal(
                bundle.spec, path, timeout_s=self.probe_timeout_s, providers=providers
            )
            with _PROBED_LOCK:
                _PROBED[key] = why
        if why is not None:
            raise ModelError(
                f"{bundle.key} {precision} ({path.name}): not installed with `radserve models "
                f"install` (or changed since), so probed in a separate process before "
                f"loading: {why}"
            )


# what the separate-process probe said of a graph under a manifest on a list of
# providers, by their SHA-256s (the same bytes under the same model.yaml on the same
# providers answer the same: one probe per process, however many catalogs or copies of
# the bundle): None, it may load; else why not
_PROBED: dict[tuple[str, str, tuple[str, ...]], str | None] = {}
_PROBED_LOCK = threading.Lock()

WarmRunner = Callable[[Any, np.ndarray], list[np.ndarray]]


def _run_here(session: Any, batch: np.ndarray) -> list[np.ndarray]:
    return [session.run(batch)]


__all__ = ["Catalog", "ResolvedPipeline", "WarmupState"]

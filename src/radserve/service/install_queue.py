"""Installs that build precision variants, run after their request was answered.

Building and gating variants takes minutes (minutes per variant at full size), so ``POST
/v1/models?build_variants=true`` checks and stages the bundle, answers 202 with the
install's record (:mod:`radserve.lifecycle.install_tasks`), and the build runs here: one
install at a time, in order, in one daemon thread whose CPU priority is lowered below
the clinical workers' (the studies being served keep their cores).

The checked bundle is kept with the install's record until it ends, and each build
stages it afresh (the checks run again on what the build starts from). So a stop leaves
the installs not finished to the next start (:meth:`BackgroundInstalls.stop`), and one a
crash cut short is claimed by the next server started on the data dir
(:meth:`BackgroundInstalls.resume`), as a job is: the operator does not send it again.
While an install is queued or building here, its record is touched every
:data:`~radserve.lifecycle.install_tasks.BEAT_S`, so that a replica of another host sharing
the data dir can tell an install at work from one whose host died; and a running server
looks for installs left behind every :data:`CLAIM_S`, not only at its start (a dead
host's install becomes claimable while the other replicas run).
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from radserve.errors import BundleExistsError, RadserveError
from radserve.lifecycle.install import (
    INSTALL_FILE,
    InstalledBundle,
    StagedBundle,
    models_root,
    read_install,
)
from radserve.lifecycle.install_tasks import BEAT_S, InstallTask, InstallTasks
from radserve.service.errors import InstallsStoppedError
from radserve.service.lifecycle import ModelLifecycle
from radserve.service.variant_install import VariantRequest, install_summary

logger = logging.getLogger(__name__)

__all__ = ["CLAIM_S", "BackgroundInstalls"]

CLAIM_S = 5 * 60.0  # a running server claims installs left behind this often


def _request_of(task: InstallTask) -> VariantRequest:
    """The variant request a record keeps (:func:`_build_of`)."""
    build = dict(task.build or {})
    precisions = tuple(task.precisions) if task.precisions else None
    return VariantRequest(precisions=precisions, **build)


def _build_of(variants: VariantRequest) -> dict[str, Any]:
    """The variant request's fields besides the precisions (which the record shows)."""
    out = dataclasses.asdict(variants)
    del out["precisions"]
    return out


class BackgroundInstalls:
    """``wrap`` makes the thread's body run at the lowered priority."""

    def __init__(
        self,
        lifecycle: ModelLifecycle,
        tasks: InstallTasks,
        wrap: Callable[[Callable[[], None]], Callable[[], None]] = lambda run: run,
        beat_s: float = BEAT_S,
        claim_s: float = CLAIM_S,
    ) -> None:
        self.lifecycle = lifecycle
        self.tasks = tasks
        self._wrap = wrap
        self._orders: queue.Queue[InstallTask | None] = queue.Queue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopped = False
        self._beat_s = beat_s
        self._claim_s = claim_s
        self._held: set[str] = set()  # queued or building here: their records are touched
        self._beating: threading.Thread | None = None

    def submit(
        self,
        staged: StagedBundle,
        *,
        actor: str | None,
        client: str | None,
        variants: VariantRequest,
    ) -> InstallTask:
        """Record the install (``queued``), keep the checked bundle with it and hand it to
        the thread; the staged copy is gone once this returns."""
        try:
            with self._lock:
                if self._stopped:
                    raise InstallsStoppedError("the server is stopping; send the bundle again")
                task = self.tasks.create(
                    staged.copy,
                    staged.source_name,
                    actor=actor,
                    precisions=list(variants.precisions) if variants.precisions else None,
                    client=client,
                    build=_build_of(variants),
                )
                self._queue(task)
        finally:
            staged.discard()
        logger.info("install %s of %s queued", task.id, staged.spec.key)
        return task

    def resume(self) -> int:
        """Claim the installs a stopped or crashed server left (oldest first) and queue
        them; returns how many. From then on this is looked for again every ``claim_s``."""
        with self._lock:
            if not self._stopped:
                self._start_beat()
        claimed = 0
        for left in self.tasks.claimable():
            task = self.tasks.claim(left.id)
            if task is None or task.state != "queued":
                continue  # another server's now, or given up
            with self._lock:
                if self._stopped:
                    self.tasks.release(task)
                    break
                self._queue(task)
            claimed += 1
            logger.warning(
                "install %s of %s: left unfinished (a stop, a crash or its host gone); "
                "built again (attempt %d)",
                task.id,
                task.source,
                task.attempts + 1,
            )
        return claimed

    def _start_beat(self) -> None:
        if self._beating is None:
            self._beating = threading.Thread(
                target=self._beat, name="radserve-install-beat", daemon=True
            )
            self._beating.start()

    def _queue(self, task: InstallTask) -> None:
        self._held.add(task.id)
        self._orders.put(task)
        self._start_beat()
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._wrap(self._run), name="radserve-installs", daemon=True
            )
            self._thread.start()

    def stop(self) -> None:
        """Installs not started yet are left, with their bundles, to the next start; one
        being built is left to its thread (it cannot be cut short safely and must not
        hold the server's stop for minutes): if the process ends first, the next start
        builds it again."""
        with self._lock:
            self._stopped = True
        while True:
            try:
                task = self._orders.get_nowait()
            except queue.Empty:
                break
            if task is not None:
                self.tasks.release(task)
                self._let_go(task)
        self._orders.put(None)

    def _let_go(self, task: InstallTask) -> None:
        with self._lock:
            self._held.discard(task.id)

    def _beat(self) -> None:
        """Touch the records held here until the server stopped and none is left (the
        build under way at a stop goes on, and so does its beat); until the stop, claim
        the installs left behind every ``claim_s``."""
        claimed = time.monotonic()
        while True:
            time.sleep(self._beat_s)
            with self._lock:
                held = sorted(self._held)
                stopped = self._stopped
                if stopped and not held:
                    self._beating = None
                    return
            for task_id in held:
                self.tasks.beat(task_id)
            if not stopped and time.monotonic() - claimed >= self._claim_s:
                claimed = time.monotonic()
                try:
                    self.resume()
                except Exception:  # the data dir away for a moment: the next round
                    logger.exception("installs left behind could not be claimed")

    def _run(self) -> None:
        while (task := self._orders.get()) is not None:
            try:
                self._build(task)
            except Exception:  # its record could not be written: the next one still runs
                logger.exception("install %s: its record could not be written", task.id)
            finally:
                self._let_go(task)

    def _build(self, queued: InstallTask) -> None:
        task = self.tasks.started(queued)
        key = task.source
        try:  # the checks again, on a fresh copy: the kept bundle stays as it came
            staged = self.lifecycle.stage(self.tasks.bundle(task), described_as=task.source)
        except Exception as exc:
            if isinstance(exc, BundleExistsError):  # did this install put it there?
                done = _installed_before(task, self.lifecycle.settings.data_dir)
                if done is not None:
                    self.tasks.installed(task, install_summary(done))
                    return
            self._failed(task, key, exc)
            return
        key = staged.spec.key
        try:
            installed = self.lifecycle.complete(
                staged, actor=task.actor, client=task.client, variants=_request_of(task)
            )
        except Exception as exc:
            done = _installed_before(task, self.lifecycle.settings.data_dir, staged, exc)
            if done is None:
                self._failed(task, key, exc)
                return
            # in the store, whole: what failed came after (the catalog rescan, the audit)
            logger.error(
                "install %s of %s: installed, but what follows an install failed (its "
                "audit record may be missing)",
                task.id,
                key,
                exc_info=exc,
            )
            installed = done
        finally:
            staged.discard()  # finish_install removed it already, unless it never ran
        self.tasks.installed(task, install_summary(installed))
        logger.info("install %s of %s finished", task.id, key)

    def _failed(self, task: InstallTask, key: str, exc: Exception) -> None:
        """Record how a build ended without installing: the server stopped under it (left
        to the next start), what it needs failed for now (the database, while the audit
        record was written: failed, with the reason), the bundle or what was built from it
        was refused (the reason), or radserve failed."""
        if self._stopped:
            logger.warning("install %s of %s cut short by the stop: %s", task.id, key, exc)
            self.tasks.release(task)
        elif isinstance(exc, RadserveError) and exc.retryable:  # the database away, say
            logger.error("install %s of %s failed: %s", task.id, key, exc.message)
            self.tasks.ended(
                task, "failed", exc.code, f"{exc.message}; nothing was installed: send it again"
            )
        elif isinstance(exc, RadserveError):
            logger.warning("install %s of %s refused: %s", task.id, key, exc.message)
            self.tasks.ended(task, "rejected", exc.code, exc.message)
        else:
            logger.error("install %s of %s failed", task.id, key, exc_info=exc)
            self.tasks.ended(
                task, "failed", "internal_error", "the install failed; the server log says why"
            )


def _installed_before(
    task: InstallTask,
    data_dir: Path,
    staged: StagedBundle | None = None,
    exc: Exception | None = None,
) -> InstalledBundle | None:
    """The bundle of ``task`` if it reached the model store (its ``install.json`` names
    this install's source, actor and time after the task was created), else None: before
    ``exc`` was raised by the build of ``staged`` (another install of the same version
    winning that race raises BundleExistsError: never ours), or by an earlier attempt
    that a stop cut short after the store had it (found when staging again)."""
    if isinstance(exc, BundleExistsError):
        return None
    if staged is not None:
        targets = [staged.target]
    else:  # the version is not known without staging: every installed one of the source
        targets = [p.parent for p in models_root(data_dir).glob(f"*/*/{INSTALL_FILE}")]
    for target in targets:
        record = read_install(target)
        if (
            record is not None
            and (record.source, record.actor) == (task.source, task.actor)
            and record.installed_at >= task.created[:19]
        ):
            return record
    return None

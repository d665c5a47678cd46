"""Installs that build precision variants, run after their request was answered.

Building and gating variants takes minutes (minutes per variant at full size), so ``POST
/v1/models?build_variants=true`` checks and stages the bundle, answers 202 with the
install's record (:mod:`radserve.lifecycle.install_tasks`), and the build runs here: one
install at a time, in order, in one daemon thread whose CPU priority is lowered below
the clinical workers' (the studies being served keep their cores).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass

from radserve.errors import BundleExistsError, RadserveError
from radserve.lifecycle.install import InstalledBundle, StagedBundle, read_install
from radserve.lifecycle.install_tasks import INTERRUPTED_WHY, InstallTask, InstallTasks
from radserve.service.errors import InstallsStoppedError
from radserve.service.lifecycle import ModelLifecycle
from radserve.service.variant_install import VariantRequest, install_summary

logger = logging.getLogger(__name__)

__all__ = ["BackgroundInstalls"]


@dataclass(frozen=True)
class _Order:
    task: InstallTask
    staged: StagedBundle
    actor: str | None
    client: str | None
    variants: VariantRequest


class BackgroundInstalls:
    """``wrap`` makes the thread's body run at the lowered priority."""

    def __init__(
        self,
        lifecycle: ModelLifecycle,
        tasks: InstallTasks,
        wrap: Callable[[Callable[[], None]], Callable[[], None]] = lambda run: run,
    ) -> None:
        self.lifecycle = lifecycle
        self.tasks = tasks
        self._wrap = wrap
        self._orders: queue.Queue[_Order | None] = queue.Queue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopped = False

    def submit(
        self,
        staged: StagedBundle,
        *,
        actor: str | None,
        client: str | None,
        variants: VariantRequest,
    ) -> InstallTask:
        """Record the install (``queued``) and hand it to the thread; the staged copy is
        the thread's from here on."""
        with self._lock:
            if self._stopped:
                staged.discard()
                raise InstallsStoppedError("the server is stopping; send the bundle again")
            precisions = list(variants.precisions) if variants.precisions else None
            try:
                task = self.tasks.create(staged.source_name, actor=actor, precisions=precisions)
            except BaseException:
                staged.discard()
                raise
            self._orders.put(_Order(task, staged, actor, client, variants))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._wrap(self._run), name="radserve-installs", daemon=True
                )
                self._thread.start()
        logger.info("install %s of %s queued", task.id, staged.spec.key)
        return task

    def stop(self) -> None:
        """Installs not started yet are recorded as interrupted and their staged copies
        removed; one being built is left to its thread (it cannot be cut short safely
        and must not hold the server's stop for minutes)."""
        with self._lock:
            self._stopped = True
        while True:
            try:
                order = self._orders.get_nowait()
            except queue.Empty:
                break
            if order is not None:
                order.staged.discard()
                self.tasks.ended(order.task, "interrupted", "interrupted", INTERRUPTED_WHY)
        self._orders.put(None)

    def _run(self) -> None:
        while (order := self._orders.get()) is not None:
            try:
                self._build(order)
            except Exception:  # its record could not be written: the next one still runs
                logger.exception("install %s: its record could not be written", order.task.id)
                order.staged.discard()

    def _build(self, order: _Order) -> None:
        key = order.staged.spec.key
        task = self.tasks.started(order.task)
        try:
            installed = self.lifecycle.complete(
                order.staged, actor=order.actor, client=order.client, variants=order.variants
            )
        except Exception as exc:
            done = _installed_before(order, exc)
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
            order.staged.discard()  # finish_install removed it already, unless it never ran
        self.tasks.installed(task, install_summary(installed))
        logger.info("install %s of %s finished", task.id, key)

    def _failed(self, task: InstallTask, key: str, exc: Exception) -> None:
        """Record how a build ended without installing: the server stopped under it, the
        bundle or what was built from it was refused (the reason), or radserve failed."""
        if self._stopped:
            logger.warning("install %s of %s cut short by the stop: %s", task.id, key, exc)
            self.tasks.ended(task, "interrupted", "interrupted", INTERRUPTED_WHY)
        elif isinstance(exc, RadserveError):
            logger.warning("install %s of %s refused: %s", task.id, key, exc.message)
            self.tasks.ended(task, "rejected", exc.code, exc.message)
        else:
            logger.error("install %s of %s failed", task.id, key, exc_info=exc)
            self.tasks.ended(
                task, "failed", "internal_error", "the install failed; the server log says why"
            )


def _installed_before(order: _Order, exc: Exception) -> InstalledBundle | None:
    """The bundle of ``order`` if it reached the model store before ``exc`` was raised
    (its ``install.json`` names this upload and actor), else None. Another install of the
    same version winning the race raises BundleExistsError: never ours."""
    if isinstance(exc, BundleExistsError):
        return None
    record = read_install(order.staged.target)
    if record is None or (record.source, record.actor) != (order.staged.source_name, order.actor):
        return None
    return record

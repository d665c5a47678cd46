"""Result folders of voided runs: deleted once the job's winning result is settled.

With replicas, a job taken over (or back from an earlier incarnation of the same
instance) runs again into a folder of its own, ``results/<job id>.<incarnation>``
(:func:`radserve.store.leases.result_folder_name`), since the run it replaces may still
be writing into its folder. Exactly one run's result is recorded (the fence in the
store); the other run's folder used to stay on disk for good: a study's worth of SEG,
SR and report files per take-over.

:class:`VoidedRunFolders` sweeps them (at start and every :data:`SWEEP_EVERY_S`): for
each job that has an incarnation folder, once its row is final, every folder of that
job other than the one its row names is deleted, where

- the row is final (succeeded, failed or cancelled) -- no run of it will be recorded
  any more; an unfinished job, or a folder no row names as its job, is left alone;
- the folder is not the row's ``result_path`` (the result served) nor named by any other
  row (a cached answer points at the result it reuses); a failed job's ``<job id>``
  folder is kept too (its failure notice is written there, radserve.service.failure_notice);
- nothing in it changed for :data:`GRACE_S`: a voided run that is still writing (a
  frozen replica that woke up) stops at its next write, refused by the fence; if it
  writes again after the deletion, the next sweep deletes that too. A folder is renamed
  away before it is deleted, so a half-deleted one never looks like a result.

A result served from the storage fallback (``result_path`` outside the data folder's
``results/``) is not settled yet: its job is looked at again after the move back.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from radserve.service.periodic_sweep import PeriodicSweep
from radserve.store import JobState, Store
from radserve.store.errors import JobNotFoundError

logger = logging.getLogger(__name__)

GRACE_S = 600.0  # far longer than a voided run takes to learn it was voided
SWEEP_EVERY_S = 60.0
_TRASH_PREFIX = ".voided-"


class VoidedRunFolders(PeriodicSweep):
    """Deletes the folders of voided runs (a daemon thread; :meth:`sweep`)."""

    what = "deleting voided runs' result folders"
    thread_name = "radserve-voided"
    log = logger

    def __init__(
        self,
        results_root: Path,
        store: Store,
        *,
        grace_s: float = GRACE_S,
        every_s: float = SWEEP_EVERY_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(store, grace_s=grace_s, every_s=every_s, clock=clock)
        self.root = Path(results_root)

    def sweep(self) -> list[Path]:
        """One round; the folders deleted."""
        if not self.root.is_dir():
            return []
        deleted: list[Path] = []
        for job_id in sorted(self._jobs_with_incarnation_folders()):
            deleted += self._settle(job_id)
        return deleted

    def _jobs_with_incarnation_folders(self) -> set[str]:
        jobs = set()
        with os.scandir(self.root) as entries:
            for entry in entries:
                if entry.name.startswith(".") or "." not in entry.name:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    jobs.add(entry.name.split(".", 1)[0])
        for trash in self.root.glob(_TRASH_PREFIX + "*"):  # a sweep that stopped half-way
            shutil.rmtree(trash, ignore_errors=True)
        return jobs

    def _settle(self, job_id: str) -> list[Path]:
        try:
            record = self.store.get_job(job_id)
        except JobNotFoundError:
            return []  # not a job's folder, or its row is not there (yet): left alone
        if not record.terminal:
            return []  # a run of it may still be recorded
        keep: set[Path] = set()
        if record.state is JobState.SUCCEEDED:
            if not record.result_path:
                return []
            served = Path(record.result_path).resolve()
            if served.parent != self.root.resolve():
                return []  # in the storage fallback: settled once it is moved back
            keep.add(served)
        if record.state is JobState.FAILED:
            keep.add((self.root / job_id).resolve())  # its failure notice, if any
        deleted = []
        for folder in self._folders_of(job_id):
            if folder.resolve() in keep or not self._quiet(folder):
                continue
            if self.store.rows_naming(str(folder)):
                continue  # another job's result (a cached answer reuses it)
            if _delete(folder):
                logger.info(
                    "job %s: deleted the result folder %s of a voided run", job_id, folder.name
                )
                deleted.append(folder)
        return deleted

    def _folders_of(self, job_id: str) -> list[Path]:
        own = self.root / job_id
        found = [own] if own.is_dir() and not own.is_symlink() else []
        prefix = job_id + "."
        with os.scandir(self.root) as entries:
            found += [
                Path(e.path)
                for e in entries
                if e.name.startswith(prefix) and e.is_dir(follow_symlinks=False)
            ]
        return sorted(found)

    def _quiet(self, folder: Path) -> bool:
        """Nothing in ``folder`` changed for the grace (its newest entry's mtime)."""
        newest = _newest_mtime(folder)
        return newest is not None and self.clock() - newest >= self.grace_s


def _newest_mtime(folder: Path) -> float | None:
    try:
        newest = folder.stat().st_mtime
        for parent, dirs, files in os.walk(folder):
            for name in dirs + files:
                try:
                    newest = max(newest, os.lstat(os.path.join(parent, name)).st_mtime)
                except FileNotFoundError:
                    continue
    except OSError:
        return None
    return newest


def _delete(folder: Path) -> bool:
    trash = folder.with_name(_TRASH_PREFIX + folder.name)
    try:
        folder.rename(trash)
    except OSError:
        return False
    shutil.rmtree(trash, ignore_errors=True)
    return True


__all__ = ["GRACE_S", "SWEEP_EVERY_S", "VoidedRunFolders"]

"""Studies and results while the shared data folder is away: a local fallback folder,
and reconciling it when the data folder returns (``storage.fallback_dir``).

Without a fallback (the default) studies and results go to ``data_dir`` and a study that
cannot be stored is refused (503 ``storage_unavailable``).

With one:

- **Studies.** Stored in ``data_dir`` while the storage probe
  (:mod:`radserve.service.storage`) is healthy; a write that fails there marks the
  storage failed and the same upload is stored in ``<fallback>/studies/`` (same
  fsync-then-rename rule), so the 202 / C-STORE success still means "durable on a disk".
  The job row names that folder and the job runs from it.
- **Results.** Every job writes its result folder on local disk (``<fallback>/work/``)
  and a last stage *publishes* it: copied into ``data_dir/results/.staging-*``,
  fsynced, renamed into place; the local copy is deleted. The recorded ``result_path``
  and the rows made from it (outbox, result index) name the published folder. If the
  copy fails, the result stays local (``<fallback>/results/``) and is recorded there.
  So a storage failure mid-run reaches only the publish step, never the pipeline.
- **Reconcile** (after each healthy probe while the fallback holds something, and at
  start): each local study or result folder that a job row names is copied into
  ``data_dir`` and then, in one transaction, every row naming it or a file in it is
  pointed at the copy (:meth:`radserve.store.Store.relocate`); the local folder is
  deleted afterwards -- a study only once no unfinished job was built from it (a retry
  re-reads the path its work was built with). Each step can be repeated after a crash:
  until the rows move, they still name the local copy.

Not handled: a fallback folder is local to one replica, so another replica cannot take
over a job whose study is there until it is reconciled (the take-over fails that job).
Unreferenced local folders (an upload whose job row was never committed, a run that
never recorded its result) are deleted at start only, when nothing is in flight.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from radserve import durable
from radserve.service.storage import StorageProbe
from radserve.service.unclaimed import mark
from radserve.store import Store
from radserve.store.files import (
    STUDIES_DIR,
    StorageUnavailableError,
    StoredStudy,
    store_study,
    store_study_files,
)
from radserve.store.records import JobState

logger = logging.getLogger(__name__)

RESULTS_DIR = "results"
# the figures of the shadow comparisons, one <version>.json per job folder (models.md)
COMPARISONS_DIR = "comparisons"
WORK_DIR = "work"
_FINAL = {s.value for s in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)}


class SharedStorage:
    """Where studies and results are written, and the way back from the fallback."""

    def __init__(
        self,
        data_dir: Path,
        fallback_dir: Path | None,
        probe: StorageProbe,
        store: Store,
        *,
        on_moved: Callable[[list[str]], None] | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.fallback = Path(fallback_dir) if fallback_dir is not None else None
        self.probe = probe
        self.store = store
        self.on_moved = on_moved
        self._lock = threading.Lock()  # one reconcile at a time
        # local study folder -> jobs built from it that may still read it
        self._in_use: dict[Path, set[str]] = {}
        self._relocated: set[Path] = set()  # local study folders whose rows moved

    @property
    def enabled(self) -> bool:
        return self.fallback is not None

    # --- studies ----------------------------------------------------------------------
    def store_study(
        self,
        files: Iterable[tuple[str, BinaryIO]],
        *,
        max_bytes: int | None = None,
        check: Callable[[Path], object] | None = None,
    ) -> StoredStudy:
        """Store an upload's streams durably: in ``data_dir``, else in the fallback.
        ``check``: judges the staged files before they are published (raises to refuse)."""
        pairs = list(files)
        starts = [stream.tell() for _, stream in pairs] if self.fallback is not None else []
        return self._store(
            lambda root: store_study(
                root, pairs, max_bytes=max_bytes, before_publish=self._marker(root), check=check
            ),
            rewind=lambda: [s.seek(p) for (_, s), p in zip(pairs, starts, strict=True)],
        )

    def store_study_files(self, paths: Sequence[Path]) -> StoredStudy:
        """:meth:`store_study` for files on disk (gateway, STOW-RS)."""
        return self._store(
            lambda root: store_study_files(root, paths, before_publish=self._marker(root)),
            rewind=lambda: None,
        )

    def _marker(self, root: Path) -> Callable[[Path], object] | None:
        """What marks a study in ``data_dir`` before it is published: until a job row
        names it, it is one the sweeper may delete (radserve.service.unclaimed), so a
        crash between the two leaves no folder that nothing accounts for. (A fallback
        folder needs none: unreferenced ones are deleted at start.)"""
        if root != self.data_dir:
            return None
        return lambda study: mark(self.data_dir, study)

    def _store(
        self, write: Callable[[Path], StoredStudy], *, rewind: Callable[[], object]
    ) -> StoredStudy:
        if self.fallback is None:
            return write(self.data_dir)
        if self.probe.problem is None:
            try:
                return write(self.data_dir)
            except StorageUnavailableError as exc:
                self.probe.report(exc.message)
                rewind()
        stored = write(self.fallback)
        logger.warning("storage: study %s… stored in the local fallback", stored.fingerprint[:12])
        return stored

    def built_from(self, study_dir: Path, job_id: str) -> None:
        """A job's work reads ``study_dir``: keep a local copy until the job is final."""
        if self.fallback is not None and Path(study_dir).is_relative_to(self.fallback):
            with self._lock:
                self._in_use.setdefault(Path(study_dir), set()).add(job_id)

    # --- results ----------------------------------------------------------------------
    def result_dir(self, folder: str) -> Path:
        """Where a job writes its result folder ``folder``."""
        if self.fallback is None:
            return self.data_dir / RESULTS_DIR / folder
        return self.fallback / WORK_DIR / folder

    def publish(self, local: Path) -> Path:
        """Move a finished local result folder into ``data_dir/results``; where it is now
        (the fallback's ``results/`` when the data folder cannot be written)."""
        assert self.fallback is not None
        if self.probe.problem is None:
            try:
                target = _copy_into(local, self.data_dir / RESULTS_DIR)
            except OSError as exc:
                self.probe.report(_errno_name(exc))
            else:
                shutil.rmtree(local, ignore_errors=True)
                return target
        kept = self.fallback / RESULTS_DIR / local.name
        kept.parent.mkdir(parents=True, exist_ok=True)
        if kept.exists():  # an earlier, unrecorded attempt of the same run
            shutil.rmtree(kept)
        local.rename(kept)
        durable.fsync_dir(kept.parent)
        logger.warning("storage: result %s kept in the local fallback", local.name)
        return kept

    def remove_stale_temporaries(self) -> int:
        """Delete the temporaries (:mod:`radserve.durable`) that writers killed mid-write
        left in result folders (reports, DICOM results, FHIR Bundles, critical notices,
        key images one folder down) and comparison folders, and the ``*.tmp`` ones of
        older versions that no writer holds (:func:`radserve.durable.sweep_unowned`):
        nothing under them was acknowledged, and nothing else ever removes them. Call at
        start, before :meth:`reconcile` copies the fallback's results back. A live
        writer's (another replica's) are kept. Returns how many were deleted."""
        # a job's folder and its subfolders (key images under keyimages/)
        roots = [self.data_dir / RESULTS_DIR]
        if self.fallback is not None:
            roots.append(self.fallback / RESULTS_DIR)
        folders = [(root, folder) for root in roots for folder in ("*/", "*/*/")]
        folders.append((self.data_dir / COMPARISONS_DIR, "*/"))
        return sum(
            durable.sweep(root, f"{folder}.*{durable.TEMPORARY_SUFFIX}")
            + durable.sweep_unowned(root, f"{folder}*{durable.UNOWNED_SUFFIX}")
            for root, folder in folders
        )

    # --- reconcile --------------------------------------------------------------------
    def pending(self) -> bool:
        """Whether the fallback holds studies or results to move back."""
        if self.fallback is None:
            return False
        return any(_children(self.fallback / RESULTS_DIR)) or any(
            _children(self.fallback / STUDIES_DIR, depth=2)
        )

    def reconcile(self, *, at_start: bool = False) -> int:
        """Move what the fallback holds back into ``data_dir``; how many folders moved.
        ``at_start``: nothing is in flight, so unreferenced local folders go too."""
        if self.fallback is None or self.probe.problem is not None:
            return 0
        with self._lock:
            t0, moved = time.monotonic(), 0
            try:
                for folder in list(_children(self.fallback / RESULTS_DIR)):
                    moved += self._move_result(folder, at_start)
                for folder in list(_children(self.fallback / STUDIES_DIR, depth=2)):
                    moved += self._move_study(folder, at_start)
                if at_start:
                    shutil.rmtree(self.fallback / WORK_DIR, ignore_errors=True)
            except OSError as exc:
                self.probe.report(_errno_name(exc))
                logger.error("storage: reconcile stopped (%s)", _errno_name(exc))
            if moved:
                logger.warning(
                    "storage: %d folder(s) moved back from the local fallback in %.2f s",
                    moved,
                    time.monotonic() - t0,
                )
            return moved

    def _move_result(self, folder: Path, at_start: bool) -> int:
        if not self.store.rows_naming(str(folder)):
            if at_start:  # a result never recorded: its job runs again
                shutil.rmtree(folder, ignore_errors=True)
            return 0
        target = _copy_into(folder, self.data_dir / RESULTS_DIR)
        self._moved(self.store.relocate(str(folder), str(target)))
        shutil.rmtree(folder, ignore_errors=True)
        return 1

    def _move_study(self, folder: Path, at_start: bool) -> int:
        moved = 0
        if self.store.rows_naming(str(folder)):
            files = sorted(p for p in folder.iterdir() if p.is_file())
            stored = store_study_files(self.data_dir, files)
            self._moved(self.store.relocate(str(folder), str(stored.path)))
            self._relocated.add(folder)
            moved = 1
        # unreferenced and never relocated: maybe an upload whose job is being created
        if at_start or (folder in self._relocated and not self._still_read(folder)):
            shutil.rmtree(folder, ignore_errors=True)
            _prune(folder.parent)
            self._relocated.discard(folder)
        return moved

    def _still_read(self, folder: Path) -> bool:
        jobs = self._in_use.get(folder)
        if not jobs:
            return False
        unfinished = {j for j in jobs if self.store.get_job(j).state.value not in _FINAL}
        if unfinished:
            self._in_use[folder] = unfinished
            return True
        del self._in_use[folder]
        return False

    def _moved(self, job_ids: list[str]) -> None:
        if job_ids and self.on_moved is not None:
            self.on_moved(job_ids)


class WithPublish:
    """``inner``'s stages, then one more: the finished result folder is published
    (:meth:`SharedStorage.publish`) and the result names where it is now."""

    def __init__(self, inner: Any, storage: SharedStorage) -> None:
        self.inner = inner
        self.storage = storage
        self._result: Any = None
        self._state = "inner"

    @property
    def models(self) -> tuple[str, ...]:
        return self.inner.models  # type: ignore[no-any-return]

    def next_stage(self) -> Any:
        from radserve.scheduling import CpuStage

        if self._state == "inner":
            stage = self.inner.next_stage()
            if stage is not None:
                return stage
            self._state = "publish"
            return CpuStage("publish result", self._publish)
        return None

    def _publish(self) -> None:
        result = self.inner.result()
        where = self.storage.publish(Path(result.out_dir))
        self._result = dataclasses.replace(
            result, out_dir=where, report_path=where / Path(result.report_path).name
        )
        self._state = "done"

    def result(self) -> object:
        return self._result if self._result is not None else self.inner.result()


def _copy_into(folder: Path, parent: Path) -> Path:
    """Copy ``folder`` to ``parent/<its name>`` durably (staging copy, fsync, rename);
    an existing folder of that name (an unrecorded earlier copy) is replaced."""
    parent.mkdir(parents=True, exist_ok=True)
    staging = parent / f".staging-{uuid.uuid4().hex}"
    target = parent / folder.name
    try:
        shutil.copytree(folder, staging)
        if target.exists():
            shutil.rmtree(target)
        durable.rename_tree(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _children(folder: Path, depth: int = 1) -> Iterable[Path]:
    if not folder.is_dir():
        return
    for child in folder.iterdir():
        if child.is_dir() and not child.name.startswith("."):
            if depth == 1:
                yield child
            else:
                yield from _children(child, depth - 1)


def _prune(folder: Path) -> None:
    with_nothing = folder.is_dir() and not any(folder.iterdir())
    if with_nothing:
        folder.rmdir()


def _errno_name(exc: OSError) -> str:
    return errno.errorcode.get(exc.errno or 0, type(exc).__name__)


__all__ = ["SharedStorage", "WithPublish"]

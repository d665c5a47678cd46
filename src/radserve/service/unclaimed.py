"""Studies stored for a submission that got no job: set aside, then deleted once no job
names them.

A study is stored (fsynced into the content-addressed store) before its job row is
written. When that write fails -- the database did not answer within
``server.store_wait_s`` (503 ``store_error``, the sender retries), a refusal of the
scheduler -- the folder used to stay in ``studies/`` with no job naming it, for good.
:meth:`radserve.service.intake.Intake.submit_stored` now *sets it aside*: a marker in
``<data_dir>/unclaimed/`` names the folder. :class:`UnclaimedStudies` sweeps the
markers (at start and every :data:`SWEEP_EVERY_S`): a folder no job row names, whose
marker and whose own modification time are both older than the grace, is deleted.

A crash (``kill -9``, the OOM killer) between the two steps must not leave
a folder nothing accounts for either, so since session 17 the marker is written
*before* the study's folder is renamed into ``studies/``
(:meth:`radserve.service.failover.SharedStorage.store_study`) and removed once the
submission ends with a job (:func:`set_aside_if_refused`). Such a study is not made a
job at the next start: its sender was never answered (no 202, no C-STORE success for
the last instances) and sends it again, and a gateway study still has its spool copy.

Why not delete it at once: the folder is content-addressed, so an identical upload (the
sender's retry on another replica, or a concurrent one) may be using it, between its
store and its job row, while this one is refused. Such an upload touches the folder
(:func:`radserve.store.files.store_study` on a study already stored), so the grace
protects it; a sweep renames a folder away before deleting it and puts it back if it
was touched meanwhile, and an upload that finds it gone stores it again. A C-STORE or
quiet-period STOW study keeps its spool copy too (its instances were acknowledged) and
is handed over again later: its job then names the folder and the marker just goes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from radserve import durable
from radserve.service.periodic_sweep import PeriodicSweep
from radserve.store import Store

logger = logging.getLogger(__name__)

UNCLAIMED_DIR = "unclaimed"
GRACE_S = 600.0  # far longer than a submission takes between its store and its job row
SWEEP_EVERY_S = 60.0
_TRASH_PREFIX = ".unclaimed-"


def _marker(data_dir: Path, study_dir: Path) -> Path:
    name = hashlib.sha256(str(study_dir).encode()).hexdigest()[:32]
    return Path(data_dir) / UNCLAIMED_DIR / f"{name}.json"


def mark(data_dir: Path, study_dir: Path) -> bool:
    """Mark ``study_dir`` as one no job names (yet); whether the marker was written (best
    effort: one that cannot be written leaves the folder as it always was, logged).
    Durable before this returns (its data, its name and ``unclaimed/``'s own name
    fsynced, as :mod:`radserve.durable` does elsewhere), so before the study is renamed
    into place: a power cut after that rename leaves the folder marked, not one that
    nothing accounts for (until session 18 it was not fsynced: that held for a killed
    process only). Two fsyncs per upload (the file, ``unclaimed/``), one more when
    ``unclaimed/`` is new. Not to be called inside :func:`radserve.durable.batch`, which
    would defer the folder's fsync past the rename."""
    marker = _marker(data_dir, study_dir)
    try:
        durable.make_dirs(marker.parent)
        durable.write_json(marker, {"path": str(study_dir)})  # never inside durable.batch()
    except OSError as exc:
        logger.warning("a study without a job could not be marked (%s)", exc.strerror)
        return False
    return True


def set_aside(data_dir: Path, study_dir: Path) -> None:
    """Mark ``study_dir`` as stored for a submission that got no job, and say so."""
    if mark(data_dir, study_dir):
        logger.warning(
            "study %s… got no job: set aside, deleted unless a job names it",
            study_dir.name[:12],
        )


@contextmanager
def set_aside_if_refused(data_dir: Path, study_dir: Path) -> Iterator[None]:
    """:func:`set_aside` ``study_dir`` if the block raises (its submission got no job);
    else its marker goes (the submission ended with a job, or an earlier job answers it)."""
    try:
        yield
    except BaseException:
        set_aside(data_dir, study_dir)
        raise
    # best effort: a marker left (the data folder read-only, the study in the fallback)
    # is dropped by the sweep, which finds the job naming the folder
    with contextlib.suppress(OSError):
        _marker(data_dir, study_dir).unlink(missing_ok=True)


class UnclaimedStudies(PeriodicSweep):
    """Deletes the set-aside studies no job names (a daemon thread; :meth:`sweep`)."""

    what = "sweeping studies without a job"
    thread_name = "radserve-unclaimed"
    log = logger

    def __init__(
        self,
        data_dir: Path,
        store: Store,
        *,
        grace_s: float = GRACE_S,
        every_s: float = SWEEP_EVERY_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(store, grace_s=grace_s, every_s=every_s, clock=clock)
        self.folder = Path(data_dir) / UNCLAIMED_DIR

    def sweep(self) -> int:
        """One round; how many study folders were deleted."""
        if not self.folder.is_dir():
            return 0
        deleted = 0
        for marker in sorted(self.folder.glob("*.json")):
            if self._older(marker):
                deleted += self._settle(marker)
        return deleted

    def _settle(self, marker: Path) -> int:
        """Delete the study ``marker`` names if it is still unclaimed; drop the marker
        once the question is settled (a job names it, or it is gone)."""
        try:
            study = Path(json.loads(marker.read_text())["path"])
        except (OSError, ValueError, KeyError, TypeError):
            marker.unlink(missing_ok=True)
            return 0
        trash = study.with_name(_TRASH_PREFIX + study.name)
        shutil.rmtree(trash, ignore_errors=True)  # a sweep that stopped half-way
        if not study.is_dir() or self.store.rows_naming(str(study)):
            marker.unlink(missing_ok=True)
            return 0
        seen = _mtime_ns(study)
        if seen is None or not self._older(study):
            return 0  # an identical upload used it lately: look again later
        deleted = _delete_unless_touched(study, trash, seen)
        if deleted:
            logger.warning("study %s… had no job: deleted", study.name[:12])
        marker.unlink(missing_ok=True)
        return int(deleted)

    def _older(self, path: Path) -> bool:
        seen = _mtime_ns(path)
        return seen is not None and self.clock() - seen / 1e9 >= self.grace_s


def _delete_unless_touched(study: Path, trash: Path, seen: int) -> bool:
    """Rename ``study`` away and delete it, unless an upload touched it just before (then
    it is put back, or left to the copy stored since)."""
    try:
        study.rename(trash)
    except FileNotFoundError:
        return False
    if _mtime_ns(trash) != seen:
        try:
            trash.rename(study)
        except OSError:  # stored again meanwhile: the same bytes
            shutil.rmtree(trash, ignore_errors=True)
        return False
    shutil.rmtree(trash, ignore_errors=True)  # studies/<ab>/ stays: an upload may use it
    return True


def _mtime_ns(path: Path) -> int | None:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return None


__all__ = [
    "GRACE_S",
    "SWEEP_EVERY_S",
    "UNCLAIMED_DIR",
    "UnclaimedStudies",
    "mark",
    "set_aside",
    "set_aside_if_refused",
]

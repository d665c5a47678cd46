"""Retention: how long the data folder keeps each study's files (``storage.*_retention_days``).

radserve received every study twice and kept both for good: the gateway's (or STOW-RS's
quiet-period) copy under ``gateway/incoming/<Study UID>/`` and the content-addressed
copy under ``studies/<fp[:2]>/<fp>/`` that jobs read, plus the results. The disk filled,
and then the gateway's free-space floor refused every C-STORE. :class:`Retention`
removes, at start and every ``storage.retention_interval_s``:

- **sources** (``source_retention_days``, default 7): a ``studies/`` folder once every
  job of that input (matched by fingerprint, the folder's name) has been final for the
  retention and the folder itself was not stored again for as long (a re-send touches
  it: :func:`radserve.store.files.store_study`); also the console's cached volumes of
  those jobs. A folder no job names is the unclaimed sweep's, never this one's. The job
  rows, results and deliveries stay; a study sent again is stored again and answered
  from the result cache (or run, if its result went too).
- **incoming** (``incoming_retention_days``, default 7): a received study folder of the
  gateway or of STOW-RS once its last instance is that old and every instance in it was
  handed over (its hand-over marker counts them all), with no association receiving into
  it (no receiving or interrupted marker, no temporary file); also the gateway's
  quarantine folders once as quiet. A late instance re-runs a study *from this folder*
  (every instance in it, radserve.gateway.completeness), so the folder must stay as long
  as late instances should join the study: one arriving after the folder went makes a
  study of the late instances alone, which (``late_policy: rerun``) supersedes the
  earlier result. Seven days is also how long the gateway remembers a handed-over study.
- **results** (``result_retention_days``, default null: kept): a job's result folders
  once it and every job answered from its result (``cached_from``) have been final
  that long and none of their deliveries waits (pending, sending, held, committing);
  its result cache entry and DICOMweb index rows are deleted first, so a re-sent study
  runs again and WADO-RS/QIDO-RS no longer list what is gone. Each job it served is
  marked (a ``result_removed`` job warning naming the policy and the date,
  :mod:`radserve.service.job_view`): its result endpoints answer 410, not 404, and
  ``GET /v1/jobs/{id}`` says so.
- **comparisons** (the same ``result_retention_days``): a job's canary/shadow folder
  ``comparisons/<job id>/`` (radserve.service.lifecycle: each comparison's figures,
  ``<version>.json``, and the trial output ``<version>/`` of a run in progress, or of one
  that failed or was cut off) once the job has been final that long and nothing in the
  folder was written for as long. Why the results' rule: it is output derived from the
  job's study, like the result and no larger, and its figures are the model trial's
  only per-study evidence (no PACS holds them): a site that keeps results keeps these,
  and a site that sets ``result_retention_days`` for "what radserve derived from a
  study" means these too. The sources' seven days would delete, by default, what the
  results' default keeps. A run writes into the folder from its start (its trial
  folder), so one in progress keeps it (``comparison_running``), and a run starting
  during the removal puts it back (its own time changed). A job answered from the
  result cache gets no comparison run and deliveries never read the folder, so neither
  keeps it.

Nothing touched in the last :data:`MIN_QUIET_S` is removed, whatever the settings. Each
pass removes at most ``storage.retention_max_per_pass`` folders of each kind. A folder is
renamed into a trash folder beside its root before it is deleted, and put back if it
changed in between (a re-send, a late instance, a new cached answer): replicas sharing
a data folder may all sweep, and only the one whose rename succeeds deletes it. Each pass
that removed something writes a ``retention.swept`` audit record (counts and bytes, no
identifiers) and every pass one log line; ``radserve_retention_removed_*`` count what went.
``radserve retention run --dry-run`` prints what a pass would remove.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import logging
import os
import shutil
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from radserve.audit import AuditEvent
from radserve.audit.events import Action
from radserve.config import StorageSettings
from radserve.gateway.completeness import HANDOVER_MARKER, INTERRUPTED_MARKER, RECEIVING_PREFIX
from radserve.gateway.dicomweb.stow import STOW_DIR
from radserve.gateway.storage import (
    INCOMING_DIR,
    INSTANCE_SUFFIX,
    PARTIAL_SUFFIX,
    QUARANTINE_DIR,
)
from radserve.service.failover import COMPARISONS_DIR
from radserve.service.job_view import result_removed_warning
from radserve.service.periodic_sweep import PeriodicSweep
from radserve.store import JobRecord, Store
from radserve.store.files import STUDIES_DIR
from radserve.store.retention_queries import (
    JobAge,
    forget_results,
    jobs_by_id,
    jobs_of_results,
    jobs_of_studies,
    jobs_with_unsent,
    record_result_removed,
)

logger = logging.getLogger(__name__)

AUDIT_ACTION = Action.RETENTION_SWEPT
SOURCES, INCOMING, RESULTS, COMPARISONS = "sources", "incoming", "results", "comparisons"
KINDS = (SOURCES, INCOMING, RESULTS, COMPARISONS)
# the storage setting (storage.<name>, days) that decides each kind
SETTING_OF = {
    SOURCES: "source_retention_days",
    INCOMING: "incoming_retention_days",
    RESULTS: "result_retention_days",
    COMPARISONS: "result_retention_days",
}
# never anything touched this recently, whatever the settings: a submission between its
# store and its job row (radserve.service.unclaimed.GRACE_S), a hand-over in progress
MIN_QUIET_S = 600.0
TRASH_DIR = ".retention-trash"
STALE_TRASH_S = 3600.0  # a trash entry this old was left by a pass that stopped half-way
# where the other parts of the data folder keep what this removes (their modules own the
# names: radserve.gateway.config puts the SCP's folder at data_dir/gateway,
# radserve.service.intake.RESULTS_DIR, radserve.console.volume the console's volumes;
# the comparison runs' COMPARISONS_DIR is imported from radserve.service.failover)
GATEWAY_DIR = "gateway"
RESULTS_DIR = "results"
VOLUMES_DIR = ("console", "volumes")
_DAY_S = 86_400.0

# why an old enough folder was kept (the keys of RetentionPass.kept)
KEPT_UNFINISHED = "unfinished_job"  # a job of it is not final
KEPT_RECENT = "recent_job"  # a job of it became final within the retention
KEPT_NO_JOB = "no_job"  # no job names it (the unclaimed sweep's, or not radserve's)
KEPT_UNSENT = "unsent_delivery"  # a delivery of its result still waits
KEPT_NOT_HANDED = "not_handed_over"  # received instances not handed over yet
KEPT_RECEIVING = "receiving"  # an association writes into it, or was cut off
KEPT_CHANGED = "changed"  # changed while it was being removed: put back
KEPT_COMPARING = "comparison_running"  # a comparison run wrote into it within the retention


@dataclass
class Tally:
    folders: int = 0
    bytes: int = 0

    def add(self, size: int) -> None:
        self.folders += 1
        self.bytes += size


@dataclass
class RetentionPass:
    """What one pass removed (or, dry, would remove) and why it kept what it kept."""

    dry_run: bool
    removed: dict[str, Tally] = field(default_factory=lambda: {k: Tally() for k in KINDS})
    kept: Counter[str] = field(default_factory=Counter)
    console_volumes: int = 0  # cached console volumes of removed sources (bytes in sources)
    more: bool = False  # stopped at retention_max_per_pass: the next pass goes on
    seconds: float = 0.0

    @property
    def total(self) -> int:
        return sum(t.folders for t in self.removed.values())

    def payload(self) -> dict[str, Any]:
        """Counts and sizes only: no path, UID or fingerprint (an audit record, a log
        line and the command's output carry it)."""
        return {
            "dry_run": self.dry_run,
            "removed": {k: dataclasses.asdict(t) for k, t in self.removed.items()},
            "console_volumes": self.console_volumes,
            "kept": dict(sorted(self.kept.items())),
            "more": self.more,
        }

    def summary(self) -> str:
        verb = "would remove" if self.dry_run else "removed"
        parts = [
            f"{t.folders} {kind} folder(s) ({_mib(t.bytes)})" for kind, t in self.removed.items()
        ]
        kept = ", ".join(f"{n} {why}" for why, n in sorted(self.kept.items())) or "none"
        more = "; more next pass" if self.more else ""
        return f"retention: {verb} {', '.join(parts)}; kept old enough: {kept}{more}"


def _mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"


class Retention(PeriodicSweep):
    """The retention policy of one data folder (a daemon thread; :meth:`sweep`).

    ``on_result_removed``: called with each job record marked ``result_removed`` (after
    its commit), e.g. the service's job cache's ``put``, which keeps finished records and
    would show the job as before until it is evicted."""

    what = "applying the retention policy"
    thread_name = "radserve-retention"
    log = logger

    def __init__(
        self,
        data_dir: Path,
        settings: StorageSettings,
        store: Store,
        *,
        clock: Callable[[], float] = time.time,
        on_result_removed: Callable[[JobRecord], None] | None = None,
    ) -> None:
        super().__init__(
            store, grace_s=MIN_QUIET_S, every_s=settings.retention_interval_s, clock=clock
        )
        self.data_dir = Path(data_dir)
        self.settings = settings
        self.totals = {kind: Tally() for kind in KINDS}
        self.passes = 0
        self._lock = threading.Lock()  # one pass at a time in this process
        self._cursor: dict[str, str] = {}  # where the last pass stopped looking, per kind
        self.on_result_removed = on_result_removed

    @property
    def enabled(self) -> bool:
        s = self.settings
        days = (s.source_retention_days, s.incoming_retention_days, s.result_retention_days)
        return any(d is not None for d in days)

    def start(self) -> None:
        if not self.enabled:
            logger.info("retention: off (every storage.*_retention_days is null): nothing removed")
            return
        super().start()

    @property
    def collector(self) -> Collector:
        return _RetentionCollector(self)

    # --- one pass -------------------------------------------------------------------------
    def sweep(self, *, dry_run: bool = False) -> RetentionPass:
        """One pass; what it removed (``dry_run``: what it would remove, nothing is)."""
        with self._lock:
            done = RetentionPass(dry_run=dry_run)
            started = time.monotonic()
            now = self.clock()
            try:
                if not dry_run:
                    self._empty_trash(time.time())
                self._sources(now, done)
                self._incoming(now, done)
                self._results(now, done)
                self._comparisons(now, done)
            finally:
                done.seconds = time.monotonic() - started
                self._account(done)
            return done

    def _account(self, done: RetentionPass) -> None:
        """The pass's log line, metrics and (when it removed something) audit record."""
        level = logging.INFO if done.total or done.kept or done.more else logging.DEBUG
        logger.log(level, "%s (%.1f s)", done.summary(), done.seconds)
        if done.dry_run:
            return
        self.passes += 1
        for kind, tally in done.removed.items():
            self.totals[kind].folders += tally.folders
            self.totals[kind].bytes += tally.bytes
        if not done.total:
            return
        try:
            self.store.append_audit(
                AuditEvent(action=AUDIT_ACTION, subject="data_dir", payload=done.payload())
            )
        except Exception as exc:  # the files are gone either way: say that it is unrecorded
            logger.error(
                "retention: the pass was not audited (%s): %s",
                getattr(exc, "code", type(exc).__name__),
                done.payload(),
            )

    def _cutoff(self, now: float, days: float) -> float:
        return min(now - days * _DAY_S, now - MIN_QUIET_S)

    # --- sources ----------------------------------------------------------------------
    def _sources(self, now: float, done: RetentionPass) -> None:
        days = self.settings.source_retention_days
        if days is None:
            return
        cutoff = self._cutoff(now, days)
        root = self.data_dir / STUDIES_DIR
        names = [f"{ab}/{fp}" for ab in _subfolders(root) for fp in _subfolders(root / ab)]
        candidates: list[tuple[Path, int]] = []
        for name in self._rotation(SOURCES, names, candidates, done):
            folder = root / name
            seen = _mtime_ns(folder)
            if seen is not None and seen / 1e9 < cutoff:  # not stored again since
                candidates.append((folder, seen))
        jobs = jobs_of_studies(self.store, [folder for folder, _ in candidates])
        for folder, seen in candidates:
            rows = jobs.get(folder.name, [])
            why = _blocked(rows, cutoff) if rows else KEPT_NO_JOB
            if why is not None:
                done.kept[why] += 1
                continue
            if done.removed[SOURCES].folders >= self.settings.retention_max_per_pass:
                done.more = True
                break
            size = _usage(folder)
            if not done.dry_run and not self._remove(SOURCES, folder, seen, merge=False):
                done.kept[KEPT_CHANGED] += 1
                continue
            done.removed[SOURCES].add(size)
            for row in rows:  # the console's volume of each job: image data too
                volume = self.data_dir.joinpath(*VOLUMES_DIR, f"{row.id}.nii.gz")
                size = _file_size(volume)
                if size is not None and (done.dry_run or _unlink(volume)):
                    done.removed[SOURCES].bytes += size
                    done.console_volumes += 1

    # --- incoming copies --------------------------------------------------------------
    def _incoming(self, now: float, done: RetentionPass) -> None:
        days = self.settings.incoming_retention_days
        if days is None:
            return
        cutoff = self._cutoff(now, days)
        roots = (
            (self.data_dir / GATEWAY_DIR / INCOMING_DIR, True),
            (self.data_dir / GATEWAY_DIR / QUARANTINE_DIR, False),
            (self.data_dir / STOW_DIR / INCOMING_DIR, True),
        )
        names = [f"{i}/{name}" for i, (root, _) in enumerate(roots) for name in _subfolders(root)]
        candidates: list[tuple[Path, bool]] = []
        for name in self._rotation(INCOMING, names, candidates, done):
            index, study = name.split("/", 1)
            root, handed_over = roots[int(index)]
            seen = _mtime_ns(root / study)  # an instance or marker added: newer
            if seen is not None and seen / 1e9 < cutoff:
                candidates.append((root / study, handed_over))
        for folder, handed_over in candidates:
            scan = _scan(folder)
            if scan is None or scan.newest >= cutoff:
                continue
            if scan.busy:
                done.kept[KEPT_RECEIVING] += 1
                continue
            if handed_over and scan.handed != scan.instances:
                done.kept[KEPT_NOT_HANDED] += 1
                continue
            if done.removed[INCOMING].folders >= self.settings.retention_max_per_pass:
                done.more = True
                break
            if not done.dry_run and not self._remove(INCOMING, folder, scan.own_ns, merge=True):
                done.kept[KEPT_CHANGED] += 1
                continue
            done.removed[INCOMING].add(scan.bytes)

    # --- results ----------------------------------------------------------------------
    def _results(self, now: float, done: RetentionPass) -> None:
        days = self.settings.result_retention_days
        if days is None:
            return
        cutoff = self._cutoff(now, days)
        root = self.data_dir / RESULTS_DIR
        candidates: list[tuple[Path, int, str]] = []
        for name in self._rotation(RESULTS, list(_subfolders(root)), candidates, done):
            folder = root / name
            seen = _mtime_ns(folder)
            if seen is not None and seen / 1e9 < cutoff:
                # <job id>, or <job id>.<incarnation> (a run of a job taken over)
                candidates.append((folder, seen, name.split(".", 1)[0]))
        jobs = jobs_of_results(self.store, [job_id for _, _, job_id in candidates])
        ids = [row.id for rows in jobs.values() for row in rows]
        unsent = jobs_with_unsent(self.store, ids)
        for folder, seen, job_id in candidates:
            rows = jobs.get(job_id, [])
            why = _blocked(rows, cutoff, unsent) if rows else KEPT_NO_JOB
            if why is not None:
                done.kept[why] += 1
                continue
            if done.removed[RESULTS].folders >= self.settings.retention_max_per_pass:
                done.more = True
                break
            size = _usage(folder)
            if not done.dry_run and not self._remove_result(folder, seen, job_id, cutoff, now):
                done.kept[KEPT_CHANGED] += 1
                continue
            done.removed[RESULTS].add(size)

    def _remove_result(
        self, folder: Path, seen: int, job_id: str, cutoff: float, now: float
    ) -> bool:
        """Forget the result's index rows, then remove its folder and mark the jobs it
        served as having had it removed, unless a job was answered from it meanwhile
        (then it is put back, unmarked; its cache entry stays gone, so the next copy of
        the study runs again). The mark is written before the folder is deleted: a mark
        that cannot be written (the database away) keeps the folder for a later pass.
        ``on_result_removed`` hears of the marked records once the folder is gone."""
        marked: list[JobRecord] = []

        def forget_then_check() -> bool:
            rows = jobs_of_results(self.store, [job_id]).get(job_id, [])
            forget_results(self.store, [row.id for row in rows] or [job_id])
            rows = jobs_of_results(self.store, [job_id]).get(job_id, [])
            unsent = jobs_with_unsent(self.store, [row.id for row in rows])
            if not rows or _blocked(rows, cutoff, unsent) is not None:
                return False
            on = dt.datetime.fromtimestamp(now, dt.UTC).date()
            warning = result_removed_warning(on)
            marked.extend(record_result_removed(self.store, rows, folder.name, warning))
            return True

        if not self._remove(RESULTS, folder, seen, merge=True, check=forget_then_check):
            return False
        if self.on_result_removed is not None:
            for record in marked:
                self.on_result_removed(record)
        return True

    # --- comparison runs --------------------------------------------------------------
    def _comparisons(self, now: float, done: RetentionPass) -> None:
        days = self.settings.result_retention_days
        if days is None:
            return
        cutoff = self._cutoff(now, days)
        root = self.data_dir / COMPARISONS_DIR
        candidates: list[tuple[Path, int]] = []
        for name in self._rotation(COMPARISONS, list(_subfolders(root)), candidates, done):
            folder = root / name  # <job id>
            seen = _mtime_ns(folder)  # a run starting, or a comparison's figures: newer
            if seen is not None and seen / 1e9 < cutoff:
                candidates.append((folder, seen))
        jobs = jobs_by_id(self.store, [folder.name for folder, _ in candidates])
        for folder, seen in candidates:
            row = jobs.get(folder.name)
            why = _blocked([row], cutoff) if row is not None else KEPT_NO_JOB
            if why is not None:
                done.kept[why] += 1
                continue
            tree = _tree(folder)
            if tree is None:  # gone meanwhile (another replica's pass)
                continue
            if tree.newest >= cutoff:  # a run writes its trial output into a subfolder
                done.kept[KEPT_COMPARING] += 1
                continue
            if done.removed[COMPARISONS].folders >= self.settings.retention_max_per_pass:
                done.more = True
                break
            # a run starting meanwhile adds its trial folder (the folder's own time): kept
            if not done.dry_run and not self._remove(COMPARISONS, folder, seen, merge=True):
                done.kept[KEPT_CHANGED] += 1
                continue
            done.removed[COMPARISONS].add(tree.bytes)

    # --- removing ---------------------------------------------------------------------
    def _remove(
        self,
        kind: str,
        folder: Path,
        seen: int,
        *,
        merge: bool,
        check: Callable[[], bool] | None = None,
    ) -> bool:
        """Rename ``folder`` into the trash beside its root and delete it there; False
        (and the folder put back) when it changed since ``seen`` (its own modification
        time: an entry added, a re-send's touch) or ``check`` says it is in use now. A
        folder gone already (another replica's pass) is not counted. ``merge``: what is
        put back joins a folder made again meanwhile under its name (a late instance),
        instead of being dropped as the same bytes (a content-addressed study)."""
        trash_root = folder.parent.parent / TRASH_DIR
        if kind == SOURCES:  # studies/<ab>/<fp>: beside studies/
            trash_root = folder.parent.parent.parent / TRASH_DIR
        # named by when it went there (wall time, not the policy's clock): a pass that
        # stops half-way leaves it for a later one (_empty_trash)
        trash = trash_root / f"{int(time.time())}-{uuid.uuid4().hex[:8]}-{kind}"
        try:
            trash_root.mkdir(exist_ok=True)
            folder.rename(trash)
        except FileNotFoundError:
            return False
        except OSError as exc:  # another file system (EXDEV), no permission: kept
            logger.warning("retention: a %s folder cannot be removed (%s)", kind, exc.strerror)
            return False
        try:
            keep = _mtime_ns(trash) != seen or (check is not None and not check())
        except BaseException:
            _put_back(trash, folder, merge=merge)
            raise
        if keep:
            _put_back(trash, folder, merge=merge)
            return False
        shutil.rmtree(trash, ignore_errors=True)
        return True

    def _empty_trash(self, now: float) -> None:
        """Delete what a pass that stopped half-way left in the trash (its name says
        when it was put there; a recent entry may be another replica's, being decided)."""
        for trash_root in (
            self.data_dir / TRASH_DIR,
            self.data_dir / GATEWAY_DIR / TRASH_DIR,
            self.data_dir / STOW_DIR / TRASH_DIR,
        ):
            for name in _subfolders(trash_root, dot_names=True):
                stamp = name.split("-", 1)[0]  # another host's clock may be ahead
                if not stamp.isdigit() or abs(now - int(stamp)) > STALE_TRASH_S:
                    shutil.rmtree(trash_root / name, ignore_errors=True)

    def _rotation(
        self, kind: str, names: list[str], candidates: list[Any], done: RetentionPass
    ) -> Iterator[str]:
        """``names`` in order from after where the last pass of ``kind`` stopped looking,
        round again, until ``candidates`` (the caller's list of folders old enough to
        look into) holds four times the per-pass bound: what a pass reads of the store
        and of the folders stays bounded, and folders kept for a reason (an unfinished
        job) do not hold the others back pass after pass."""
        names.sort()
        cursor = self._cursor.get(kind, "")
        start = next((i for i, n in enumerate(names) if n > cursor), 0)
        limit = 4 * self.settings.retention_max_per_pass
        for name in names[start:] + names[:start]:
            if len(candidates) >= limit:
                done.more = True
                return
            self._cursor[kind] = name
            yield name


def _blocked(rows: Sequence[JobAge], cutoff: float, unsent: set[str] | None = None) -> str | None:
    """Why the jobs ``rows`` still need their folder, or None."""
    if any(not row.final for row in rows):
        return KEPT_UNFINISHED
    if any(row.ended is None or _epoch(row.ended) >= cutoff for row in rows):
        return KEPT_RECENT
    if unsent and any(row.id in unsent for row in rows):
        return KEPT_UNSENT
    return None


def _epoch(when: dt.datetime) -> float:
    if when.tzinfo is None:  # stored as UTC (radserve.store.db.UtcDateTime)
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()


@dataclass(frozen=True)
class _Scan:
    """One received study folder, as retention sees it."""

    bytes: int
    own_ns: int  # the folder's own modification time (an entry added or removed)
    newest: float  # the newest modification time of the folder and its entries (s)
    instances: int  # instance files (as radserve.gateway.storage.study_instances counts)
    handed: int | None  # instances its hand-over marker counts; None: none handed over
    busy: bool  # an association receives into it, was cut off, or a file is half-written


def _scan(folder: Path) -> _Scan | None:
    try:
        own = folder.stat()
        size, newest, instances, busy = 0, own.st_mtime, 0, False
        with os.scandir(folder) as entries:
            for entry in entries:
                try:
                    info = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                newest = max(newest, info.st_mtime)
                size += info.st_size if entry.is_file(follow_symlinks=False) else 0
                name = entry.name
                if (
                    name.startswith(RECEIVING_PREFIX)
                    or name == INTERRUPTED_MARKER
                    or name.endswith(PARTIAL_SUFFIX)
                    or entry.is_dir(follow_symlinks=False)
                ):
                    busy = True
                elif name.endswith(INSTANCE_SUFFIX) and not name.startswith("."):
                    instances += 1
    except OSError:
        return None
    return _Scan(size, own.st_mtime_ns, newest, instances, _handed(folder), busy)


def _handed(folder: Path) -> int | None:
    try:
        data = json.loads((folder / HANDOVER_MARKER).read_text())
        return int(data["instances"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _put_back(trash: Path, folder: Path, *, merge: bool) -> None:
    try:
        trash.rename(folder)
        return
    except OSError:
        pass
    if merge and folder.is_dir():  # made again meanwhile: what was there joins it
        for entry in trash.iterdir():
            target = folder / entry.name
            if not target.exists():
                with contextlib.suppress(OSError):
                    entry.rename(target)
        logger.warning("retention: a folder changed while it was removed; kept")
    shutil.rmtree(trash, ignore_errors=True)  # a study stored again meanwhile: same bytes


def _subfolders(root: Path, *, dot_names: bool = False) -> Iterator[str]:
    """The names of the folders in ``root``, sorted; those with a dot name only with
    ``dot_names`` (a sweep's trash is no study, nor result)."""
    try:
        with os.scandir(root) as entries:
            names = [
                e.name
                for e in entries
                if (dot_names or not e.name.startswith(".")) and e.is_dir(follow_symlinks=False)
            ]
    except OSError:
        return
    yield from sorted(names)


@dataclass(frozen=True)
class _Tree:
    bytes: int  # of the files under the folder (links not followed)
    newest: float  # the newest modification time of the folder and all under it (s)


def _tree(folder: Path) -> _Tree | None:
    """Size and newest modification time of ``folder`` and everything under it (a run
    writing files in a subfolder changes no time of the folder itself); None if gone."""
    try:
        newest = folder.stat().st_mtime
    except OSError:
        return None
    size = 0
    for parent, dirs, files in os.walk(folder):
        for name, is_file in (*((d, False) for d in dirs), *((f, True) for f in files)):
            with contextlib.suppress(OSError):
                info = os.lstat(os.path.join(parent, name))
                newest = max(newest, info.st_mtime)
                size += info.st_size if is_file else 0
    return _Tree(size, newest)


def _usage(folder: Path) -> int:
    """Bytes of the files under ``folder`` (links not followed)."""
    total = 0
    for parent, _dirs, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(parent, name)).st_size
    return total


def _mtime_ns(path: Path) -> int | None:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return None


def _file_size(path: Path) -> int | None:
    try:
        return path.lstat().st_size
    except OSError:
        return None


def _unlink(path: Path) -> bool:
    try:
        path.unlink()
    except OSError:
        return False
    return True


class _RetentionCollector(Collector):
    """What retention removed since the server started, per kind."""

    def __init__(self, retention: Retention) -> None:
        self._retention = retention

    def collect(self) -> Iterator[Any]:
        folders = CounterMetricFamily(
            "radserve_retention_removed_folders",
            "Folders removed by the retention policy since start (sources: studies/, "
            "incoming: the gateway's and STOW-RS's received copies, results, comparisons: "
            "the canary/shadow comparison runs' folders)",
            labels=["kind"],
        )
        size = CounterMetricFamily(
            "radserve_retention_removed_bytes",
            "Bytes removed by the retention policy since start (sources include the "
            "console's cached volumes of their jobs)",
            labels=["kind"],
        )
        for kind, tally in self._retention.totals.items():
            folders.add_metric([kind], tally.folders)
            size.add_metric([kind], tally.bytes)
        passes = CounterMetricFamily(
            "radserve_retention_passes", "Retention passes run since start"
        )
        passes.add_metric([], self._retention.passes)
        yield folders
        yield size
        yield passes


__all__ = [
    "AUDIT_ACTION",
    "COMPARISONS",
    "KINDS",
    "MIN_QUIET_S",
    "SETTING_OF",
    "TRASH_DIR",
    "Retention",
    "RetentionPass",
    "Tally",
]

"""When is a received study complete? When nothing new has arrived for ``quiet_s`` seconds.

DICOM has no "end of study" message, and association release is not one: a PACS may
send one study over several associations (Orthanc pushed a 10-instance study as 1 + 9).
So a study is handed to intake once it has been quiet for ``quiet_s`` (MONAI's gateway
waits 5 s, Orthanc's StableAge is 60 s). Instances arriving after the hand-over are late:
per :class:`LatePolicy` the study is handed over again as a re-run, or flagged.

The tracker reads an injectable monotonic clock and does nothing on its own: a
:class:`CompletenessMonitor` thread (or a test) calls :meth:`StudyTracker.poll`. After a
successful hand-over it writes a small marker into the study folder, so a restart can
tell finished studies from those still waiting (:meth:`StudyTracker.recover`).

A study whose association was cut off — aborted, or the server crashed while receiving
it (the SCP keeps a ``.radserve-receiving-*`` marker in the study folder for the length
of each association) — is known to be incomplete. It waits ``interrupted_quiet_s``
(default 5 min) instead of ``quiet_s`` after its last instance, so a sender that resumes
or re-sends after a restart completes it; a later association that delivers instances
to it and is released normally ends the interruption. After a restart the wait starts
again from the restart.

While an association that delivered instances to a study is still open, the study is not
quiet however long the gap between its instances: the sender has not said it is done
(a modality sending slices as they are reconstructed, or a loaded server whose receive
threads stall for longer than ``quiet_s``, would otherwise have a partial study handed
over and then re-run). Such a study, too, waits at most ``interrupted_quiet_s`` after its
last instance; the quiet period proper starts when the association is released. Handed
over at the end of that wait with the association still open (a sender that sent 3
slices and then only C-ECHOs, or half a data set and then silence), the study is marked
``interrupted`` as a cut-off one is (its job carries ``study_maybe_incomplete``): the
sender never said it was done. Before, it was handed over unmarked, and an abort after
the hand-over changed nothing (the entry was gone); now the hand-over itself marks it, so
a later abort, release or time-out of that association has nothing to add.

An instance a door refused with a failure status (a C-STORE, a STOW-RS part) whose Study
Instance UID was readable is noted in that study's folder (:func:`note_refused`, the
marker :data:`REFUSED_MARKER`), so the study's hand-over says how many of its instances
were refused and why (:attr:`CompletedStudy.refused`; its job carries
``instances_refused``), also after a restart. The marker is bounded: refusals are counted
per reason, and only the first :data:`REFUSED_NAMED` refused instances are named (by SOP
Instance UID), so that one sent again is counted once and one stored later not at all.
Until 2026-12-07 a refused instance was answered to its sender only: the job of the rest
of the study said nothing of it, and a radiologist read a result computed on part of
what the modality sent.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from radserve import durable
from radserve.gateway.storage import INSTANCE_SUFFIX, study_instances
from radserve.ingest import rules
from radserve.loop_failures import LoopFailures

logger = logging.getLogger(__name__)

HANDOVER_MARKER = ".radserve-handover.json"
RECEIVING_PREFIX = ".radserve-receiving-"  # + association id: an association is open
INTERRUPTED_MARKER = ".radserve-interrupted"  # an association was cut off mid-study
REFUSED_MARKER = ".radserve-refused.json"  # instances of the study a door refused
# refused instances a refused marker names by SOP Instance UID (one sent again is counted
# once, one stored later not at all); refusals past them are counted by reason only, so
# a sender refused a million times leaves a marker of a few hundred bytes
REFUSED_NAMED = 16
# reasons (error code, status) a marker counts apart; radserve answers a handful, and
# past this many a refusal is counted as "other"
REFUSED_REASONS = 16
_MAX_REFUSED_BYTES = 16 * 1024  # a marker is under 3 KB; a larger one is damaged
_REFUSED_VERSION = 1
_CODE = re.compile(r"[a-z][a-z0-9_]{0,63}")
_MAX_RETRY_S = 300.0
# a hand-over refused because the database did not answer is tried again at least this
# often: the study (acknowledged already) gets its job soon after the database returns,
# not up to _MAX_RETRY_S later (each try waits server.store_wait_s for it)
_OUTAGE_RETRY_S = 15.0


def receiving_token(pid: int | None = None) -> str:
    """The suffix of one association's receiving marker; with ``pid``, the prefix every
    marker of that process starts with (a parent tells a dead receiver's markers)."""
    if pid is not None:
        return f"{pid}-"
    return f"{os.getpid()}-{uuid.uuid4().hex}"


class LatePolicy(StrEnum):
    """What instances arriving after a study's hand-over cause."""

    RERUN = "rerun"  # hand the whole study over again (kind RERUN)
    FLAG = "flag"  # hand it over with kind LATE_FLAGGED: mark the result, do not re-run


class CompletionKind(StrEnum):
    COMPLETE = "complete"
    RERUN = "rerun"
    LATE_FLAGGED = "late_flagged"


@dataclass(frozen=True)
class CompletedStudy:
    """What intake receives: a study folder that has been quiet for the quiet period."""

    study_instance_uid: str
    folder: Path
    kind: CompletionKind
    generation: int  # 1 at the first hand-over, then 2, 3 ... for late instances
    instances: tuple[Path, ...]  # every instance now in the folder
    new_instances: int  # arrived since the previous hand-over
    calling_ae_titles: tuple[str, ...]
    # handed over while still cut off (the sender did not resume within the wait), or
    # while an association that delivered instances to it was still open
    interrupted: bool = False
    # instances of the study a door refused that are not in ``instances`` (None: none)
    refused: Refused | None = None


StudyCallback = Callable[[CompletedStudy], None]


class Arrivals(Protocol):
    """What the SCP's handlers report: :class:`StudyTracker` itself, or in a receiving
    process the relay to the tracker of the parent (:mod:`radserve.gateway.receivers`)."""

    def arrived(self, study_uid: str, folder: Path, **details: Any) -> None:
        """``details``: ``calling_ae``, ``new``, ``association`` (:meth:`StudyTracker.arrived`)."""

    def interrupted(self, study_uid: str, association: object | None = None) -> None: ...

    def resumed(self, study_uid: str, association: object | None = None) -> None: ...

    def touch(self, study_uid: str) -> None: ...


@dataclass
class _Open:
    folder: Path
    last_arrival: float
    last_new: float  # the last new instance (or the opening): what bounds other activity
    new_instances: int = 0
    calling_ae_titles: set[str] = field(default_factory=set)
    failures: int = 0
    retry_at: float = 0.0
    interrupted: bool = False
    associations: set[object] = field(default_factory=set)  # still open, delivering it


@dataclass
class _Done:
    generation: int
    instances: int
    handed_at: float


# activity without a new instance keeps a study open at most this many quiet periods
# (and at least MIN_EXTENSION_S) after its last new instance (:meth:`StudyTracker._extend`)
EXTENSION_QUIETS = 6
MIN_EXTENSION_S = 60.0


class StudyTracker:
    """Arrivals in, completed studies out (through ``on_complete``). Thread-safe."""

    def __init__(
        self,
        on_complete: StudyCallback,
        *,
        quiet_s: float = 10.0,
        interrupted_quiet_s: float | None = None,
        late_policy: LatePolicy = LatePolicy.RERUN,
        clock: Callable[[], float] = time.monotonic,
        forget_after_s: float = 7 * 24 * 3600.0,
    ) -> None:
        self._on_complete = on_complete
        self.quiet_s = quiet_s
        self.interrupted_quiet_s = max(quiet_s, interrupted_quiet_s or quiet_s)
        self.late_policy = late_policy
        # how long activity without a new instance may keep a study open (:meth:`_extend`)
        self.max_extension_s = max(MIN_EXTENSION_S, EXTENSION_QUIETS * quiet_s)
        self._clock = clock
        self._forget_after_s = forget_after_s
        self._lock = threading.Lock()
        self._open: dict[str, _Open] = {}
        self._done: dict[str, _Done] = {}
        self._poll_lock = threading.Lock()
        # hand-overs refused while the database is away: logged once, then rarely
        self._outages = LoopFailures(logger, "handing received studies to intake")

    def arrived(
        self,
        study_uid: str,
        folder: Path,
        *,
        calling_ae: str = "",
        new: bool = True,
        association: object | None = None,
    ) -> None:
        """An instance of ``study_uid`` is on disk in ``folder``. ``new=False`` for a
        duplicate: it keeps an open study open but does not reopen a finished one.
        ``association``: a key of the open association that delivered it; the study is
        not quiet until that association ends (:meth:`resumed`, :meth:`interrupted`)."""
        now = self._clock()
        with self._lock:
            entry = self._open.get(study_uid)
            if entry is None:
                if not new:
                    return
                entry = self._open[study_uid] = _Open(folder, last_arrival=now, last_new=now)
                if study_uid in self._done:
                    logger.info("late instance for handed-over study %s", study_uid)
            entry.last_arrival = now  # a re-sent instance too: a sender resuming a study
            if new:
                entry.last_new = now
            entry.new_instances += int(new)
            if association is not None:
                entry.associations.add(association)
            if calling_ae:
                entry.calling_ae_titles.add(calling_ae)

    def interrupted(self, study_uid: str, association: object | None = None) -> None:
        """The association delivering ``study_uid`` was cut off: wait longer for it."""
        with self._lock:
            entry = self._open.get(study_uid)
            if entry is not None:
                entry.associations.discard(association)
            if entry is not None and not entry.interrupted:
                entry.interrupted = True
                logger.warning(
                    "study %s: its association was cut off; waiting up to %.0f s for the "
                    "sender to resume",
                    study_uid,
                    self.interrupted_quiet_s,
                )

    def resumed(self, study_uid: str, association: object | None = None) -> None:
        """An association that delivered instances to ``study_uid`` ended normally: its
        quiet period runs from now on (or from its last instance, if later)."""
        now = self._clock()
        with self._lock:
            entry = self._open.get(study_uid)
            if entry is not None and association in entry.associations:
                entry.associations.discard(association)
                entry.last_arrival = max(entry.last_arrival, now)
            if entry is not None and entry.interrupted:
                entry.interrupted = False
                _remove(entry.folder / INTERRUPTED_MARKER)
                logger.info("study %s: the sender resumed; usual quiet period", study_uid)

    def touch(self, study_uid: str) -> None:
        """Activity that is not an instance for intake (a quarantined object): keeps an
        open study from being declared complete, opens nothing."""
        now = self._clock()
        with self._lock:
            entry = self._open.get(study_uid)
            if entry is not None:
                self._extend(entry, now)

    def _extend(self, entry: _Open, now: float) -> None:
        """Activity that is no instance for intake (a refusal, a quarantined object)
        keeps the study open from ``now``, but never past :attr:`max_extension_s` after
        its last new instance: a sender that retried a refused instance more often than
        ``quiet_s`` kept the study open for good, and its job never started. (A re-sent
        instance is not bounded so: a sender resuming a cut-off study re-sends it from
        its start, on an association the study waits for.)"""
        entry.last_arrival = max(
            entry.last_arrival, min(now, entry.last_new + self.max_extension_s)
        )

    def pending(self) -> list[str]:
        """Study UIDs still waiting for their quiet period."""
        with self._lock:
            return sorted(self._open)

    def next_due_in(self) -> float | None:
        """Seconds until the next study may complete (None: no open study)."""
        now = self._clock()
        with self._lock:
            if not self._open:
                return None
            due = min(max(e.last_arrival + self._quiet(e), e.retry_at) for e in self._open.values())
        return max(0.0, due - now)

    def poll(self) -> list[CompletedStudy]:
        """Hand over every study quiet for ``quiet_s``; returns those handed over.

        A callback that raises keeps the study open and retries it later (the files stay
        on disk, so nothing is lost while intake is down)."""
        with self._poll_lock:
            now = self._clock()
            with self._lock:
                ready = [
                    (uid, self._open.pop(uid))
                    for uid, entry in list(self._open.items())
                    if now - entry.last_arrival >= self._quiet(entry) and now >= entry.retry_at
                ]
                self._forget(now)
            handed: list[CompletedStudy] = []
            for uid, entry in ready:
                study = self._completed(uid, entry)
                try:
                    self._on_complete(study)
                except Exception as exc:
                    outage = getattr(exc, "outage", False)
                    if outage:  # the database away: every study fails
                        self._outages.failed(exc)
                    else:
                        logger.exception("intake failed for study %s; will retry", uid)
                    self._reopen(uid, entry, now, cap_s=_OUTAGE_RETRY_S if outage else _MAX_RETRY_S)
                    continue
                self._outages.succeeded()
                _write_marker(entry.folder, study.generation, len(study.instances))
                _remove(entry.folder / INTERRUPTED_MARKER)
                with self._lock:
                    self._done[uid] = _Done(study.generation, len(study.instances), now)
                logger.info(
                    "study %s %s: %d instances (%d new), generation %d",
                    uid,
                    study.kind.value,
                    len(study.instances),
                    study.new_instances,
                    study.generation,
                )
                handed.append(study)
            return handed

    def recover(self, incoming: Path, *, others_receiving: bool = False) -> int:
        """After a restart: every study folder with instances not yet handed over starts
        its quiet period now. Returns how many studies were reopened.

        ``others_receiving``: a receiving process died while others still receive (see
        :mod:`radserve.gateway.receivers`): their receiving markers are left alone, only
        folders not open already are reopened (instances whose report the dead process
        never sent)."""
        reopened = 0
        now = self._clock()
        for folder in sorted(p for p in Path(incoming).iterdir() if p.is_dir()):
            count = len(study_instances(folder))
            marker = _read_marker(folder)
            if others_receiving:
                cut_off = (folder / INTERRUPTED_MARKER).exists()
            else:
                cut_off = _cut_off(folder)  # the server stopped while receiving it
            opened = False
            with self._lock:
                # generation 0: nothing handed over (a folder a refusal made: note_refused)
                if marker is not None and marker[0] > 0 and folder.name not in self._done:
                    self._done[folder.name] = _Done(marker[0], marker[1], now)
                if count > (marker[1] if marker else 0) and folder.name not in self._open:
                    new = count - (marker[1] if marker else 0)
                    self._open[folder.name] = _Open(
                        folder, now, now, new_instances=new, interrupted=cut_off
                    )
                    reopened += 1
                    opened = True
            if cut_off and (opened or not others_receiving):
                logger.warning(
                    "study %s was being received when the server stopped; waiting up to "
                    "%.0f s for the sender to resume",
                    folder.name,
                    self.interrupted_quiet_s,
                )
        if reopened:
            logger.info("%d received studies were not handed over yet; waiting again", reopened)
        return reopened

    def _quiet(self, entry: _Open) -> float:
        """An interrupted study, or one whose association is still open, waits longer."""
        return self.interrupted_quiet_s if entry.interrupted or entry.associations else self.quiet_s

    def _completed(self, uid: str, entry: _Open) -> CompletedStudy:
        with self._lock:
            done = self._done.get(uid)
        generation = 1 if done is None else done.generation + 1
        if generation == 1:
            kind = CompletionKind.COMPLETE
        elif self.late_policy is LatePolicy.RERUN:
            kind = CompletionKind.RERUN
        else:
            kind = CompletionKind.LATE_FLAGGED
        still_open = len(entry.associations)
        if still_open:
            logger.warning(
                "study %s: handed over after %.0f s without a new instance while %d "
                "association(s) that delivered it are still open: it may be incomplete",
                uid,
                self.interrupted_quiet_s,
                still_open,
            )
        instances = tuple(study_instances(entry.folder))
        return CompletedStudy(
            study_instance_uid=uid,
            folder=entry.folder,
            kind=kind,
            generation=generation,
            instances=instances,
            new_instances=entry.new_instances,
            calling_ae_titles=tuple(sorted(entry.calling_ae_titles)),
            interrupted=entry.interrupted or bool(still_open),
            refused=refused_missing(entry.folder, instances),
        )

    def _reopen(self, uid: str, entry: _Open, now: float, *, cap_s: float) -> None:
        entry.failures += 1
        entry.retry_at = now + min(self.quiet_s * 2**entry.failures, max(cap_s, self.quiet_s))
        with self._lock:
            newer = self._open.get(uid)
            if newer is not None:  # arrivals during the failed hand-over
                entry.last_arrival = max(entry.last_arrival, newer.last_arrival)
                entry.last_new = max(entry.last_new, newer.last_new)
                entry.new_instances += newer.new_instances
                entry.calling_ae_titles |= newer.calling_ae_titles
                entry.interrupted = entry.interrupted or newer.interrupted
                entry.associations |= newer.associations
            self._open[uid] = entry

    def _forget(self, now: float) -> None:
        """Drop old finished studies from memory (their markers stay on disk)."""
        stale = [u for u, d in self._done.items() if now - d.handed_at > self._forget_after_s]
        for uid in stale:
            del self._done[uid]


class CompletenessMonitor:
    """A daemon thread that polls a tracker until stopped."""

    def __init__(self, tracker: StudyTracker, *, max_interval_s: float = 1.0) -> None:
        self.tracker = tracker
        self._interval = min(max_interval_s, max(tracker.quiet_s / 4, 0.05))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="radserve-completeness", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.tracker.poll()
            except Exception:  # a bug here must not stop completeness for good
                logger.exception("completeness poll failed")
            due = self.tracker.next_due_in()
            self._stop.wait(self._interval if due is None else min(self._interval, due + 0.01))


def _write_marker(folder: Path, generation: int, instances: int) -> None:
    """Atomically record the hand-over (best effort: a lost marker means a re-run)."""
    try:
        durable.write_json(
            folder / HANDOVER_MARKER, {"generation": generation, "instances": instances}
        )
    except OSError as exc:
        logger.warning("cannot write the hand-over marker of %s: %s", folder.name, exc)


def _cut_off(folder: Path) -> bool:
    """Whether an association was receiving into ``folder`` when the server stopped
    (its ``.radserve-receiving-*`` marker remains) or had been cut off before; the
    receiving markers become one interrupted marker."""
    receiving = list(folder.glob(f"{RECEIVING_PREFIX}*"))
    if receiving:
        try:
            (folder / INTERRUPTED_MARKER).touch()
        except OSError as exc:
            logger.warning("cannot mark %s as interrupted: %s", folder.name, exc)
        for path in receiving:
            _remove(path)
    return bool(receiving) or (folder / INTERRUPTED_MARKER).exists()


def _remove(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError as exc:
        logger.warning("cannot remove %s: %s", path.name, exc)


def _read_marker(folder: Path) -> tuple[int, int] | None:
    try:
        data = json.loads((folder / HANDOVER_MARKER).read_text())
        return int(data["generation"]), int(data["instances"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


# --- instances a door refused ------------------------------------------------------------


@dataclass(frozen=True, order=True)
class RefusalReason:
    """Why a door refused an instance: radserve's error code ("" when it has none) and
    the status it answered (a C-STORE's, or a STOW-RS Failure Reason). Never a value of
    the instance: the reason goes into the job's warning."""

    code: str
    status: int

    def __str__(self) -> str:
        return f"{self.code} (0x{self.status:04X})" if self.code else f"status 0x{self.status:04X}"


_OTHER = RefusalReason("other", 0)  # the reasons past REFUSED_REASONS


@dataclass(frozen=True)
class Refused:
    """The instances of a study that a door refused and that its folder does not hold
    at the hand-over, counted per reason. ``approximate``: some refusals were past the
    named ones (or named no SOP Instance UID) and are counted each time, so an instance
    refused twice, or stored after its refusal, may be counted (the count is at most)."""

    counts: tuple[tuple[RefusalReason, int], ...]
    approximate: bool = False

    @classmethod
    def of(cls, reasons: Iterable[RefusalReason]) -> Refused | None:
        """Instances refused for ``reasons`` (one each), known exactly (a STOW-RS
        request's own refused parts); None when there are none."""
        counts = Counter(reasons)
        return cls(tuple(sorted(counts.items(), key=lambda item: str(item[0])))) if counts else None

    @property
    def instances(self) -> int:
        return sum(count for _, count in self.counts)


@dataclass
class _RefusedRecord:
    """The marker's content: the named refused instances, and the counts past them."""

    named: dict[str, RefusalReason] = field(default_factory=dict)
    more: dict[RefusalReason, int] = field(default_factory=dict)

    def add(self, folder: Path, sop_uid: str | None, reason: RefusalReason) -> bool:
        """Count one refusal; False when the marker need not change (a named instance
        refused again for the same reason: a sender's retry)."""
        if sop_uid is not None and sop_uid in self.named:
            if self.named[sop_uid] == reason:
                return False
            self.named[sop_uid] = reason  # counted once, for its latest reason
            return True
        if sop_uid is not None and len(self.named) >= REFUSED_NAMED:
            # a named instance stored since is no longer missing: its place is free
            for uid in [u for u in self.named if (folder / f"{u}{INSTANCE_SUFFIX}").exists()]:
                del self.named[uid]
        if sop_uid is not None and len(self.named) < REFUSED_NAMED:
            self.named[sop_uid] = reason
            return True
        key = reason if reason in self.more or len(self.more) < REFUSED_REASONS else _OTHER
        self.more[key] = self.more.get(key, 0) + 1
        return True

    def to_json(self) -> dict[str, Any]:
        return {
            "version": _REFUSED_VERSION,
            "named": [[uid, r.code, r.status] for uid, r in self.named.items()],
            "more": [[r.code, r.status, n] for r, n in sorted(self.more.items())],
        }

    @classmethod
    def from_json(cls, data: object) -> _RefusedRecord:
        """Raises ValueError naming what is wrong (never a value: a damaged or planted
        file may hold anything, and what is read goes into a job's warning)."""
        if not isinstance(data, dict) or data.get("version") != _REFUSED_VERSION:
            raise ValueError(f"not a version {_REFUSED_VERSION} refusal record")
        named, more = data.get("named"), data.get("more")
        if not isinstance(named, list) or not isinstance(more, list):
            raise ValueError("named or more is not a list")
        if len(named) > REFUSED_NAMED or len(more) > REFUSED_REASONS + 1:
            raise ValueError("more entries than a record keeps")
        record = cls()
        for item in named:
            if not isinstance(item, list) or len(item) != 3:
                raise ValueError("a named entry is not [uid, code, status]")
            if rules.uid_problem(item[0], "SOP Instance UID") is not None:
                raise ValueError("a named entry's SOP Instance UID is not a UID")
            record.named[str(item[0])] = _reason(item[1], item[2])
        for item in more:
            if not isinstance(item, list) or len(item) != 3:
                raise ValueError("a count is not [code, status, count]")
            count = item[2]
            if type(count) is not int or not 0 < count < 2**53:
                raise ValueError("a count is not a positive integer")
            record.more[_reason(item[0], item[1])] = count
        return record


def _reason(code: object, status: object) -> RefusalReason:
    if not isinstance(code, str) or (code and _CODE.fullmatch(code) is None):
        raise ValueError("a code is not radserve's form of error code")
    if type(status) is not int or not 0 <= status <= 0xFFFF:
        raise ValueError("a status is not a 16-bit integer")
    return RefusalReason(code, status)


def note_refused(folder: Path, refusals: Iterable[tuple[str | None, RefusalReason]]) -> None:
    """Note in the study folder ``folder`` (made if need be: the first instance of a
    study may be the refused one) that instances of the study were refused: for each,
    its SOP Instance UID (checked against the UID rules; None when it was unreadable or
    broke them) and why. Called before the door answers the refusal, so a hand-over
    after it, even after a restart, counts it; one write for all ``refusals`` (a STOW-RS
    request's refused parts of one study).

    Processes and threads that refuse instances of one study at once (receiving
    processes, STOW-RS requests) take turns by a lock on the folder. A folder this
    makes has a hand-over marker of generation 0 (nothing handed over, no instance):
    a study whose every instance was refused is no job, and retention removes its
    folder as it removes a handed-over one. Best effort: a marker that cannot be
    written is logged (the refusal is still answered; the job then does not name it)."""
    try:
        if not folder.is_dir():
            folder.mkdir(parents=True, exist_ok=True)
            durable.fsync_dir(folder.parent)
        descriptor = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        logger.warning("cannot note a refused instance of study %s: %s", folder.name, exc.strerror)
        return
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        earlier = _read_refused(folder)
        record = earlier or _RefusedRecord()
        changed = [record.add(folder, sop_uid, reason) for sop_uid, reason in refusals]
        if not any(changed):
            return
        if earlier is None and not study_instances(folder):
            _mark_nothing_handed(folder)
        durable.write_json(folder / REFUSED_MARKER, record.to_json())
    except OSError as exc:
        logger.warning("cannot note a refused instance of study %s: %s", folder.name, exc.strerror)
    finally:
        os.close(descriptor)  # and with it the lock


def refused_missing(folder: Path, instances: Sequence[Path]) -> Refused | None:
    """The refused instances of the study in ``folder`` that are not among
    ``instances`` (its instance files at the hand-over), or None: none refused, or all
    of them stored since (a sender's successful resend)."""
    record = _read_refused(folder)
    if record is None:
        return None
    names = {path.name for path in instances}
    counts: Counter[RefusalReason] = Counter(
        reason for uid, reason in record.named.items() if f"{uid}{INSTANCE_SUFFIX}" not in names
    )
    counts.update(record.more)
    if not counts:
        return None
    return Refused(tuple(sorted(counts.items())), approximate=bool(record.more))


def _read_refused(folder: Path) -> _RefusedRecord | None:
    """The study's refusal record, or None: none, or one that is not a small regular
    file of the expected form (logged and ignored; the next refusal replaces it)."""
    try:
        data = durable.read_small_json(folder / REFUSED_MARKER, _MAX_REFUSED_BYTES)
        return None if data is None else _RefusedRecord.from_json(data)
    except ValueError as exc:
        logger.warning(
            "study %s: its refusal record (%s) is unusable and ignored (%s)",
            folder.name,
            REFUSED_MARKER,
            exc,
        )
        return None


def _mark_nothing_handed(folder: Path) -> None:
    """A hand-over marker of generation 0 and no instance, unless one exists (never
    replacing a real hand-over's): see :func:`note_refused`."""
    with contextlib.suppress(FileExistsError):
        descriptor = os.open(folder / HANDOVER_MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(descriptor, json.dumps({"generation": 0, "instances": 0}).encode())
            os.fsync(descriptor)
        finally:
            os.close(descriptor)

"""DICOMweb STOW-RS: instances from a ``multipart/related`` request -> durable studies
-> jobs, and the Store Instances Response (PS3.18 10.5, Annex I) that says which
instances were stored and why others were not.

Every part is checked on its own (a DICOM Part-10 file, an image storage SOP class, a
transfer syntax the SCP accepts, the target study), then the accepted instances are
stored through the same paths as the other intakes:

- completeness ``request`` (default): each Study Instance UID in the request is one
  complete study; :meth:`Intake.submit_upload` stores it (fsync, content-addressed) and
  commits its job before the response, exactly as ``POST /v1/studies`` does;
- completeness ``quiet``: instances are filed like C-STORE instances (fsync, one file
  per SOP Instance UID) and the study is handed to intake once no instance has arrived
  for ``dicomweb.quiet_s`` — for senders that split a study over several requests.

The response is built as a pydicom Dataset and serialised with ``to_json_dict``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import BinaryIO

import pydicom
from pydicom.dataset import Dataset
from pydicom.errors import InvalidDicomError

from radserve.errors import RadserveError
from radserve.gateway import conformance
from radserve.gateway.completeness import (
    CompletedStudy,
    CompletenessMonitor,
    LatePolicy,
    StudyTracker,
)
from radserve.gateway.errors import GatewayError, InstanceRejectedError
from radserve.gateway.storage import Disposition, InstanceStore, check_uid
from radserve.scheduling import PriorityClass, QueueFullError
from radserve.service.catalog import ResolvedPipeline
from radserve.service.intake import DICOMWEB_SOURCE, Intake, Origin, Submission
from radserve.store.files import store_study_files

logger = logging.getLogger(__name__)

DICOM_MEDIA = "application/dicom"
STOW_DIR = "dicomweb"
_IMAGE_CLASSES = frozenset(str(uid) for uid in conformance.IMAGE_STORAGE)
_SYNTAXES = frozenset(str(uid) for uid in conformance.SCP_TRANSFER_SYNTAXES)


class FailureReason(IntEnum):
    """Failure Reason (0008,1197) values (PS3.18 Table I.2-2, plus 0xC409)."""

    PROCESSING_FAILURE = 0x0110
    SOP_CLASS_NOT_SUPPORTED = 0x0122
    OUT_OF_RESOURCES = 0xA700
    CANNOT_UNDERSTAND = 0xC000
    TRANSFER_SYNTAX_NOT_SUPPORTED = 0xC122
    # implementation-specific (as dcm4chee): the instance is not of the target study
    STUDY_UID_MISMATCH = 0xC409


@dataclass(frozen=True)
class StowPart:
    """One body part: its media type (empty when the part had no Content-Type) and bytes."""

    media_type: str
    stream: BinaryIO


@dataclass(frozen=True)
class InstanceOutcome:
    """What became of one part. ``reason`` is for the log (UIDs and rules, no PHI)."""

    part: int  # 1-based
    sop_class_uid: str = ""
    sop_instance_uid: str = ""
    study_instance_uid: str = ""
    failure: FailureReason | None = None
    reason: str = ""

    @property
    def stored(self) -> bool:
        return self.failure is None


@dataclass(frozen=True)
class StowResult:
    instances: tuple[InstanceOutcome, ...]
    jobs: tuple[Submission, ...] = ()
    # studies filed for the quiet period (their jobs start later)
    waiting: tuple[str, ...] = ()
    target_study: str | None = None

    @property
    def stored(self) -> int:
        return sum(1 for i in self.instances if i.stored)

    @property
    def http_status(self) -> int:
        """200 all stored, 202 some, 409 none (PS3.18 Table 10.5.3-1)."""
        if self.stored == len(self.instances):
            return 200
        return 202 if self.stored else 409

    def response(self) -> Dataset:
        """The Store Instances Response Module as a Dataset."""
        ds = Dataset()
        if self.target_study:
            ds.StudyInstanceUID = self.target_study
        ds.FailedSOPSequence = [_item(i) for i in self.instances if not i.stored]
        ds.ReferencedSOPSequence = [_item(i) for i in self.instances if i.stored]
        return ds


def _item(outcome: InstanceOutcome) -> Dataset:
    item = Dataset()
    if outcome.sop_class_uid:
        item.ReferencedSOPClassUID = outcome.sop_class_uid
    if outcome.sop_instance_uid:
        item.ReferencedSOPInstanceUID = outcome.sop_instance_uid
    if outcome.failure is not None:
        item.FailureReason = int(outcome.failure)
    return item


@dataclass
class _Accepted:
    outcome: InstanceOutcome
    stream: BinaryIO
    duplicates: list[InstanceOutcome] = field(default_factory=list)


class StowIntake:
    """STOW-RS requests -> studies -> jobs. Thread-safe; ``start``/``stop`` run the
    quiet-period monitor."""

    def __init__(self, intake: Intake, *, data_dir: Path, quiet_s: float = 10.0) -> None:
        self.intake = intake
        self.instances = InstanceStore(Path(data_dir) / STOW_DIR)
        self.tracker = StudyTracker(self._on_study, quiet_s=quiet_s, late_policy=LatePolicy.RERUN)
        self._monitor = CompletenessMonitor(self.tracker)

    def start(self) -> None:
        """Studies filed for the quiet period before a restart wait again, then go on."""
        self.instances.remove_partials()
        self.tracker.recover(self.instances.incoming)
        self._monitor.start()

    def stop(self) -> None:
        self._monitor.stop()

    # --- requests ---------------------------------------------------------------------
    def store(
        self,
        parts: Sequence[StowPart],
        *,
        target_study: str | None,
        resolved: ResolvedPipeline,
        priority: PriorityClass | None,
        origin: Origin,
        quiet: bool = False,
    ) -> StowResult:
        """Check every part, store the accepted instances, start or schedule their jobs.

        Raises :class:`QueueFullError` only when no instance was stored because the
        queue is full (HTTP 503 with Retry-After tells the sender to come back)."""
        accepted: dict[str, _Accepted] = {}
        outcomes: list[InstanceOutcome] = []
        for number, part in enumerate(parts, start=1):
            outcome = check_part(number, part, target_study)
            if not outcome.stored:
                logger.warning("STOW part %d not stored: %s", number, outcome.reason)
                outcomes.append(outcome)
            elif outcome.sop_instance_uid in accepted:  # the same instance twice: kept once
                accepted[outcome.sop_instance_uid].duplicates.append(outcome)
            else:
                accepted[outcome.sop_instance_uid] = _Accepted(outcome, part.stream)
        jobs: tuple[Submission, ...] = ()
        waiting: tuple[str, ...] = ()
        if quiet:
            stored = self._file_for_quiet_period(list(accepted.values()))
            waiting = tuple(sorted({o.study_instance_uid for o in stored if o.stored}))
        else:
            stored, jobs = self._submit_studies(list(accepted.values()), resolved, priority, origin)
        outcomes += stored
        result = StowResult(
            tuple(sorted(outcomes, key=lambda o: o.part)), jobs, waiting, target_study
        )
        if result.stored == 0 and outcomes and _all_queue_full(outcomes):
            raise QueueFullError(
                "the queue is full; no instance was stored: send the request again later",
                retry_after=self.intake.scheduler.config.default_retry_after_s,
            )
        logger.info(
            "STOW: %d of %d instance(s) stored, %d job(s)%s",
            result.stored,
            len(result.instances),
            len(jobs),
            f", {len(waiting)} study(ies) waiting for the quiet period" if waiting else "",
        )
        return result

    def _submit_studies(
        self,
        accepted: list[_Accepted],
        resolved: ResolvedPipeline,
        priority: PriorityClass | None,
        origin: Origin,
    ) -> tuple[list[InstanceOutcome], tuple[Submission, ...]]:
        by_study: dict[str, list[_Accepted]] = {}
        for entry in accepted:
            by_study.setdefault(entry.outcome.study_instance_uid, []).append(entry)
        outcomes: list[InstanceOutcome] = []
        jobs: list[Submission] = []
        for study_uid, entries in by_study.items():
            for entry in entries:
                entry.stream.seek(0)
            try:
                submission = self.intake.submit_upload(
                    [e.stream for e in entries], resolved=resolved, priority=priority, origin=origin
                )
            except RadserveError as exc:
                failure = _failure_for(exc)
                logger.warning("STOW study %s not stored: %s", study_uid, exc.code)
                for entry in entries:
                    outcomes += [
                        _failed(o, failure, exc.code) for o in (entry.outcome, *entry.duplicates)
                    ]
                continue
            jobs.append(submission)
            for entry in entries:
                outcomes += [entry.outcome, *entry.duplicates]
        return outcomes, tuple(jobs)

    def _file_for_quiet_period(self, accepted: list[_Accepted]) -> list[InstanceOutcome]:
        outcomes: list[InstanceOutcome] = []
        for entry in accepted:
            outcome = entry.outcome
            entry.stream.seek(0)
            try:
                saved = self.instances.save(
                    entry.stream.read(),
                    study_instance_uid=outcome.study_instance_uid,
                    sop_instance_uid=outcome.sop_instance_uid,
                    sop_class_uid=outcome.sop_class_uid,
                )
            except GatewayError as exc:  # out of resources: nothing kept
                outcomes += [
                    _failed(o, FailureReason.OUT_OF_RESOURCES, exc.code)
                    for o in (outcome, *entry.duplicates)
                ]
                continue
            self.tracker.arrived(
                outcome.study_instance_uid,
                saved.path.parent,
                calling_ae="DICOMWEB",
                new=saved.disposition is Disposition.STORED,
            )
            outcomes += [outcome, *entry.duplicates]
        return outcomes

    # --- quiet period over --------------------------------------------------------------
    def _on_study(self, study: CompletedStudy) -> None:
        """A study filed over STOW went quiet: store it and queue its job (raising makes
        the tracker offer it again later; its files stay on disk)."""
        stored = store_study_files(self.intake.settings.data_dir, list(study.instances))
        resolved = self.intake.catalog.resolve(None)
        submission = self.intake.submit_stored(
            stored.path,
            stored.fingerprint,
            resolved=resolved,
            priority=None,
            origin=Origin(client="dicomweb", source=DICOMWEB_SOURCE),
        )
        logger.info(
            "job %s from DICOMweb after the quiet period (%s, generation %d)",
            submission.job.id,
            "cached" if submission.cached else "queued",
            study.generation,
        )


def check_part(number: int, part: StowPart, target_study: str | None) -> InstanceOutcome:
    """Whether one part can be stored: the checks of the conformance statement, in order.
    Reads the header only; leaves the stream anywhere (callers seek)."""
    media = part.media_type.split(";", 1)[0].strip().lower()
    if media and media != DICOM_MEDIA:
        return InstanceOutcome(
            number,
            failure=FailureReason.CANNOT_UNDERSTAND,
            reason=f"media type {media!r}; expected {DICOM_MEDIA}",
        )
    part.stream.seek(0)
    try:
        ds = pydicom.dcmread(part.stream, stop_before_pixels=True)
        sop_class = str(ds.get("SOPClassUID") or ds.file_meta.get("MediaStorageSOPClassUID", ""))
        syntax = str(ds.file_meta.get("TransferSyntaxUID", ""))
        sop_uid = check_uid(
            ds.get("SOPInstanceUID") or ds.file_meta.get("MediaStorageSOPInstanceUID"),
            "SOP Instance UID",
        )
        study_uid = check_uid(ds.get("StudyInstanceUID"), "Study Instance UID")
    except InstanceRejectedError as exc:
        return InstanceOutcome(number, failure=FailureReason.CANNOT_UNDERSTAND, reason=exc.message)
    except (InvalidDicomError, AttributeError, EOFError, ValueError, TypeError, OSError) as exc:
        # the parser's message may quote element values: name only its type
        return InstanceOutcome(
            number,
            failure=FailureReason.CANNOT_UNDERSTAND,
            reason=f"not a readable DICOM Part-10 file ({type(exc).__name__})",
        )
    outcome = InstanceOutcome(number, sop_class, sop_uid, study_uid)
    if target_study is not None and study_uid != target_study:
        return _failed(outcome, FailureReason.STUDY_UID_MISMATCH, "not of the target study")
    if sop_class not in _IMAGE_CLASSES:
        return _failed(
            outcome,
            FailureReason.SOP_CLASS_NOT_SUPPORTED,
            f"SOP class {sop_class or '(none)'} is not an image storage class radserve reads",
        )
    if syntax not in _SYNTAXES:
        return _failed(
            outcome,
            FailureReason.TRANSFER_SYNTAX_NOT_SUPPORTED,
            f"transfer syntax {syntax or '(none)'} is not accepted",
        )
    return outcome


def _failed(outcome: InstanceOutcome, failure: FailureReason, reason: str) -> InstanceOutcome:
    return InstanceOutcome(
        outcome.part,
        outcome.sop_class_uid,
        outcome.sop_instance_uid,
        outcome.study_instance_uid,
        failure,
        reason,
    )


def _failure_for(exc: RadserveError) -> FailureReason:
    if exc.code in ("queue_full", "upload_too_large"):
        return FailureReason.OUT_OF_RESOURCES
    if exc.code in ("unsupported_media_type", "not_dicom", "study_invalid", "empty_upload"):
        return FailureReason.CANNOT_UNDERSTAND
    return FailureReason.PROCESSING_FAILURE


def _all_queue_full(outcomes: Sequence[InstanceOutcome]) -> bool:
    return all(o.reason == "queue_full" for o in outcomes if not o.stored)


__all__ = [
    "DICOM_MEDIA",
    "FailureReason",
    "InstanceOutcome",
    "StowIntake",
    "StowPart",
    "StowResult",
    "check_part",
]

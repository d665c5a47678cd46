"""DICOMweb STOW-RS: instances from a ``multipart/related`` request -> durable studies
-> jobs, and the Store Instances Response (PS3.18 10.5, Annex I) that says which
instances were stored and why others were not.

Every part is checked on its own (a DICOM Part-10 file, an image storage SOP class, a
transfer syntax the SCP accepts, the target study, and a complete instance: the same
bounded header read and pixel-data length checks ingest makes, so a truncated part is
answered as a failure, 0xC000, instead of being stored), then the accepted instances are
stored through the same paths as the other intakes (the server binds them:
:mod:`radserve.service.dicomweb`):

- completeness ``request`` (default): each Study Instance UID in the request is one
  complete study; the server's ``submit`` (``Intake.submit_upload``) stores it (fsync,
  content-addressed) and commits its job before the response, exactly as
  ``POST /v1/studies`` does;
- completeness ``quiet``: instances are filed like C-STORE instances (fsync, one file
  per SOP Instance UID) and the study is handed to intake once no instance has arrived
  for ``dicomweb.quiet_s`` — for senders that split a study over several requests.

The response is built as a pydicom Dataset and serialised with ``to_json_dict``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import BinaryIO, Generic, TypeVar

from pydicom.dataset import Dataset
from pydicom.errors import InvalidDicomError

from radserve import error_table
from radserve.errors import (
    InvalidRequestError,
    NotDicomError,
    RadserveError,
    UnsupportedMediaError,
    quoted,
)
from radserve.gateway import conformance
from radserve.gateway.completeness import (
    CompletenessMonitor,
    LatePolicy,
    RefusalReason,
    StudyCallback,
    StudyTracker,
    note_refused,
)
from radserve.gateway.errors import GatewayError, InstanceRejectedError
from radserve.gateway.own_results import OwnResults
from radserve.gateway.storage import Disposition, InstanceStore, check_uid
from radserve.ingest.headers import (
    SkipFile,
    UnreadableHeaderError,
    header_text,
    read_header,
    read_stream,
)
from radserve.ingest.policy import IngestPolicy
from radserve.ingest.sources import SourceFile
from radserve.scheduling import QueueFullError

logger = logging.getLogger(__name__)
S = TypeVar("S")  # what the server's submit callable returns for one study (its job)
# the server's submit: one study's accepted instances (streams) and the reasons its
# refused image parts were refused (their job names them) -> its job
Submit = Callable[[list[BinaryIO], Sequence[RefusalReason]], S]

DICOM_MEDIA = "application/dicom"
# A failed item's radserve reason: (0009,0010) "radserve", (0009,1001) LO its error code,
# (0009,1002) LT its text (docs/conformance.md 4.1)
REASON_GROUP = 0x0009
REASON_CREATOR = "radserve"
REASON_CODE = 0x01
REASON_TEXT = 0x02
STOW_DIR = "dicomweb"
# refused parts (and refused studies) of one request logged each; the others in one line
# (a request may hold 100,000 parts: 1,000 parts that were not DICOM logged 1,000 warnings)
LOGGED_REFUSALS = 10
# refused parts that name no instance (empty, not DICOM, no SOP Instance UID) answered
# each in the Failed SOP Sequence; the rest are counted on one summary item. An item of
# such a part says nothing a sender can match to what it sent (no UID, no part number),
# and 99,999 empty parts (a 4.3 MB body) were answered with 21.9 MB, 29.5 s of server
# CPU and +283 MB; a refused instance that has its UID is always answered with its item
# (a sender resends by it; the item is no larger than the part)
LISTED_UNNAMED_REFUSALS = 1000
# the radserve code on the summary item of the unnamed refused parts past that
UNLISTED_CODE = "parts_not_listed"
# the code of a part whose SOP class radserve does not read: the one ingest.validate
# gives a series of such a class
SOP_CLASS_UNSUPPORTED = "sop_class_unsupported"
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
    # radserve's error code for the failure, as the form's error answers it (may be "")
    code: str = ""
    # radserve's own result (SEG/SR/SC it wrote): answered as stored, not filed
    own_result: bool = False

    @property
    def stored(self) -> bool:
        return self.failure is None


@dataclass(frozen=True)
class StowResult(Generic[S]):
    instances: tuple[InstanceOutcome, ...]
    jobs: tuple[S, ...] = ()
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
        """The Store Instances Response Module as a Dataset: an item per stored instance
        and per refused one, but of the refused parts that name no instance only the first
        :data:`LISTED_UNNAMED_REFUSALS`, then one summary item counting the rest."""
        ds = Dataset()
        if self.target_study:
            ds.StudyInstanceUID = self.target_study
        failed, unlisted = [], []
        unnamed = 0
        for outcome in self.instances:
            if outcome.stored:
                continue
            if not outcome.sop_instance_uid:
                unnamed += 1
                if unnamed > LISTED_UNNAMED_REFUSALS:
                    unlisted.append(outcome)
                    continue
            failed.append(_item(outcome))
        if unlisted:
            failed.append(_summary(unlisted))
        ds.FailedSOPSequence = failed
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
        # radserve's reason, in a private block (PS3.18 has no text per failed item): the
        # code and text the upload form answers for the same instance; no patient data
        block = item.private_block(REASON_GROUP, REASON_CREATOR, create=True)
        if outcome.code:
            block.add_new(REASON_CODE, "LO", outcome.code)
        if outcome.reason:
            block.add_new(REASON_TEXT, "LT", outcome.reason)
    return item


def _summary(unlisted: Sequence[InstanceOutcome]) -> Dataset:
    """One Failed SOP Sequence item for the refused parts past the listed ones: the
    Failure Reason most of them have, and in radserve's private block the code
    :data:`UNLISTED_CODE` and a text with their count, part numbers and codes."""
    counts: dict[tuple[str, int], int] = {}
    for outcome in unlisted:
        key = (outcome.code or "-", 0 if outcome.failure is None else int(outcome.failure))
        counts[key] = counts.get(key, 0) + 1
    (_, reason), _ = max(counts.items(), key=lambda kv: kv[1])
    item = Dataset()
    item.FailureReason = reason
    block = item.private_block(REASON_GROUP, REASON_CREATOR, create=True)
    block.add_new(REASON_CODE, "LO", UNLISTED_CODE)
    codes = ", ".join(
        f"{n} {code} (0x{failure:04X})" for (code, failure), n in sorted(counts.items())
    )
    block.add_new(
        REASON_TEXT,
        "LT",
        f"{len(unlisted)} more part(s) not stored, not listed each (the first "
        f"{LISTED_UNNAMED_REFUSALS} parts refused without a SOP Instance UID are): parts "
        f"{unlisted[0].part} to {unlisted[-1].part}: {codes}",
    )
    return item


@dataclass
class _Accepted:
    outcome: InstanceOutcome
    stream: BinaryIO


class StowIntake(Generic[S]):
    """STOW-RS requests -> checked instances -> studies handed to the server. Thread-safe;
    ``start``/``stop`` run the quiet-period monitor.

    The server binds it to its intake with two callables, as it binds the storage SCP:
    ``submit`` (per request: store one complete study and commit its job, returning what
    the response's ``Link`` names) and ``on_study`` (a study filed for the quiet period
    has gone quiet). Either raises :class:`~radserve.errors.RadserveError` to refuse."""

    def __init__(
        self,
        on_study: StudyCallback,
        *,
        data_dir: Path,
        quiet_s: float = 10.0,
        own_results: OwnResults | None = None,
        policy: IngestPolicy | None = None,
    ) -> None:
        self.own_results = own_results
        self.instances = InstanceStore(Path(data_dir) / STOW_DIR)
        self.tracker = StudyTracker(on_study, quiet_s=quiet_s, late_policy=LatePolicy.RERUN)
        self._monitor = CompletenessMonitor(self.tracker)
        self.policy = policy or IngestPolicy()  # the completeness checks' read limits

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
        submit: Submit[S] | None,
        retry_after: int,
        on_filing: Callable[[str, Path], None] | None = None,
    ) -> StowResult[S]:
        """Check every part, then hand each study's accepted instances to ``submit``
        (one call per Study Instance UID, with the reasons of the study's refused image
        parts, for its job's warnings), or file them for the quiet period when
        ``submit`` is None. ``on_filing(study_uid, folder)``: called once per study of
        the request filed for the quiet period, after its first instance is on disk and
        before the quiet period sees it, so what it records (who filed the study) is on
        disk before the study can be handed over.

        Raises :class:`QueueFullError` (``retry_after`` seconds) only when no instance
        was stored because the queue is full (HTTP 503 with Retry-After tells the
        sender to come back)."""
        # Every part goes on, a second one of a SOP Instance UID too: ingest drops a copy
        # and refuses two different instances under one UID (naming both), as at the form.
        accepted: list[_Accepted] = []
        outcomes: list[InstanceOutcome] = []
        refused: list[InstanceOutcome] = []
        for number, part in enumerate(parts, start=1):
            outcome = check_part(
                number, part, target_study, own_results=self.own_results, policy=self.policy
            )
            if outcome.own_result:  # acknowledged as held, never filed as input
                outcomes.append(outcome)
            elif not outcome.stored:
                if len(refused) < LOGGED_REFUSALS:
                    logger.warning("STOW part %d not stored: %s", number, outcome.reason)
                refused.append(outcome)
                outcomes.append(outcome)
            else:
                accepted.append(_Accepted(outcome, part.stream))
        _log_unlogged(refused)
        jobs: tuple[S, ...] = ()
        waiting: tuple[str, ...] = ()
        outage: RadserveError | None = None
        if submit is None:
            # noted before any instance of the request is filed: the quiet period cannot
            # hand a study over without the refusals of the request that filed it
            self._note_refused(refused)
            stored = self._file_for_quiet_period(accepted, on_filing)
            waiting = tuple(sorted({o.study_instance_uid for o in stored if o.stored}))
        else:
            stored, jobs, outage = _submit_studies(accepted, submit, refusals_by_study(refused))
        outcomes += stored
        result = StowResult(
            tuple(sorted(outcomes, key=lambda o: o.part)), jobs, waiting, target_study
        )
        if result.stored == 0 and outcomes and _all_queue_full(outcomes):
            raise QueueFullError(
                "the queue is full; no instance was stored: send the request again later",
                retry_after=retry_after,
            )
        if result.stored == 0 and outage is not None and _all_refused_by(outage, outcomes):
            raise outage  # the database did not answer: 503 with its Retry-After
        logger.info(
            "STOW: %d of %d instance(s) stored, %d job(s)%s",
            result.stored,
            len(result.instances),
            len(jobs),
            f", {len(waiting)} study(ies) waiting for the quiet period" if waiting else "",
        )
        return result

    def _file_for_quiet_period(
        self, accepted: list[_Accepted], on_filing: Callable[[str, Path], None] | None
    ) -> list[InstanceOutcome]:
        outcomes: list[InstanceOutcome] = []
        filing: set[str] = set()  # studies of this request on_filing has seen
        for entry in accepted:
            outcome = entry.outcome
            try:
                # the part's stream, copied in chunks: its bytes read whole took the
                # server's memory up by the part's size (a 2 GiB part: 2 GiB)
                saved = self.instances.save(
                    entry.stream,
                    study_instance_uid=outcome.study_instance_uid,
                    sop_instance_uid=outcome.sop_instance_uid,
                    sop_class_uid=outcome.sop_class_uid,
                )
            except GatewayError as exc:  # out of resources: nothing kept
                failed = _failed(outcome, FailureReason.OUT_OF_RESOURCES, exc.message, exc.code)
                self._note_refused([failed])
                outcomes.append(failed)
                continue
            if on_filing is not None and outcome.study_instance_uid not in filing:
                filing.add(outcome.study_instance_uid)
                on_filing(outcome.study_instance_uid, saved.path.parent)
            self.tracker.arrived(
                outcome.study_instance_uid,
                saved.path.parent,
                calling_ae="DICOMWEB",
                new=saved.disposition is Disposition.STORED,
            )
            outcomes.append(outcome)
        return outcomes

    def _note_refused(self, refused: Sequence[InstanceOutcome]) -> None:
        """Parts refused for the quiet period: each noted in its study's folder
        (:func:`refusals_by_study`), so the job of the rest of the study names the
        refusal (:func:`note_refused`: one write per study, however many of its parts a
        request held), and the study is kept open as by an arrival."""
        for study, refusals in refusals_by_study(refused).items():
            note_refused(self.instances.study_dir(study), refusals)
            self.tracker.touch(study)


Refusal = tuple[str | None, RefusalReason]  # a refused instance's SOP UID (if any), why


def refusals_by_study(refused: Sequence[InstanceOutcome]) -> dict[str, list[Refusal]]:
    """The refused parts that are images (by their own SOP Class UID) of a readable
    study, per Study Instance UID: what the job of the rest of that study names. A
    refused object of a class radserve does not read is left out: it is in no result
    anyway (a dose SR refused beside a CT would warn on every study)."""
    by_study: dict[str, list[Refusal]] = {}
    for outcome in refused:
        study = outcome.study_instance_uid
        if study and outcome.failure is not None and outcome.sop_class_uid in _IMAGE_CLASSES:
            reason = RefusalReason(outcome.code, int(outcome.failure))
            by_study.setdefault(study, []).append((outcome.sop_instance_uid or None, reason))
    return by_study


def _log_unlogged(refused: Sequence[InstanceOutcome]) -> None:
    """One line for the refused parts past the first :data:`LOGGED_REFUSALS` (each of
    which had its own): how many, from which part to which, and their codes (the
    response names each part's reason)."""
    rest = refused[LOGGED_REFUSALS:]
    if not rest:
        return
    codes: dict[str, int] = {}
    for outcome in rest:
        failure = 0 if outcome.failure is None else int(outcome.failure)
        key = outcome.code or f"0x{failure:04X}"
        codes[key] = codes.get(key, 0) + 1
    logger.warning(
        "STOW: %d more part(s) not stored (parts %d to %d: %s); the response names each "
        "part's reason (or counts those past the first %d without a SOP Instance UID)",
        len(rest),
        rest[0].part,
        rest[-1].part,
        ", ".join(f"{n} {code}" for code, n in sorted(codes.items())),
        LISTED_UNNAMED_REFUSALS,
    )


def _submit_studies(
    accepted: list[_Accepted],
    submit: Submit[S],
    refusals: dict[str, list[Refusal]],
) -> tuple[list[InstanceOutcome], tuple[S, ...], RadserveError | None]:
    """Each study's instances to ``submit``, with the reasons of its refused parts
    (``refusals``: by study; a part refused whose SOP Instance UID another part of the
    request stored is not missing); their outcomes, the jobs, and the last refusal that
    was an outage (the database did not answer), if any."""
    outage: RadserveError | None = None
    by_study: dict[str, list[_Accepted]] = {}
    for entry in accepted:
        by_study.setdefault(entry.outcome.study_instance_uid, []).append(entry)
    outcomes: list[InstanceOutcome] = []
    jobs: list[S] = []
    refused: list[str] = []  # the refused studies' error codes, in request order
    for study_uid, entries in by_study.items():
        for entry in entries:
            entry.stream.seek(0)
        try:
            held = {e.outcome.sop_instance_uid for e in entries}
            missing = [why for uid, why in refusals.get(study_uid, []) if uid not in held]
            submission = submit([e.stream for e in entries], missing)
        except RadserveError as exc:
            failure = _failure_for(exc)
            if len(refused) < LOGGED_REFUSALS:
                logger.warning("STOW study %s not stored: %s", study_uid, exc.code)
            refused.append(exc.code)
            outage = exc if exc.outage else outage
            outcomes += [_failed(e.outcome, failure, exc.message, exc.code) for e in entries]
            continue
        jobs.append(submission)
        outcomes += [e.outcome for e in entries]
    _log_unlogged_studies(refused)
    return outcomes, tuple(jobs), outage


def _log_unlogged_studies(codes: Sequence[str]) -> None:
    """One line for the refused studies past the first :data:`LOGGED_REFUSALS` (each of
    which had its own), as :func:`_log_unlogged` does for parts: a request may hold
    thousands of studies, each refused (a full queue) with a line of its own before."""
    rest = codes[LOGGED_REFUSALS:]
    if not rest:
        return
    counts: dict[str, int] = {}
    for code in rest:
        counts[code] = counts.get(code, 0) + 1
    logger.warning(
        "STOW: %d more study(ies) not stored (%s); the response names each instance's reason",
        len(rest),
        ", ".join(f"{n} {code}" for code, n in sorted(counts.items())),
    )


# what check_part reads before ingest's own read (_check_complete): the UIDs and what
# names radserve's own results; the rest of a header is skipped, not built (100,000
# private elements cost +79 MB as a whole Dataset, read once more by ingest)
_CHECKED = (
    "SOPClassUID",
    "SOPInstanceUID",
    "StudyInstanceUID",
    "Manufacturer",
    "ContributingEquipmentSequence",
)


def check_part(
    number: int,
    part: StowPart,
    target_study: str | None,
    *,
    own_results: OwnResults | None = None,
    policy: IngestPolicy | None = None,
) -> InstanceOutcome:
    """Whether one part can be stored: the checks of the conformance statement, in order.
    Reads the header only (bounded by ``policy``); leaves the stream anywhere (callers
    seek). radserve's own results come back ``own_result`` (listed as stored in the
    response, never filed)."""
    media = part.media_type.split(";", 1)[0].strip().lower()
    named_study = ""  # the part's Study Instance UID once read (a refusal names it)
    if media and media != DICOM_MEDIA:
        return InstanceOutcome(
            number,
            failure=FailureReason.CANNOT_UNDERSTAND,
            reason=f"media type {quoted(media)}; expected {DICOM_MEDIA}",
            code=UnsupportedMediaError.code,
        )
    if part.stream.seek(0, 2) == 0:  # no file at all: refused without a parser's try
        return InstanceOutcome(
            number,
            failure=FailureReason.CANNOT_UNDERSTAND,
            reason="an empty part: not a DICOM Part-10 file",
            code=NotDicomError.code,
        )
    part.stream.seek(0)
    bounds = policy or IngestPolicy()
    sop_class = ""
    try:
        ds = read_header(
            part.stream,
            tags=_CHECKED,
            max_header_bytes=bounds.max_header_bytes,
            max_header_elements=bounds.max_header_elements,
        )
        meta = getattr(ds, "file_meta", None)
        named_study = header_text(ds, "StudyInstanceUID")
        sop_class = header_text(ds, "SOPClassUID") or header_text(meta, "MediaStorageSOPClassUID")
        syntax = header_text(meta, "TransferSyntaxUID")
        sop_uid = check_uid(
            header_text(ds, "SOPInstanceUID") or header_text(meta, "MediaStorageSOPInstanceUID"),
            "SOP Instance UID",
        )
        study_uid = check_uid(header_text(ds, "StudyInstanceUID"), "Study Instance UID")
    except InstanceRejectedError as exc:  # a UID against ingest.rules: as the form says it
        if sop_class and sop_class not in _IMAGE_CLASSES:  # not an image: refused as such
            return _not_read(InstanceOutcome(number, sop_class), sop_class)
        return InstanceOutcome(
            number,
            sop_class,
            study_instance_uid=_rule_abiding(named_study, "Study Instance UID"),
            failure=FailureReason.CANNOT_UNDERSTAND,
            reason=exc.message,
            code=exc.code,
        )
    except UnreadableHeaderError as exc:
        return InstanceOutcome(
            number,
            failure=FailureReason.CANNOT_UNDERSTAND,
            reason=f"not a readable DICOM Part-10 file ({exc.cause_name})",
            code=NotDicomError.code,
        )
    except (InvalidDicomError, AttributeError, EOFError, ValueError, TypeError, OSError) as exc:
        # the parser's message may quote element values: name only its type
        return InstanceOutcome(
            number,
            failure=FailureReason.CANNOT_UNDERSTAND,
            reason=f"not a readable DICOM Part-10 file ({type(exc).__name__})",
            code=NotDicomError.code,
        )
    outcome = InstanceOutcome(number, sop_class, sop_uid, study_uid)
    if target_study is not None and study_uid != target_study:
        return _failed(
            outcome,
            FailureReason.STUDY_UID_MISMATCH,
            "not of the target study",
            InvalidRequestError.code,
        )
    if own_results is not None and own_results.check(ds, "STOW-RS"):
        return InstanceOutcome(number, sop_class, sop_uid, study_uid, own_result=True)
    if sop_class not in _IMAGE_CLASSES:
        return _not_read(outcome, sop_class)
    if syntax not in _SYNTAXES:
        return _failed(
            outcome,
            FailureReason.TRANSFER_SYNTAX_NOT_SUPPORTED,
            conformance.REFUSED_TRANSFER_SYNTAXES.get(
                syntax, f"transfer syntax {quoted(syntax)} is not accepted"
            ),
            "instance_invalid",
        )
    return _check_complete(outcome, part, bounds)


def _rule_abiding(value: str, what: str) -> str:
    """``value`` when it is a UID by radserve's rules, else "" (it names no folder)."""
    try:
        return check_uid(value, what)
    except InstanceRejectedError:
        return ""


def _not_read(outcome: InstanceOutcome, sop_class: str) -> InstanceOutcome:
    """0x0122 for an object of a class radserve does not read, whatever its UIDs (a
    DICOMDIR has no Study Instance UID: it was refused as an invalid instance, while
    the other doors pass over it)."""
    return _failed(
        outcome,
        FailureReason.SOP_CLASS_NOT_SUPPORTED,
        f"SOP class {quoted(sop_class)} is not an image storage class radserve reads",
        SOP_CLASS_UNSUPPORTED,
    )


def _check_complete(
    outcome: InstanceOutcome, part: StowPart, policy: IngestPolicy
) -> InstanceOutcome:
    """Whether the part is a whole, usable instance: ingest's own bounded header read,
    with the pixel data's length checked against Rows, Columns and Number of Frames."""
    stream = part.stream
    size = stream.seek(0, 2)
    stream.seek(0)
    try:
        record = read_stream(stream, size, SourceFile(Path(f"part {outcome.part}")), policy)
    except SkipFile as exc:
        return _failed(outcome, FailureReason.CANNOT_UNDERSTAND, exc.reason, NotDicomError.code)
    problem = next((f.problem for f in record.frames if f.problem is not None), None)
    if problem is None:
        return outcome
    failure = (
        FailureReason.OUT_OF_RESOURCES
        if problem.code == "input_too_large"
        else FailureReason.CANNOT_UNDERSTAND
    )
    return _failed(outcome, failure, problem.text, problem.code)


def _failed(
    outcome: InstanceOutcome, failure: FailureReason, reason: str, code: str
) -> InstanceOutcome:
    return InstanceOutcome(
        outcome.part,
        outcome.sop_class_uid,
        outcome.sop_instance_uid,
        outcome.study_instance_uid,
        failure,
        reason,
        code=code,
    )


def _failure_for(exc: RadserveError) -> FailureReason:
    """The Failure Reason of a refused study's instances: the error table's row."""
    return FailureReason(error_table.lookup(exc).stow)


def _all_queue_full(outcomes: Sequence[InstanceOutcome]) -> bool:
    return all(o.code == "queue_full" for o in outcomes if not o.stored)


def _all_refused_by(error: RadserveError, outcomes: Sequence[InstanceOutcome]) -> bool:
    """Whether every instance not stored was refused with ``error``'s code."""
    return all(o.code == error.code for o in outcomes if not o.stored)


__all__ = [
    "DICOM_MEDIA",
    "LISTED_UNNAMED_REFUSALS",
    "UNLISTED_CODE",
    "FailureReason",
    "InstanceOutcome",
    "StowIntake",
    "StowPart",
    "StowResult",
    "check_part",
]

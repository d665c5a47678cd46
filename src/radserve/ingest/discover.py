"""Find image series in folders, zips and files with one header-only pass.

Files are grouped by Series Instance UID, then each series is split by SOP Class,
orientation, Rows/Columns, Pixel Spacing and temporal position / echo / stack: the
largest regular group is part 0, the others become parts of their own. Localizers
(ImageType LOCALIZER, or another orientation with only a few instances) are dropped from
the series and listed on part 0, never loaded into the volume.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from radserve.checkpoints import checkpoint
from radserve.errors import NotDicomError, StudyError
from radserve.ingest.geometry import slice_normal
from radserve.ingest.headers import (
    DiscoveryMemo,
    FrameRef,
    InstanceRecord,
    PatientInfo,
    SkipFile,
    read_instance,
    uid_shown,
)
from radserve.ingest.policy import IngestPolicy
from radserve.ingest.sop_classes import VOLUME_MODALITY
from radserve.ingest.sources import (
    DEFAULT_MAX_ARCHIVE_BYTES,
    InputTooLargeError,
    SkipKind,
    SkippedFile,
    SourceFile,
    SourceReader,
    expand_sources,
)

log = logging.getLogger(__name__)

DEFAULT_MAX_LOCALIZER_SLICES = 3
_ORIENTATION_TOL = 1e-3  # per IOP component (about 0.06°)
_SPACING_TOL = 1e-3  # mm
_POSITION_TOL = 1e-2  # mm along the slice normal (ingest's smallest slice step)
# what may differ in images that are still one stack's slices (then "interleaved"): a
# CT and an MR image alternating in one series are no two series either (session 43)
_SAME_STACK = frozenset({"orientation", "dimensions", "pixel_spacing", "sop_class", "modality"})
_REASON_TEXT = {
    "sop_class": "another SOP Class",
    "modality": "another Modality",
    "orientation": "another orientation",
    "dimensions": "other Rows/Columns",
    "pixel_spacing": "other Pixel Spacing",
    "stack": "another temporal position, echo or stack",
}


@dataclass(frozen=True)
class SeriesHeader:
    """One loadable part of a series, from headers only (no pixel data read yet).

    ``part`` is 0 for the largest regular stack of the Series Instance UID and >0 for the
    groups split off from it; ``split_reasons`` names what differed ("orientation",
    "dimensions", "pixel_spacing", "sop_class", "modality", "stack"; "interleaved" when
    the groups' images lie between each other's slices). ``dropped`` lists localizers
    removed from this part, ``skipped`` every file of the same discovery that is in no
    series (not DICOM, not an image, unreadable), with the reason.
    """

    series_instance_uid: str
    study_instance_uid: str
    modality: str
    series_description: str
    series_number: int | None
    body_part_examined: str
    frame_of_reference_uid: str | None
    sop_class_uid: str
    image_type: tuple[str, ...]
    slice_thickness: float | None
    number_of_instances: int
    patient: PatientInfo
    frames: tuple[FrameRef, ...] = field(repr=False)
    absent_type2: tuple[str, ...] = ()  # Type 2 attributes the outputs copy, absent somewhere
    study_instance_uids: frozenset[str] = frozenset()  # of every instance of the part
    frame_of_reference_uids: frozenset[str | None] = frozenset()
    patient_identities: int = 1  # distinct PatientInfo.identity among the part's instances
    part: int = 0
    split_reasons: frozenset[str] = frozenset()
    notes: tuple[str, ...] = ()
    dropped: tuple[SkippedFile, ...] = field(default=(), repr=False)
    skipped: tuple[SkippedFile, ...] = field(default=(), repr=False)
    # (a copy's frame, the frame kept) per frame of an instance found in several files
    # with other bytes: ingest checks that their pixels agree
    copies: tuple[tuple[FrameRef, FrameRef], ...] = field(default=(), repr=False)

    @property
    def key(self) -> str:
        """Unique within a discovery: the series UID, plus ``#part`` for split-off parts."""
        uid = self.series_instance_uid
        return uid if self.part == 0 else f"{uid}#{self.part}"

    @property
    def files(self) -> tuple[SourceFile, ...]:
        """The files holding this part's frames, in discovery order, without repeats."""
        return tuple(dict.fromkeys(f.source for f in self.frames))

    @property
    def number_of_frames(self) -> int:
        return len(self.frames)

    @property
    def unusable(self) -> str | None:
        """What makes the part's first unusable instance unusable, or None. Such an
        instance stands as one frame whatever its Number of Frames, so a multi-frame
        one's series looks like a single image until this is asked."""
        return next((f.problem.text for f in self.frames if f.problem is not None), None)

    @property
    def is_localizer(self) -> bool:
        return all(f.is_localizer for f in self.frames)


def _image_of(record: InstanceRecord) -> tuple[object, ...]:
    """What two copies of one instance must agree on: frames, size, place."""
    return tuple((f.pixel.rows, f.pixel.columns, f.position, f.orientation) for f in record.frames)


def _check_same_instance(
    first: tuple[SourceFile, InstanceRecord], src: SourceFile, record: InstanceRecord
) -> None:
    """A second file of an instance already found is a copy, dropped; one that places
    other pixels (another position, orientation, size or frame count) under the same SOP
    Instance UID is a conflict, refused: keeping either would silently drop a slice, or
    put one where it does not belong."""
    # the two files are named by the UID they share, never by their names: those are
    # the sender's (a PACS export names folders and files by patient)
    shared = _shared_uid(record)
    if first[1].study_instance_uid != record.study_instance_uid:
        raise SeveralStudiesError(
            "two files carry one SOP Instance UID in two studies (Study Instance UIDs "
            "differ; an anonymiser or a copy that kept the SOP Instance UIDs?): "
            f"{SeveralStudiesError.advice}{shared}"
        )
    if first[1].series_instance_uid != record.series_instance_uid:
        raise StudyError(
            "two files carry one SOP Instance UID in two series (Series Instance UIDs "
            "differ): an instance belongs to one series, which of them is right cannot "
            f"be told{shared}",
            code="instance_invalid",
        )
    if _image_of(first[1]) != _image_of(record):
        raise StudyError(
            "two files carry one SOP Instance UID but differ in position, orientation, "
            "size or frames: two instances with one identity (the sender reused a UID), "
            f"which of them is right cannot be told{shared}",
            code="instance_invalid",
        )


def _shared_uid(record: InstanceRecord) -> str:
    return uid_shown(record.frames[0].sop_instance_uid, "SOP Instance UID")


class SeveralStudiesError(StudyError):
    """One input (an upload, a folder for ``radserve run``) holds several studies: a
    series of one was run and the other's named in its report as "another series
    preferred", or, when they shared SOP Instance UIDs, dropped as copies unsaid. The
    doors that take several studies at once (C-STORE, STOW-RS, the batch upload) give
    each its own job first."""

    code = "several_studies"
    advice = (
        "a job analyses one study, and which of them was meant cannot be told; send each "
        "study on its own (STOW-RS, C-STORE and POST /v1/studies/batch take several, each "
        "its own job)"
    )


RECEIVED_AGAIN = "an earlier copy of an instance received again"


def _written_after(src: SourceFile, other: SourceFile) -> bool:
    """Whether ``src`` is a file written later than ``other`` (another copy of its
    instance): a sender re-sending an instance with other header values (a corrected
    name or ID) means the later one; the gateway and STOW-RS keep both, the second
    named by its content, so the file name says nothing of the order. Archive members
    and unreadable times keep the first found."""
    if src.member is not None or other.member is not None:
        return False
    return written_after(src.path, other.path)


def written_after(path: Path, other: Path) -> bool:
    """Whether the file ``path`` was written later than ``other`` (unreadable times:
    no). The one rule for which copy of a re-sent instance counts: ingest reads it, and
    the DICOM results take their patient and study attributes from it."""
    try:
        return path.stat().st_mtime_ns > other.stat().st_mtime_ns
    except OSError:
        return False


def discover_series(
    sources: Path | str | Sequence[Path | str],
    *,
    max_localizer_slices: int = DEFAULT_MAX_LOCALIZER_SLICES,
    max_archive_bytes: int = DEFAULT_MAX_ARCHIVE_BYTES,
    policy: IngestPolicy | None = None,
) -> list[SeriesHeader]:
    """Every image series (and split-off part) in ``sources``, in a stable order.

    Reading is bounded by ``policy`` (its ``max_*`` limits): the total size of the files
    before any is opened, each header as it is read, the frames as they are found.

    Raises:
        NotDicomError: no file in ``sources`` is a DICOM image; the message counts why.
        ArchiveRejectedError: a zip archive exceeds the size or member limits.
        InputTooLargeError: the files or frames exceed ``policy.max_study_bytes`` /
            ``max_frames``.
    """
    policy = policy or IngestPolicy()
    files, skipped = expand_sources(
        sources,
        max_archive_bytes=min(max_archive_bytes, policy.max_study_bytes),
        max_archive_members=policy.max_archive_members,
    )
    total = len(files) + len(skipped)
    records: list[InstanceRecord] = []
    seen: dict[str, tuple[SourceFile, InstanceRecord]] = {}
    position: dict[str, int] = {}  # of each SOP Instance UID's record in records
    copies: dict[str, list[InstanceRecord]] = defaultdict(list)  # dropped, per UID
    n_frames = 0
    patients = DiscoveryMemo()
    with SourceReader() as reader:
        _check_study_bytes(reader, files, policy)
        for src in files:
            checkpoint()  # a routine study's ingest lets URGENT work pass, file by file
            try:
                record = read_instance(reader, src, policy, patients)
            except SkipFile as exc:
                skipped.append(SkippedFile(src, exc.reason, exc.kind))
                continue
            except Exception as exc:  # I/O or archive damage while reading this file
                reason = f"unreadable file ({type(exc).__name__})"
                skipped.append(SkippedFile(src, reason, SkipKind.UNREADABLE))
                continue
            uid = record.frames[0].sop_instance_uid
            if uid in seen:
                _check_same_instance(seen[uid], src, record)
                earlier = seen[uid][0]
                if _written_after(src, earlier):  # re-sent: the later copy corrects it
                    records[position[uid]] = record
                    copies[uid].append(seen[uid][1])
                    seen[uid] = (src, record)
                    skipped.append(SkippedFile(earlier, RECEIVED_AGAIN, SkipKind.COPY))
                else:
                    copies[uid].append(record)
                    again = "another copy of an instance already found"
                    skipped.append(SkippedFile(src, again, SkipKind.COPY))
                continue
            n_frames += len(record.frames)
            if n_frames > policy.max_frames:
                raise InputTooLargeError(
                    f"the input holds more than ingest.max_frames={policy.max_frames} frames "
                    f"(found {n_frames} in the first {len(records) + 1} instances); send one "
                    "study at a time or raise the limit"
                )
            seen[uid] = (src, record)
            position[uid] = len(records)
            records.append(record)

    by_series: dict[str, list[InstanceRecord]] = defaultdict(list)
    for record in records:
        by_series[record.series_instance_uid].append(record)
    headers = [h for group in by_series.values() for h in _split(group, max_localizer_slices)]
    if not headers:
        raise NotDicomError(f"no DICOM image series found in {total} files ({_summarise(skipped)})")
    headers.sort(
        key=lambda h: (h.study_instance_uid, h.series_number or 0, h.series_instance_uid, h.part)
    )
    log.info(
        "discovered %d series parts in %d files; skipped %d (%s)",
        len(headers),
        total,
        len(skipped),
        _summarise(skipped),
    )
    frozen = tuple(skipped)
    pairs = _copy_pairs(copies, seen)
    return [replace(h, skipped=frozen, copies=_copies_of(h, pairs)) for h in headers]


def _copy_pairs(
    copies: dict[str, list[InstanceRecord]], seen: dict[str, tuple[SourceFile, InstanceRecord]]
) -> dict[tuple[str, int | None], list[FrameRef]]:
    """The dropped copies' frames by (SOP Instance UID, frame index) of the kept frame."""
    pairs: dict[tuple[str, int | None], list[FrameRef]] = defaultdict(list)
    for uid, dropped in copies.items():
        kept = seen[uid][1]
        for record in dropped:
            for copy, frame in zip(record.frames, kept.frames, strict=True):
                pairs[(uid, frame.frame_index)].append(copy)
    return pairs


def _copies_of(
    header: SeriesHeader, pairs: dict[tuple[str, int | None], list[FrameRef]]
) -> tuple[tuple[FrameRef, FrameRef], ...]:
    if not pairs:
        return ()
    return tuple(
        (copy, frame)
        for frame in header.frames
        for copy in pairs.get((frame.sop_instance_uid, frame.frame_index), ())
    )


def _check_study_bytes(
    reader: SourceReader, files: Sequence[SourceFile], policy: IngestPolicy
) -> None:
    total = 0
    for src in files:
        try:
            total += reader.size(src)
        except OSError:
            continue  # judged when read
        if total > policy.max_study_bytes:
            raise InputTooLargeError(
                f"the input holds more than ingest.max_study_bytes={policy.max_study_bytes} "
                f"bytes (counted over {len(files)} files); send one study at a time or raise "
                "the limit"
            )


def _summarise(skipped: Sequence[SkippedFile]) -> str:
    counts = Counter(s.reason for s in skipped)
    return "; ".join(f"{n}× {reason}" for reason, n in counts.most_common()) or "none"


def _split(records: list[InstanceRecord], max_localizer_slices: int) -> list[SeriesHeader]:
    pairs = [(r, f) for r in records for f in r.frames]
    frames = [f for _, f in pairs]
    orient_ids = _cluster([f.orientation for f in frames], _ORIENTATION_TOL)
    spacing_ids = _cluster([f.pixel_spacing for f in frames], _SPACING_TOL)
    groups: dict[tuple[object, ...], list[int]] = defaultdict(list)
    for i, (record, f) in enumerate(pairs):
        key = (
            f.sop_class_uid,
            orient_ids[i],
            (f.pixel.rows, f.pixel.columns),
            spacing_ids[i],
            f.stack_key,
            # a CT, MR or PET class fixes the Modality (one that contradicts it makes the
            # instance unusable, refused naming it); another class (Secondary Capture)
            # does not, and a series of two Modalities in it is split
            "" if f.sop_class_uid in VOLUME_MODALITY else record.modality,
            f.is_localizer,
        )
        groups[key].append(i)

    keys = list(groups)
    regular = [k for k in keys if not k[-1]] or keys
    main = max(regular, key=lambda k: len(groups[k]))  # first of the largest wins ties
    main_size = len({frames[i].sop_instance_uid for i in groups[main]})

    dropped: list[SkippedFile] = []
    others: list[tuple[tuple[object, ...], frozenset[str]]] = []
    for key in keys:
        if key == main:
            continue
        reasons = _reasons(main, key)
        idx = groups[key]
        n_instances = len({frames[i].sop_instance_uid for i in idx})
        if key[-1] and not main[-1]:
            why = "localizer (ImageType LOCALIZER)"
        elif (
            "orientation" in reasons
            and n_instances <= max_localizer_slices < main_size
            and reasons <= {"orientation", "dimensions", "pixel_spacing"}
        ):
            why = f"localizer ({n_instances} instances with another orientation)"
        else:
            if reasons <= _SAME_STACK and _interleaved(frames, groups[main], idx):
                reasons = reasons | {"interleaved"}
            others.append((key, reasons))
            continue
        for src in dict.fromkeys(frames[i].source for i in idx):
            dropped.append(SkippedFile(src, why, SkipKind.SET_ASIDE))

    others.sort(key=lambda kr: -len(groups[kr[0]]))
    main_notes = [
        f"series also holds {len(groups[k])} frames with {_describe(r, frames[groups[k][0]])}, "
        f"split off as part {n}"
        for n, (k, r) in enumerate(others, start=1)
    ]
    all_reasons = frozenset().union(*(r for _, r in others)) if others else frozenset()
    headers = [
        _header(pairs, groups[main], 0, all_reasons, main_notes, dropped),
    ]
    for n, (key, reasons) in enumerate(others, start=1):
        note = f"split off from part 0 of its series: {_describe(reasons, frames[groups[key][0]])}"
        headers.append(_header(pairs, groups[key], n, reasons, [note], []))
    return headers


def _interleaved(frames: Sequence[FrameRef], main: Sequence[int], other: Sequence[int]) -> bool:
    """Whether images of another in-plane orientation, Rows/Columns or Pixel Spacing
    share the main part's slice normal and lie in the gaps between its slices: one
    stack some of whose images are turned, resized or resampled, not a localizer, a
    reformat or a stack beside it. Split apart (every other slice), each part has an
    even spacing and would load, however many images it lost."""
    normal = slice_normal(
        next((frames[i].orientation for i in main if frames[i].orientation), None)
    )
    other_normal = slice_normal(
        next((frames[i].orientation for i in other if frames[i].orientation), None)
    )
    if normal is None or other_normal is None:
        return False
    if abs(sum(a * b for a, b in zip(normal, other_normal, strict=True))) < 0.999:
        return False

    def along(i: int) -> float | None:
        position = frames[i].position
        return (
            None if position is None else sum(a * b for a, b in zip(normal, position, strict=True))
        )

    ours = sorted(d for i in main if (d := along(i)) is not None)
    theirs = [d for i in other if (d := along(i)) is not None]
    if not ours:
        return False
    # in a gap between two of ours; at one of our positions it is a second image of that
    # slice (another reconstruction), which the split keeps apart as before
    return any(
        ours[0] < d < ours[-1] and all(abs(d - o) > _POSITION_TOL for o in ours) for d in theirs
    )


def _reasons(main: tuple[object, ...], key: tuple[object, ...]) -> frozenset[str]:
    names = ("sop_class", "orientation", "dimensions", "pixel_spacing", "stack", "modality")
    return frozenset(n for n, a, b in zip(names, main, key, strict=False) if a != b)


def _describe(reasons: frozenset[str], sample: FrameRef) -> str:
    parts = []
    for reason in sorted(reasons - {"interleaved"}):  # a flag, not a difference
        text = _REASON_TEXT[reason]
        if reason == "dimensions":
            text += f" ({sample.pixel.rows}×{sample.pixel.columns})"
        parts.append(text)
    return ", ".join(parts)


def _header(
    pairs: list[tuple[InstanceRecord, FrameRef]],
    idx: list[int],
    part: int,
    reasons: frozenset[str],
    notes: list[str],
    dropped: list[SkippedFile],
) -> SeriesHeader:
    record, first = pairs[idx[0]]
    frames = tuple(pairs[i][1] for i in idx)
    records = {id(pairs[i][0]): pairs[i][0] for i in idx}.values()
    return SeriesHeader(
        series_instance_uid=record.series_instance_uid,
        study_instance_uid=record.study_instance_uid,
        modality=record.modality,
        series_description=record.series_description,
        series_number=record.series_number,
        body_part_examined=record.body_part_examined,
        frame_of_reference_uid=record.frame_of_reference_uid,
        sop_class_uid=first.sop_class_uid,
        image_type=record.image_type,
        slice_thickness=first.slice_thickness,
        number_of_instances=len({f.sop_instance_uid for f in frames}),
        patient=record.patient,
        frames=frames,
        absent_type2=tuple(sorted({kw for r in records for kw in r.absent_type2})),
        study_instance_uids=frozenset(r.study_instance_uid for r in records),
        frame_of_reference_uids=frozenset(r.frame_of_reference_uid for r in records),
        patient_identities=len({r.patient.identity for r in records}),
        part=part,
        split_reasons=reasons,
        notes=tuple(notes),
        dropped=tuple(dropped),
    )


def _cluster(values: Sequence[tuple[float, ...] | None], tol: float) -> list[int]:
    """Label values so that values within ``tol`` (per component) share a label."""
    centres: list[tuple[float, ...] | None] = []
    labels = []
    for value in values:
        label = next((n for n, c in enumerate(centres) if _close(value, c, tol)), None)
        if label is None:
            label = len(centres)
            centres.append(value)
        labels.append(label)
    return labels


def _close(a: tuple[float, ...] | None, b: tuple[float, ...] | None, tol: float) -> bool:
    if a is None or b is None:
        return a is b
    return all(abs(x - y) <= tol for x, y in zip(a, b, strict=True))

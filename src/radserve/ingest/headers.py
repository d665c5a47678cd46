"""One header-only read per file, turned into typed per-frame records.

A classic single-frame instance gives one :class:`FrameRef`; an enhanced multi-frame
instance gives one per frame, with position, orientation, spacing and rescale taken from
its per-frame functional groups (falling back to the shared groups). Extraction is
lenient: a malformed optional value becomes ``None`` and is judged later, where the
geometry is checked, so one odd tag never hides a whole file.

Reading is bounded whatever the file claims (see :class:`~radserve.ingest.policy.IngestPolicy`
for the limits): values over :data:`DEFER_BYTES` are skipped unread unless asked for, every
byte read into memory counts against ``max_header_bytes``, a Deflated file is inflated
into a spooled temporary file up to ``max_file_bytes``, and Number of Frames, Rows,
Columns and the pixel format are checked against the Pixel Data element's length (for
encapsulated data: its offset table and fragments) *before* any per-frame record is
made. What makes an instance unusable becomes a :class:`Problem` on its one frame
record; loading its series then fails naming the file.
"""

from __future__ import annotations

import contextlib
import functools
import io
import math
import os
import struct
import tempfile
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import PurePosixPath
from typing import Any, BinaryIO, cast

import pydicom
from pydicom.datadict import dictionary_description, dictionary_VR, tag_for_keyword
from pydicom.dataelem import RawDataElement
from pydicom.dataset import Dataset
from pydicom.filebase import DicomFileLike
from pydicom.filereader import _read_file_meta_info
from pydicom.filewriter import write_file_meta_info
from pydicom.tag import BaseTag
from pydicom.uid import (
    UID,
    CTImageStorage,
    DeflatedExplicitVRLittleEndian,
    ExplicitVRLittleEndian,
    ImplicitVRLittleEndian,
    MRImageStorage,
    PositronEmissionTomographyImageStorage,
    UID_dictionary,
)

from radserve.errors import NotDicomError
from radserve.ingest import rules
from radserve.ingest.encapsulated import Image, after_text, encapsulated_problem
from radserve.ingest.person_name import person_name_text
from radserve.ingest.policy import IngestPolicy
from radserve.ingest.sop_classes import VOLUME_MODALITY, is_localizer
from radserve.ingest.sources import (
    SPOOL_BYTES,
    BoundedStream,
    InputTooLargeError,
    SkipKind,
    SourceFile,
    SourceReader,
)

_PREAMBLE = 128
# First tag of a DICOM stream without preamble: group 0002 or 0008, little endian.
_BARE_STREAM_STARTS = (b"\x02\x00", b"\x08\x00")

DEFER_BYTES = 64 * 1024
"""Header values longer than this are skipped unread (a private blob costs a seek); the
few radserve reads are read on access, counted against ``max_header_bytes``."""
MAX_META_BYTES = 1 << 20  # the File Meta group is a few hundred bytes
MAX_RESCALE_SLOPE = 1e6
MAX_RESCALE_INTERCEPT = 1e6
_PIXEL_TAGS = {
    0x7FE00010: "Pixel Data",
    0x7FE00008: "Float Pixel Data",
    0x7FE00009: "Double Float Pixel Data",
}
_NATIVE_LITTLE = {ExplicitVRLittleEndian, ImplicitVRLittleEndian}
_LONG_VRS = {b"OB", b"OW", b"OF", b"OD", b"OL", b"OV", b"UN", b"SQ", b"UC", b"UR", b"UT"}
# Photometric Interpretations (PS3.3 C.7.6.3.1.2), one definition for ingest: the
# intensities a volume holds, the one-sample and the multi-sample defined terms (and the
# retired multi-sample ones, which no header passes but colour checks still name)
GREYSCALE = frozenset({"MONOCHROME1", "MONOCHROME2"})
_MONOCHROME = GREYSCALE | {"PALETTE COLOR"}
_COLOUR = frozenset(
    {"RGB", "YBR_FULL", "YBR_FULL_422", "YBR_PARTIAL_420", "YBR_PARTIAL_422", "YBR_ICT", "YBR_RCT"}
)
COLOUR_TERMS = _COLOUR | {"HSV", "ARGB", "CMYK", "XYB"}
_NUMBER_CHARS = set("0123456789+-.eE\\ naNifIFAty")


class SkipFile(Exception):
    """The file is not an image instance; ``reason`` says why (no patient data), ``kind``
    what it is (:class:`~radserve.ingest.sources.SkipKind`: one that may be an image
    whose header could not be read is reported by ingest)."""

    def __init__(self, reason: str, kind: SkipKind) -> None:
        super().__init__(reason)
        self.reason = reason
        self.kind = kind


@dataclass(frozen=True)
class Problem:
    """Why one instance cannot become part of a volume. ``code`` is the error code its
    series fails with; ``text`` says what is wrong (no patient data, no UIDs)."""

    code: str
    text: str


@dataclass(frozen=True, repr=False)
class PatientInfo:
    """Patient and request attributes that reports need; never logged (repr is redacted)."""

    patient_name: str = ""
    patient_id: str = ""
    patient_birth_date: str = ""
    patient_sex: str = ""
    accession_number: str = ""
    study_date: str = ""
    referring_physician_name: str = ""
    requested_procedure_priority: str = ""
    specific_character_set: tuple[str, ...] = ()
    # Issuer of Patient ID, and its Universal Entity ID (+ type: ISO, URI, UUID, ...)
    # from the Issuer of Patient ID Qualifiers Sequence, for the FHIR identifier system.
    issuer_of_patient_id: str = ""
    issuer_universal_entity_id: str = ""
    issuer_universal_entity_id_type: str = ""

    def __repr__(self) -> str:
        return "PatientInfo(<redacted>)"

    __str__ = __repr__

    @property
    def identity(self) -> tuple[str, str, str, str]:
        """Who the image is of (ID and its issuer, name, birth date): images of one series
        with two identities are two patients' images, whatever else they share."""
        return (
            self.patient_id,
            self.issuer_of_patient_id,
            _name_as_compared(self.patient_name),
            self.patient_birth_date,
        )

    def differs_from(self, other: PatientInfo) -> tuple[str, ...]:
        """The names of the :attr:`identity` attributes whose values differ from
        ``other``'s (never the values: they are the patient's)."""
        pairs = zip(IDENTITY_ATTRIBUTES, self.identity, other.identity, strict=True)
        return tuple(name for name, mine, theirs in pairs if mine != theirs)


# what PatientInfo.identity holds, in its order
IDENTITY_ATTRIBUTES = (
    "Patient ID",
    "Issuer of Patient ID",
    "Patient's Name",
    "Patient's Birth Date",
)


def _name_as_compared(name: str) -> str:
    """A Person Name without the trailing empty components and groups PS3.5 6.2 lets a
    writer add or omit (``DOE^JOHN^^`` is ``DOE^JOHN``), so that spelling alone never
    makes one patient two."""
    groups = [group.rstrip("^ ") for group in name.split("=")]
    while groups and not groups[-1]:
        groups.pop()
    return "=".join(groups)


@dataclass(frozen=True)
class PixelFormat:
    """How stored values are encoded; shared by all frames of one instance."""

    transfer_syntax_uid: str
    rows: int
    columns: int
    samples_per_pixel: int
    photometric_interpretation: str
    bits_allocated: int
    bits_stored: int
    pixel_representation: int
    padding: tuple[int, int] | None = None  # Pixel Padding Value [, Range Limit] (stored)
    # how the values were approximated, "" when they are the scanner's: Lossy Image
    # Compression 01, or a transfer syntax that is lossy whatever the header says
    lossy: str = ""
    lossy_ratio: float | None = None  # Lossy Image Compression Ratio, its first value


@dataclass(frozen=True)
class FrameRef:
    """One 2-D image: a single-frame instance or one frame of a multi-frame instance."""

    source: SourceFile
    frame_index: int | None  # 0-based frame of a multi-frame instance; None if single-frame
    sop_instance_uid: str
    sop_class_uid: str
    pixel: PixelFormat
    position: tuple[float, float, float] | None = None
    orientation: tuple[float, float, float, float, float, float] | None = None
    pixel_spacing: tuple[float, float] | None = None  # (row spacing, column spacing)
    slice_thickness: float | None = None
    spacing_between_slices: float | None = None
    rescale_slope: float = 1.0
    rescale_intercept: float = 0.0
    instance_number: int | None = None
    is_localizer: bool = False
    stack_key: tuple[str, ...] = ()  # temporal position / echo / b-value / stack id
    # a frame of an Enhanced (functional-group) instance: DICOM outputs name it by frame
    # number; a classic instance that merely has Number of Frames 1 is no such frame
    enhanced: bool = False
    problem: Problem | None = None  # the instance is unusable; its series fails on load
    note: str | None = None  # tolerated but flagged (e.g. padding after the pixel data)
    unusable: tuple[str, ...] = ()  # geometry values present but not numbers, as shown
    # Where the Pixel Data element of a single-frame native little-endian file starts,
    # as the header reader found it: the pixel reader reads the value there instead of
    # parsing the header a second time (checked again before it is trusted).
    pixel_offset: int | None = None

    @property
    def label(self) -> str:
        """How a message names this image: its Instance Number and SOP Instance UID (and,
        for a frame of a multi-frame instance, its frame number). Never by its file: the
        names of files, folders and zip members are the sender's (a PACS export names
        folders by patient name, ID and birth date), a stored file's path is the
        server's, and these messages reach job errors any read key sees, reports and the
        failure notices sent to the PACS and FHIR server."""
        instance = (
            f"instance {self.instance_number}"
            if self.instance_number is not None
            else "an instance"
        )
        frame = f"frame {self.frame_index + 1} of " if self.frame_index is not None else ""
        return f"{frame}{instance}{uid_shown(self.sop_instance_uid, 'SOP Instance UID')}"


def uid_shown(uid: str, what: str = "") -> str:
    """`` (<what> <uid>)`` for a message, or ``""`` when ``uid`` is no UID
    (:func:`radserve.ingest.rules.uid_problem`): a hostile header may put any text
    there, a name included."""
    if not uid or rules.uid_problem(uid, what or "UID") is not None:
        return ""
    return f" ({what} {uid})" if what else f" ({uid})"


@dataclass(frozen=True)
class InstanceRecord:
    """Series-level attributes of one instance plus its frames."""

    series_instance_uid: str
    study_instance_uid: str
    modality: str
    series_description: str
    series_number: int | None
    body_part_examined: str
    frame_of_reference_uid: str | None
    image_type: tuple[str, ...]
    patient: PatientInfo
    frames: tuple[FrameRef, ...] = field(repr=False)
    absent_type2: tuple[str, ...] = ()  # keywords of TYPE2_FOR_OUTPUTS missing from the header


def read_instance(
    reader: SourceReader,
    src: SourceFile,
    policy: IngestPolicy | None = None,
    patients: DiscoveryMemo | None = None,
) -> InstanceRecord:
    """Header-only, bounded read of one file; raises :class:`SkipFile` for anything but
    an image (or a header over ``policy.max_header_bytes``). ``patients``, shared by the
    reads of one discovery, builds each patient's :class:`PatientInfo` once."""
    with reader.open(src) as raw:
        return read_stream(raw, reader.size(src), src, policy, patients)


def is_bare_dicom(source: str | os.PathLike[str] | BinaryIO) -> bool:
    """Whether ``source`` (a path, or a stream at its start, left there) is DICOM without
    the Part 10 preamble and "DICM" marker, its first tag of group 0002 or 0008: a legacy
    file :func:`read_stream` reads with ``force``. A later reader of a file ingest took
    (the DICOM SEG/SR writers' :func:`read_header`) must read it alike: before, ``radserve
    run`` on such files ran the models and then failed ``report_failed``."""
    if isinstance(source, str | os.PathLike):
        with open(source, "rb") as raw:
            return is_bare_dicom(raw)
    at = source.tell()
    try:
        head = source.read(_PREAMBLE + 4)
    finally:
        source.seek(at)
    return head[_PREAMBLE:] != b"DICM" and head[:2] in _BARE_STREAM_STARTS


def read_stream(
    raw: BinaryIO,
    size: int,
    src: SourceFile,
    policy: IngestPolicy | None = None,
    patients: DiscoveryMemo | None = None,
) -> InstanceRecord:
    """:func:`read_instance` for an open, seekable stream of ``size`` bytes (an upload
    part); ``src`` only names it in messages."""
    policy = policy or IngestPolicy()
    patients = patients or DiscoveryMemo()
    raw.seek(0)
    head = raw.read(_PREAMBLE + 4)
    raw.seek(0)
    if head[_PREAMBLE:] == b"DICM":
        force = False
    elif is_bare_dicom(raw):
        force = True  # legacy file without preamble/meta: still DICOM
    else:
        raise _without_marker(head, src)
    try:
        try:
            return _read_record(raw, size, src, policy, patients, force=force, deflated=False)
        except _DeflatedDataSet:
            pass
        with inflated(
            raw,
            policy.max_file_bytes,
            preamble=not force,
            max_header_bytes=policy.max_header_bytes,
        ) as (stream, end):
            return _read_record(stream, end, src, policy, patients, force=force, deflated=True)
    except SkipFile:
        raise
    except InputTooLargeError as exc:
        raise SkipFile(f"header not read: {exc.message}", SkipKind.UNREADABLE) from exc
    except Exception as exc:  # pydicom raises many types on damaged input
        reason = f"unreadable DICOM header ({cause_name(exc)})"
        raise SkipFile(reason, SkipKind.UNREADABLE) from exc


# What a file without the "DICM" marker may plainly be instead (its first bytes): PDF,
# PNG, JPEG, GIF, zip, Windows and ELF programs, TIFF, gzip, OLE (Thumbs.db, .doc),
# AppleDouble (a Mac's "._" files), .DS_Store, bzip2, xz, 7-Zip, RAR, NIfTI-1 (both byte
# orders) and NIfTI-2, XML, RTF
_OTHER_FORMATS = (
    b"%PDF", b"\x89PNG", b"\xff\xd8\xff", b"GIF8", b"PK", b"MZ", b"\x7fELF", b"II*\x00",
    b"MM\x00*", b"\x1f\x8b", b"\xd0\xcf\x11\xe0", b"\x00\x05\x16\x07", b"\x00\x00\x00\x01Bud1",
    b"BZh", b"\xfd7zXZ", b"7z\xbc\xaf", b"Rar!", b"\x5c\x01\x00\x00", b"\x00\x00\x01\x5c",
    b"\x1c\x02\x00\x00", b"<?xml", b"{\\rtf",
)  # fmt: skip
_DICOM_SUFFIXES = frozenset({".dcm", ".dicom", ".dic", ".ima"})
_TEXT_CONTROLS = frozenset(range(32)) - {9, 10, 12, 13, 27}


def _without_marker(head: bytes, src: SourceFile) -> SkipFile:
    """Why a file without the "DICM" marker (nor a bare DICOM stream's first tag) is
    skipped, and whether it may be a damaged DICOM file: zeros where the preamble and
    marker belong (a file allocated and never written, a copy that stopped), or a file
    named as DICOM (a zip member: also one named by a number or nothing, as PACS exports
    name them) that is plainly no other format. Those are reported as unreadable
    (:attr:`SkipKind.UNREADABLE`): before, the last 5 members of a study's zip, zeroed,
    were skipped as "not DICOM" and the study ran on 35 of its 40 slices without a word.
    The name is only looked at, never said."""
    if head[:_PREAMBLE] and not head[:_PREAMBLE].strip(b"\0"):
        return SkipFile(
            "damaged DICOM file: zeros where its preamble and 'DICM' marker belong (a file "
            "allocated but never written?)",
            SkipKind.UNREADABLE,
        )
    name = PurePosixPath(src.name)
    suffix = name.suffix.lower()
    hidden = name.name.startswith(".") or (
        src.member is not None and "__MACOSX" in PurePosixPath(src.member).parts
    )
    named_dicom = suffix in _DICOM_SUFFIXES or (
        src.member is not None and (suffix == "" or suffix[1:].isdigit())
    )
    if named_dicom and not hidden and not head:
        return SkipFile("damaged DICOM file: empty", SkipKind.UNREADABLE)
    if named_dicom and not hidden and not _plainly_other_format(head):
        return SkipFile(
            "damaged DICOM file: no 'DICM' marker, and its bytes are no other format",
            SkipKind.UNREADABLE,
        )
    return SkipFile("not DICOM (no 'DICM' marker)", SkipKind.NOT_DICOM)


def _plainly_other_format(head: bytes) -> bool:
    """Whether ``head`` (a file's first bytes) starts a known other format, or is text."""
    if head.startswith(_OTHER_FORMATS):
        return True
    return b"\0" not in head and not _TEXT_CONTROLS.intersection(head)


class _DeflatedDataSet(Exception):
    """pydicom asked for the whole rest of the file: it does so only to inflate a Deflated
    data set, whole, in memory (a deflate bomb); :func:`inflated` does it bounded."""


class _HeaderStream(BoundedStream):
    """The bounded stream :func:`read_stream` gives pydicom, refusing a read of the whole
    rest (:class:`_DeflatedDataSet`): so pydicom's parse of the File Meta is the only one,
    where a check for the Deflated syntax first parsed it once more (0.1 of a 512x512 CT
    file's 1.4 CPU-ms). Its bounded read is :meth:`BoundedStream.read` for a size, not a
    call to it: pydicom reads ~180 times a header, and a second call each cost 0.06 ms."""

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            raise _DeflatedDataSet
        if size == 8:  # an element header (BoundedStream.count_element, inlined: hot)
            self.elements += 1
            if self.max_elements is not None and self.elements > self.max_elements:
                self.count_element(size)  # raises
        if size > self.limit - self.count:
            raise self._error(self.count + size)
        data = self._raw.read(size)
        self.count += len(data)
        return data


def _read_record(
    stream: BinaryIO,
    size: int,
    src: SourceFile,
    policy: IngestPolicy,
    patients: DiscoveryMemo,
    *,
    force: bool,
    deflated: bool,
) -> InstanceRecord:
    stream.seek(0)
    fh = _HeaderStream(
        stream,
        policy.max_header_bytes,
        "ingest.max_header_bytes",
        max_elements=policy.max_header_elements,
    )
    ds = pydicom.dcmread(
        cast(BinaryIO, fh), stop_before_pixels=True, force=force, defer_size=DEFER_BYTES
    )
    token = _CONVERTED.set(patients.values)
    try:
        return _record(ds, src, fh, size, policy, deflated, patients)
    finally:
        _CONVERTED.reset(token)


@contextmanager
def part10_stream(
    raw: BinaryIO, size: int, force: bool, max_bytes: int
) -> Iterator[tuple[BinaryIO, int, bool]]:
    """``raw`` as pydicom should read it: ``(stream, size, deflated)``; a Deflated
    Explicit VR Little Endian file through :func:`inflated`."""
    if force or not _is_deflated(raw):
        raw.seek(0)
        yield raw, size, False
        return
    with inflated(raw, max_bytes) as (stream, end):
        yield stream, end, True


@contextmanager
def inflated(
    raw: BinaryIO, max_bytes: int, *, preamble: bool = True, max_header_bytes: int | None = None
) -> Iterator[tuple[BinaryIO, int]]:
    """A Deflated Explicit VR Little Endian file (``raw``; without the 128-byte preamble
    and 'DICM' when not ``preamble``) inflated, chunk by chunk, into a spooled temporary
    file rewritten as Explicit VR Little Endian (and starting as ``raw`` does):
    ``(stream, size)``; refused once it passes ``max_bytes`` (pydicom would inflate it
    whole, in memory: a deflate bomb) and, given ``max_header_bytes`` (the header
    reader: every door's first read), once it passes what its own header declares
    (:func:`_declared_inflated_bytes`). The pixel decoder reads only files the header
    reader took, and inflates them within ``max_bytes``."""
    declared = (
        math.inf
        if max_header_bytes is None
        else _declared_inflated_bytes(raw, preamble, max_header_bytes)
    )
    raw.seek(0)
    head = raw.read(_PREAMBLE + 4) if preamble else b""
    meta = _read_file_meta_info(BoundedStream(raw, MAX_META_BYTES, "the File Meta limit"))
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    with tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES) as out:
        out.write(head)
        write_file_meta_info(DicomFileLike(out), meta, enforce_standard=False)
        inflater = zlib.decompressobj(-zlib.MAX_WBITS)
        base, total = out.tell(), 0
        chunk = raw.read(1 << 20)
        while chunk:
            data = inflater.decompress(chunk, 1 << 22)
            while data:
                total += len(data)
                if total > max_bytes:
                    raise InputTooLargeError(
                        f"the deflated data inflates to more than ingest.max_file_bytes={max_bytes}"
                    )
                if base + total > declared:
                    raise InputTooLargeError(
                        f"the Deflated data set inflates beyond the {declared} bytes its header "
                        "declares (the header, the Pixel Data its Rows, Columns, Samples per "
                        "Pixel, Bits Allocated and Number of Frames need, and at most "
                        "ingest.max_header_bytes after it): a deflate bomb, refused before "
                        "it is inflated further"
                    )
                out.write(data)
                data = inflater.decompress(inflater.unconsumed_tail, 1 << 22)
            chunk = raw.read(1 << 20)
        out.write(inflater.flush())
        end = out.tell()
        out.seek(0)
        yield cast(BinaryIO, out), end


def _declared_inflated_bytes(raw: BinaryIO, preamble: bool, max_header_bytes: int) -> int:
    """How many bytes a Deflated file (``raw``) may inflate to, by its own header: the
    header (inflated only as far as it is parsed, at most ``max_header_bytes``), the
    native Pixel Data its image attributes need, and at most ``max_header_bytes`` after
    that (the elements that may follow the Pixel Data). A 1 MB file inflating to 1 GiB
    of zeros after its 3 KB of pixels took 35 s and 1 GiB of the temporary folder, at
    discovery and again at decoding, and ran (2026-12-07); radserve inflated up to
    ``max_file_bytes`` (4 GiB) of any file."""
    policy = IngestPolicy()
    raw.seek(0)
    stream = InflatingStream(raw, max_header_bytes, preamble=preamble)
    try:
        ds = pydicom.dcmread(
            _bounded(cast(BinaryIO, stream), max_header_bytes, policy.max_header_elements),
            stop_before_pixels=True,
            defer_size=DEFER_BYTES,
            force=not preamble,
        )
    except InputTooLargeError:
        raise
    except Exception as exc:  # pydicom raises many types on damaged input
        raise UnreadableHeaderError(exc) from exc
    at = stream.tell()  # the Pixel Data element, or the end of the data set
    rows, columns = _int(ds, "Rows") or 0, _int(ds, "Columns") or 0
    samples = _int(ds, "SamplesPerPixel") or 1
    bits = _int(ds, "BitsAllocated") or 0
    frames = min(max(_int(ds, "NumberOfFrames") or 1, 1), policy.max_frames)
    pixels = -(-rows * columns * samples * frames * bits // 8)
    return at + 12 + pixels + max_header_bytes


def _is_deflated(raw: BinaryIO) -> bool:
    raw.seek(_PREAMBLE + 4)
    try:
        meta = _read_file_meta_info(BoundedStream(raw, MAX_META_BYTES, "the File Meta limit"))
    except InputTooLargeError:
        raise
    except Exception:
        return False  # pydicom judges the file itself
    return _text(meta, "TransferSyntaxUID") == DeflatedExplicitVRLittleEndian


def _record(
    ds: Dataset,
    src: SourceFile,
    fh: BoundedStream,
    size: int,
    policy: IngestPolicy,
    deflated: bool,
    patients: DiscoveryMemo,
) -> InstanceRecord:
    sop_class = _text(ds, "SOPClassUID")
    series_uid = _text(ds, "SeriesInstanceUID")
    sop_uid = _text(ds, "SOPInstanceUID")
    if not (sop_class and series_uid and sop_uid):
        # a DICOMDIR names its class only in the File Meta; any other such header may be
        # an image's, cut short (300 bytes of a 33 KB slice) or damaged
        declared = sop_class or _text(getattr(ds, "file_meta", None), "MediaStorageSOPClassUID")
        if declared and not _image_class(declared):
            raise SkipFile(f"not an image ({_class_name(declared)})", SkipKind.NOT_IMAGE)
        raise SkipFile(
            "DICOM without SOP Class/SOP Instance/Series Instance UID (a damaged or cut header?)",
            SkipKind.UNREADABLE,
        )
    rows, cols = _int(ds, "Rows"), _int(ds, "Columns")
    if not rows or not cols:
        name = _class_name(sop_class)
        if _image_class(sop_class):  # an image's header without its size: damaged
            missing = " and ".join(k for k, v in (("Rows", rows), ("Columns", cols)) if not v)
            raise SkipFile(f"{name} without a usable {missing}", SkipKind.UNREADABLE)
        raise SkipFile(f"not an image ({name})", SkipKind.NOT_IMAGE)
    pixel = PixelFormat(
        transfer_syntax_uid=str(DeflatedExplicitVRLittleEndian)
        if deflated
        else _transfer_syntax(ds, _found_implicit(fh)),
        rows=rows,
        columns=cols,
        samples_per_pixel=_int(ds, "SamplesPerPixel") or 1,
        photometric_interpretation=_text(ds, "PhotometricInterpretation").upper(),
        bits_allocated=_int(ds, "BitsAllocated") or 0,
        bits_stored=_bits_stored(ds),
        pixel_representation=_int(ds, "PixelRepresentation") or 0,
        padding=_padding(ds),
    )
    lossy, ratio = lossy_compression(ds, pixel.transfer_syntax_uid)
    pixel = replace(pixel, lossy=lossy, lossy_ratio=ratio)
    image_type = tuple(str(v).upper() for v in _values(ds, "ImageType"))
    common: dict[str, Any] = {
        "source": src,
        "sop_instance_uid": sop_uid,
        "sop_class_uid": sop_class,
        "pixel": pixel,
        "instance_number": _int(ds, "InstanceNumber"),
    }
    n_frames, problem = _frame_count(ds, policy)
    problem = (
        _size_problem(size, policy)
        or _identity_problem(ds, pixel)
        or _empty_type1_problem(ds)
        or _format_problem(ds, pixel, rows, cols)
        or _value_mapping_problem(ds, sop_class)
        or problem
        or _single_frame_problem(sop_class, n_frames)
        or _pixel_data_problem(ds, fh, pixel, n_frames or 1, size, policy.max_header_bytes)
    )
    if problem is None and (padding := _excess_padding(fh, pixel, n_frames or 1)):
        common["note"] = padding
    if problem is not None:
        frames: tuple[FrameRef, ...] = (
            replace(_classic_frames(ds, common, image_type, None)[0], problem=problem),
        )
    elif "PerFrameFunctionalGroupsSequence" in ds or "SharedFunctionalGroupsSequence" in ds:
        frames = _enhanced_frames(ds, common, image_type, n_frames or 1)
    else:
        frames = _classic_frames(ds, common, image_type, n_frames)
        offset = getattr(fh, "pixel_offset", None)
        if offset is not None and not deflated and len(frames) == 1 and problem is None:
            frames = (replace(frames[0], pixel_offset=offset),)
    return InstanceRecord(
        series_instance_uid=series_uid,
        study_instance_uid=_text(ds, "StudyInstanceUID"),
        modality=_text(ds, "Modality").upper(),
        series_description=_text(ds, "SeriesDescription"),
        series_number=_int(ds, "SeriesNumber"),
        body_part_examined=_text(ds, "BodyPartExamined"),
        frame_of_reference_uid=_text(ds, "FrameOfReferenceUID") or None,
        image_type=image_type,
        patient=patients.patient(ds),
        frames=frames,
        absent_type2=_absent_type2(ds, frames),
    )


def _absent_type2(ds: Dataset, frames: Sequence[FrameRef]) -> tuple[str, ...]:
    """The keywords of :data:`TYPE2_FOR_OUTPUTS` the instance lacks. An Enhanced
    (functional-group) instance keeps Slice Thickness in its Pixel Measures functional
    group (PS3.3 C.7.6.16.2.1), not at the top level, where its IOD has no Image Plane
    module: it lacks it only when no frame's group gives it (every conformant Enhanced CT
    was flagged "Type 2 attributes absent ...: SliceThickness" in its report before)."""
    absent = [kw for kw in TYPE2_FOR_OUTPUTS if kw not in ds]
    if "SliceThickness" in absent and any(
        f.enhanced and f.slice_thickness is not None for f in frames
    ):
        absent.remove("SliceThickness")
    return tuple(absent)


def _class_name(uid: str) -> str:
    """A SOP Class for a message: its name, or "an unknown SOP Class" (the value of a
    hostile header may be any text, a name included)."""
    return str(UID_dictionary[uid][0]) if uid in UID_dictionary else "an unknown SOP Class"


def _image_class(uid: str) -> bool:
    """Whether ``uid`` is an image storage SOP Class of the standard. An instance of
    another (SR, a DICOMDIR, a presentation state, a vendor's private non-image class)
    is passed over, never taken for a damaged image."""
    return uid in UID_dictionary and "Image Storage" in str(UID_dictionary[uid][0])


TYPE2_FOR_OUTPUTS = (
    "PatientName",
    "PatientID",
    "PatientBirthDate",
    "PatientSex",
    "StudyDate",
    "StudyTime",
    "StudyID",
    "AccessionNumber",
    "ReferringPhysicianName",
    "SliceThickness",
)
"""Type 2 attributes (present, possibly empty) that the DICOM SEG/SR writers copy from the
source header; an instance without them is non-conformant and is flagged at ingest."""


# --- what makes an instance unusable, found before any per-frame record is made -------------
_NAMED_MODALITIES = frozenset({"CT", "MR", "PT", "NM", "OT", "SC", "US", "CR", "DX", "XA", "RF"})


def _value_mapping_problem(ds: Dataset, sop_class: str) -> Problem | None:
    """What would make the stored values be read as other values than the writer meant:
    a Modality that contradicts the SOP Class (an "MR Image" read through a CT pipeline
    as HU), a Modality LUT Sequence (radserve applies only a linear Rescale), a CT Image
    without its Rescale Slope and Intercept (Type 1: absent, the stored values were read
    as HU, 1,024 too high, and the body became a "lesion"). Names attributes, never
    values but the Modality's defined term."""
    required = VOLUME_MODALITY.get(UID(sop_class))
    modality = _text(ds, "Modality").upper()
    if required and modality and modality != required:
        # a defined term is named; anything else is text of unknown origin: not quoted
        named = f"Modality {modality}" if modality in _NAMED_MODALITIES else "the Modality"
        return Problem(
            "instance_invalid",
            f"{named} contradicts the SOP Class {UID(sop_class).name}, whose images are "
            f"{required}: which of the two is right cannot be told, so neither is trusted",
        )
    if "ModalityLUTSequence" in ds:
        return Problem(
            "instance_invalid",
            "a Modality LUT Sequence (0028,3000) maps the stored values: radserve applies "
            "only Rescale Slope and Intercept, and would read them unmapped; send the "
            "series with Rescale Slope and Intercept",
        )
    if sop_class == CTImageStorage and not ("RescaleSlope" in ds and "RescaleIntercept" in ds):
        return Problem(
            "instance_invalid",
            "a CT Image without Rescale Slope and Intercept (Type 1, PS3.3 C.8.2.1): its "
            "stored values cannot be read as Hounsfield units",
        )
    return None


def _identity_problem(ds: Dataset, pixel: PixelFormat) -> Problem | None:
    """The rules of :mod:`radserve.ingest.rules` every door applies: UIDs results can
    reference, a transfer syntax not refused on purpose."""
    for keyword, what in _CHECKED_UIDS:  # a missing one: the checks of validate, as before
        value = _text(ds, keyword)
        if value and (text := rules.uid_problem(value, what)) is not None:
            return Problem("instance_invalid", text)
    if (text := rules.transfer_syntax_problem(pixel.transfer_syntax_uid)) is not None:
        return Problem("instance_invalid", text)
    return None


_CHECKED_UIDS = (
    ("SOPInstanceUID", "SOP Instance UID"),
    ("SeriesInstanceUID", "Series Instance UID"),
    ("StudyInstanceUID", "Study Instance UID"),
)


def _size_problem(size: int, policy: IngestPolicy) -> Problem | None:
    if size > policy.max_file_bytes:
        return Problem(
            "input_too_large",
            f"the file is {size} bytes, more than ingest.max_file_bytes={policy.max_file_bytes}",
        )
    return None


# Type 1 attributes whose value, once read, decides what the stored values mean; an
# empty one was read as absent and a default put in its place
_TYPE1_PIXEL = (
    ("SamplesPerPixel", "Samples per Pixel", "Image Pixel, PS3.3 C.7.6.3"),
    ("BitsStored", "Bits Stored", "Image Pixel, PS3.3 C.7.6.3"),
    ("PixelRepresentation", "Pixel Representation", "Image Pixel, PS3.3 C.7.6.3"),
    ("NumberOfFrames", "Number of Frames", "Multi-frame, PS3.3 C.7.6.6"),
)


def _empty_type1_problem(ds: Dataset) -> Problem | None:
    """A Type 1 attribute present with no value: read as absent, a default stood in for
    it (Pixel Representation 0: signed values read as unsigned; Bits Stored from Bits
    Allocated; Number of Frames 1: the other frames ignored), and a study read so ran.
    A Type 1 attribute must hold a value; which the sender meant cannot be told."""
    for keyword, name, module in _TYPE1_PIXEL:
        if _empty(ds, keyword):
            return Problem(
                "instance_invalid",
                f"{name} is present but empty (Type 1, {module}): how the stored values are "
                "to be read cannot be told, and no default is assumed",
            )
    return None


def _frame_count(ds: Dataset, policy: IngestPolicy) -> tuple[int | None, Problem | None]:
    """Number of Frames, or None when the attribute is absent (a single-frame instance)."""
    raw = _raw(ds, "NumberOfFrames")
    if raw is None or raw == "":
        return None, None
    value = _number(raw)
    if value is None or value != int(value) or value < 1:
        return None, Problem(
            "instance_invalid", f"Number of Frames is {_shown(raw)}, not a positive integer"
        )
    if value > policy.max_frames:
        return None, Problem(
            "input_too_large",
            f"Number of Frames is {int(value)}, more than ingest.max_frames={policy.max_frames}",
        )
    return int(value), None


def _format_problem(ds: Dataset, pixel: PixelFormat, rows: int, cols: int) -> Problem | None:
    spp, photometric = pixel.samples_per_pixel, pixel.photometric_interpretation
    why = None
    if rows < 0 or cols < 0 or rows > 65535 or cols > 65535:
        why = f"Rows × Columns is {rows} × {cols}"
    elif spp not in (1, 3):
        why = f"Samples per Pixel is {spp} (1 or 3 expected)"
    elif photometric in _MONOCHROME and spp != 1:
        why = f"Photometric Interpretation {photometric} with Samples per Pixel {spp} (1 expected)"
    elif photometric in _COLOUR and spp != 3:
        why = f"Photometric Interpretation {photometric} with Samples per Pixel {spp} (3 expected)"
    elif photometric not in _MONOCHROME | _COLOUR:
        # a code string, not a number: described, never quoted (it may hold anything)
        known = ", ".join(sorted(_MONOCHROME | _COLOUR))
        why = "Photometric Interpretation is " + (
            f"none of {known} ({len(photometric)} characters)" if photometric else "missing"
        )
    elif pixel.bits_allocated not in (1, 8, 16, 32, 64):
        raw = _raw(ds, "BitsAllocated")
        why = f"Bits Allocated is {_shown(raw) if raw else 'missing'}"
    elif not 1 <= pixel.bits_stored <= pixel.bits_allocated:
        why = f"Bits Stored {pixel.bits_stored} does not fit Bits Allocated {pixel.bits_allocated}"
    elif (high := _high_bit_problem(ds, pixel)) is not None:
        why = high
    elif pixel.pixel_representation not in (0, 1):
        why = f"Pixel Representation is {pixel.pixel_representation} (0 or 1 expected)"
    return (
        Problem("instance_invalid", f"{why}: the pixel format is not consistent") if why else None
    )


def _bits_stored(ds: Dataset) -> int:
    """Bits Stored; Bits Allocated when it is absent (a lenient reading of a Type 1
    attribute some old files lack; an empty one is refused, :func:`_empty_type1_problem`).
    A Bits Stored of 0 is 0, refused: it was read as absent, Bits Allocated stood in, and
    a study of Bits Stored 0 ran (session 43)."""
    stored = _int(ds, "BitsStored")
    return stored if stored is not None else (_int(ds, "BitsAllocated") or 0)


def _high_bit_problem(ds: Dataset, pixel: PixelFormat) -> str | None:
    """High Bit must be Bits Stored - 1 (PS3.5 8.1.1: the stored bits are the low bits
    of each value; the other bit positions earlier editions allowed are retired, and
    pydicom and the decoders radserve uses read the low Bits Stored bits whatever High
    Bit says). A High Bit that says otherwise contradicts the pixel format:
    High Bit 15 with Bits Stored 12 (the values in the upper bits?), or Bits Stored 1
    with High Bit 11, which ran masked to 1 bit (session 43). Tolerated: an absent,
    empty or unreadable High Bit (the Bits Stored decide, as they do for the decoders)."""
    high = _int(ds, "HighBit")
    if high is None or high == pixel.bits_stored - 1:
        return None
    return (
        f"High Bit {high} with Bits Stored {pixel.bits_stored} (High Bit must be Bits "
        "Stored - 1, PS3.5 8.1.1: which bits hold the values cannot be told)"
    )


# SOP Classes whose IOD has no Multi-frame Module: an instance is one image (PS3.3 A.3,
# A.4, A.21); Number of Frames 1 is tolerated
_SINGLE_FRAME_CLASSES = frozenset(
    {CTImageStorage, MRImageStorage, PositronEmissionTomographyImageStorage}
)


def _single_frame_problem(sop_class: str, n_frames: int | None) -> Problem | None:
    """A CT, MR or PET Image (a single-frame SOP Class) claiming several frames: failed
    as "80 of 80 frames have no Image Position (Patient)" (session 43), its frames
    having no position of their own; the instance itself is at fault."""
    if n_frames is None or n_frames <= 1 or sop_class not in _SINGLE_FRAME_CLASSES:
        return None
    return Problem(
        "instance_invalid",
        f"Number of Frames is {n_frames} in an instance of {UID(sop_class).name}, a single-frame "
        "SOP Class (its IOD has no Multi-frame Module, PS3.3 A.3, A.4, A.21): which frame is "
        "the "
        "image, and where the others lie, cannot be told; send one image per instance, or "
        "an Enhanced (multi-frame) instance",
    )


def _pixel_data_problem(
    ds: Dataset, fh: BoundedStream, pixel: PixelFormat, n_frames: int, size: int, max_after: int
) -> Problem | None:
    """Whether the Pixel Data element (``fh`` is at its tag) holds what the header says,
    and at most ``max_after`` bytes follow it (``ingest.max_header_bytes``: what follows
    the pixel data is bounded as what precedes it; a 1 MB zip whose member held 1 GiB of
    zeros after its 3 KB of pixels cost 1 GiB of the temporary folder, copied out to be
    decoded, and ran)."""
    _implicit, little = ds.original_encoding
    endian = "<" if little is not False else ">"
    element_at = fh.tell()
    header = fh.read(8)
    if len(header) < 8:
        return Problem("decode_failed", "the file has no Pixel Data (truncated after the header?)")
    group, element = struct.unpack(endian + "HH", header[:4])
    name = _PIXEL_TAGS.get(group << 16 | element)
    if name is None:
        return Problem("decode_failed", "the header is not followed by Pixel Data")
    length = _element_length(header, fh, endian)
    start = fh.tell()
    available = size - start
    if length != 0xFFFFFFFF:
        fh.pixel_length = length  # type: ignore[attr-defined]  # for _excess_padding
        if name == "Pixel Data" and endian == "<":
            fh.pixel_offset = element_at  # type: ignore[attr-defined]  # for native_pixel_value
        return _native_problem(name, length, available, pixel, n_frames) or _after_problem(
            name, available - length, max_after
        )
    problem = encapsulated_problem(
        ds,
        fh,
        endian,
        size,
        n_frames,
        Image(
            pixel.transfer_syntax_uid,
            pixel.rows,
            pixel.columns,
            pixel.samples_per_pixel,
            pixel.bits_allocated,
        ),
        max_after=max_after,
    )
    return Problem(*problem) if problem is not None else None


def _after_problem(name: str, after: int, max_after: int) -> Problem | None:
    if after <= max_after:
        return None
    return Problem("input_too_large", after_text(name, after, max_after))


def native_pixel_value(raw: BinaryIO, offset: int, nbytes: int) -> bytes | None:
    """The first ``nbytes`` of the little-endian native Pixel Data value whose element
    starts at ``offset`` (:attr:`FrameRef.pixel_offset`), or None when the element found
    there is not that: then the caller reads the file the general way."""
    raw.seek(offset)
    header = raw.read(8)
    if len(header) < 8 or struct.unpack("<HH", header[:4]) != (0x7FE0, 0x0010):
        return None
    length = _element_length(header, raw, "<")
    if length == 0xFFFFFFFF or length < nbytes:
        return None
    data = raw.read(nbytes)
    return data if len(data) == nbytes else None


def _element_length(header: bytes, fh: BinaryIO, endian: str) -> int:
    """The value length of the element whose first 8 bytes are ``header`` (``fh`` just
    after them; a long explicit VR's length is read from it)."""
    if _implicit_header(header):  # the element's own bytes decide (see _found_implicit)
        return int(struct.unpack(endian + "L", header[4:])[0])
    if header[4:6] in _LONG_VRS:
        return int(struct.unpack(endian + "L", fh.read(4))[0])
    return int(struct.unpack(endian + "H", header[6:])[0])


def _native_problem(
    name: str, length: int, available: int, pixel: PixelFormat, n_frames: int
) -> Problem | None:
    if length > available:
        return Problem(
            "decode_failed",
            f"the file is truncated: {name} declares {length} bytes but only {max(available, 0)} "
            "follow",
        )
    samples = pixel.rows * pixel.columns * pixel.samples_per_pixel
    if pixel.bits_allocated == 1:
        expected = -(-samples * n_frames // 8)
    else:
        expected = samples * (pixel.bits_allocated // 8) * n_frames
    frames = f"{n_frames} frames of " if n_frames != 1 else ""
    what = (
        f"{frames}{pixel.rows} × {pixel.columns} × {pixel.samples_per_pixel} samples of "
        f"{pixel.bits_allocated} bits"
    )
    if length < expected:
        return Problem(
            "decode_failed",
            f"{name} holds {length} bytes, but {what} need {expected} (Number of Frames, Rows "
            "or Columns larger than the data, or a truncated file)",
        )
    frame = expected // n_frames if n_frames else expected
    if length - expected >= max(frame, 2):
        return Problem(
            "instance_invalid",
            f"{name} holds {length} bytes, room for more frames than the {expected} that "
            f"{what} need (Rows, Columns or Number of Frames smaller than the data)",
        )
    return None


def _excess_padding(fh: BoundedStream, pixel: PixelFormat, n_frames: int) -> str | None:
    """A note when native Pixel Data holds more than the frames need (but less than one
    more frame): pydicom ignores the excess; it is tolerated and flagged."""
    declared = getattr(fh, "pixel_length", None)
    if declared is None or pixel.bits_allocated < 8:
        return None
    need = pixel.rows * pixel.columns * pixel.samples_per_pixel * pixel.bits_allocated // 8
    excess = declared - need * n_frames
    return f"{excess} bytes after the last frame's pixel data were ignored" if excess > 1 else None


def _classic_frames(
    ds: Dataset, common: dict[str, Any], image_type: tuple[str, ...], n_frames: int | None
) -> tuple[FrameRef, ...]:
    stack = [
        f"{label}={v}"
        for label, kw in (
            ("temporal", "TemporalPositionIdentifier"),
            ("echo", "EchoNumbers"),
            ("b", "DiffusionBValue"),
        )
        if (v := _text(ds, kw))
    ]
    slope, intercept, problem = _rescale(ds, None)
    unusable: list[str] = []
    frame = FrameRef(
        **common,
        frame_index=None,
        position=_geometry(ds, "ImagePositionPatient", 3, unusable),  # type: ignore[arg-type]
        orientation=_geometry(ds, "ImageOrientationPatient", 6, unusable),  # type: ignore[arg-type]
        pixel_spacing=_geometry(ds, "PixelSpacing", 2, unusable),  # type: ignore[arg-type]
        slice_thickness=_distance(ds, "SliceThickness"),
        spacing_between_slices=_distance(ds, "SpacingBetweenSlices"),
        rescale_slope=slope,
        rescale_intercept=intercept,
        is_localizer=is_localizer(image_type),
        stack_key=tuple(stack),
        problem=problem,
        unusable=tuple(unusable),
    )
    if n_frames is None or problem is not None:
        return (frame,)
    if n_frames == 1:
        return (replace(frame, frame_index=0),)
    # Multi-frame without functional groups (cine, NM, dose grids): frames have no
    # per-frame position of their own, so geometry is left unknown and judged at load.
    # n_frames was checked against the pixel data and ingest.max_frames before this.
    return tuple(replace(frame, frame_index=i, position=None) for i in range(n_frames))


def _enhanced_frames(
    ds: Dataset, common: dict[str, Any], image_type: tuple[str, ...], n: int
) -> tuple[FrameRef, ...]:
    shared = _first_item(ds, "SharedFunctionalGroupsSequence") or Dataset()
    per_frame: Sequence[Dataset] = ds.get("PerFrameFunctionalGroupsSequence") or ()
    if per_frame and len(per_frame) != n:
        problem = Problem(
            "instance_invalid",
            f"{len(per_frame)} per-frame functional groups for {n} frames (Number of Frames)",
        )
        return (replace(_classic_frames(ds, common, image_type, None)[0], problem=problem),)
    frames = []
    for i in range(n):
        groups = (per_frame[i] if per_frame else Dataset(), shared)
        fg = partial(_group_item, groups)
        frame_type = _frame_type(groups) or image_type
        stack = [
            f"{label}={_text(item, kw)}"
            for label, seq, kw in (
                ("stack", "FrameContentSequence", "StackID"),
                ("temporal", "FrameContentSequence", "TemporalPositionIndex"),
                ("echo", "MREchoSequence", "EffectiveEchoTime"),
                ("b", "MRDiffusionSequence", "DiffusionBValue"),
            )
            if (item := fg(seq, kw)) is not None and _text(item, kw)
        ]
        measures = fg("PixelMeasuresSequence", "PixelSpacing")
        thickness = fg("PixelMeasuresSequence", "SliceThickness")
        between = fg("PixelMeasuresSequence", "SpacingBetweenSlices")
        position = fg("PlanePositionSequence", "ImagePositionPatient")
        orientation = fg("PlaneOrientationSequence", "ImageOrientationPatient")
        rescale = fg("PixelValueTransformationSequence", "RescaleSlope")
        slope, intercept, problem = _rescale(rescale, ds)
        problem = _both_groups_problem(groups, i) or problem
        unusable: list[str] = []
        frames.append(
            FrameRef(
                **common,
                frame_index=i,
                enhanced=True,
                position=_geometry(position, "ImagePositionPatient", 3, unusable),  # type: ignore[arg-type]
                orientation=_geometry(orientation, "ImageOrientationPatient", 6, unusable),  # type: ignore[arg-type]
                pixel_spacing=_geometry(measures, "PixelSpacing", 2, unusable),  # type: ignore[arg-type]
                slice_thickness=_distance(thickness, "SliceThickness"),
                spacing_between_slices=_distance(between, "SpacingBetweenSlices"),
                rescale_slope=slope,
                rescale_intercept=intercept,
                is_localizer=is_localizer(frame_type),
                stack_key=tuple(stack),
                unusable=tuple(unusable),
            )
        )
        if problem is not None:  # one bad frame makes the instance unusable
            return (replace(frames[-1], frame_index=None, problem=problem),)
    return tuple(frames)


def _rescale(item: Dataset | None, fallback: Dataset | None) -> tuple[float, float, Problem | None]:
    """Rescale Slope and Intercept: 1 and 0 when absent, a :class:`Problem` when present
    but not usable (empty, text, NaN, infinite, zero slope, absurd magnitudes): such
    values used to become 1 and 0 silently, scaling every voxel wrongly."""
    values = []
    for keyword, default, limit in (
        ("RescaleSlope", 1.0, MAX_RESCALE_SLOPE),
        ("RescaleIntercept", 0.0, MAX_RESCALE_INTERCEPT),
    ):
        raw = _raw(item, keyword)
        if raw is None and fallback is not None:
            raw = _raw(fallback, keyword)
        if raw is None:
            values.append(default)
            continue
        if raw == "":
            # Type 1 where present (CT Image C.8.2.1, Modality LUT C.11.1): an empty one
            # was read as absent, 1 or 0 stood in, and the stored values ran as HU
            name = "Rescale Slope" if keyword == "RescaleSlope" else "Rescale Intercept"
            return (
                1.0,
                0.0,
                Problem(
                    "instance_invalid",
                    f"{name} is present but empty (Type 1, PS3.3 C.8.2.1 / C.11.1): the "
                    "stored values cannot be mapped to physical units, and no default is "
                    "assumed",
                ),
            )
        value = _number(raw)
        if value is None or abs(value) > limit or (keyword == "RescaleSlope" and value == 0):
            name = "Rescale Slope" if keyword == "RescaleSlope" else "Rescale Intercept"
            rule = (
                "finite, non-zero, at most 1e6 in magnitude"
                if keyword == "RescaleSlope"
                else ("finite, at most 1e6 in magnitude")
            )
            return (
                1.0,
                0.0,
                Problem(
                    "instance_invalid", f"{name} is {_shown(raw)}; it must be a number, {rule}"
                ),
            )
        values.append(value)
    return values[0], values[1], None


def _geometry(
    ds: Dataset | None, keyword: str, count: int, unusable: list[str]
) -> tuple[float, ...] | None:
    """``count`` finite numbers, or None; a value present but unusable is also noted in
    ``unusable`` (attribute and value as shown), for the error that rejects the stack."""
    value = _floats(ds, keyword, count)
    if value is None:
        raw = _raw(ds, keyword)
        if raw:
            unusable.append(f"{_NAMES.get(keyword, keyword)} {_shown(raw)}")
    return value


_NAMES = {
    "ImagePositionPatient": "Image Position (Patient)",
    "ImageOrientationPatient": "Image Orientation (Patient)",
    "PixelSpacing": "Pixel Spacing",
}


# the functional groups radserve reads geometry and values from, and their attributes
_READ_GROUPS = (
    ("PixelMeasuresSequence", ("PixelSpacing", "SliceThickness", "SpacingBetweenSlices")),
    ("PlanePositionSequence", ("ImagePositionPatient",)),
    ("PlaneOrientationSequence", ("ImageOrientationPatient",)),
    ("PixelValueTransformationSequence", ("RescaleSlope", "RescaleIntercept")),
)


def _both_groups_problem(groups: tuple[Dataset, Dataset], index: int) -> Problem | None:
    """A functional group in both the frame's and the shared groups, with other values:
    PS3.3 C.7.6.16 allows each in one of the two only. The frame's was read (0.5 mm
    pixels per frame against 1 mm shared ran on 0.5 mm, 2026-12-07); which one the
    writer meant cannot be told, and a wrong Pixel Spacing scales every measurement."""
    frame, shared = groups
    for sequence, keywords in _READ_GROUPS:
        own, common = _first_item(frame, sequence), _first_item(shared, sequence)
        if own is None or common is None:
            continue
        differ = [
            k for k in keywords if k in own and k in common and _raw(own, k) != _raw(common, k)
        ]
        if differ:
            return Problem(
                "instance_invalid",
                f"frame {index + 1}: {dictionary_description(differ[0])} differs between its "
                f"own and the shared {dictionary_description(sequence).removesuffix(' Sequence')} "
                "functional group: PS3.3 C.7.6.16 allows a group in one of the two only, and "
                "which value holds cannot be told",
            )
    return None


def _group_item(groups: tuple[Dataset, ...], sequence: str, keyword: str) -> Dataset | None:
    """The functional-group item holding ``keyword``: per-frame first, then shared."""
    for group in groups:
        item = _first_item(group, sequence)
        if item is not None and keyword in item:
            return item
    return None


def _frame_type(groups: tuple[Dataset, ...]) -> tuple[str, ...]:
    for group in groups:
        for sequence in ("CTImageFrameTypeSequence", "MRImageFrameTypeSequence"):
            item = _first_item(group, sequence)
            if item is not None and "FrameType" in item:
                return tuple(str(v).upper() for v in _values(item, "FrameType"))
    return ()


class DiscoveryMemo:
    """What the header reads of one discovery share, so that what every instance of a
    series repeats is worked out once.

    :class:`PatientInfo` is built once per patient, not once per instance: its 12
    attributes (pydicom's conversion, the name's decoding) were a seventh of a 512x512 CT
    header's read. Two headers whose patient elements hold the same bytes, read in the
    same encoding and character set, with the same sequence values, give the same
    PatientInfo; a header without Specific Character Set (its name's set is guessed from
    all its text) or with a converted value is built alone.

    ``values``: pydicom's conversion of a repeated element (:func:`_get`), by its tag, VR,
    byte order and bytes, for the VRs whose value depends on nothing else (numbers, UIDs,
    codes, dates; not text a character set decodes): 88 % of a 300-slice CT's conversions
    were of a value an earlier instance had (Rows, Pixel Spacing, the series' UIDs...).
    At most ``_MEMO_MAX_ENTRIES``; values that only one instance has stop being added then.

    Lives as long as the discovery (patient data only in memory, never logged)."""

    def __init__(self) -> None:
        self._known: dict[tuple[object, ...], PatientInfo] = {}
        self.values: dict[tuple[object, ...], Any] = {}

    def patient(self, ds: Dataset) -> PatientInfo:
        nested = _patient_sequences(ds)
        key = _patient_key(ds, nested)
        if key is None:
            return _patient(ds, nested)
        found = self._known.get(key)
        if found is None:
            found = self._known[key] = _patient(ds, nested)
        return found


_PATIENT_KEYWORDS = (
    "PatientName",
    "PatientID",
    "PatientBirthDate",
    "PatientSex",
    "AccessionNumber",
    "StudyDate",
    "ReferringPhysicianName",
    "RequestedProcedurePriority",
    "IssuerOfPatientID",
)
"""The top-level elements :func:`_patient` reads, but Specific Character Set."""


def _patient_key(ds: Dataset, nested: tuple[str, str, str]) -> tuple[object, ...] | None:
    """What :func:`_patient` depends on (the declared character set, the encodings
    pydicom decodes by, the patient elements' bytes, what the sequences gave), or None
    when those elements are not all raw bytes."""
    declared = tuple(str(v) for v in _values(ds, "SpecificCharacterSet"))
    if not any(declared):
        return None  # none declared: the name's is guessed from all the header's text
    key: list[object] = [declared, tuple(ds.original_character_set), ds.original_encoding, nested]
    for keyword in _PATIENT_KEYWORDS:
        tag = _tag(keyword)
        element = ds.get_item(tag) if tag in ds else None
        if element is None:
            key.append(None)
        elif isinstance(element, RawDataElement) and isinstance(element.value, bytes):
            key.append((element.VR, element.value))
        else:
            return None
    return tuple(key)


def _patient_sequences(ds: Dataset) -> tuple[str, str, str]:
    """Requested Procedure Priority of the Request Attributes Sequence, and the Issuer
    of Patient ID Qualifiers' Universal Entity ID and its type ("" when absent)."""
    request = _first_item(ds, "RequestAttributesSequence")
    qualifiers = _first_item(ds, "IssuerOfPatientIDQualifiersSequence")
    return (
        _text(request, "RequestedProcedurePriority"),
        _text(qualifiers, "UniversalEntityID"),
        _text(qualifiers, "UniversalEntityIDType").upper(),
    )


def _patient(ds: Dataset, nested: tuple[str, str, str]) -> PatientInfo:
    request_priority, issuer_uid, issuer_uid_type = nested
    priority = _text(ds, "RequestedProcedurePriority") or request_priority
    return PatientInfo(
        patient_name=person_name_text(ds, "PatientName"),  # no ISO 2022 escapes left
        patient_id=_text(ds, "PatientID"),
        patient_birth_date=_text(ds, "PatientBirthDate"),
        patient_sex=_text(ds, "PatientSex"),
        accession_number=_text(ds, "AccessionNumber"),
        study_date=_text(ds, "StudyDate"),
        referring_physician_name=_text(ds, "ReferringPhysicianName"),
        requested_procedure_priority=priority.upper(),
        specific_character_set=tuple(str(v) for v in _values(ds, "SpecificCharacterSet")),
        issuer_of_patient_id=_text(ds, "IssuerOfPatientID"),
        issuer_universal_entity_id=issuer_uid,
        issuer_universal_entity_id_type=issuer_uid_type,
    )


def _implicit_header(header: bytes) -> bool:
    """Whether an element header (tag, then VR or length) is Implicit VR: no VR of two
    upper-case letters after the tag (pydicom's own test)."""
    return not all(0x40 < b < 0x5B for b in header[4:6])


def _found_implicit(fh: BinaryIO) -> bool | None:
    """Whether the element at ``fh`` (Pixel Data, after a header-only read) is Implicit
    VR; None when nothing follows. ``fh`` is left where it was.

    A file whose meta says Explicit VR Little Endian but whose data set is Implicit VR
    (pydicom: "Expected explicit VR, but found implicit VR") is read by pydicom as
    implicit, while its ``original_encoding`` and meta still say explicit; the length of
    Pixel Data, and the decoder, must follow what is found, not what is declared."""
    at = fh.tell()
    header = fh.read(8)
    fh.seek(at)
    return _implicit_header(header) if len(header) == 8 else None


def _transfer_syntax(ds: Dataset, found_implicit: bool | None = None) -> str:
    meta = getattr(ds, "file_meta", None)
    uid = _text(meta, "TransferSyntaxUID") if meta is not None else None
    if uid in _NATIVE_LITTLE and found_implicit is not None:
        # native little endian: the encoding found is the one the bytes have
        return str(ImplicitVRLittleEndian if found_implicit else ExplicitVRLittleEndian)
    if uid:
        return str(uid)
    implicit, _little = ds.original_encoding
    return str(ImplicitVRLittleEndian if implicit else ExplicitVRLittleEndian)


def _padding(ds: Dataset) -> tuple[int, int] | None:
    value = _int(ds, "PixelPaddingValue")
    if value is None:
        return None
    limit = _int(ds, "PixelPaddingRangeLimit")
    return (min(value, limit), max(value, limit)) if limit is not None else (value, value)


# Lossy Image Compression Method (0028,2114) defined terms (PS3.3 C.7.6.1.1.5.1)
_LOSSY_METHODS = {
    "ISO_10918_1": "JPEG",
    "ISO_14495_1": "JPEG-LS near-lossless",
    "ISO_15444_1": "JPEG 2000",
    "ISO_15444_15": "HTJ2K",
    "ISO_18181_1": "JPEG XL",
    "ISO_13818_2": "MPEG2",
    "ISO_14496_10": "MPEG-4 AVC/H.264",
    "ISO_23008_2": "HEVC/H.265",
}
# transfer syntaxes that cannot hold the values exactly, whatever the header says
_LOSSY_SYNTAXES = {
    "1.2.840.10008.1.2.4.50": "JPEG Baseline",
    "1.2.840.10008.1.2.4.51": "JPEG Extended",
}


def lossy_compression(ds: Dataset, syntax: str) -> tuple[str, float | None]:
    """How the stored values were approximated ("" when they were not) and the first
    Lossy Image Compression Ratio: Lossy Image Compression (0028,2110) "01" (the method
    named when it is a defined term), else a lossy-only transfer syntax. JPEG 2000 and
    JPEG-LS syntaxes that may hold exact values count only by that attribute."""
    ratio = _float_first(ds, "LossyImageCompressionRatio")
    if _text(ds, "LossyImageCompression") == "01":
        methods = [
            _LOSSY_METHODS.get(str(m).strip().upper())
            for m in _values(ds, "LossyImageCompressionMethod")
        ]
        named = ", ".join(dict.fromkeys(m for m in methods if m)) or "method not named"
        return f"Lossy Image Compression 01, {named}", ratio
    if syntax in _LOSSY_SYNTAXES:
        return f"{_LOSSY_SYNTAXES[syntax]} transfer syntax", ratio
    return "", None


def _float_first(ds: Dataset, keyword: str) -> float | None:
    values = _values(ds, keyword)
    try:
        value = float(values[0]) if values else None
    except (TypeError, ValueError):
        return None
    return value if value is not None and math.isfinite(value) and value > 0 else None


# --- lenient value access: a malformed optional value is None, never an exception ------------
def _raw(ds: Dataset | None, keyword: str) -> str | None:
    """The value as stored (text for string VRs), None when absent; never converted, so
    text in a numeric attribute is seen as text rather than dropped as missing."""
    tag = tag_for_keyword(keyword)
    if ds is None or tag is None:
        return None
    try:
        if tag not in ds:
            return None
        elem = ds.get_item(tag, keep_deferred=True)
    except Exception:
        return "<unreadable>"
    value = getattr(elem, "value", None)
    if value is None:
        return "" if not getattr(elem, "length", 0) else f"<{elem.length} bytes>"
    if isinstance(value, bytes):
        return value.decode("latin-1").strip(" \0")
    if isinstance(value, list | tuple | pydicom.multival.MultiValue):
        return "\\".join(str(v) for v in value)
    return str(value).strip()


def _empty(ds: Dataset | None, keyword: str) -> bool:
    """Whether ``keyword`` is present with a zero-length value. Not ``_raw(...) == ""``:
    that strips NUL bytes, so a binary 0 (US 0x0000) reads as "" too."""
    if ds is None:
        return False
    tag = _tag(keyword)
    try:
        if tag not in ds:
            return False
        element = ds.get_item(tag, keep_deferred=True)
    except Exception:
        return False
    if isinstance(element, RawDataElement):
        if element.length == 0:
            return True
        text = (element.VR or _dictionary_vr(tag)) in ("DS", "IS")  # padding only: empty
        return text and isinstance(element.value, bytes) and not element.value.strip(b" \0")
    value = element.value
    if isinstance(value, str | bytes | list | tuple | pydicom.multival.MultiValue):
        return not value
    return value is None


def _number(raw: str) -> float | None:
    """One finite number from a stored value, else None."""
    if "\\" in raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _shown(raw: str) -> str:
    """A stored value fit for a message: numbers as written (shortened), anything else
    only described, since a hostile sender may have put patient data in any field."""
    if raw and set(raw) <= _NUMBER_CHARS and len(raw) <= 64:
        return repr(raw)
    return f"not a number ({len(raw)} characters)"


def _get(ds: Dataset | None, keyword: str) -> Any:
    """The value of ``keyword`` in ``ds`` (converted by pydicom), None when absent.
    Looked up by tag: ``Dataset.get(keyword)`` goes through ``__getattr__`` and a keyword
    look-up first, a sixth of a 512x512 CT header's attribute extraction. Within a
    discovery, a value another instance's element had to the byte is taken from
    :attr:`DiscoveryMemo.values`, not converted again."""
    if ds is None:
        return None
    tag = _tag(keyword)
    memo = _CONVERTED.get()
    if memo is None or (key := _memo_key(tag, ds.get_item(tag, keep_deferred=True))) is None:
        return _converted(ds, tag)
    value = memo.get(key, _UNSEEN)
    if value is _UNSEEN:
        value = _converted(ds, tag)  # a value pydicom cannot convert raises, and is not kept
        if len(memo) < _MEMO_MAX_ENTRIES:
            memo[key] = value
    return value


def _converted(ds: Dataset, tag: BaseTag) -> Any:
    element = ds.get(tag)
    return None if element is None else element.value


# DiscoveryMemo.values: the VRs whose conversion depends on the bytes, the VR and the byte
# order alone (no character set), and bounds on what is kept
_MEMO_VRS = frozenset(
    {"AS", "CS", "DA", "DS", "DT", "FD", "FL", "IS", "SL", "SS", "TM", "UI", "UL", "US"}
)
_MEMO_MAX_BYTES = 64
_MEMO_MAX_ENTRIES = 4096
_UNSEEN = object()  # not in the memo (a kept value may be None)
_CONVERTED: ContextVar[dict[tuple[object, ...], Any] | None] = ContextVar(
    "radserve_converted_values", default=None
)


def _memo_key(tag: BaseTag, raw: object) -> tuple[object, ...] | None:
    """The memo's key of a raw element not yet converted, None for any other."""
    if type(raw) is not RawDataElement:
        return None
    value = raw.value
    if not isinstance(value, bytes) or len(value) > _MEMO_MAX_BYTES:
        return None  # deferred (None), or too long to be worth keeping
    vr = raw.VR or _dictionary_vr(tag)
    if vr not in _MEMO_VRS:
        return None
    return (tag, vr, raw.is_little_endian, value)


@functools.cache
def _dictionary_vr(tag: BaseTag) -> str | None:
    """An Implicit VR element's VR as pydicom reads it (None: private or unknown)."""
    if tag.is_private:
        return None
    try:
        return dictionary_VR(tag)
    except KeyError:
        return None


@functools.cache
def _tag(keyword: str) -> BaseTag:
    tag = tag_for_keyword(keyword)
    if tag is None:
        raise ValueError(f"{keyword!r} is no DICOM keyword")
    return BaseTag(tag)


def _first_item(ds: Dataset | None, keyword: str) -> Dataset | None:
    try:
        seq = _get(ds, keyword)
        return seq[0] if seq else None
    except Exception:
        return None


def _values(ds: Dataset | None, keyword: str) -> list[Any]:
    try:
        value = _get(ds, keyword)
    except Exception:
        return []
    if value is None or value == "":
        return []
    return list(value) if isinstance(value, list | tuple | pydicom.multival.MultiValue) else [value]


def _text(ds: Dataset | None, keyword: str) -> str:
    values = _values(ds, keyword)
    return "\\".join(str(v) for v in values).strip() if values else ""


def header_text(ds: Dataset | None, keyword: str) -> str:
    """``keyword``'s value in ``ds`` (a :func:`read_header` result, or its ``file_meta``)
    as text, multiple values joined by backslashes; "" when absent or when pydicom cannot
    convert it. pydicom converts a value when it is first read, not when the header is
    parsed, so a value it cannot convert (an unknown VR, say) raises at the caller, of
    any type (``NotImplementedError``...): found by fuzzing the STOW-RS part check, which
    let it through as a 500. Lenient as ingest is: a value that cannot be read is absent,
    and the rule that needs it refuses the instance by name."""
    return _text(ds, keyword)


def _float(ds: Dataset | None, keyword: str) -> float | None:
    values = _values(ds, keyword)
    try:
        value = float(values[0]) if len(values) == 1 else None
    except (TypeError, ValueError):
        return None
    return value if value is not None and math.isfinite(value) else None


def _distance(ds: Dataset | None, keyword: str) -> float | None:
    """A thickness or distance (Slice Thickness, Spacing Between Slices): None unless
    positive. Zero or negative is no thickness: taken as one, -4 mm counted as the
    thinnest series of a study (``prefer: thinnest``) and passed ``max_slice_thickness_mm``,
    so a 4 mm series ran instead of the 2 mm one beside it."""
    value = _float(ds, keyword)
    return value if value is not None and value > 0 else None


def _int(ds: Dataset | None, keyword: str) -> int | None:
    value = _float(ds, keyword)
    return int(value) if value is not None else None


def _floats(ds: Dataset | None, keyword: str, count: int) -> tuple[float, ...] | None:
    values = _values(ds, keyword)
    if len(values) != count:
        return None
    try:
        result = tuple(float(v) for v in values)
    except (TypeError, ValueError):
        return None
    return result if all(math.isfinite(v) for v in result) else None


# --- header reads for the rest of the server ---------------------------------------------
class UnreadableHeaderError(NotDicomError):
    """pydicom could not parse a DICOM header (or it passed ``max_header_bytes``). The
    message names only the exception type (``cause_name``): pydicom's own messages may
    quote element values."""

    def __init__(self, cause: BaseException) -> None:
        self.cause_name = cause_name(cause)
        super().__init__(f"unreadable DICOM header ({self.cause_name})")


def cause_name(exc: BaseException) -> str:
    """Why pydicom could not parse a header, without its message (which may quote values):
    the exception type, and for the one whose type alone says nothing to a sender, what
    it means in a DICOM file."""
    if isinstance(exc, RecursionError):
        return "RecursionError: sequences nested too deeply to read"
    if isinstance(exc, InputTooLargeError):  # a bound of ours: its message names it
        return f"{type(exc).__name__}: {exc.message}"
    return type(exc).__name__


def read_header(
    source: str | os.PathLike[str] | BinaryIO,
    *,
    tags: Sequence[str | int] | None = None,
    force: bool = False,
    max_header_bytes: int = IngestPolicy().max_header_bytes,
    transfer_syntax: str | None = None,
    max_header_elements: int = IngestPolicy().max_header_elements,
) -> Dataset:
    """The header of one DICOM file or stream: the one header parser for code outside
    ingest (priority rules, STOW-RS checks, result index, WADO-RS metadata, FHIR).

    Never the pixel data; values over :data:`DEFER_BYTES` are read only when used; only
    ``tags`` (keywords or tags) when given. A path or a stream is read through a
    :class:`~radserve.ingest.sources.BoundedStream` (at most ``max_header_bytes`` read
    into memory, at most ``max_header_elements`` elements: a path was read by pydicom
    unbounded, so C-STORE's received file escaped the element bound); a stream from
    where it is, left where the parser stopped (callers seek), its deferred values read
    through the bound too; a path's deferred values are read from the path when used.
    Raises :class:`UnreadableHeaderError` for what pydicom cannot parse or what
    passes the bound; :class:`OSError` (a file gone or unreadable) passes through, as it
    is not the header's fault.

    ``transfer_syntax``, when the caller knows it (the C-STORE SCP wrote the file's File
    Meta from the presentation context), says whether the file is Deflated without a
    parse of its File Meta before pydicom parses it again.
    """
    if transfer_syntax is not None:
        deflated = not force and transfer_syntax == DeflatedExplicitVRLittleEndian
    else:
        deflated = not force and _deflated_source(source)
    if deflated:
        return _read_deflated_header(source, tags, max_header_bytes, max_header_elements)
    with contextlib.ExitStack() as stack:
        path = os.fspath(source) if isinstance(source, str | os.PathLike) else None
        raw = stack.enter_context(open(path, "rb")) if path is not None else source
        try:
            ds = pydicom.dcmread(
                _bounded(cast(BinaryIO, raw), max_header_bytes, max_header_elements),
                stop_before_pixels=True,
                defer_size=DEFER_BYTES,
                specific_tags=list(tags) if tags is not None else None,
                force=force,
            )
        except OSError:
            raise
        except Exception as exc:  # pydicom raises many types on damaged input
            raise UnreadableHeaderError(exc) from exc
    if path is not None:  # deferred values are read from the path, as if pydicom opened it
        ds.buffer, ds.filename, ds.fileobj_type = None, path, open
        ds.timestamp = os.stat(path).st_mtime
    return ds


def _bounded(raw: BinaryIO, max_bytes: int, max_elements: int) -> BinaryIO:
    """The one bound on a header read outside ingest's own (:class:`_HeaderStream`, the
    same counters): a path, a stream or an inflating stream, at every door (C-STORE's
    received file, a STOW-RS part, a stored file) read through it."""
    bounded = BoundedStream(raw, max_bytes, "ingest.max_header_bytes", max_elements=max_elements)
    return cast(BinaryIO, bounded)


def _deflated_source(source: str | os.PathLike[str] | BinaryIO) -> bool:
    """Whether ``source`` (a path, or a stream at its start, left there) is a Part 10
    file of the Deflated transfer syntax."""
    if isinstance(source, str | os.PathLike):
        with open(source, "rb") as raw:
            return _deflated_source(raw)
    at = source.tell()
    try:
        if source.read(_PREAMBLE + 4)[_PREAMBLE:] != b"DICM":
            return False
        return _is_deflated(source)
    except InputTooLargeError:
        return False  # pydicom then judges the file (and the bounded read refuses it)
    finally:
        source.seek(at)


def _read_deflated_header(
    source: str | os.PathLike[str] | BinaryIO,
    tags: Sequence[str | int] | None,
    limit: int,
    max_elements: int,
) -> Dataset:
    """A Deflated file's header, inflated only as far as the parser reads, all values
    read (no deferred read can reach the inflated data later), at most ``limit`` bytes
    inflated: pydicom inflates the whole data set in memory (a 2 MB file inflating to
    256 MB took a server up by 500 MB)."""
    with contextlib.ExitStack() as stack:
        raw = source
        if isinstance(source, str | os.PathLike):
            raw = stack.enter_context(open(source, "rb"))
        raw = cast(BinaryIO, raw)
        at = raw.tell()
        try:
            ds = pydicom.dcmread(
                _bounded(cast(BinaryIO, InflatingStream(raw, limit)), limit, max_elements),
                stop_before_pixels=True,
                specific_tags=list(tags) if tags is not None else None,
            )
            ds.file_meta.TransferSyntaxUID = DeflatedExplicitVRLittleEndian  # as stored
            return ds
        except OSError:
            raise
        except Exception as exc:  # pydicom raises many types on damaged input
            raise UnreadableHeaderError(exc) from exc
        finally:
            if raw is source:
                raw.seek(at)


class InflatingStream(io.RawIOBase):
    """A Deflated Explicit VR Little Endian Part 10 file (``raw``, at its start) as the
    Explicit VR Little Endian file it inflates to, inflated only as far as it is read
    and refused (:class:`InputTooLargeError`) past ``limit`` inflated bytes. Everything
    inflated so far is kept, so it seeks anywhere before that point: memory is at most
    ``limit`` plus one chunk, whatever the compression ratio."""

    _CHUNK = 1 << 16

    def __init__(self, raw: BinaryIO, limit: int, *, preamble: bool = True) -> None:
        super().__init__()
        head = raw.read(_PREAMBLE + 4) if preamble else b""
        meta = _read_file_meta_info(BoundedStream(raw, MAX_META_BYTES, "the File Meta limit"))
        meta.TransferSyntaxUID = ExplicitVRLittleEndian
        start = io.BytesIO()
        start.write(head)
        write_file_meta_info(DicomFileLike(start), meta, enforce_standard=False)
        self._buffer = bytearray(start.getvalue())
        self._raw = raw
        self._inflater = zlib.decompressobj(-zlib.MAX_WBITS)
        self._max = limit
        self._limit = limit + len(self._buffer)
        self._position = 0
        self._done = False

    def _fill(self, end: int | None) -> None:
        """Inflate until ``end`` bytes are held (None: all of it) or the data ends."""
        while not self._done and (end is None or len(self._buffer) < end):
            if len(self._buffer) > self._limit:
                raise InputTooLargeError(
                    f"the deflated header inflates to more than ingest.max_header_bytes={self._max}"
                )
            data = self._inflater.unconsumed_tail or self._raw.read(self._CHUNK)
            if not data:
                self._buffer += self._inflater.flush()
                self._done = True
                break
            self._buffer += self._inflater.decompress(data, self._CHUNK)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        if whence == os.SEEK_CUR:
            offset += self._position
        elif whence == os.SEEK_END:
            self._fill(None)
            offset += len(self._buffer)
        self._position = max(0, offset)
        return self._position

    def read(self, size: int | None = -1) -> bytes:
        end = None if size is None or size < 0 else self._position + size
        self._fill(end)
        data = bytes(self._buffer[self._position : end])
        self._position += len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

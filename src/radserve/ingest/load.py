"""Turn a discovered series into a :class:`Volume`, applying the ingest policy.

The only place that reads DICOM pixel data. Every problem either raises a
:class:`StudyError` subclass with the reason, or proceeds and records a warning on the
:class:`LoadedSeries`, as the :class:`IngestPolicy` says.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from radserve.domain.volume import Volume, spacing_of
from radserve.errors import GeometryError, StudyError, UnsupportedModalityError
from radserve.ingest.arrival import SliceArrival
from radserve.ingest.ct_scale import check_ct_scale, declared_on_ct_scale
from radserve.ingest.decode import decode_stack, ensure_decoders, start_decode_stack
from radserve.ingest.discover import SeriesHeader, discover_series
from radserve.ingest.geometry import (
    SpacingError,
    StackLayout,
    check_in_plane_field,
    plan_stack,
)
from radserve.ingest.headers import COLOUR_TERMS, GREYSCALE, FrameRef, PixelFormat, uid_shown
from radserve.ingest.policy import IngestPolicy, policy_hint
from radserve.ingest.resample import resample_slices, shift_slices_in_plane
from radserve.ingest.sources import SkipKind, SkippedFile, SourceFile, SourceReader
from radserve.ingest.validate import check_series

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SliceSource:
    """The instance (and frame) one volume slice came from, for SEG/SR references."""

    sop_instance_uid: str
    sop_class_uid: str
    frame_number: int | None  # 1-based Referenced Frame Number in an Enhanced instance, else None
    source: SourceFile


@dataclass(frozen=True, eq=False)
class LoadedSeries:
    """A volume plus where it came from and what was tolerated on the way.

    ``source_slices`` has one entry per volume slice, or is empty when the policy
    resampled the stack (slices then no longer map one-to-one to instances).
    """

    volume: Volume
    header: SeriesHeader
    warnings: tuple[str, ...] = ()
    source_slices: tuple[SliceSource, ...] = field(default=(), repr=False)
    arrival: SliceArrival | None = field(default=None, repr=False)
    """Set when the volume is still being decoded (``load_series(decode_first=...)``):
    wait on it before reading the array."""

    def wait_decoded(self) -> None:
        """Return once every slice of the volume is in place (at once when it was
        decoded whole); raises the decode's error if it failed."""
        if self.arrival is not None:
            self.arrival.wait_all()


@dataclass(frozen=True)
class RejectedSeries:
    """A series that could not be loaded, with the error's stable code and message."""

    header: SeriesHeader
    code: str
    reason: str


@dataclass(frozen=True, eq=False)
class LoadedStudy:
    """Everything found in the sources: loaded series, rejected series, skipped files."""

    series: tuple[LoadedSeries, ...]
    rejected: tuple[RejectedSeries, ...]
    skipped: tuple[SkippedFile, ...]


# (shape, spacing) of the volume -> the slices a reader wants before the others
DecodeFirst = Callable[[tuple[int, int, int], tuple[float, float, float]], Sequence[int]]


def load_series(
    header: SeriesHeader,
    policy: IngestPolicy = IngestPolicy(),  # noqa: B008 - frozen, safe as a default
    required_modality: str | None = None,
    workers: int | None = None,
    *,
    decode_first: DecodeFirst | None = None,
) -> LoadedSeries:
    """Decode one series part into a volume in physical units (HU for CT).

    ``decode_first``: return while the decoder processes still fill the volume, with
    the slices it names decoded first and ``LoadedSeries.arrival`` set; readers wait
    on it. Only stacks decoded in processes (JPEG 2000) and stored as they are (no
    duplicate check, in-plane shift or resampling) load that way; others load whole.

    Raises:
        UnsupportedModalityError: ``required_modality`` is set and differs.
        GeometryError: the slices do not form a stack the policy accepts.
        DecodeError: a decoder is missing or pixel data is damaged.
        StudyError: the pixels cannot form an intensity volume (e.g. colour).
    """
    if required_modality and header.modality != required_modality.upper():
        raise UnsupportedModalityError(
            f"series modality is {header.modality or 'missing'}, but {required_modality.upper()} "
            "is required; send the matching series or choose a pipeline for this modality"
        )
    warnings = list(header.notes)
    _check_pixels(header.frames, warnings)
    check_series(header, warnings, lossy_input=policy.lossy_input)
    _apply_split_policy(header, policy, warnings)
    _check_matrix(header.frames[0], policy)

    try:
        layout = plan_stack(header.frames, policy)
    except GeometryError as exc:
        said = _stack_refusal(header, exc)
        if said is None:
            raise
        raise said from exc
    check_in_plane_field(header.frames[0], header.modality, policy)
    _refuse_interleaved(header)
    warnings.extend(layout.warnings)
    if unreadable := _unreadable(header):
        # no gap named them: they may still be this series' first or last slices (a zip
        # member in Deflate64, a damaged header), and the study ran without a word
        warnings.append(
            f"{unreadable}; if they were images of this series, it was analysed without them"
        )
    _check_size(header.frames[0], layout, policy)
    ensure_decoders(f.pixel.transfer_syntax_uid for f in header.frames)
    ordered = [header.frames[i] for i in layout.order]
    air = policy.ct_padding_hu if header.modality == "CT" else policy.other_padding_value

    if decode_first is not None and _streamable(header, layout, policy):
        started = _start_streaming(header, layout, ordered, air, workers, policy, decode_first)
        if started is not None:
            return _loaded(header, layout, ordered, warnings, *started)
    with SourceReader() as reader:
        array = decode_stack(
            ordered, reader, air=air, workers=workers, max_file_bytes=policy.max_file_bytes
        )
        if layout.duplicates and policy.duplicate_positions == "drop_identical":
            _verify_identical(
                header, layout.order, layout.duplicates, array, reader, air, workers, policy
            )
            warnings.append(f"dropped {len(layout.duplicates)} identical duplicate slices")
        if header.copies:
            _verify_copies(header, ordered, array, reader, air, workers, policy)
    _check_finite(array)
    _check_ct_values(header, array)
    if layout.in_plane_shifts is not None:
        shift_slices_in_plane(array, layout.in_plane_shifts, air)
    if layout.target_offsets is not None:
        array = resample_slices(array, layout.source_offsets, layout.target_offsets)
    return _loaded(header, layout, ordered, warnings, array)


def _loaded(
    header: SeriesHeader,
    layout: StackLayout,
    ordered: list[FrameRef],
    warnings: list[str],
    array: np.ndarray,
    arrival: SliceArrival | None = None,
) -> LoadedSeries:
    slices = tuple(map(_slice_source, ordered))
    if layout.target_offsets is not None:
        slices = ()
    volume = Volume(
        array,
        layout.affine,
        header.frame_of_reference_uid,
        tuple(s.sop_instance_uid for s in slices),
    )
    log.info(
        "loaded %s series part %d: shape %s %s (%.1f MB)%s, %d warnings",
        header.modality,
        header.part,
        volume.shape,
        array.dtype,
        array.nbytes / 1e6,
        " (still decoding)" if arrival is not None else "",
        len(warnings),
    )
    for warning in warnings:
        log.warning("ingest: %s", warning)
    return LoadedSeries(volume, header, tuple(warnings), slices, arrival)


def _streamable(header: SeriesHeader, layout: StackLayout, policy: IngestPolicy) -> bool:
    """The stack goes into the volume as decoded: nothing compares or moves slices, and
    a CT's header keeps every value on the CT scale (a streamed volume is not checked
    after its decode, as a whole one is by :func:`_check_ct_values`)."""
    return (
        not header.copies
        and not (layout.duplicates and policy.duplicate_positions == "drop_identical")
        and layout.in_plane_shifts is None
        and layout.target_offsets is None
        and (header.modality != "CT" or all(map(_declared_on_ct_scale, header.frames)))
    )


def _declared_on_ct_scale(frame: FrameRef) -> bool:
    fmt = frame.pixel
    return declared_on_ct_scale(
        fmt.bits_stored,
        bool(fmt.pixel_representation),
        frame.rescale_slope,
        frame.rescale_intercept,
    )


def _start_streaming(
    header: SeriesHeader,
    layout: StackLayout,
    ordered: list[FrameRef],
    air: float,
    workers: int | None,
    policy: IngestPolicy,
    decode_first: DecodeFirst,
) -> tuple[np.ndarray, SliceArrival] | None:
    first = ordered[0].pixel
    shape = (len(ordered), first.rows, first.columns)
    spacing = spacing_of(layout.affine)
    return start_decode_stack(
        ordered,
        air=air,
        first=decode_first(shape, spacing),
        workers=workers,
        max_file_bytes=policy.max_file_bytes,
    )


def load_study(
    sources: Path | str | Sequence[Path | str],
    *,
    policy: IngestPolicy = IngestPolicy(),  # noqa: B008 - frozen, safe as a default
    required_modality: str | None = None,
    workers: int | None = None,
    select: Callable[[SeriesHeader], bool] | None = None,
) -> LoadedStudy:
    """Discover and load every (selected) series; record why each failure was rejected.

    Holds all volumes in memory at once: for large studies prefer
    :func:`discover_series` and :func:`load_series` one series at a time.
    """
    headers = discover_series(sources, policy=policy)
    loaded: list[LoadedSeries] = []
    rejected: list[RejectedSeries] = []
    for header in headers:
        if select is not None and not select(header):
            continue
        try:
            loaded.append(load_series(header, policy, required_modality, workers))
        except StudyError as exc:
            log.warning("series part %d rejected: %s", header.part, exc.message)
            rejected.append(RejectedSeries(header, exc.code, exc.message))
    return LoadedStudy(tuple(loaded), tuple(rejected), headers[0].skipped)


def _stack_refusal(header: SeriesHeader, exc: GeometryError) -> GeometryError | None:
    """The refusal of a stack the geometry rejected, saying what may explain it (None:
    ``exc`` as it is). A gap may be where a slice set aside (a localizer, another
    orientation, other Rows/Columns, a damaged header) belongs: said, or the sender
    looks for a slice never lost. Images of another size, spacing, orientation, SOP
    Class or Modality in the stack's gaps are why it is refused, whatever else is: the
    advice to resample the gaps (session 43: "set ingest.missing_slices: resample" for
    one slice of other Rows/Columns) would only have met that refusal."""
    gap = exc.detail if isinstance(exc, SpacingError) else exc.message
    if "interleaved" in header.split_reasons:
        return GeometryError(
            f"{_interleaved_text(header)}; the stack without them: {gap}; correct the "
            "images at the source and send the series again"
        )
    set_aside = _set_aside(header)
    if not set_aside:
        return None
    advice = f". {exc.advice}" if isinstance(exc, SpacingError) else ""
    return GeometryError(f"{gap}; {'; '.join(set_aside)}{advice}")


def _set_aside(header: SeriesHeader) -> list[str]:
    """What discovery kept out of this stack that may be its missing slices: localizers
    dropped, frames split off into other parts (other Rows/Columns, Pixel Spacing,
    orientation), files of the input whose header could not be read (their series is
    unknown)."""
    said = []
    if header.dropped:
        what = sorted({d.reason for d in header.dropped})
        said.append(
            f"{len(header.dropped)} image(s) of the series were set aside first: {'; '.join(what)}"
        )
    if header.part == 0:
        said.extend(header.notes)  # "series also holds N frames with ..., split off as part k"
    unreadable = _unreadable(header)
    if unreadable:
        said.append(unreadable)
    return said


def _unreadable(header: SeriesHeader) -> str | None:
    """The input's files that were skipped unread, which may be images of any series."""
    unreadable = [s for s in header.skipped if s.kind is SkipKind.UNREADABLE]
    if not unreadable:
        return None
    reasons = sorted({s.reason for s in unreadable})
    more = f" (and {len(reasons) - 3} other reasons)" if len(reasons) > 3 else ""
    return (
        f"{len(unreadable)} file(s) of the input were skipped, unreadable: "
        f"{'; '.join(reasons[:3])}{more}"
    )


def _refuse_interleaved(header: SeriesHeader) -> None:
    """Whatever mixed_orientation and mismatched_dimensions say; after the stack's own
    checks, so that one odd slice is named by the gap it leaves."""
    if "interleaved" in header.split_reasons:
        raise GeometryError(_interleaved_text(header))


def _interleaved_text(header: SeriesHeader) -> str:
    return (
        "series interleaves images of another orientation, size, pixel spacing, SOP Class "
        f"or Modality with its slices ({'; '.join(header.notes)}): one stack some of whose "
        "images are turned, resized, resampled or of another kind, not a localizer or a "
        "reformat beside it; neither part is the series as acquired, so none is loaded"
    )


def _apply_split_policy(header: SeriesHeader, policy: IngestPolicy, warnings: list[str]) -> None:
    for reason, choice, field_name in (
        ("orientation", policy.mixed_orientation, "mixed_orientation"),
        ("dimensions", policy.mismatched_dimensions, "mismatched_dimensions"),
    ):
        if reason in header.split_reasons and choice == "reject":
            raise GeometryError(
                f"series mixes images of {reason.replace('dimensions', 'different Rows/Columns')}"
                f" ({'; '.join(header.notes)}); to load each part on its own, "
                f"{policy_hint(field_name, 'split')}"
            )
    if header.dropped:
        what = sorted({d.reason for d in header.dropped})
        if policy.localizers == "reject":
            raise GeometryError(
                f"series contains {len(header.dropped)} localizer images ({'; '.join(what)}); "
                f"to drop them, {policy_hint('localizers', 'drop')}"
            )
        warnings.append(f"dropped {len(header.dropped)} localizer images: {'; '.join(what)}")


def _slice_source(frame: FrameRef) -> SliceSource:
    number = frame.frame_index + 1 if frame.enhanced and frame.frame_index is not None else None
    return SliceSource(frame.sop_instance_uid, frame.sop_class_uid, number, frame.source)


def _check_matrix(first: FrameRef, policy: IngestPolicy) -> None:
    """Before the geometry: a stack of 1 × 1 images is refused for that, not for its gaps."""
    rows, columns = first.pixel.rows, first.pixel.columns
    if min(rows, columns) < policy.min_matrix:
        raise GeometryError(
            f"the images are {rows} × {columns} pixels (Rows × Columns), fewer than "
            f"ingest.min_matrix={policy.min_matrix} along an axis: not a cross-sectional image "
            "a model can read"
        )


def _check_size(first: FrameRef, layout: StackLayout, policy: IngestPolicy) -> None:
    targets = layout.target_offsets
    n = max(len(layout.order), 0 if targets is None else len(targets))
    voxels = n * first.pixel.rows * first.pixel.columns
    if voxels > policy.max_voxels:
        raise StudyError(
            f"series would need {voxels} voxels ({n} × {first.pixel.rows} × "
            f"{first.pixel.columns}), more than IngestPolicy.max_voxels={policy.max_voxels}",
            code="series_too_large",
        )


def _not_intensity(fmt: PixelFormat) -> str | None:
    """Why pixels of format ``fmt`` are not intensities a volume can hold (None: they are,
    or the format contradicts itself, which the per-file check at decoding names)."""
    photometric = fmt.photometric_interpretation
    if fmt.samples_per_pixel != 1 and photometric in COLOUR_TERMS:
        return f"colour images (Samples per Pixel {fmt.samples_per_pixel}, {photometric})"
    if fmt.samples_per_pixel == 1 and photometric == "PALETTE COLOR":
        # stored values index a colour table, they are no intensities
        return "images of Photometric Interpretation PALETTE COLOR"
    if fmt.bits_allocated == 1 and photometric in GREYSCALE:
        return "1-bit images (Bits Allocated 1: a bitmap, not intensities)"
    return None


def _check_pixels(frames: Sequence[FrameRef], warnings: list[str]) -> None:
    """Every frame's pixels must be intensities (one sample, MONOCHROME1/2, not 1-bit):
    a series mixing in one colour or palette slice is refused naming it, not decoded
    into a shape error."""
    refused = [(frame, why) for frame in frames if (why := _not_intensity(frame.pixel))]
    if refused:
        frame, why = refused[0]
        where = (
            ""
            if len(refused) == len(frames)
            else (f" ({len(refused)} of the series' {len(frames)} images, e.g. {frame.label})")
        )
        raise StudyError(
            f"{why} cannot form an intensity volume{where}", code="unsupported_pixel_format"
        )
    if any(f.pixel.photometric_interpretation == "MONOCHROME1" for f in frames):
        warnings.append("MONOCHROME1 pixels: low values display bright; values kept as stored")


def _check_finite(array: np.ndarray) -> None:
    """Float or Double Float Pixel Data may hold NaN or infinity: a NaN voxel of a CT
    loaded, ran through the models and into the findings' mean HU (2026-12-07; the CT
    scale bound ignores NaN, and the NIfTI path already refused such voxels). Only a
    float volume can hold them: two passes over it (its minimum and maximum propagate
    NaN), no copy; counted slice by slice when there are any."""
    if array.dtype.kind != "f" or not array.size:
        return
    with np.errstate(invalid="ignore"):
        if np.isfinite(array.min()) and np.isfinite(array.max()):
            return
    bad = sum(
        int(array[k].size - np.count_nonzero(np.isfinite(array[k]))) for k in range(len(array))
    )
    raise StudyError(
        f"{bad} of {array.size} voxels are not finite numbers (NaN or infinity): Float or "
        "Double Float Pixel Data that holds them is not an image a model can read",
        code="implausible_pixel_values",
    )


def _check_ct_values(header: SeriesHeader, array: np.ndarray) -> None:
    """CT values off any CT scale, at either end, mean the pixels were not read as they
    were written: signed HU declared unsigned (-1000 read as 64,536), a wrong Rescale
    Slope or Intercept (-999,999 made every voxel about -1e6 HU, and the job found
    nothing), or padding without Pixel Padding Value. The same bound as a NIfTI CT's
    (:mod:`radserve.ingest.ct_scale`). Only a float volume can leave it: no cost else."""
    if header.modality != "CT":
        return
    check_ct_scale(
        array,
        "CT values",
        "the pixel data is not read as it was written (signed values with Pixel "
        "Representation 0, a wrong Rescale Slope or Intercept, or padding without Pixel "
        "Padding Value?)",
    )


def _verify_copies(
    header: SeriesHeader,
    ordered: Sequence[FrameRef],
    array: np.ndarray,
    reader: SourceReader,
    air: float,
    workers: int | None,
    policy: IngestPolicy,
) -> None:
    """An instance found in several files (a re-send, a folder copied twice) is read
    from one of them; its other copies may differ in header values and transfer syntax,
    not in pixels. Before session 35 they were not compared: a copy of a slice with other
    pixels at the same place was read or not by the order the files came in (a blank
    copy uploaded last halved the liver's volume)."""
    slot = {id(frame): k for k, frame in enumerate(ordered)}
    pairs = [(copy, kept) for copy, kept in header.copies if id(kept) in slot]
    if not pairs:
        return
    frames, slices = [copy for copy, _ in pairs], [slot[id(kept)] for _, kept in pairs]
    differ = _differing(frames, slices, array, reader, air, workers, policy)
    if differ:
        _, kept = pairs[differ[0]]
        shared = uid_shown(kept.sop_instance_uid, "SOP Instance UID")
        raise StudyError(  # the files named by the UID they share, never by their names
            "two files carry one SOP Instance UID at one place but hold different pixel "
            f"data ({len(differ)} of {len(pairs)} copied frames): two images under one "
            f"identity (the sender reused a UID), which of them is right cannot be told{shared}",
            code="instance_invalid",
        )


def _verify_identical(
    header: SeriesHeader,
    order: tuple[int, ...],
    duplicates: tuple[tuple[int, int], ...],
    array: np.ndarray,
    reader: SourceReader,
    air: float,
    workers: int | None,
    policy: IngestPolicy,
) -> None:
    slot = {frame: k for k, frame in enumerate(order)}
    frames = [header.frames[d] for d, _ in duplicates]
    slices = [slot[kept] for _, kept in duplicates]
    differ = len(_differing(frames, slices, array, reader, air, workers, policy))
    if differ:
        raise GeometryError(
            f"{differ} of {len(duplicates)} slices at duplicate positions hold different pixel "
            "data (several acquisitions or time points in one series?); to keep one of "
            f"each, {policy_hint('duplicate_positions', 'keep_first')}"
        )


def _differing(
    frames: Sequence[FrameRef],
    slices: Sequence[int],
    array: np.ndarray,
    reader: SourceReader,
    air: float,
    workers: int | None,
    policy: IngestPolicy,
) -> list[int]:
    """Which of ``frames``, decoded, differ from the volume's slice ``slices`` names for
    each: frames left out of the stack that must hold the pixels of one in it."""
    decoded = decode_stack(
        frames, reader, air=air, workers=workers, max_file_bytes=policy.max_file_bytes
    )
    return [
        i
        for i, (image, k) in enumerate(zip(decoded, slices, strict=True))
        if not np.array_equal(image, array[k])
    ]

"""Pick the series a pipeline runs on, and say why every other series was not used."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import numpy as np
from pydicom.uid import UID

from radserve.errors import StudyError, UnsupportedModalityError
from radserve.ingest.discover import SeveralStudiesError
from radserve.ingest.geometry import plan_stack
from radserve.ingest.headers import FrameRef
from radserve.ingest.policy import IngestPolicy
from radserve.ingest.sop_classes import LOCALIZER_IMAGE_TYPE, VOLUME_IMAGE_STORAGE, is_localizer
from radserve.models.manifest import ModelSpec
from radserve.models.registry import ModelRegistry
from radserve.pipeline.spec import PipelineSpec, SeriesRules
from radserve.preprocess.axes import OrientationError, orientation_error, plane_mismatch
from radserve.report.schema import SeriesRef


class SeriesLike(Protocol):
    """The header fields selection rules look at (``radserve.ingest.SeriesHeader``)."""

    @property
    def series_instance_uid(self) -> str: ...
    @property
    def study_instance_uid(self) -> str: ...
    @property
    def series_number(self) -> int | None: ...
    @property
    def modality(self) -> str: ...
    @property
    def body_part_examined(self) -> str: ...
    @property
    def slice_thickness(self) -> float | None: ...
    @property
    def number_of_frames(self) -> int: ...
    @property
    def number_of_instances(self) -> int: ...
    @property
    def image_type(self) -> tuple[str, ...]: ...
    @property
    def series_description(self) -> str: ...
    @property
    def sop_class_uid(self) -> str: ...
    @property
    def unusable(self) -> str | None: ...


S = TypeVar("S", bound=SeriesLike)


# how a series short of frames because an instance is unusable is refused
UNUSABLE = "an instance is unusable: "
SINGLE_IMAGE = "a single image (a localizer or a capture), not a volume"
_NAMED_REFUSALS = 8  # distinct "series N: reason" lines a refusal names, at most


def description_matches(pattern: str | None, description: str | None) -> bool:
    """Whether a Series Description satisfies a rule's regular expression (none: any);
    searched, not matched whole, so a rule may name a word of it."""
    return pattern is None or re.search(pattern, description or "") is not None


def rejection_reason(series: SeriesLike, rules: SeriesRules) -> str | None:
    """The first rule ``series`` breaks, in words, or None when it qualifies."""
    if rules.modalities and series.modality not in rules.modalities:
        return f"modality {series.modality} is not one of {list(rules.modalities)}"
    if series.sop_class_uid not in VOLUME_IMAGE_STORAGE:
        return f"{_sop_class_name(series.sop_class_uid)} is not a volume image class"
    excluded = set(series.image_type) & set(rules.exclude_image_types)
    if is_localizer(series.image_type):
        excluded.add(LOCALIZER_IMAGE_TYPE)
    if excluded:
        return f"image type {sorted(excluded)} is excluded"
    stack = stack_rejection_reason(
        series.number_of_frames, series.slice_thickness, rules, unusable=series.unusable
    )
    if stack is not None:
        return stack
    pattern = rules.series_description
    if not description_matches(pattern, series.series_description):
        # the description itself is not quoted: free text a technologist typed, which may
        # name the patient, and this reason reaches the report, the job's error and the
        # doors' answers (before 2026-12-08: "series description 'SMITH^JOHN chest' ...")
        return f"series description does not match {pattern!r}"
    if rules.body_parts:
        part = (series.body_part_examined or "").upper()
        if part not in {p.upper() for p in rules.body_parts}:
            return f"body part {part or '(none)'} is not one of {list(rules.body_parts)}"
    return None


def stack_rejection_reason(
    number_of_frames: int,
    slice_thickness: float | None,
    rules: SeriesRules,
    *,
    unusable: str | None = None,
) -> str | None:
    """The first rule on the stack itself (how many images, how thick) a volume breaks,
    or None: the part of :func:`rejection_reason` any input has, a DICOM series or a
    NIfTI volume (whose slice spacing stands for the thickness). A NIfTI of one slice,
    or of 2 where a pipeline asks 20, ran and reported "no findings" before (content
    probe, 2026-12-06), while the same DICOM series was refused."""
    if number_of_frames < max(2, rules.min_slices) and unusable:
        # an unusable multi-frame instance counts as one frame: say why, not "1 image"
        return f"{UNUSABLE}{unusable}"
    if number_of_frames == 1:
        return SINGLE_IMAGE
    if number_of_frames < rules.min_slices:
        return f"{number_of_frames} images, fewer than the {rules.min_slices} required"
    limit = rules.max_slice_thickness_mm
    if limit is not None and slice_thickness is not None and slice_thickness > limit + 1e-6:
        return f"slice thickness {slice_thickness:g} mm exceeds {limit:g} mm"
    return None


def select_series(series: Sequence[S], rules: SeriesRules) -> tuple[S, list[SeriesRef]]:
    """The best qualifying series and a reason for each series not chosen.

    Raises a StudyError (UnsupportedModalityError when only the modality is wrong) that
    lists every series and its reason when none qualifies.
    """
    ordered, rejected = rank_series(series, rules)
    best = ordered[0]
    rejected += [series_ref(other, passed_over_reason(best, other, rules)) for other in ordered[1:]]
    return best, rejected


def passed_over_reason(best: SeriesLike, other: SeriesLike, rules: SeriesRules) -> str:
    """Why ``other``, which qualifies, is not used when ``best`` is."""
    if _is_derived(other) and not _is_derived(best):
        return "an ORIGINAL series preferred over this DERIVED one"
    return f"another series preferred ({rules.prefer})"


def rank_series(series: Sequence[S], rules: SeriesRules) -> tuple[list[S], list[SeriesRef]]:
    """Every qualifying series, best first, and a reason for each that does not
    qualify: the order in which a study's series are tried when the best one cannot be
    loaded. Raises as :func:`select_series` does when none qualifies."""
    rejected: list[SeriesRef] = []
    candidates: list[S] = []
    for s in series:
        reason = rejection_reason(s, rules)
        if reason is None:
            candidates.append(s)
        else:
            rejected.append(series_ref(s, reason))
    if not candidates:
        detail = _refusal_detail(rejected)
        if not series:
            raise StudyError("the study contains no DICOM image series")
        if rules.modalities and all(s.modality not in rules.modalities for s in series):
            raise UnsupportedModalityError(
                f"this pipeline needs {'/'.join(rules.modalities)}; the study has "
                f"{sorted({s.modality for s in series})} ({detail})"
            )
        raise StudyError(f"no series meets the pipeline's selection rules ({detail})")
    studies = {s.study_instance_uid for s in candidates}
    if len(studies) > 1:
        raise SeveralStudiesError(
            f"series of {len(studies)} studies (Study Instance UIDs differ) meet the "
            f"pipeline's selection rules: {SeveralStudiesError.advice}"
        )
    return sorted(candidates, key=lambda s: _preference(s, rules)), rejected


@dataclass(frozen=True)
class PlaneRefusal:
    """A series in another plane than a slice model of the pipeline reads."""

    model: str  # the model's key (name/version)
    have: str  # the series' slice plane: axial, coronal or sagittal
    wanted: str  # the plane the model reads

    def error(self) -> OrientationError:
        """What the study fails with when no series is in a plane the models read."""
        return orientation_error(self.model, self.have, self.wanted)

    def describe(self) -> str:
        return f"its slices are {self.have}, and model {self.model} reads {self.wanted} slices"


@dataclass(frozen=True)
class SlicePlanes:
    """The pipeline's 2D/2.5D models and the axes they declare (``input.axes``): a
    series whose slices lie in another plane than one of them reads cannot be run
    (``orientation_unsupported``, :func:`radserve.preprocess.axes.slice_plane`), so
    the selection passes it over for the next qualifying series, as it does a series
    that cannot be loaded. 3D models read any plane (they resample).

    One definition of a series' plane for both checks: the plane of the affine the
    loaded volume will have (:func:`radserve.ingest.geometry.plan_stack` on every
    frame's position, no pixel read), judged by
    :func:`radserve.preprocess.axes.plane_mismatch`, as inference judges the loaded
    volume. The first frame's orientation alone disagreed with inference on a gantry
    tilt kept as a sheared affine (``ingest.gantry_tilt: flag``): a series passed here
    could be refused there, and one refused here would have run."""

    readers: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @classmethod
    def of(cls, specs: Iterable[ModelSpec]) -> SlicePlanes:
        return cls(
            tuple(
                (spec.key, spec.input.network_axes)
                for spec in specs
                if spec.input.mode in ("2d", "2.5d")
            )
        )

    @classmethod
    def of_pipeline(cls, pipeline: PipelineSpec, registry: ModelRegistry) -> SlicePlanes:
        """The slice models of ``pipeline``'s steps, as ``registry`` holds them."""
        return cls.of(registry.get(step.model, step.version).spec for step in pipeline.steps)

    def refusal(
        self, frames: Sequence[FrameRef], policy: IngestPolicy | None = None
    ) -> PlaneRefusal | None:
        """The first slice model that cannot read the slices of a series of ``frames``,
        from its headers alone (the volume is not loaded); None when every one can, or
        the geometry is unusable (loading the series says why)."""
        if not self.readers or not frames:
            return None
        try:
            affine = plan_stack(frames, policy or IngestPolicy()).affine
        except StudyError:  # a geometry ingest refuses: loading it says why
            return None
        return self.refusal_of(affine)

    def refusal_of(self, affine: np.ndarray) -> PlaneRefusal | None:
        """:meth:`refusal` of a volume whose (slice, row, column) affine is ``affine``."""
        for model, axes in self.readers:
            mismatch = plane_mismatch(axes, affine)
            if mismatch is not None:
                return PlaneRefusal(model, *mismatch)
        return None


class FramedSeries(SeriesLike, Protocol):
    """A series whose frames' geometry is known (``radserve.ingest.SeriesHeader``)."""

    @property
    def frames(self) -> Sequence[FrameRef]: ...


def _refusal_detail(rejected: Sequence[SeriesRef]) -> str:
    """Each distinct "series N: reason" once, with how many series it stands for, at
    most :data:`_NAMED_REFUSALS` of them: a study whose 500 slices each came with their
    own Series Instance UID made a message of 500 lines."""
    counts: dict[str, int] = {}
    for r in rejected:
        line = f"series {r.series_number or '?'}: {r.reason}"
        counts[line] = counts.get(line, 0) + 1
    lines = [line if n == 1 else f"{line} ({n} series)" for line, n in counts.items()]
    if len(lines) > _NAMED_REFUSALS:
        lines = [*lines[:_NAMED_REFUSALS], f"and {len(lines) - _NAMED_REFUSALS} more"]
    singles = sum(1 for r in rejected if r.reason == SINGLE_IMAGE)
    if singles >= 3:
        lines.append(
            f"{singles} series hold a single image each: if they are the slices of one "
            "series, the sender gave each its own Series Instance UID; send them as one"
        )
    return "; ".join(lines)


def refusals(
    series: Sequence[FramedSeries],
    rules: SeriesRules,
    planes: SlicePlanes | None = None,
    policy: IngestPolicy | None = None,
) -> list[SeriesRef]:
    """Each of ``series`` with the first rule it breaks when ``rules`` refuse every one
    (what made :func:`select_series` fail), else none: a study one of whose series
    qualifies was not refused. With ``planes``, a series no slice model of the pipeline
    can read (another plane) is refused too, the reason naming its plane and the
    model's: a study of only coronal and sagittal series for an axial model fails for
    that (``orientation_unsupported``) before any series is loaded."""
    refused = []
    for s in series:
        reason = rejection_reason(s, rules)
        if reason is None and planes is not None:
            plane = planes.refusal(s.frames, policy)
            reason = None if plane is None else plane.describe()
        if reason is None:
            return []
        refused.append(series_ref(s, reason))
    return refused


def no_plane_error(
    series: Sequence[FramedSeries],
    rules: SeriesRules,
    planes: SlicePlanes,
    first: PlaneRefusal,
    policy: IngestPolicy | None = None,
) -> OrientationError:
    """What a study fails with when every series that meets ``rules`` lies in a plane no
    slice model of the pipeline reads (``first``: the preferred series' refusal): each
    series named with its reason in the words :func:`refusals` gives the console's list
    ("series 1: its slices are coronal, and model organs/1.0.0 reads axial slices"),
    as a study refused by the rules names them. One definition for both doors: the
    upload form answers it (422) before a job exists, a job of a C-STORE study fails
    with it (:func:`radserve.pipeline.inputs.selection_refusal`)."""
    detail = _refusal_detail(refusals(series, rules, planes, policy))
    return OrientationError(
        f"no series is in a plane the pipeline's slice models read ({detail}): send the "
        f"study's {first.wanted} series (or a model whose model.yaml declares the plane it "
        "was trained on in input.axes)"
    )


def _preference(series: SeriesLike, rules: SeriesRules) -> tuple[object, ...]:
    """Sort key, best first: ORIGINAL before DERIVED/SECONDARY (a reformat or a copy of
    the acquisition), then the pipeline's ``prefer``, then Series Number and UID so that
    a tie is decided alike at every door."""
    thickness = series.slice_thickness or 1e9
    if rules.prefer == "thinnest":
        size: tuple[float, float] = (thickness, -series.number_of_frames)
    else:
        size = (-series.number_of_frames, thickness)
    number = series.series_number if series.series_number is not None else 2**31
    return (_is_derived(series), *size, number, series.series_instance_uid)


def _is_derived(series: SeriesLike) -> bool:
    """Image Type says DERIVED (value 1) or SECONDARY (value 2); an absent one does not."""
    return bool({"DERIVED", "SECONDARY"} & set(series.image_type[:2]))


def _sop_class_name(uid: str) -> str:
    known = UID(uid)
    return known.name if uid and known.name != uid else f"SOP Class {uid or '(none)'}"


def series_ref(series: SeriesLike, reason: str) -> SeriesRef:
    """``series`` as a report names a series it did not use, with ``reason``."""
    return SeriesRef(
        series_instance_uid=series.series_instance_uid,
        series_number=series.series_number,
        modality=series.modality,
        reason=reason,
        instance_count=series.number_of_instances,
    )

"""The upload form's selection check: a REST upload (``POST /v1/studies``, each study of
``/v1/studies/batch``, a STOW-RS request answered as a whole study) none of whose series
the pipeline can use is refused, 422, before a job exists.

The server holds every file before it answers, so it judges them as the job would
before loading any series: :func:`radserve.pipeline.inputs.selection_refusal` on the
headers of the staged files (:func:`radserve.ingest.discover_series`, no pixel data,
under the server's ingest bounds) says what the job would fail with — no series meets
the pipeline's selection rules (``study_invalid``, ``unsupported_modality``), or every
one that does lies in a plane no slice model of the pipeline reads
(``orientation_unsupported``) — naming each series and why, in the words the job and
the console's refused list use. It runs on the staging folder
(:func:`radserve.store.files.store_study`'s ``check``): a refused upload leaves no study
folder, no job row and no audit record.

That discovery costs what a job's costs (1.5 ms a file here: a 200-slice upload took
2.5 s instead of 2.0 s), so an ordinary study does not pay it: the headers the upload's own-results
check reads anyway (:func:`radserve.service.own_uploads.without_own_results`, ``seen``)
are summed per series first, and a series that plainly meets the rules
(:func:`~radserve.pipeline.selection.rejection_reason` on the summary) in a plane the
models read (:meth:`~radserve.pipeline.selection.SlicePlanes.refusal_of`, on the stack
its positions give, sheared or not) lets the upload through without it. The screen
only ever lets an upload through; what it cannot judge plainly (Enhanced multi-frame
instances, a series whose instances disagree on orientation or image type) goes to the
exact check, and only the exact check refuses.

An upload of several studies whose series qualify (two zips of two studies in one form)
is refused too, ``several_studies`` as its job would fail (session 43: it was answered
202 and its job failed): the screen passes only an upload whose headers name one Study
Instance UID (:meth:`SelectionDoor.several_studies_seen`), and the exact check refuses
what :func:`~radserve.pipeline.selection.rank_series` refuses, unless an unusable
instance is what the job would fail with.

What neither judges is left to the job, as before: NIfTI uploads (their stack rules need
the volume), anything discovery itself refuses (not DICOM, over a limit: the job says
so), series of one study naming several patients, and the plane when model deployments
route studies (a canary version may read another plane than the stable one; the rules
are still judged, they are the pipeline's). C-STORE and quiet-period STOW-RS studies are not
judged at their door: their instances are acknowledged as they arrive, and their job
fails with the same error before any series is loaded.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pydicom.datadict import tag_for_keyword
from pydicom.dataset import Dataset
from pydicom.tag import BaseTag

from radserve.errors import RadserveError
from radserve.ingest import IngestPolicy, SeriesHeader, discover_series
from radserve.ingest.discover import SeveralStudiesError
from radserve.models.registry import ModelRegistry
from radserve.pipeline.inputs import selection_refusal
from radserve.pipeline.selection import SlicePlanes, rank_series, rejection_reason
from radserve.pipeline.spec import PipelineSpec, SeriesRules
from radserve.service.sniff import FileKind

logger = logging.getLogger(__name__)

_JUDGED = (FileKind.DICOM, FileKind.ZIP)
_SAME = 1e-4  # direction cosines that agree to this are one orientation
_TAGS = {
    keyword: BaseTag(tag_for_keyword(keyword))  # type: ignore[arg-type]
    for keyword in (
        "SeriesNumber", "SliceThickness", "NumberOfFrames", "SeriesInstanceUID",
        "StudyInstanceUID", "Modality", "SOPClassUID", "ImageType", "BodyPartExamined",
        "ImageOrientationPatient", "ImagePositionPatient", "PixelSpacing",
    )
}  # fmt: skip


@dataclass(frozen=True)
class _Seen:
    """What the screen keeps of one instance's header (small values only)."""

    series_instance_uid: str
    study_instance_uid: str
    series_number: int | None
    modality: str
    sop_class_uid: str
    image_type: tuple[str, ...]
    frames: int
    slice_thickness: float | None
    series_description: str
    body_part_examined: str
    orientation: tuple[float, ...] | None
    position: tuple[float, ...] | None
    pixel_spacing: tuple[float, ...] | None


@dataclass(frozen=True)
class _Series:
    """A summary of one series' instances, as :func:`rejection_reason` reads a series."""

    series_instance_uid: str
    study_instance_uid: str
    series_number: int | None
    modality: str
    body_part_examined: str
    slice_thickness: float | None
    number_of_frames: int
    number_of_instances: int
    image_type: tuple[str, ...]
    series_description: str
    sop_class_uid: str
    unusable: str | None = None


class SelectionDoor:
    """The selection check of one upload for one pipeline: :meth:`seen` takes the headers
    read at intake; :meth:`staged_check` is the exact check for the staged files, or
    None when a series plainly qualifies (or the upload is not judged)."""

    def __init__(
        self,
        pipeline: PipelineSpec,
        registry: ModelRegistry,
        policy: IngestPolicy,
        *,
        planes: bool = True,
    ) -> None:
        self.rules: SeriesRules = pipeline.series_selection
        self.planes = SlicePlanes.of_pipeline(pipeline, registry) if planes else None
        self.policy = policy
        self._seen: dict[str, list[_Seen]] = {}

    @classmethod
    def for_upload(
        cls,
        kinds: Sequence[FileKind],
        pipeline: PipelineSpec,
        registry: ModelRegistry,
        policy: IngestPolicy,
        *,
        planes: bool = True,
    ) -> SelectionDoor | None:
        """The door of an upload of ``kinds``; None for one that is not judged (NIfTI)."""
        if not kinds or any(kind not in _JUDGED for kind in kinds):
            return None
        return cls(pipeline, registry, policy, planes=planes)

    # --- the screen ----------------------------------------------------------------------
    def seen(self, header: Dataset) -> None:
        """One instance's header, read by the upload's own-results check."""
        try:
            seen = _summary(header)
        except Exception:  # an odd value: the exact check reads the file as ingest does
            return
        self._seen.setdefault(seen.series_instance_uid, []).append(seen)

    def plainly_usable(self) -> bool:
        """Whether a series of what was seen meets the rules, in a plane the models read,
        on its headers as summed here (never a refusal: see the module docstring)."""
        return any(self._usable(instances) for instances in self._seen.values())

    def several_studies_seen(self) -> bool:
        """Whether the headers seen name more than one Study Instance UID: the exact
        check then judges the upload, however plainly usable its series."""
        studies = {i.study_instance_uid for seen in self._seen.values() for i in seen}
        return len(studies) > 1

    def _usable(self, instances: Sequence[_Seen]) -> bool:
        first = instances[0]
        if any(not _alike(first, other) for other in instances[1:]):
            return False
        if first.frames != 1 or first.orientation is None or first.pixel_spacing is None:
            return False  # multi-frame, or no geometry at the top level
        if any(i.position is None for i in instances):
            return False
        series = _Series(
            series_instance_uid=first.series_instance_uid,
            study_instance_uid=first.study_instance_uid,
            series_number=first.series_number,
            modality=first.modality,
            body_part_examined=first.body_part_examined,
            slice_thickness=first.slice_thickness,
            number_of_frames=len(instances),
            number_of_instances=len(instances),
            image_type=first.image_type,
            series_description=first.series_description,
            sop_class_uid=first.sop_class_uid,
        )
        if rejection_reason(series, self.rules) is not None:
            return False
        if self.planes is None:
            return True
        affines = _stack_affines(instances)
        return bool(affines) and all(self.planes.refusal_of(a) is None for a in affines)

    # --- the exact check -------------------------------------------------------------------
    def staged_check(self) -> Callable[[Path], None] | None:
        """The check :func:`radserve.store.files.store_study` runs on the staged files
        (raises the error the job would fail with), or None when the screen let the
        upload through."""
        if self.plainly_usable() and not self.several_studies_seen():
            return None
        return self.check

    def check(self, folder: Path) -> None:
        """Raise what a job would fail with before loading any series of ``folder``."""
        try:
            headers = discover_series(folder, policy=self.policy)
            refusal = _several_studies(headers, self.rules) or selection_refusal(
                headers, self.rules, planes=self.planes, policy=self.policy
            )
        except SeveralStudiesError as exc:  # two files of one instance in two studies
            refusal = exc
        except RadserveError as exc:  # not a selection matter: the job says it, as before
            logger.info("upload: its series were not judged at the door (%s)", exc.code)
            return
        except Exception as exc:  # never turn an upload the job would take into a 500
            logger.warning(
                "upload: its series could not be judged at the door (%s); the job judges them",
                type(exc).__name__,
            )
            return
        if refusal is not None:
            logger.info(
                "upload refused at the door: %s (%d series, none usable)",
                refusal.code,
                len(headers),
            )
            raise refusal


def _several_studies(
    headers: Sequence[SeriesHeader], rules: SeriesRules
) -> SeveralStudiesError | None:
    """What the job fails with when series of several studies qualify, as it would say
    it; None when they do not, or when the job would fail first for an unusable
    instance (its own code: :func:`radserve.pipeline.inputs.ingest_study`)."""
    try:
        rank_series(headers, rules)
    except SeveralStudiesError as exc:
        if any(h.unusable is not None for h in headers):
            return None
        return exc
    except RadserveError:
        return None
    return None


def _summary(ds: Dataset) -> _Seen:
    """The screen's values of ``ds``, read from the raw bytes where pydicom has not
    converted them yet (a conversion per value cost 0.4 ms a file; a deferred value is
    not read: absent, the exact check judges)."""
    number = _text(ds, "SeriesNumber")
    thickness = _text(ds, "SliceThickness")
    frames = _text(ds, "NumberOfFrames")
    return _Seen(
        series_instance_uid=_text(ds, "SeriesInstanceUID"),
        study_instance_uid=_text(ds, "StudyInstanceUID"),
        series_number=int(float(number)) if number else None,
        modality=_text(ds, "Modality"),
        sop_class_uid=_text(ds, "SOPClassUID"),
        image_type=tuple(v.strip() for v in _text(ds, "ImageType").split("\\")),
        frames=int(float(frames)) if frames else 1,
        slice_thickness=float(thickness) if thickness else None,
        series_description=str(ds.get("SeriesDescription", "")),
        body_part_examined=_text(ds, "BodyPartExamined"),
        orientation=_floats(ds, "ImageOrientationPatient", 6),
        position=_floats(ds, "ImagePositionPatient", 3),
        pixel_spacing=_floats(ds, "PixelSpacing", 2),
    )


def _text(ds: Dataset, keyword: str) -> str:
    """A value of a text VR (UI, CS, DS, IS) as written, values joined by backslashes."""
    element = ds.get_item(_TAGS[keyword], keep_deferred=True)
    if element is None or element.value is None:
        return ""
    value = element.value
    if isinstance(value, bytes):
        return value.decode("ascii", "replace").strip(" \x00")
    if isinstance(value, str):
        return value.strip(" \x00")
    if isinstance(value, int | float):
        return str(value)
    return "\\".join(str(v) for v in value)


def _floats(ds: Dataset, keyword: str, count: int) -> tuple[float, ...] | None:
    text = _text(ds, keyword)
    if not text:
        return None
    values = tuple(float(v) for v in text.split("\\"))
    return values if len(values) == count and all(map(math.isfinite, values)) else None


def _alike(a: _Seen, b: _Seen) -> bool:
    """Instances one series part of discovery would hold alike (else the exact check)."""
    if (a.study_instance_uid, a.modality, a.sop_class_uid, a.image_type, a.frames) != (
        b.study_instance_uid,
        b.modality,
        b.sop_class_uid,
        b.image_type,
        b.frames,
    ):
        return False
    if a.orientation is None or b.orientation is None:
        return False
    same = all(abs(x - y) <= _SAME for x, y in zip(a.orientation, b.orientation, strict=True))
    return same and a.pixel_spacing == b.pixel_spacing


def _stack_affines(instances: Sequence[_Seen]) -> list[np.ndarray]:
    """The (slice, row, column) affines the stack may load with: its slice step along
    the normal (resampled or untilted) and along its first→last positions (a gantry tilt
    kept sheared); none for fewer than two distinct positions."""
    first = instances[0]
    assert first.orientation is not None and first.pixel_spacing is not None
    row_dir = np.array(first.orientation[:3])
    col_dir = np.array(first.orientation[3:])
    normal = np.cross(row_dir, col_dir)
    positions = np.array([i.position for i in instances], dtype=np.float64)
    along = positions @ normal
    order = np.argsort(along, kind="stable")
    span = float(along[order[-1]] - along[order[0]])
    if len(instances) < 2 or span <= 0:
        return []
    steps = len(instances) - 1
    affines = []
    for slice_vector in (
        normal * span / steps,
        (positions[order[-1]] - positions[order[0]]) / steps,
    ):
        affine = np.eye(4)
        affine[:3, 0] = slice_vector
        affine[:3, 1] = col_dir * first.pixel_spacing[0]
        affine[:3, 2] = row_dir * first.pixel_spacing[1]
        affine[:3, 3] = positions[order[0]]
        affines.append(affine)
    return affines


__all__ = ["SelectionDoor"]

"""Pick the series a pipeline runs on, and say why every other series was not used."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol, TypeVar

from radserve.errors import StudyError, UnsupportedModalityError
from radserve.pipeline.spec import SeriesRules
from radserve.report.schema import SeriesRef


class SeriesLike(Protocol):
    """The header fields selection rules look at (``radserve.ingest.SeriesHeader``)."""

    @property
    def series_instance_uid(self) -> str: ...
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


S = TypeVar("S", bound=SeriesLike)


def rejection_reason(series: SeriesLike, rules: SeriesRules) -> str | None:
    """The first rule ``series`` breaks, in words, or None when it qualifies."""
    if rules.modalities and series.modality not in rules.modalities:
        return f"modality {series.modality} is not one of {list(rules.modalities)}"
    excluded = set(series.image_type) & set(rules.exclude_image_types)
    if excluded:
        return f"image type {sorted(excluded)} is excluded"
    if series.number_of_frames < rules.min_slices:
        return f"{series.number_of_frames} images, fewer than the {rules.min_slices} required"
    thickness = series.slice_thickness
    limit = rules.max_slice_thickness_mm
    if limit is not None and thickness is not None and thickness > limit + 1e-6:
        return f"slice thickness {thickness:g} mm exceeds {limit:g} mm"
    pattern = rules.series_description
    if pattern is not None and re.search(pattern, series.series_description or "") is None:
        return f"series description {series.series_description!r} does not match {pattern!r}"
    if rules.body_parts:
        part = (series.body_part_examined or "").upper()
        if part not in {p.upper() for p in rules.body_parts}:
            return f"body part {part or '(none)'} is not one of {list(rules.body_parts)}"
    return None


def select_series(series: Sequence[S], rules: SeriesRules) -> tuple[S, list[SeriesRef]]:
    """The best qualifying series and a reason for each series not chosen.

    Raises a StudyError (UnsupportedModalityError when only the modality is wrong) that
    lists every series and its reason when none qualifies.
    """
    rejected: list[SeriesRef] = []
    candidates: list[S] = []
    for s in series:
        reason = rejection_reason(s, rules)
        if reason is None:
            candidates.append(s)
        else:
            rejected.append(_ref(s, reason))
    if not candidates:
        detail = "; ".join(f"series {r.series_number or '?'}: {r.reason}" for r in rejected)
        if not series:
            raise StudyError("the study contains no DICOM image series")
        if rules.modalities and all(s.modality not in rules.modalities for s in series):
            raise UnsupportedModalityError(
                f"this pipeline needs {'/'.join(rules.modalities)}; the study has "
                f"{sorted({s.modality for s in series})} ({detail})"
            )
        raise StudyError(f"no series meets the pipeline's selection rules ({detail})")
    if rules.prefer == "thinnest":
        key = lambda s: (s.slice_thickness or 1e9, -s.number_of_frames)  # noqa: E731
    else:
        key = lambda s: (-s.number_of_frames, s.slice_thickness or 1e9)  # noqa: E731
    ordered = sorted(candidates, key=key)
    best = ordered[0]
    for other in ordered[1:]:
        rejected.append(_ref(other, f"another series preferred ({rules.prefer})"))
    return best, rejected


def refusals(series: Sequence[SeriesLike], rules: SeriesRules) -> list[SeriesRef]:
    """Each of ``series`` with the first rule it breaks when ``rules`` refuse every one
    (what made :func:`select_series` fail), else none: a study one of whose series
    qualifies was not refused."""
    refused = []
    for s in series:
        reason = rejection_reason(s, rules)
        if reason is None:
            return []
        refused.append(_ref(s, reason))
    return refused


def _ref(series: SeriesLike, reason: str) -> SeriesRef:
    return SeriesRef(
        series_instance_uid=series.series_instance_uid,
        series_number=series.series_number,
        modality=series.modality,
        reason=reason,
        instance_count=series.number_of_instances,
    )

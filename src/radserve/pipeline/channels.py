"""Several series in, one model: the other series a multi-channel model reads (PET/CT).

A model with ``input.channels`` (:class:`~radserve.models.manifest.ChannelSpec`) takes
its reference channel from the series the pipeline selected and every other channel
from another series of the same study, chosen by modality (and Series Description):
loaded, converted (PT to SUVbw where declared: the reference series too, for a model
that reads a PET as its grid, a PET-only model) and resampled onto the reference grid
through patient coordinates, by the model's ``input.channel_interpolation``. Refused,
with the reason: a channel whose series the study does not have, a series of another
patient or study than the reference series (``channel_series_mismatch``: which of
Patient ID, Issuer of Patient ID, Patient's Name, Birth Date and Study Instance UID
differ, never their values), a series in another Frame of Reference (radserve does not
register series), a PET whose headers do not give an SUV, a series that images none of
the reference volume (or less than the model's ``input.min_channel_coverage``). A series
that images part of it (a small-FOV T2 beside a 3D T1) is read as 0 (no signal) outside
its slab and the report says which share of the reference volume it covered: the
model's output there rests on the other channels.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from radserve.errors import StudyError
from radserve.ingest import IngestPolicy, LoadedSeries, SeriesHeader, load_series
from radserve.ingest.sop_classes import is_localizer
from radserve.ingest.suv import series_to_suv
from radserve.models.manifest import ChannelSpec, ModelSpec
from radserve.models.registry import ModelRegistry
from radserve.pipeline.selection import description_matches
from radserve.pipeline.spec import PipelineSpec
from radserve.preprocess.onto_grid import INTERPOLATION_ORDERS, sample_onto
from radserve.progress import StageTimer

if TYPE_CHECKING:  # inputs imports the volume run, which imports this module
    from radserve.pipeline.inputs import IngestedStudy

logger = logging.getLogger(__name__)


class ChannelSeriesError(StudyError):
    """A multi-channel model's series is missing from the study or cannot be used."""

    code = "channel_series_unavailable"
    depends_on_model = True  # the series one model version asks for


class ChannelSeriesMismatchError(ChannelSeriesError):
    """A multi-channel model's other series is of another patient or study than the
    reference series: one patient's PET over another's CT would be a clinical error."""

    code = "channel_series_mismatch"


@dataclass(frozen=True)
class ChannelInputs:
    """Each multi-channel model's non-reference channels on the reference grid
    (model key -> channel name -> float32 array), and the series they came from."""

    arrays: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    series: dict[str, str] = field(default_factory=dict)  # "model key: channel" -> series UID

    def for_model(self, spec: ModelSpec) -> dict[str, np.ndarray] | None:
        """The arrays ``spec`` needs (None for a single-series model)."""
        if not spec.input.channels:
            return None
        return self.arrays.get(spec.key, {})


def matches(header: SeriesHeader, channel: ChannelSpec) -> bool:
    """Whether ``header`` is a series ``channel`` may be taken from."""
    if header.modality.upper() != channel.modality:
        return False
    if is_localizer(header.image_type):
        return False
    return description_matches(channel.series_description, header.series_description)


def _wanted(channel: ChannelSpec) -> str:
    """The series ``channel`` reads, in words."""
    where = channel.series_description
    return f"a {channel.modality} series" + (
        f" with a Series Description matching {where!r}" if where else ""
    )


def _differences(reference: SeriesHeader, other: SeriesHeader) -> tuple[str, ...]:
    """The names of the attributes that make ``other`` another patient's or study's
    series than ``reference`` (no values)."""
    names = reference.patient.differs_from(other.patient)
    if other.study_instance_uid != reference.study_instance_uid:
        names = (*names, "Study Instance UID")
    return names


def _pick(
    series: Sequence[SeriesHeader],
    channel: ChannelSpec,
    spec: ModelSpec,
    reference: SeriesHeader,
) -> SeriesHeader:
    candidates = [s for s in series if matches(s, channel)]
    if not candidates:
        have = ", ".join(sorted({s.modality or "?" for s in series})) or "no image series"
        raise ChannelSeriesError(
            f"model {spec.key} needs input channel {channel.name!r} from {_wanted(channel)}, "
            f"but the study has none (its series: {have}); send that series with the study"
        )
    own = [s for s in candidates if not _differences(reference, s)]
    if not own:
        other = candidates[0]
        number = other.series_number or "?"
        raise ChannelSeriesMismatchError(
            f"model {spec.key}: the {channel.modality} series {number} of channel "
            f"{channel.name!r} is not of the reference series' patient and study "
            f"({', '.join(_differences(reference, other))} differ"
            + (f"; {len(candidates)} such series, none of them" if len(candidates) > 1 else "")
            + "): its images would be read over another patient's or study's; send the "
            "series of one patient's study together"
        )
    return max(own, key=lambda s: (s.number_of_frames, -(s.slice_thickness or 1e9)))


def _load(header: SeriesHeader, channel: ChannelSpec, policy: IngestPolicy | None) -> LoadedSeries:
    loaded = load_series(header, policy or IngestPolicy(), required_modality=channel.modality)
    return _in_units(loaded, channel)


def _in_units(loaded: LoadedSeries, channel: ChannelSpec) -> LoadedSeries:
    """``loaded`` in the units ``channel`` declares (a PT series to SUVbw)."""
    if channel.units != "SUVbw":
        return loaded
    volume, factors = series_to_suv(loaded)
    logger.info("channel %s: SUVbw (%s)", channel.name, factors.rule)
    return dataclasses.replace(loaded, volume=volume)


def load_channels(
    ingested: IngestedStudy,
    pipeline: PipelineSpec,
    registry: ModelRegistry,
    policy: IngestPolicy | None = None,
    timer: StageTimer | None = None,
) -> tuple[IngestedStudy, ChannelInputs]:
    """The other series the pipeline's multi-channel models read, on the reference grid.

    Returns the study with those series taken off its list of series passed over, and the
    channel arrays. A pipeline of single-series models costs nothing here.
    """
    specs = [registry.get(s.model, s.version).spec for s in pipeline.steps]
    specs = [s for s in specs if s.input.channels]
    if not specs:
        return ingested, ChannelInputs()
    timer = timer or StageTimer()
    reference = ingested.loaded
    ref_volume = reference.volume
    cache: dict[tuple[str, str, int], tuple[np.ndarray, float]] = {}
    inputs = ChannelInputs()
    warnings: list[str] = []
    with timer.stage("ingest: channels"):
        for spec in specs:
            ref_channel = spec.input.reference_channel
            assert ref_channel is not None
            if not matches(reference.header, ref_channel):
                raise ChannelSeriesError(
                    f"model {spec.key}'s reference channel {ref_channel.name!r} reads "
                    f"{_wanted(ref_channel)}, but the pipeline selected a "
                    f"{reference.header.modality} series; set the pipeline's "
                    "series_selection (modalities, series_description) to select the "
                    "reference series"
                )
            arrays: dict[str, np.ndarray] = {}
            if ref_channel.units == "SUVbw":  # a PET as the grid: its own values in SUV
                key = (reference.header.key, ref_channel.units, -1)  # -1: not resampled
                if key not in cache:
                    cache[key] = _in_units(reference, ref_channel).volume.array, 1.0
                arrays[ref_channel.name] = cache[key][0]
            for channel in spec.input.channels:
                if channel.name == ref_channel.name:
                    continue
                header = _pick(ingested.series, channel, spec, reference.header)
                order = INTERPOLATION_ORDERS[spec.input.channel_interpolation]
                key = (header.key, channel.units, order)
                if key not in cache:
                    loaded = _load(header, channel, policy)
                    uid = loaded.volume.frame_of_reference_uid
                    if not uid or uid != ref_volume.frame_of_reference_uid:
                        raise ChannelSeriesError(
                            f"model {spec.key}: the {channel.modality} series of channel "
                            f"{channel.name!r} is not in the reference series' Frame of "
                            "Reference; radserve does not register series, so it cannot "
                            "place one on the other (send series acquired together, as a "
                            "PET/CT is)"
                        )
                    on_grid, covered = sample_onto(
                        loaded.volume,
                        ref_volume,
                        order=order,
                        max_voxels=(policy or IngestPolicy()).max_voxels,
                    )
                    cache[key] = on_grid.array, covered
                arrays[channel.name], covered = cache[key]
                _check_coverage(covered, channel, header, spec, warnings)
                inputs.series[f"{spec.key}: {channel.name}"] = header.series_instance_uid
            inputs.arrays[spec.key] = arrays
    used = set(inputs.series.values())
    rejected = [r for r in ingested.rejected if r.series_instance_uid not in used]
    loaded = dataclasses.replace(reference, warnings=(*reference.warnings, *warnings))
    return dataclasses.replace(ingested, loaded=loaded, rejected=rejected), inputs


def _check_coverage(
    covered: float,
    channel: ChannelSpec,
    header: SeriesHeader,
    spec: ModelSpec,
    warnings: list[str],
) -> None:
    """Refuse a channel series that images too little of the reference volume; flag one
    that images part of it (a radiologist reads a finding outside a sequence's slab from
    the other sequences only, and must be told)."""
    floor = spec.input.min_channel_coverage
    number = header.series_number or "?"
    where = f"the {channel.modality} series {number} of channel {channel.name!r}"
    if covered <= 0.0 or covered < floor:
        raise ChannelSeriesError(
            f"model {spec.key}: {where} images {covered:.1%} of the reference series' "
            f"volume (the model needs {'some' if floor <= 0 else f'at least {floor:.0%}'}); "
            "send a series that covers the same anatomy"
        )
    if covered < 1.0:
        warnings.append(
            f"channel_partial_coverage: model {spec.key}: {where} images {covered:.1%} of the "
            "reference series' volume; outside it the channel is read as 0 (no signal), so "
            "results there rest on the other channels"
        )


__all__ = [
    "ChannelInputs",
    "ChannelSeriesError",
    "ChannelSeriesMismatchError",
    "load_channels",
    "matches",
]

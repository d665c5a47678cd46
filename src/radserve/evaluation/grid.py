"""Accuracy across a grid of acquisitions (``radserve evaluate --grid``).

A model is honest about its input domain when it meets its accuracy floors wherever it
says it works and says where it does not. Each grid cell changes one acquisition
property of the held-out phantoms away from their baseline (one factor at a time, so
the cell count is the sum of the axes' values, not their product):

- ``slice_thickness`` (mm): slices of that thickness and spacing over the same coverage;
- ``noise`` (x): the phantom's Gaussian noise multiplied;
- ``hu_offset`` (HU): a calibration offset added to every voxel;
- ``fov`` (mm): the in-plane field of view (pixel spacing = fov / columns, same patient);
- ``pixel_spacing`` (mm): the same change named by the pixel (fov = spacing x columns);
- ``matrix`` (rows = columns): another reconstruction matrix over the same field of view
  (so the pixel spacing changes with it);
- ``coverage`` (mm): the z extent (same slice step, same midpoint, more or fewer slices);
- ``suv_scale`` (x): every PET SUV multiplied (PET/CT pipelines; a dose or calibration
  error);
- ``enhancement`` (x): the contrast medium's enhancement of vessels, organs and enhancing
  lesions (1: the portal-venous phase the phantoms draw, 0: a non-contrast CT).

``default`` spans the models' declaration: for each declared range (the tightest over
the pipeline's models) a cell at each edge and one just outside it, plus noise, HU
offset and contrast enhancement (and SUV scale for PET/CT). Each cell is scored like
``radserve evaluate`` (organ Dice, lesion recall by size, false positives per study),
compared with the project floors (:mod:`radserve.domain.accuracy`) and checked against
every pipeline model's declared ``input_domain``: the table says, per cell, whether the
floors are met, whether the studies lie inside the declaration and which declared range
they break. SUV scale is not part of the declared domain; its cells say "not
declared". The HU offset is declared where a model declares ``fat_hu`` (the CT number
its study's fat reads, measured per study: radserve.pipeline.ct_number), the noise where
one declares ``noise_hu`` (radserve.pipeline.ct_noise), the enhancement where one
declares ``structure_hu`` (a structure's mean HU in the output); their cells say which
studies they flag.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from radserve.domain.accuracy import (
    LESION_MAX_FP_PER_STUDY,
    LESION_RECALL_FLOORS,
    ORGAN_MEAN_DICE_FLOOR,
)
from radserve.domain.input_domain import (
    OUTSIDE_INPUT_DOMAIN,
    AcquisitionFacts,
    InputDomain,
    Interval,
    PixelReading,
    Range,
    header_violations,
    readings_outside,
)
from radserve.domain.volume import Volume
from radserve.evaluation.lesions import gt_lesions_from
from radserve.evaluation.pipeline_runs import organ_label_values
from radserve.evaluation.runner import GroundTruth, StudyPrediction, score_study
from radserve.evaluation.summary import StudyScores, summarise
from radserve.models.manifest import ModelSpec
from radserve.models.registry import ModelRegistry
from radserve.phantom import ORGAN_LABELS, Phantom, PhantomSpec, generate_phantom
from radserve.phantom.pet import generate_pet, with_suv_scale
from radserve.pipeline import SessionPool, run_volume
from radserve.pipeline.channels import ChannelInputs
from radserve.pipeline.profile import check_output_domain, volume_facts
from radserve.pipeline.spec import PipelineSpec
from radserve.preprocess.onto_grid import INTERPOLATION_ORDERS, resample_onto

logger = logging.getLogger(__name__)

AXES: dict[str, str] = {
    "slice_thickness": "mm",
    "noise": "x",
    "hu_offset": "HU",
    "fov": "mm",
    "pixel_spacing": "mm",
    "matrix": "",
    "coverage": "mm",
    "suv_scale": "x",
    "enhancement": "x",
}
# Without a declared domain: a few values around the phantoms' own acquisition.
# How the images look, which no geometric range declares: noise, calibration, contrast.
APPEARANCE_GRID = "noise=2.5,4;hu_offset=-40,40;enhancement=0.5"
DEFAULT_GRID = f"slice_thickness=1.25,2.5,5,7.5;fov=320,450,500;{APPEARANCE_GRID}"
DEFAULT_PET_GRID = ";suv_scale=0.8,1.25"
_UNDECLARED = frozenset({"noise", "hu_offset", "suv_scale", "enhancement"})
# Declared range -> grid axis, and how far past an edge "just outside" lies.
_DOMAIN_AXES: tuple[tuple[str, str], ...] = (
    ("pixel_spacing_mm", "pixel_spacing"),
    ("slice_thickness_mm", "slice_thickness"),
    ("fov_mm", "fov"),
    ("matrix", "matrix"),
    ("coverage_mm", "coverage"),
)
_OUTSIDE = 0.1  # 10 % past the edge; a matrix steps by 64 (the next common size)

__all__ = [
    "AXES",
    "DEFAULT_GRID",
    "GRID_HEADER",
    "CellResult",
    "GridCell",
    "cell_phantom",
    "domain_grid",
    "evaluate_grid",
    "floor_failures",
    "grid_markdown",
    "grid_rows",
    "parse_grid",
    "tightest_domain",
]


@dataclass(frozen=True)
class GridCell:
    """One variation of the baseline acquisition (``axis`` None: the baseline itself)."""

    axis: str | None = None
    value: float | None = None

    @property
    def label(self) -> str:
        if self.axis is None:
            return "baseline"
        unit = AXES[self.axis]
        return f"{self.axis}={self.value:g}{'' if unit in ('x', '') else ' '}{unit}"


def tightest_domain(domains: Sequence[InputDomain | None]) -> InputDomain | None:
    """The ranges every model accepts (the highest min and lowest max of each declared
    range); None when no model declares a domain."""
    declared = [d for d in domains if d is not None]
    if not declared:
        return None
    fields: dict[str, Interval] = {}
    for name in [name for name, _axis in _DOMAIN_AXES] + ["fat_hu"]:
        ranges: list[Interval] = [r for d in declared if (r := getattr(d, name)) is not None]
        if not ranges:
            continue
        lows = [r.min for r in ranges if r.min is not None]
        highs = [r.max for r in ranges if r.max is not None]
        kind = Interval if name == "fat_hu" else Range
        fields[name] = kind(min=max(lows) if lows else None, max=min(highs) if highs else None)
    return InputDomain.model_validate(fields)


def domain_grid(domain: InputDomain) -> str:
    """Grid axes at each declared edge and just outside it (10 % past a mm edge, 64 past a
    matrix edge), e.g. ``slice_thickness=0.5625,0.625,5,5.5``."""
    parts = []
    for name, axis in _DOMAIN_AXES:
        allowed: Range | None = getattr(domain, name)
        if allowed is None:
            continue
        values: list[float] = []
        if allowed.min:
            step = 64.0 if axis == "matrix" else allowed.min * _OUTSIDE
            values += [round(allowed.min - step, 4), allowed.min]
        if allowed.max is not None:
            step = 64.0 if axis == "matrix" else allowed.max * _OUTSIDE
            values += [allowed.max, round(allowed.max + step, 4)]
        if allowed.min is not None and allowed.min == allowed.max:
            values = [v for v in values if v != allowed.min]  # the edge is the baseline
        values = sorted({v for v in values if v > 0})
        if values:
            parts.append(f"{axis}=" + ",".join(f"{v:g}" for v in values))
    return ";".join(parts)


def parse_grid(
    text: str, *, pet: bool = False, domain: InputDomain | None = None
) -> list[GridCell]:
    """``"slice_thickness=1.25,5;noise=2"`` (or ``default``) -> baseline + one cell per
    value. ``default`` spans ``domain`` (:func:`domain_grid`) plus noise, HU offset and
    contrast enhancement, or a fixed set of values when no domain is declared; ``pet``
    adds SUV scales."""
    if text.strip() == "default":
        spans = domain_grid(domain) if domain is not None else ""
        text = (f"{spans};{APPEARANCE_GRID}" if spans else DEFAULT_GRID) + (
            DEFAULT_PET_GRID if pet else ""
        )
    cells = [GridCell()]
    for part in filter(None, (p.strip() for p in text.split(";"))):
        match = re.fullmatch(r"([a-z_]+)\s*=\s*([-0-9.,\s]+)", part)
        if not match:
            raise ValueError(f"bad grid axis {part!r}; expected e.g. 'slice_thickness=1.25,5'")
        axis = match.group(1)
        if axis not in AXES:
            raise ValueError(f"unknown grid axis {axis!r}; choose from {', '.join(AXES)}")
        try:
            values = [float(v) for v in match.group(2).split(",") if v.strip()]
        except ValueError as exc:
            raise ValueError(f"grid axis {axis!r}: values must be numbers ({exc})") from exc
        if axis == "enhancement" and any(v < 0 or v > 2 for v in values):
            raise ValueError(f"grid axis 'enhancement': values must be in 0..2, got {values}")
        if axis not in ("hu_offset", "enhancement") and any(v <= 0 for v in values):
            raise ValueError(f"grid axis {axis!r}: values must be positive, got {values}")
        if not values:
            raise ValueError(f"grid axis {axis!r} has no values; expected e.g. '{axis}=1,2'")
        cells += [GridCell(axis, v) for v in values]
    if len(cells) == 1:  # a typo such as ';' would evaluate the baseline alone, silently
        raise ValueError(
            f"no grid axis in {text!r}; expected e.g. 'slice_thickness=1.25,5' or 'default'"
        )
    return cells


def cell_phantom(seed: int, cell: GridCell, *, small: bool) -> tuple[Phantom, Volume]:
    """The phantom of ``seed`` acquired as ``cell`` says, and its CT (offset applied)."""
    spec = PhantomSpec.random(seed, small=small)
    value = float(cell.value) if cell.value is not None else 0.0
    if cell.axis == "slice_thickness":
        n = max(3, round(spec.n_slices * spec.slice_spacing_mm / value))
        spec = spec.with_slices(n, value)
    elif cell.axis == "noise":
        spec = dataclasses.replace(spec, noise_sigma_hu=spec.noise_sigma_hu * value)
    elif cell.axis == "fov":
        spec = dataclasses.replace(spec, pixel_spacing_mm=value / spec.columns)
    elif cell.axis == "pixel_spacing":
        spec = dataclasses.replace(spec, pixel_spacing_mm=value)
    elif cell.axis == "matrix":
        fov = spec.columns * spec.pixel_spacing_mm
        n = round(value)
        spec = dataclasses.replace(spec, rows=n, columns=n, pixel_spacing_mm=fov / n)
    elif cell.axis == "coverage":
        spec = spec.with_slices(max(3, round(value / spec.slice_spacing_mm)))
    elif cell.axis == "enhancement":
        spec = dataclasses.replace(spec, contrast_enhancement=value)
    phantom = generate_phantom(spec)
    ct = phantom.ct
    if cell.axis == "hu_offset":
        shifted = np.clip(ct.array.astype(np.int32) + round(value), -1024, 3071)
        ct = ct.with_array(shifted.astype(np.int16))
    return phantom, ct


def phantom_facts(ct: Volume, slice_thickness_mm: float | None = None) -> AcquisitionFacts:
    """A phantom CT's acquisition facts, as a study's are read (the slice thickness is the
    slice step unless given)."""
    return volume_facts(ct, modality="CT", slice_thickness_mm=slice_thickness_mm, body_part="CHEST")


def phantom_domain_violations(
    specs: Sequence[ModelSpec], ct: Volume, slice_thickness_mm: float | None = None
) -> list[str]:
    """Each way a phantom CT lies outside a step model's declared ``input_domain``, as
    ``model: what`` (the modality aside: PET/CT models read CT + PT)."""
    headers, readings = _phantom_outside(specs, phantom_facts(ct, slice_thickness_mm))
    return headers + [f"{model}: {reading.describe()}" for model, reading in readings]


def _phantom_outside(
    specs: Sequence[ModelSpec], facts: AcquisitionFacts
) -> tuple[list[str], list[tuple[str, PixelReading]]]:
    """(what the headers put outside, as ``model: what``; (model, reading) of the pixel
    readings outside), the modality aside."""
    headers = [
        f"{spec.name}: {v}"
        for spec in specs
        for v in header_violations(spec.input_domain, spec.modality, facts)
        if not v.startswith("modality ")
    ]
    readings = [
        (spec.name, reading)
        for spec in specs
        for reading in readings_outside(spec.input_domain, facts)
    ]
    return headers, readings


@dataclass(frozen=True)
class CellResult:
    """One row of the grid table."""

    cell: GridCell
    n_studies: int
    dice_mean: float | None
    lesion_recall: float | None
    n_lesions: int
    fp_per_study: float
    in_domain: bool
    violations: tuple[str, ...]
    undeclared: bool
    # ">=10mm" / "5-10mm" -> (recall or None, GT lesions): the strata the floors judge
    recall_floor_strata: tuple[tuple[str, float | None, int], ...] = ()
    failures: tuple[str, ...] = ()  # project floors not met (empty: all met)
    output_flagged: int = 0  # studies flagged for a structure volume or HU outside the declared

    @property
    def floors_met(self) -> bool:
        return not self.failures

    def to_dict(self) -> dict[str, object]:
        return {
            "cell": self.cell.label,
            "axis": self.cell.axis,
            "value": self.cell.value,
            "n_studies": self.n_studies,
            "dice_mean": self.dice_mean,
            "lesion_recall": self.lesion_recall,
            "n_lesions": self.n_lesions,
            "fp_per_study": self.fp_per_study,
            "recall_by_floor_stratum": {
                name: {"recall": recall, "n_lesions": n}
                for name, recall, n in self.recall_floor_strata
            },
            "floors_met": self.floors_met,
            "floor_failures": list(self.failures),
            "in_domain": self.in_domain,
            "studies_flagged_by_structures": self.output_flagged,
            "domain_declared": not self.undeclared,
            "violations": list(self.violations),
        }


def _channels(
    specs: Sequence[ModelSpec], phantom: Phantom, ct: Volume, cell: GridCell
) -> ChannelInputs:
    """The PET channel of each PET/CT model from the phantom's PET (SUV scale applied)."""
    needed = [s for s in specs if s.input.channels]
    if not needed:
        return ChannelInputs()
    pet = generate_pet(phantom)
    if cell.axis == "suv_scale" and cell.value is not None:
        pet = with_suv_scale(pet, cell.value)
    inputs = ChannelInputs()
    for spec in needed:
        order = INTERPOLATION_ORDERS[spec.input.channel_interpolation]
        suv = resample_onto(pet.suv, ct, order=order).array
        arrays = {}
        reference = spec.input.reference_channel
        for channel in spec.input.channels:
            grid = reference is not None and channel.name == reference.name
            if grid and channel.units != "SUVbw":
                continue  # the CT phantom itself; a PET as the grid is its SUV on the CT's
            if channel.modality != "PT" or channel.units != "SUVbw":
                raise ValueError(
                    f"model {spec.key}: channel {channel.name!r} ({channel.modality}, "
                    f"{channel.units}) has no phantom; the grid makes CT and PET in SUVbw"
                )
            arrays[channel.name] = suv
        inputs.arrays[spec.key] = arrays
    return inputs


_FLOOR_STRATA: dict[str, tuple[str, ...]] = {">=10mm": ("10-20", ">20"), "5-10mm": ("5-10",)}


def floor_strata(
    n_by_size: dict[str, int], detected_by_size: dict[str, int]
) -> tuple[tuple[str, float | None, int], ...]:
    """Recall in the strata the project floors name (">=10mm" pools 10-20 and >20 mm)."""
    out = []
    for name, strata in _FLOOR_STRATA.items():
        n = sum(n_by_size.get(s, 0) for s in strata)
        hit = sum(detected_by_size.get(s, 0) for s in strata)
        out.append((name, hit / n if n else None, n))
    return tuple(out)


def floor_failures(
    dice_mean: float | None,
    strata: Sequence[tuple[str, float | None, int]],
    fp_per_study: float,
    *,
    organs: bool,
    lesions: bool,
) -> tuple[str, ...]:
    """Which project floors (:mod:`radserve.domain.accuracy`) a cell misses: organ mean
    Dice, lesion recall per floor stratum (a stratum without GT lesions is not judged) and
    false positives per study; only the kinds the pipeline outputs are judged."""
    out = []
    if organs and (dice_mean is None or dice_mean < ORGAN_MEAN_DICE_FLOOR):
        out.append(f"Dice {_fmt(dice_mean)} < {ORGAN_MEAN_DICE_FLOOR:.2f}")
    if lesions:
        for name, recall, n in strata:
            floor = LESION_RECALL_FLOORS[name]
            if recall is not None and recall < floor:
                out.append(f"recall {name} {recall:.2f} < {floor:.2f} ({n} lesions)")
        if fp_per_study > LESION_MAX_FP_PER_STUDY:
            out.append(f"FP/study {fp_per_study:.2f} > {LESION_MAX_FP_PER_STUDY:g}")
    return tuple(out)


def evaluate_grid(
    registry: ModelRegistry,
    pipeline: PipelineSpec,
    *,
    cells: Sequence[GridCell],
    seeds: Sequence[int],
    small: bool = True,
    organ_labels: dict[str, int] | None = None,
    progress: Callable[[str], None] | None = None,
    on_row: Callable[[list[CellResult]], None] | None = None,
) -> list[CellResult]:
    """Score ``pipeline`` on the phantoms of ``seeds`` in every cell; one row per cell.
    ``progress`` hears one line per study (cell, seed, scores, seconds) and per cell;
    ``on_row`` gets the rows so far after each cell (a long run's partial table)."""
    specs = [registry.get(s.model, s.version).spec for s in pipeline.steps]
    kinds = {label.kind for spec in specs for label in spec.labels}
    organ_labels = organ_labels or organ_label_values(specs)
    sessions = SessionPool()
    rows: list[CellResult] = []
    # A declared fat CT number makes the HU offset a declared axis (the studies it moves
    # out of the range are flagged, radserve.pipeline.ct_number); a declared structure HU
    # (the aorta's enhancement) does the same for the contrast enhancement.
    domains = [s.input_domain for s in specs if s.input_domain is not None]
    declared_axes = {"hu_offset"} if any(d.fat_hu for d in domains) else set()
    if any(d.noise_hu for d in domains):
        declared_axes.add("noise")
    if any(d.structure_hu for d in domains):
        declared_axes.add("enhancement")
    for cell in cells:
        scores: list[StudyScores] = []
        violations: list[str] = []
        readings: list[tuple[str, PixelReading]] = []
        flagged = 0  # studies whose structures measured outside structure_volumes_ml or _hu
        for k, seed in enumerate(seeds, start=1):
            started = time.perf_counter()
            phantom, ct = cell_phantom(seed, cell, small=small)
            result = run_volume(
                ct,
                pipeline,
                registry=registry,
                sessions=sessions,
                channels=_channels(specs, phantom, ct, cell),
            )
            organ_step, lesion_step = result.organ_step, result.lesion_step
            organs = organ_step.labels.array if organ_step else np.zeros(ct.shape, np.uint8)
            lesions = (
                lesion_step.finding_labels.array
                if lesion_step is not None and lesion_step.finding_labels is not None
                else np.zeros(ct.shape, np.uint16)
            )
            truth = GroundTruth(
                seed=seed,
                ct=ct,
                organs=phantom.organs.array,
                organ_values=dict(ORGAN_LABELS),
                lesions=phantom.lesions.array,
                lesion_list=tuple(gt_lesions_from(phantom.lesion_list)),
            )
            prediction = StudyPrediction(organs, lesions, tuple(result.findings))
            scores.append(score_study(truth, prediction, organ_labels=organ_labels))
            if progress is not None:
                one = summarise(scores[-1:])
                found = sum(one.n_detected_by_size.values())
                progress(
                    f"{cell.label} seed {seed} ({k}/{len(seeds)}): {ct.shape[0]} slices, "
                    f"Dice {_fmt(one.dice_mean)}, {found}/{len(truth.lesion_list)} GT lesions "
                    f"found, {len(result.findings)} findings, FP {one.fp_per_study:g}, "
                    f"{time.perf_counter() - started:.0f} s"
                )
            # the report's own check: each model judged on the structures it declares
            if any(code == OUTSIDE_INPUT_DOMAIN for code, _ in check_output_domain(result)):
                flagged += 1
            headers, outside = _phantom_outside(
                specs, phantom_facts(ct, phantom.spec.slice_thickness_mm)
            )
            violations += headers
            readings += outside
        summary = summarise(scores)
        n_lesions = sum(summary.n_lesions_by_size.values())
        detected = sum(summary.n_detected_by_size.values())
        unique = _pooled(violations, readings, len(seeds))
        strata = floor_strata(summary.n_lesions_by_size, summary.n_detected_by_size)
        rows.append(
            CellResult(
                cell=cell,
                n_studies=summary.n_studies,
                dice_mean=summary.dice_mean,
                lesion_recall=detected / n_lesions if n_lesions else None,
                n_lesions=n_lesions,
                fp_per_study=summary.fp_per_study,
                in_domain=not unique and not flagged,
                violations=unique,
                undeclared=cell.axis in _UNDECLARED - declared_axes,
                recall_floor_strata=strata,
                output_flagged=flagged,
                failures=floor_failures(
                    summary.dice_mean,
                    strata,
                    summary.fp_per_study,
                    organs="organ" in kinds,
                    lesions="lesion" in kinds,
                ),
            )
        )
        if progress is not None:
            progress(f"cell {rows[-1].cell.label} done")
        if on_row is not None:
            on_row(list(rows))
        logger.info("grid cell %s: %d studies", cell.label, summary.n_studies)
    return rows


def _pooled(
    violations: Sequence[str], readings: Sequence[tuple[str, PixelReading]], n_studies: int
) -> tuple[str, ...]:
    """Each distinct violation once; a model's fat or noise readings (one per study, each
    its own value) as one entry with their span and how many studies they flag."""
    groups: dict[tuple[str, str, str], list[PixelReading]] = {}  # insertion: table order
    for model, reading in readings:
        groups.setdefault((model, reading.what, str(reading.allowed)), []).append(reading)
    pooled = []
    for (model, _, _), group in groups.items():
        low, high = min(r.hu for r in group), max(r.hu for r in group)
        span = f"{low:.0f}" if f"{low:.0f}" == f"{high:.0f}" else f"{low:.0f} to {high:.0f}"
        where = f" in {len(group)} of {n_studies} studies"
        pooled.append(f"{model}: {group[0].describe(span, where)}")
    return (*dict.fromkeys(violations), *pooled)


def _fmt(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def grid_rows(rows: Sequence[CellResult]) -> list[list[str]]:
    """The table's cells as text: cell, studies, Dice, recall (lesions), recall per floor
    stratum, FP/study, floors met, inside the declared domain."""
    out = []
    for row in rows:
        strata = {name: (recall, n) for name, recall, n in row.recall_floor_strata}
        if row.in_domain:
            inside = "yes (axis not declared)" if row.undeclared else "yes"
        else:
            reasons = list(row.violations)
            if row.output_flagged:
                reasons.append(
                    f"{row.output_flagged} of {row.n_studies} studies flagged by their "
                    "structures' volume or HU"
                )
            inside = "no: " + "; ".join(reasons)
        out.append(
            [
                row.cell.label,
                str(row.n_studies),
                _fmt(row.dice_mean),
                f"{_fmt(row.lesion_recall, 2)} ({row.n_lesions})",
                *(
                    f"{_fmt(strata.get(name, (None, 0))[0], 2)} ({strata.get(name, (None, 0))[1]})"
                    for name in _FLOOR_STRATA
                ),
                f"{row.fp_per_study:.2f}",
                "yes" if row.floors_met else "no: " + "; ".join(row.failures),
                inside,
            ]
        )
    return out


GRID_HEADER = [
    "cell",
    "studies",
    "Dice (mean)",
    "lesion recall (n)",
    "recall ≥10 mm (n)",
    "recall 5-10 mm (n)",
    "FP/study",
    "floors met",
    "in domain",
]


def grid_markdown(rows: Sequence[CellResult]) -> str:
    lines = ["| " + " | ".join(GRID_HEADER) + " |", "|" + "---|" * len(GRID_HEADER)]
    lines += ["| " + " | ".join(r) + " |" for r in grid_rows(rows)]
    return "\n".join(lines) + "\n"

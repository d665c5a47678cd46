"""What a study looked like and what the models said about it, as the drift monitor
(:mod:`radserve.lifecycle.drift`) compares it, and the check of a study against each
model's declared input domain.

Features of one study (:func:`study_features`, a JSON-ready dict):

* ``hist``: ``hu_body``, the HU histogram inside the body (fractions over
  :data:`HU_EDGES`; the body is the largest connected region above -500 HU, on a strided
  copy of the volume so a 500-slice study costs what a small one does);
* ``num`` (continuous): in-plane pixel spacing, slice thickness, slice step, slice count,
  mean body HU, noise (``noise_hu``: robust SD of neighbouring soft-tissue pixel
  differences, :mod:`radserve.pipeline.ct_noise`), the CT number of the body's fat
  (``fat_hu``: a scanner's calibration; None when none is found);
* ``cat`` (categorical): manufacturer, convolution kernel, kVp (from the first source
  file; ``unknown`` for NIfTI input or when absent);
* ``models``: per model, ``positive`` (cat), ``finding_count``, ``finding_size_mm`` (the
  longest diameters, pooled), ``mean_confidence`` and ``volume_ml.<organ>`` (num).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from scipy import ndimage

from radserve.domain import Volume
from radserve.domain.findings import OrganMeasurement
from radserve.domain.input_domain import (
    BODY_HU,
    INPUT_DOMAIN_UNCHECKED,
    OUTSIDE_INPUT_DOMAIN,
    AcquisitionFacts,
    MeasuredStructure,
    body_missing,
    domain_unchecked,
    domain_violations,
    output_unchecked,
    output_violations,
)
from radserve.errors import InputDomainError
from radserve.ingest.load import LoadedSeries
from radserve.models.manifest import ModelSpec
from radserve.pipeline.ct_body import body_thickness_mm
from radserve.pipeline.ct_noise import noise_hu
from radserve.pipeline.ct_number import fat_peak_hu
from radserve.pipeline.volume import VolumeResult

logger = logging.getLogger(__name__)

HU_EDGES = np.arange(-1000.0, 1501.0, 25.0)  # 100 bins; values outside clip to the ends
_BODY_HU = BODY_HU  # tissue: the body (the input-domain check's definition)
_MAX_VOXELS = 4_000_000  # the strided copy the features are measured on


def acquisition_facts(loaded: LoadedSeries) -> AcquisitionFacts:
    """The headers' facts, and for a CT where its fat reads and how noisy it is (~25 ms
    each on a 300-slice CT: measure once per study and pass the facts on)."""
    header = loaded.header
    return volume_facts(
        loaded.volume,
        modality=header.modality or "",
        slice_thickness_mm=header.slice_thickness,
        body_part=(header.body_part_examined or "").strip(),
    )


def volume_facts(
    volume: Volume, *, modality: str, slice_thickness_mm: float | None, body_part: str
) -> AcquisitionFacts:
    """:func:`acquisition_facts` of a volume whose headers say ``modality``, the slice
    thickness (None or 0: the slice step) and the body part (an evaluation's phantom)."""
    spacing = volume.spacing
    slices, rows, columns = volume.shape
    ct = modality.upper() == "CT"
    return AcquisitionFacts(
        modality=modality,
        pixel_spacing_mm=max(spacing[1], spacing[2]),
        slice_thickness_mm=float(slice_thickness_mm or spacing[0]),
        rows=rows,
        columns=columns,
        slices=slices,
        body_part=body_part,
        slice_spacing_mm=float(spacing[0]),
        fat_hu=_measure_pixels(fat_peak_hu, volume, "fat") if ct else None,
        noise_hu=_measure_pixels(noise_hu, volume, "noise") if ct else None,
        body_share=_measure_pixels(body_share, volume, "body") if ct else None,
        body_thickness_mm=_measure_pixels(body_thickness_mm, volume, "body") if ct else None,
    )


def body_share(volume: Volume) -> float:
    """The share of the volume's voxels above -500 HU (tissue: the body), on the strided
    copy the features use (a few ms on a 300-slice CT)."""
    array = _strided(np.asarray(volume.array))
    return float(np.count_nonzero(array > _BODY_HU)) / array.size if array.size else 0.0


def _measure_pixels(
    measure: Callable[[Volume], float | None], volume: Volume, what: str
) -> float | None:
    """A measurement of the pixels (the fat peak, the noise); a failure only leaves that
    part of the domain unchecked (the report says so), it never fails the study."""
    try:
        return measure(volume)
    except Exception:
        logger.exception("the input-domain check could not measure the study's %s", what)
        return None


def check_input_domain(
    facts: AcquisitionFacts, specs: list[ModelSpec], *, refuse: bool
) -> list[tuple[str, str]]:
    """(code, message) per model the study lies outside of, and per model what of its
    declaration the study could not be judged on (``input_domain_unchecked``); raises
    :class:`InputDomainError` instead when ``refuse`` and the study lies outside.

    First, whatever the models declare, a CT with no body in view (``body_missing``:
    all air, all padding, a small object in a large field) is outside every model's
    domain: flagged, never refused (the sender still gets a report, saying why)."""
    out: list[tuple[str, str]] = []
    for spec in specs:
        reasons = domain_violations(spec.input_domain, spec.modality, facts)
        if reasons:
            out.append(
                (
                    OUTSIDE_INPUT_DOMAIN,
                    f"outside the input domain of {spec.key}: {'; '.join(reasons)}",
                )
            )
    if refuse and out:
        raise InputDomainError("; ".join(message for _, message in out))
    missing = body_missing(facts)
    if missing:
        out.insert(0, (OUTSIDE_INPUT_DOMAIN, missing))
    for spec in specs:
        out += _unchecked(spec, domain_unchecked(spec.input_domain, facts))
    return out


def _unchecked(spec: ModelSpec, parts: list[str]) -> list[tuple[str, str]]:
    """The report note for the parts of ``spec``'s declaration a study was not judged on."""
    if not parts:
        return []
    return [
        (
            INPUT_DOMAIN_UNCHECKED,
            f"input domain of {spec.key} not wholly checked: {'; '.join(parts)}",
        )
    ]


def check_output_domain(result: VolumeResult) -> list[tuple[str, str]]:
    """(code, message) per model whose structures measured outside the volumes or mean
    HU it declares (``input_domain.structure_volumes_ml`` / ``structure_hu``): the study
    matched the declared geometry but does not look like what the model learned. Flagged,
    never refused (the model has run by then). A ``structure_hu`` label not found is
    noted as unchecked (``input_domain_unchecked``).

    A model with region labels is judged on its own structures; one without (a lesion
    model) on the earlier steps' structures it names, measured on their label maps: a
    lesion model validated on one contrast phase says so in its own name, instead of
    the organ model's flag standing for both."""
    out: list[tuple[str, str]] = []
    upstream: dict[str, tuple[MeasuredStructure, str]] = {}  # label -> latest, its model
    for step in result.steps:
        spec = step.bundle.spec
        own = [_measured(m) for m in step.organs]
        domain, where = spec.input_domain, ""
        if spec.region_labels:
            measured = own
        else:
            names = {name for _, name in domain.named_structures()} if domain else set()
            seen = [upstream[n] for n in sorted(names) if n in upstream]
            measured = [m for m, _ in seen]
            sources = sorted({key for _, key in seen})
            where = f" (structures of {', '.join(sources)})" if sources else ""
        for m in own:
            upstream[m.label] = (m, spec.key)
        reasons = output_violations(domain, measured)
        if reasons:
            message = f"outside the input domain of {spec.key}{where}: {'; '.join(reasons)}"
            out.append((OUTSIDE_INPUT_DOMAIN, message))
        out += _unchecked(spec, output_unchecked(domain, measured))
    return out


def _measured(m: OrganMeasurement) -> MeasuredStructure:
    return MeasuredStructure(m.label, m.coverage, m.volume_ml, m.mean_hu)


_CHUNK = 1 << 18  # elements per step of the counts below: bounded temporaries


def _chunked_bincount(ids: np.ndarray, length: int) -> np.ndarray:
    """``np.bincount(ids, minlength=length)`` without widening all of ``ids`` to int64
    at once (on a 300-slice study that copy was the report stage's peak, +23 MiB)."""
    counts = np.zeros(length, np.int64)
    for start in range(0, ids.size, _CHUNK):
        counts += np.bincount(ids[start : start + _CHUNK], minlength=length)
    return counts


def _hu_counts(body: np.ndarray, *, integral: bool) -> np.ndarray:
    """Voxels per ``HU_EDGES`` bin, values outside clipped to the end bins.

    ``integral``: every value is a whole HU (an integer volume's), so a value's bin is
    ``(hu - first edge) // width`` exactly, counted by ``np.bincount``: the counts of
    ``np.histogram``, which searches the edges (sorting each chunk) at ~4x the cost.
    """
    counts = np.zeros(len(HU_EDGES) - 1, np.int64)
    first, width = HU_EDGES[0], HU_EDGES[1] - HU_EDGES[0]
    for start in range(0, body.size, _CHUNK):
        chunk = body[start : start + _CHUNK]
        if integral:
            offset = np.clip(chunk, first, HU_EDGES[-1] - 1.0) - first
            counts += np.bincount((offset // width).astype(np.intp), minlength=len(counts))
        else:
            part = np.clip(chunk, first, HU_EDGES[-1] - 1e-3)
            counts += np.histogram(part, bins=HU_EDGES)[0]
    return counts


def _strided(array: np.ndarray) -> np.ndarray:
    step = 1
    while array[::step, ::step, ::step].size > _MAX_VOXELS:
        step += 1
    return array[::step, ::step, ::step]


def input_features(loaded: LoadedSeries, facts: AcquisitionFacts) -> dict[str, Any]:
    """The ``hist``/``num``/``cat`` input features of one study (``facts``: its
    :func:`acquisition_facts`)."""
    return volume_features(loaded.volume, facts, _scanner(loaded))


def volume_features(
    volume: Volume, facts: AcquisitionFacts, scanner: Mapping[str, str]
) -> dict[str, Any]:
    """:func:`input_features` of a CT volume whose acquisition facts are known."""
    array = _strided(np.asarray(volume.array))
    mask = array > _BODY_HU
    labels, n = ndimage.label(mask)
    if n > 1:
        sizes = _chunked_bincount(labels.reshape(-1), n + 1)
        sizes[0] = 0
        mask = labels == int(np.argmax(sizes))
    del labels  # int32 ids of the strided volume: the largest array here
    body = array[mask].astype(np.float32)
    if body.size:
        counts = _hu_counts(body, integral=np.issubdtype(array.dtype, np.integer))
        hist = (counts / counts.sum()).tolist()
    else:
        hist = [0.0] * (len(HU_EDGES) - 1)
    # the noise the input-domain check measured (radserve.pipeline.ct_noise: one
    # definition for both), measured here when the facts do not carry it
    noise = facts.noise_hu if facts.noise_hu is not None else noise_hu(volume)
    return {
        "hist": {"hu_body": hist},
        "num": {
            "pixel_spacing_mm": facts.pixel_spacing_mm,
            "slice_thickness_mm": facts.slice_thickness_mm,
            "slice_spacing_mm": float(volume.spacing[0]),
            "slices": float(facts.slices),
            "hu_body_mean": float(body.mean()) if body.size else None,
            "noise_hu": noise,
            "fat_hu": facts.fat_hu,
        },
        "cat": dict(scanner),
    }


def _scanner(loaded: LoadedSeries) -> dict[str, str]:
    """Manufacturer, kernel and kVp of the first source file (not in the series header,
    which carries only what the outputs need)."""
    unknown = {"manufacturer": "unknown", "kernel": "unknown", "kvp": "unknown"}
    sources = loaded.source_slices
    if not sources or sources[0].source.member is not None:
        return unknown
    try:
        import pydicom

        ds = pydicom.dcmread(
            sources[0].source.path,
            stop_before_pixels=True,
            specific_tags=["Manufacturer", "ConvolutionKernel", "KVP"],
        )
    except Exception:  # an unreadable header here only costs the categorical features
        return unknown

    def text(keyword: str) -> str:
        value = ds.get(keyword)
        if value is None or value == "":
            return "unknown"
        if not isinstance(value, str) and hasattr(value, "__iter__"):  # multi-valued
            value = "\\".join(str(v) for v in value)
        return str(value).strip()[:64] or "unknown"

    return {
        "manufacturer": text("Manufacturer"),
        "kernel": text("ConvolutionKernel"),
        "kvp": text("KVP"),
    }


def output_features(result: VolumeResult) -> dict[str, dict[str, Any]]:
    """Per model: what it found (``num``/``cat``)."""
    out: dict[str, dict[str, Any]] = {}
    for step in result.steps:
        spec = step.bundle.spec
        entry = out.setdefault(spec.name, {"num": {}, "cat": {}})
        if step.classification is not None:  # the class it chose, and how sure it was
            entry["cat"]["positive"] = "yes" if step.classification.positive else "no"
            entry["cat"]["class"] = step.classification.label
            entry["num"]["mean_confidence"] = float(step.classification.probability)
            continue
        if step.finding_labels is not None or any(not lb.is_region for lb in spec.labels):
            findings = step.findings
            entry["cat"]["positive"] = "yes" if findings else "no"
            entry["num"]["finding_count"] = float(len(findings))
            entry["num"]["finding_size_mm"] = [float(f.longest_diameter_mm) for f in findings]
            entry["num"]["mean_confidence"] = (
                float(np.mean([f.confidence for f in findings])) if findings else None
            )
        for m in step.organs:
            entry["num"][f"volume_ml.{m.label}"] = (
                float(m.volume_ml) if m.volume_ml is not None else None
            )
    return out


def study_features(
    loaded: LoadedSeries, facts: AcquisitionFacts, result: VolumeResult | None
) -> dict[str, Any]:
    """Every feature of one study (inputs, and per model its outputs)."""
    features = input_features(loaded, facts)
    features["models"] = output_features(result) if result is not None else {}
    return features


__all__ = [
    "HU_EDGES",
    "acquisition_facts",
    "body_share",
    "check_input_domain",
    "check_output_domain",
    "input_features",
    "output_features",
    "study_features",
    "volume_features",
]

"""Drift monitoring measured on phantoms (issue 14): the real feature extractor on real
small phantoms; a shifted population (HU calibration offset, noise level, slice
thickness) raises an alert within the window, 50 normal studies raise none. The figures
are printed (run with -s) and recorded in docs/models.md.

The statistics run on input features (HU histogram inside the body, spacing, thickness,
slice count, noise, scanner); the phantoms are generated on every third slice to keep
the test cheap. Output features and the input-domain check go through the real pipeline
in :func:`test_pipeline_run_features_and_input_domain`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from radserve.config import DriftSettings
from radserve.domain.input_domain import OUTSIDE_INPUT_DOMAIN, AcquisitionFacts
from radserve.errors import InputDomainError
from radserve.ingest import IngestPolicy
from radserve.lifecycle.drift import DriftMonitor, DriftState, model_record
from radserve.phantom import PhantomSpec, generate_phantom, write_dicom_series
from radserve.pipeline import load_pipeline
from radserve.pipeline.profile import volume_features
from radserve.pipeline.study import run_study

pytestmark = pytest.mark.slow

LIMITS = DriftSettings()  # the shipped defaults: window 20, judged once it is full
SCANNER = {"manufacturer": "radserve phantom", "kernel": "STANDARD", "kvp": "120"}


@dataclass(frozen=True)
class Shift:
    name: str
    hu_offset: float = 0.0
    noise_factor: float = 1.0
    thickness_mm: float | None = None


def features(seed: int, shift: Shift | None = None) -> dict[str, Any]:
    """One small phantom through the real feature extractor (every third slice)."""
    spec = PhantomSpec.random(seed, small=True)
    if shift is not None:
        spec = replace(spec, noise_sigma_hu=spec.noise_sigma_hu * shift.noise_factor)
        if shift.thickness_mm is not None:
            spec = replace(spec, slice_thickness_mm=shift.thickness_mm)
    phantom = generate_phantom(spec, range(0, spec.n_slices, 3))
    ct = phantom.ct
    if shift is not None and shift.hu_offset:
        shifted = np.clip(ct.array.astype(np.int32) + int(shift.hu_offset), -1024, 3071)
        ct = ct.with_array(shifted.astype(np.int16))
    facts = AcquisitionFacts(
        modality="CT",
        pixel_spacing_mm=spec.pixel_spacing_mm,
        slice_thickness_mm=spec.slice_thickness_mm,
        rows=spec.rows,
        columns=spec.columns,
        slices=spec.n_slices,
        body_part="CHEST",
    )
    record = volume_features(ct, facts, SCANNER)
    record["models"] = {}
    return record


@pytest.fixture(scope="module")
def reference() -> list[dict[str, Any]]:
    return [model_record(features(seed), "lesions") for seed in range(1000, 1020)]


@pytest.fixture(scope="module")
def normal_window() -> list[dict[str, Any]]:
    """A full window of normal traffic, the same for every shift: made once, copied in."""
    return [model_record(features(seed), "lesions") for seed in range(3000, 3000 + LIMITS.window)]


def test_fifty_normal_studies_raise_no_alert(reference: list[dict[str, Any]]) -> None:
    watch = DriftMonitor("lesions", "test", LIMITS, reference=list(reference))
    states = []
    for seed in range(2000, 2050):
        watch.add(model_record(features(seed), "lesions"))
        if watch.features:
            states.append(watch.state)
    warns = sum(s is DriftState.WARN for s in states)
    alerts = sum(s is DriftState.ALERT for s in states)
    print(f"\n50 normal: {len(states)} judged windows, {warns} warn, {alerts} alert")
    assert len(states) == 50 - LIMITS.min_window + 1  # judged after every study once full
    assert alerts == 0, {n: f.as_json() for n, f in watch.features.items() if f.state}


@pytest.mark.parametrize(
    "shift",
    [
        Shift("hu_offset_+40", hu_offset=40.0),
        Shift("noise_x2.5", noise_factor=2.5),
        Shift("thickness_2.5mm", thickness_mm=2.5),
    ],
    ids=lambda s: s.name,
)
def test_shifted_population_alerts_within_the_window(
    reference: list[dict[str, Any]], normal_window: list[dict[str, Any]], shift: Shift
) -> None:
    watch = DriftMonitor("lesions", "test", LIMITS, reference=list(reference))
    for record in normal_window:  # a full window of normal traffic first
        watch.add(copy.deepcopy(record))
    assert watch.state is not DriftState.ALERT
    until = None
    for k, seed in enumerate(range(4000, 4000 + LIMITS.window), start=1):
        changes = watch.add(model_record(features(seed, shift), "lesions"))
        if watch.state is DriftState.ALERT:
            until = k
            overall = [c for c in changes if c.feature == ""]
            assert overall and overall[-1].after is DriftState.ALERT
            break
    alerted = sorted(n for n, f in watch.features.items() if f.state is DriftState.ALERT)
    print(f"\n{shift.name}: alert after {until} shifted studies (window {LIMITS.window})", alerted)
    assert until is not None and until <= LIMITS.window


def test_pipeline_run_features_and_input_domain(tmp_path: Path) -> None:
    """The real pipeline on a small phantom: output features per model, and the shipped
    models' declared domain (full-size 512x512 studies) flags the small phantom, or
    refuses it under ``input_domain: refuse``."""
    spec = PhantomSpec.random(7, small=True)
    write_dicom_series(generate_phantom(spec), tmp_path / "dicom")
    pipeline = load_pipeline("ct-chest-abdomen")
    result = run_study(
        tmp_path / "dicom", pipeline=pipeline, out_dir=tmp_path / "out", key_images=False
    )
    features = result.features
    assert features is not None
    assert features["cat"] == SCANNER  # read from the DICOM the phantom writer made
    assert features["num"]["slices"] == spec.n_slices
    assert features["num"]["pixel_spacing_mm"] == pytest.approx(spec.pixel_spacing_mm, rel=1e-3)
    lesions = features["models"]["lesions"]
    assert lesions["num"]["finding_count"] == len(result.report.findings)
    assert lesions["cat"]["positive"] == ("yes" if result.report.findings else "no")
    organs = features["models"]["organs"]
    measured = {m.label: m.volume_ml for m in result.report.organ_measurements}
    assert {k.removeprefix("volume_ml."): v for k, v in organs["num"].items()} == measured
    domain = [w for w in result.report.warnings if w.code == OUTSIDE_INPUT_DOMAIN]
    assert {w.message.split(":")[0] for w in domain} == {
        f"outside the input domain of {m.name}/{m.version}" for m in result.report.models
    }
    assert "matrix" not in domain[0].message and "rows 128 outside" in domain[0].message
    with pytest.raises(InputDomainError) as refused:
        run_study(
            tmp_path / "dicom",
            pipeline=pipeline,
            out_dir=tmp_path / "refused",
            policy=IngestPolicy(input_domain="refuse"),
        )
    assert refused.value.code == OUTSIDE_INPUT_DOMAIN
    assert not (tmp_path / "refused" / "report.json").exists()

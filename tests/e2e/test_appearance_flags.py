"""Studies whose every header lies inside the shipped models' declared domain but whose
images do not look like the training data are flagged (issue 18):

- a CT whose numbers are shifted by a scanner's miscalibration, by where its fat reads
  (flagged, or refused under ``ingest.input_domain: refuse``); the same study calibrated
  is not (the evaluation grid's -40 HU cell loses a quarter of the lesions >= 10 mm);
- a CT with half the training data's contrast enhancement, by its aorta's and kidneys'
  mean HU (the grid's 0.5x cell: organ Dice 0.81, lesion recall >= 10 mm 0.73);
- a CT with six times the phantoms' noise, by its measured pixel noise (the grid's 6x
  cell: 71 false findings per study)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from tests.factories.torso import simple_torso, write_torso_nifti

from radserve.domain.input_domain import INPUT_DOMAIN_UNCHECKED, OUTSIDE_INPUT_DOMAIN
from radserve.errors import InputDomainError
from radserve.ingest import IngestPolicy
from radserve.phantom import PhantomSpec, generate_phantom, write_dicom_series
from radserve.phantom.anatomy import Tissue, hu_table
from radserve.pipeline import load_pipeline
from radserve.pipeline.inputs import NiftiInput
from radserve.pipeline.study import run_study

pytestmark = pytest.mark.slow

SEED = 18  # full size: 512 x 512, 0.725 mm pixels; 60 slices of 5 mm = 300 mm


@pytest.fixture(scope="module")
def studies(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ct-number")
    spec = PhantomSpec.random(SEED, small=False).with_slices(60)
    phantom = generate_phantom(spec)
    shifted = np.clip(phantom.ct.array.astype(np.int32) - 40, -1024, 3071).astype(np.int16)
    half = generate_phantom(dataclasses.replace(spec, contrast_enhancement=0.5))
    noisy = generate_phantom(dataclasses.replace(spec, noise_sigma_hu=6 * spec.noise_sigma_hu))
    out = {}
    for name, ph in (
        ("calibrated", phantom),
        ("minus40", dataclasses.replace(phantom, ct=phantom.ct.with_array(shifted))),
        ("half_enhanced", half),
        ("noisy", noisy),
    ):
        write_dicom_series(ph, root / name)
        out[name] = root / name
    return out


def _run(study: Path, tmp_path: Path):
    """The shipped pipeline, flagging (the default policy)."""
    pipeline = load_pipeline("ct-chest-abdomen")
    return run_study(study, pipeline=pipeline, out_dir=tmp_path / "out", key_images=False)


def _domain_warnings(report, code=OUTSIDE_INPUT_DOMAIN) -> list[str]:
    return [w.message for w in report.warnings if w.code == code]


def test_a_calibrated_study_is_inside_and_its_fat_is_a_drift_feature(studies, tmp_path):
    """The same patient at the training data's calibration and enhancement: no flag."""
    result = _run(studies["calibrated"], tmp_path)
    assert _domain_warnings(result.report) == []
    assert _domain_warnings(result.report, INPUT_DOMAIN_UNCHECKED) == []
    assert result.features is not None
    drawn = float(hu_table(SEED)[Tissue.FAT])  # -95.1
    assert result.features["num"]["fat_hu"] == pytest.approx(drawn, abs=2.0)


def test_a_study_40_hu_low_is_flagged_for_each_model_naming_its_fat(studies, tmp_path):
    result = _run(studies["minus40"], tmp_path)
    flags = _domain_warnings(result.report)
    lesions = [m for m in flags if m.startswith("outside the input domain of lesions/1.2.0")]
    organs = [m for m in flags if m.startswith("outside the input domain of organs/1.0.0:")]
    assert len(lesions) + len(organs) == len(flags), flags
    fat = [m for m in lesions if "fat reads" in m]
    assert len(fat) == 1 and "fat reads -135 HU, outside [-120, -80] HU" in fat[0], lesions
    assert any("fat reads -135 HU, outside [-130, -70] HU" in m for m in organs)
    # the enhanced structures read 40 HU low as well: both models may flag them too
    assert all("fat reads" in m or "another contrast phase" in m for m in flags), flags
    lesions = fat[0]
    assert "the CT numbers may be miscalibrated" in lesions
    for geometric in ("pixel spacing", "slice thickness", "field of view", "coverage", "rows"):
        assert geometric not in lesions


def test_half_the_contrast_enhancement_is_flagged_by_the_aorta_and_kidneys(studies, tmp_path):
    """Both models declare the contrast phase they were validated on: the lesions model
    (no organ labels of its own) by the organs step's structures, in its own name, so the
    flag says the findings may be unreliable, not only the organ map."""
    result = _run(studies["half_enhanced"], tmp_path)
    flags = _domain_warnings(result.report)
    assert [m.split(":")[0] for m in flags] == [
        "outside the input domain of organs/1.0.0",
        "outside the input domain of lesions/1.2.0 (structures of organs/1.0.0)",
    ], flags
    measured = {m.label: m.mean_hu for m in result.report.organ_measurements}
    aorta = measured["aorta"]
    for flag in flags:
        assert "another contrast phase (or none) than the model was validated on" in flag
        assert aorta is not None and f"aorta reads {aorta:.0f} HU on average, outside" in flag
        for label in ("kidney_left", "kidney_right"):  # each found one below its bound here
            hu = measured[label]
            assert hu is None or f"{label} reads {hu:.0f} HU on average, outside" in flag
    assert any(measured[k] is not None for k in ("kidney_left", "kidney_right")), measured


def test_six_times_the_noise_is_flagged_by_the_lesion_model_alone(studies, tmp_path):
    """The grid's 6x cell: every lesion found, tens of false findings per study. The
    lesions model declares its noise bound; the organs model (Dice 0.945 there) does not."""
    result = _run(studies["noisy"], tmp_path)
    flags = [m for m in _domain_warnings(result.report) if "noise reads" in m]
    assert len(flags) == 1, _domain_warnings(result.report)
    assert flags[0].startswith("outside the input domain of lesions/1.2.0: noise reads ")
    assert "outside [-inf, 55] HU: a noisier (or smoother) acquisition" in flags[0]
    assert result.features is not None
    measured = result.features["num"]["noise_hu"]  # one measurement: the check's and drift's
    assert measured > 55 and f"noise reads {measured:.0f} HU" in flags[0]


def test_refused_before_any_model_runs_under_the_refuse_policy(studies, tmp_path):
    with pytest.raises(InputDomainError, match=r"fat reads -135 HU") as refused:
        run_study(
            studies["minus40"], pipeline=load_pipeline("ct-chest-abdomen"),
            out_dir=tmp_path / "refused", policy=IngestPolicy(input_domain="refuse"),
        )  # fmt: skip
    assert refused.value.code == OUTSIDE_INPUT_DOMAIN
    assert not (tmp_path / "refused" / "report.json").exists()


def test_a_study_accepted_under_the_refuse_policy_is_measured_once(studies, tmp_path, monkeypatch):
    """The refusal's check measures the pixels before any model runs; the report and the
    drift features reuse that measurement (before session 29 both were measured twice)."""
    from radserve.pipeline import profile

    calls = {"fat": 0, "noise": 0}

    def counted(name, measure):
        def run(volume):
            calls[name] += 1
            return measure(volume)

        return run

    monkeypatch.setattr(profile, "fat_peak_hu", counted("fat", profile.fat_peak_hu))
    monkeypatch.setattr(profile, "noise_hu", counted("noise", profile.noise_hu))
    result = run_study(
        studies["calibrated"], pipeline=load_pipeline("ct-chest-abdomen"),
        out_dir=tmp_path / "out", key_images=False, policy=IngestPolicy(input_domain="refuse"),
    )  # fmt: skip
    assert calls == {"fat": 1, "noise": 1}
    assert _domain_warnings(result.report) == [] and result.features is not None
    drawn = float(hu_table(SEED)[Tissue.FAT])
    assert result.features["num"]["fat_hu"] == pytest.approx(drawn, abs=2.0)


def test_a_nifti_torso_says_what_it_could_not_be_judged_on(tmp_path):
    """An independently drawn torso (fat at -90 HU) as NIfTI: its fat is inside both
    ranges; NIfTI has no Body Part Examined, and the report says that went unchecked.
    20 slices are outside the coverage range, so it is not a clean study either way."""
    nifti = write_torso_nifti(tmp_path / "torso.nii.gz", simple_torso(slices=20))
    result = run_study(
        NiftiInput(nifti), pipeline=load_pipeline("ct-chest-abdomen"),
        out_dir=tmp_path / "out", key_images=False,
    )  # fmt: skip
    assert not any("fat reads" in m for m in _domain_warnings(result.report))
    unchecked = _domain_warnings(result.report, INPUT_DOMAIN_UNCHECKED)
    assert sorted(m.split(":")[0] for m in unchecked) == [
        "input domain of lesions/1.2.0 not wholly checked",
        "input domain of organs/1.0.0 not wholly checked",
    ]
    assert all("no Body Part Examined" in m for m in unchecked)
    assert result.features is not None and result.features["num"]["fat_hu"] == pytest.approx(
        -90.0, abs=2.0
    )

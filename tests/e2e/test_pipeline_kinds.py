"""Pipelines beyond organs-then-lesions, written by a model author in YAML only.

A site adds a ``structure`` model and a ``finding`` model (tiny ONNX graphs built with
onnx.helper, a model.yaml each) and a pipeline YAML chaining them after an organ model,
and serves it through ``radserve run`` from the settings' models/pipelines folders:
every step writes its own label map and reaches the report. A ``classification`` model
(class scores, no label map) is a step like the others: its class and probability reach
report.json, the SR and the FHIR DiagnosticReport. The bundled ``ct-organs``
pipeline runs the reference organ model alone and gives the reference pipeline's organs.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from tests.factories.bundles import write_classifier_bundle, write_test_bundles
from tests.factories.dicom_series import make_ct_series
from tests.factories.onnx_models import threshold_model
from tests.factories.results import LESIONS, lesions_hu
from tests.factories.server_process import run_radserve

from radserve.models.registry import ModelRegistry
from radserve.pipeline import load_pipeline, run_study
from radserve.report.nifti import read_nifti

WINDOW = {"kind": "ct_window", "center": 500.0, "width": 1000.0}  # 0..1000 HU -> 0..1


def _label(name: str, kind: str, **extra: Any) -> dict[str, Any]:
    return {
        "value": 1, "name": name, "kind": kind,
        "concept": {"value": "1", "scheme": "99TEST", "meaning": name},
        "category": {"value": "2", "scheme": "99TEST", "meaning": kind}, **extra,
    }  # fmt: skip


def _bundle(root: Path, name: str, task: str, level_hu: float, label: dict[str, Any],
            **inputs: Any) -> None:  # fmt: skip
    folder = root / name / "1.0.0"
    folder.mkdir(parents=True)
    threshold_model(folder / "model.onnx", in_channels=1, level=level_hu / 1000.0)
    manifest = {
        "name": name, "version": "1.0.0", "task": task, "modality": "CT",
        "input": {"mode": "2d", "spacing": [None, 1.5, 1.5], "normalisation": WINDOW, **inputs},
        "labels": [label],
    }  # fmt: skip
    (folder / "model.yaml").write_text(yaml.safe_dump(manifest))


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("site")
    models = write_test_bundles(root / "models")  # organs-test: liver > 50 HU
    _bundle(models, "dense", "segmentation", 400.0, _label("dense_tissue", "structure"))
    _bundle(
        models, "foci", "detection", 600.0,
        _label("focus", "finding", within=["dense_tissue"]), roi_labels=["dense_tissue"],
    )  # fmt: skip
    # 700 HU spheres in the liver: a 600 HU sign is present, a 900 HU one is not
    write_classifier_bundle(models, "dense-sign", 600.0)
    write_classifier_bundle(models, "bright-sign", 900.0)
    pipelines = root / "pipelines"
    pipelines.mkdir()
    (pipelines / "classify.yaml").write_text(yaml.safe_dump({
        "name": "classify", "version": "1.0.0",
        "series_selection": {"modalities": ["CT"], "min_slices": 3},
        "steps": [{"model": "organs-test"}, {"model": "dense-sign"}, {"model": "bright-sign"}],
    }))  # fmt: skip
    (pipelines / "three-kinds.yaml").write_text(yaml.safe_dump({
        "name": "three-kinds", "version": "1.0.0",
        "series_selection": {"modalities": ["CT"], "min_slices": 3},
        "steps": [{"model": "organs-test"}, {"model": "dense"}, {"model": "foci"}],
    }))  # fmt: skip
    (pipelines / "two-organ-steps.yaml").write_text(yaml.safe_dump({
        "name": "two-organ-steps", "version": "1.0.0",
        "series_selection": {"modalities": ["CT"], "min_slices": 3},
        "steps": [{"model": "organs-test", "name": "first"}, {"model": "dense"}],
    }))  # fmt: skip
    config = root / "radserve.toml"
    config.write_text(
        f"[models]\ndirs = [{json.dumps(str(models))}]\n"
        f"[pipelines]\ndirs = [{json.dumps(str(pipelines))}]\n"
        '[runtime]\nproviders = ["CPUExecutionProvider"]\nthreads = 1\n'
    )
    study = root / "study"
    make_ct_series(
        study, n_slices=24, rows=48, cols=48, spacing=(2.0, 1.0, 1.0),
        origin=(-20.0, -20.0, 0.0), hu=lesions_hu,
    )  # fmt: skip
    return {"root": root, "config": config, "study": study, "models": models}


def test_a_structure_and_a_finding_step_served_from_yaml_only(site, tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = run_radserve(
        "run", str(site["study"]), "--config", str(site["config"]),
        "--pipeline", "three-kinds", "--out", str(out), "--dicom",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads((out / "report.json").read_text())
    maps = {m["step"]: (m["path"], m["kind"]) for m in report["outputs"]["label_maps"]}
    assert maps == {
        "organs-test": ("organs-test.nii.gz", "organs"),
        "dense": ("dense.nii.gz", "structures"),
        "foci": ("foci.nii.gz", "findings"),
    }
    measured = {(m["model"], m["label"]) for m in report["organ_measurements"]}
    assert measured == {("organs-test", "liver"), ("dense", "dense_tissue")}
    # The two 700 HU spheres: found by the finding step inside the structure.
    assert len(report["findings"]) == len(LESIONS)
    assert {f["label"] for f in report["findings"]} == {"focus"}
    assert {f["containing_organ"] for f in report["findings"]} == {"dense_tissue"}
    centres = sorted(tuple(f["centroid_mm"]) for f in report["findings"])
    want = sorted(c for c, _ in LESIONS)
    np.testing.assert_allclose(centres, want, atol=1.5)
    dense = read_nifti(out / "dense.nii.gz").array
    foci = read_nifti(out / "foci.nii.gz").array
    assert (foci > 0).any() and np.all(dense[foci > 0] == 1), "foci lie in the structure"
    for name in ("organs-test-seg.dcm", "dense-seg.dcm", "foci-seg.dcm", "measurements-sr.dcm"):
        assert (out / name).is_file(), name


def test_two_steps_of_one_kind_both_reach_the_report(site, tmp_path: Path) -> None:
    """Before, only the last region step reached the report: the first was dropped."""
    result = run_study(
        site["study"],
        pipeline=load_pipeline("two-organ-steps", site["root"] / "pipelines"),
        out_dir=tmp_path / "out",
        registry=ModelRegistry(site["models"]),
        key_images=False,
    )
    report = result.report
    assert [(m.step, m.path) for m in report.outputs.label_maps] == [
        ("first", "first.nii.gz"),
        ("dense", "dense.nii.gz"),
    ]
    assert [m.label for m in report.organ_measurements] == ["liver", "dense_tissue"]
    liver = read_nifti(tmp_path / "out" / "first.nii.gz").array
    dense = read_nifti(tmp_path / "out" / "dense.nii.gz").array
    assert liver.sum() > dense.sum() > 0  # the 100 HU block is liver; the spheres dense


def test_an_unsatisfiable_pipeline_fails_before_the_study_is_read(site, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({
        "name": "bad", "version": "1", "steps": [{"model": "foci"}],
    }))  # fmt: skip
    (tmp_path / "empty").mkdir()  # not a study: the pipeline is refused before reading it
    done = run_radserve(
        "run", str(tmp_path / "empty"), "--config", str(site["config"]),
        "--pipeline", str(bad), "--out", str(tmp_path / "o"),
    )  # fmt: skip
    assert done.returncode != 0
    assert "rule 'upstream labels'" in done.stderr and "'dense_tissue'" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_bundled_ct_organs_pipeline_gives_the_reference_pipelines_organs(
    tmp_path: Path,
) -> None:
    """``ct-organs`` (organs only) through ``radserve run``: the same organ labels and
    measurements as the reference ``ct-chest-abdomen`` pipeline, and no findings map."""
    from radserve.models.registry import bundled_model_dir
    from radserve.phantom import PhantomSpec, generate_phantom, write_dicom_series

    phantom = generate_phantom(PhantomSpec.random(3, small=True), range(8, 32))
    write_dicom_series(phantom, tmp_path / "study")
    out = tmp_path / "organs"
    done = run_radserve(
        "run", str(tmp_path / "study"), "--pipeline", "ct-organs", "--out", str(out),
        "--no-key-images",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    organs_only = json.loads((out / "report.json").read_text())
    assert organs_only["pipeline"]["name"] == "ct-organs"
    assert [(m["path"], m["kind"]) for m in organs_only["outputs"]["label_maps"]] == [
        ("organs.nii.gz", "organs")
    ]
    assert organs_only["findings"] == [] and not (out / "findings.nii.gz").exists()
    reference = run_study(
        tmp_path / "study",
        pipeline=load_pipeline("ct-chest-abdomen"),
        out_dir=tmp_path / "reference",
        registry=ModelRegistry([bundled_model_dir()]),
        key_images=False,
    ).report
    assert [m.path for m in reference.outputs.label_maps] == ["organs.nii.gz", "findings.nii.gz"]
    np.testing.assert_array_equal(
        read_nifti(out / "organs.nii.gz").array,
        read_nifti(tmp_path / "reference" / "organs.nii.gz").array,
    )
    assert organs_only["organ_measurements"] == [
        m.model_dump(mode="json") for m in reference.organ_measurements
    ]


def test_a_classification_step_served_from_yaml_only(site, tmp_path: Path) -> None:
    """Two classification steps after an organ step, each on the liver's box: the class
    with its probability in report.json, a finding (TID 1501 group with "Probability") in
    the SR and an Observation in the FHIR bundle when it passes its threshold, and no
    label map or SEG for either."""
    import highdicom as hd
    import pydicom

    from radserve.ingest import PatientInfo
    from radserve.report.fhir.bundle import build_fhir_bundle
    from radserve.report.json_report import read_report

    out = tmp_path / "out"
    done = run_radserve(
        "run", str(site["study"]), "--config", str(site["config"]),
        "--pipeline", "classify", "--out", str(out), "--dicom",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    raw = json.loads((out / "report.json").read_text())
    assert [m["step"] for m in raw["outputs"]["label_maps"]] == ["organs-test"]
    assert sorted(p.name for p in out.glob("*.nii.gz")) == ["organs-test.nii.gz"]
    assert sorted(p.name for p in out.glob("*-seg.dcm")) == ["organs-test-seg.dcm"]
    assert [m["name"] for m in raw["models"]] == ["organs-test", "dense-sign", "bright-sign"]
    dense, bright = raw["classifications"]
    # max over slices of sigmoid(20 * (0.7 - 0.6)) and of sigmoid(20 * (0.7 - 0.9))
    assert (dense["step"], dense["label"], dense["positive"]) == ("dense-sign", "dense_sign", True)
    assert dense["probability"] == pytest.approx(1 / (1 + np.exp(-2.0)), abs=0.02)
    assert (bright["label"], bright["positive"]) == ("bright_sign", False)
    assert bright["probability"] == pytest.approx(1 / (1 + np.exp(4.0)), abs=0.01)
    assert dense["aggregate"] == "max" and 0 < dense["slices"] <= 24
    assert dense["probabilities"] == {"dense_sign": pytest.approx(dense["probability"])}

    sr = hd.sr.Comprehensive3DSR.from_dataset(pydicom.dcmread(out / "measurements-sr.dcm"))
    # the TID 1501 groups of Imaging Measurements, read from the content tree
    items = [
        group
        for container in sr.ContentSequence
        if container.ConceptNameCodeSequence[0].CodeValue == "126010"  # Imaging Measurements
        for group in container.ContentSequence
    ]
    classes = [
        g for g in items
        if any(i.get("TextValue", "").startswith("dense-sign:") for i in g.ContentSequence)
    ]  # fmt: skip
    assert len(classes) == 1 and not any(
        any(i.get("TextValue", "").startswith("bright-sign:") for i in g.ContentSequence)
        for g in items
    )
    [probability] = [
        i for i in classes[0].ContentSequence
        if i.ValueType == "NUM" and i.ConceptNameCodeSequence[0].CodeValue == "122157"
    ]  # fmt: skip
    value = float(probability.MeasuredValueSequence[0].NumericValue)
    assert value == pytest.approx(dense["probability"], abs=1e-4)
    [finding_type] = [
        i for i in classes[0].ContentSequence
        if i.ValueType == "CODE" and i.ConceptNameCodeSequence[0].CodeMeaning == "Finding"
    ]  # fmt: skip
    assert finding_type.ConceptCodeSequence[0].CodeMeaning == "dense_sign"
    verifier = shutil.which("dciodvfy")
    if verifier is not None:
        check = subprocess.run(
            [verifier, str(out / "measurements-sr.dcm")], capture_output=True, text=True
        )
        errors = [ln for ln in (check.stdout + check.stderr).splitlines() if "Error" in ln]
        assert errors == [], errors

    bundle = build_fhir_bundle(read_report(out / "report.json"), PatientInfo(patient_id="P1"))
    resources = [e["resource"] for e in bundle["entry"]]
    [observation] = [
        r for r in resources
        if r["resourceType"] == "Observation" and r["code"]["coding"][0]["display"] == "dense_sign"
    ]  # fmt: skip
    assert observation["valueQuantity"]["value"] == pytest.approx(dense["probability"], abs=1e-4)
    assert observation["valueQuantity"]["code"] == "1"
    [report] = [r for r in resources if r["resourceType"] == "DiagnosticReport"]
    full_urls = {e["resource"]["id"]: e["fullUrl"] for e in bundle["entry"]}
    assert {"reference": full_urls[observation["id"]]} in report["result"]
    assert [c["coding"][0]["display"] for c in report["conclusionCode"]] == ["dense_sign"]
    assert "dense-sign: dense_sign (probability 0.8" in report["conclusion"]
    assert "bright-sign: no class reached its threshold" in report["conclusion"]


def test_a_classification_model_yaml_is_checked_when_loaded(tmp_path: Path) -> None:
    """A classification model with a region label, a 3d input or post-processing, and a
    class label in a segmentation model, are refused with the rule they break."""
    from radserve.errors import ModelError
    from radserve.models.manifest import load_manifest

    base = {
        "name": "c", "version": "1", "task": "classification", "modality": "CT",
        "input": {"mode": "2d", "spacing": [None, 1.5, 1.5], "normalisation": WINDOW},
        "labels": [_label("sign", "class")],
    }  # fmt: skip
    three_d = {**base["input"], "mode": "3d", "patch_size": [8, 8, 8], "spacing": [1.5] * 3}
    cases = {
        "organ": ({"labels": [_label("liver", "organ")]}, "class labels only"),
        "3d": ({"input": three_d}, "input.mode '3d'"),
        "ops": ({"postprocess": [{"op": "min_size", "ml": 1.0}]}, "no label map to post-process"),
        "seg": ({"task": "segmentation"}, "only a model of task 'classification'"),
        "agg": ({"classification": {"aggregate": "median"}}, "aggregate"),
    }
    path = tmp_path / "model.yaml"
    path.write_text(yaml.safe_dump(base))
    spec = load_manifest(path)
    assert spec.is_classifier and spec.labels[0].is_class and spec.classifying.aggregate == "mean"
    for change, message in cases.values():
        path.write_text(yaml.safe_dump({**base, **change}))
        with pytest.raises(ModelError, match=message):
            load_manifest(path)

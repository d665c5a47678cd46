"""nnU-Net folders imported from the CLI and served by ``radserve run`` on DICOM studies.

A one-channel CT model on a DICOM CT, and a CT + PET model on the PET/CT phantom (the PET
found, converted to SUVbw and put on the CT grid). The labels ``radserve run`` writes
(NIfTI, DICOM SEG) are compared with ``nnUNetPredictor`` on the same arrays and weights;
the folders are made in the test.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pydicom
import pytest
import yaml

pytest.importorskip("nnunetv2", reason="the nnunet extra is not installed")

from tests.factories.agreement import synthetic_ct
from tests.factories.dicom_series import make_ct_series
from tests.factories.nnunet_folder import make_results_folder
from tests.factories.server_process import run_radserve

from radserve.importers.nnunet import load_predictor, read_results_folder
from radserve.ingest import discover_series, load_series
from radserve.ingest.nifti import load_nifti
from radserve.ingest.suv import series_to_suv
from radserve.preprocess.onto_grid import resample_onto


@pytest.mark.slow
def test_imported_model_serves_through_radserve_run(tmp_path: Path) -> None:
    folder = make_results_folder(tmp_path / "results", folds=(0,), spacing=(4.0, 2.5, 2.5))
    models = tmp_path / "models"
    done = run_radserve("models", "import", "nnunet", str(folder), "--models-dir", str(models),
                     "--name", "tiny-ct")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (models / "tiny-ct" / "1.0.0" / "model.onnx").is_file()
    # A second import of the same version is refused, not overwritten.
    again = run_radserve("models", "import", "nnunet", str(folder), "--models-dir", str(models),
                      "--name", "tiny-ct")  # fmt: skip
    assert again.returncode != 0 and "already holds a bundle" in again.stderr

    ct = synthetic_ct((20, 64, 64), seed=5)
    ct[ct == 0] = -1000.0  # DICOM CT: air outside the field of view
    ct = np.clip(np.round(ct), -1024, 3071)
    make_ct_series(tmp_path / "study", n_slices=20, rows=64, cols=64, spacing=(3.0, 2.0, 2.0),
                   hu=ct)  # fmt: skip
    pipeline = tmp_path / "tiny.yaml"
    pipeline.write_text(
        "name: tiny-nnunet\nversion: 1.0.0\nseries_selection: {modalities: [CT]}\n"
        "steps:\n  - model: tiny-ct\n"
    )
    out = tmp_path / "out"
    done = run_radserve("run", str(tmp_path / "study"), "--pipeline", str(pipeline), "--out",
                     str(out), "--models-dir", str(models), "--no-key-images")  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads((out / "report.json").read_text())
    assert [m["name"] for m in report["models"]] == ["tiny-ct"]
    assert (out / "tiny-ct-seg.dcm").is_file()
    labels = load_nifti(out / "tiny-ct.nii.gz")
    volume = labels  # on the grid of the CT radserve loaded
    assert labels.shape == (20, 64, 64)
    predictor = load_predictor(read_results_folder(folder))
    theirs = predictor.predict_single_npy_array(
        ct[None].astype(np.float32), {"spacing": list(volume.spacing)}
    )
    assert len(np.unique(theirs)) >= 2
    # radserve's post-processing (no min size, no keep-largest declared) leaves labels as is.
    assert float((labels.array == theirs).mean()) >= 0.999


@pytest.mark.slow
def test_imported_pet_ct_model_runs_on_the_pet_ct_phantom(tmp_path: Path) -> None:
    folder = make_results_folder(
        tmp_path / "results",
        folds=(0,),
        spacing=(4.0, 3.0, 3.0),
        # 27 patches over the phantom (tiny_plans' 16x32x32 made it 216, whose per-patch
        # overhead in radserve run and nnUNetPredictor was most of this test's CPU-seconds)
        patch=(32, 64, 64),
        schemes=("CTNormalization", "ZScoreNormalization"),
        channel_names=("CT", "noNorm"),  # says no series: named on the command line
    )
    models = tmp_path / "models"
    args = ["models", "import", "nnunet", str(folder), "--models-dir", str(models)]
    refused = run_radserve(*args, "--name", "petct")
    assert refused.returncode != 0 and "channel 1 is named 'noNorm'" in refused.stderr
    done = run_radserve(*args, "--name", "petct", "--channel", "1=PT")
    assert done.returncode == 0, done.stderr

    # the phantom's middle 24 slices (120 mm): one 32-slice patch deep at 4 mm, 9 patches
    # per run where its 43 slices took 27 (two runs: radserve run and nnUNetPredictor)
    phantom = ["phantom", "--seed", "0", "--small", "--pet", "--slices", "24"]
    done = run_radserve(*phantom, "--out", str(tmp_path / "p"))
    assert done.returncode == 0, done.stderr
    study = tmp_path / "p" / "dicom"
    pipeline = tmp_path / "petct.yaml"
    pipeline.write_text(
        "name: petct-nnunet\nversion: 1.0.0\nseries_selection: {modalities: [CT]}\n"
        "steps:\n  - model: petct\n"
    )
    out = tmp_path / "out"
    done = run_radserve("run", str(study), "--pipeline", str(pipeline), "--out", str(out),
                     "--models-dir", str(models), "--no-key-images")  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads((out / "report.json").read_text())
    assert [m["name"] for m in report["models"]] == ["petct"]
    assert report["series_selection"]["rejected"] == [], "the PET is used, not passed over"
    seg = pydicom.dcmread(out / "petct-seg.dcm")
    assert seg.Modality == "SEG"

    # nnU-Net's predictor on the CT and the SUV on the CT grid (radserve's ingest).
    headers = {h.modality: h for h in discover_series(study)}
    ct = load_series(headers["CT"]).volume
    suv, _ = series_to_suv(load_series(headers["PT"]))
    pet = resample_onto(suv, ct, order=3).array  # the import says cubic: nnU-Net's data order
    predictor = load_predictor(read_results_folder(folder))
    theirs = predictor.predict_single_npy_array(
        np.stack([ct.array, pet]).astype(np.float32), {"spacing": list(ct.spacing)}
    )
    ours = load_nifti(out / "petct.nii.gz").array
    assert ours.shape == theirs.shape == ct.shape
    assert len(np.unique(theirs)) >= 2
    assert float((ours == theirs).mean()) >= 0.999


def _imported_tiny_ct(tmp_path: Path) -> tuple[Path, Path]:
    """The tests' tiny nnU-Net CT folder imported as ``tiny-ct`` into ``models``, and a
    pipeline file running it."""
    folder = make_results_folder(tmp_path / "results", folds=(0,), spacing=(4.0, 2.5, 2.5))
    models = tmp_path / "models"
    done = run_radserve("models", "import", "nnunet", str(folder), "--models-dir", str(models),
                        "--name", "tiny-ct")  # fmt: skip
    assert done.returncode == 0, done.stderr
    pipeline = tmp_path / "tiny.yaml"
    pipeline.write_text("name: tiny-nnunet\nversion: 1.0.0\nsteps:\n  - model: tiny-ct\n")
    return models, pipeline


@pytest.mark.slow
def test_an_imported_models_variants_are_gated_on_its_own_fp32_labels(tmp_path: Path) -> None:
    """``radserve models build-variants`` on an imported model, through a pipeline file
    that runs it: the phantoms' truth barely scores this randomly weighted model (its
    "liver" overlaps the phantom's by chance), so each variant's decision must rest on
    its agreement with the model's own FP32 labels, recorded per label. A rejected
    variant is refused by ``radserve run`` with that reason; an accepted one serves."""
    models, pipeline = _imported_tiny_ct(tmp_path)
    done = run_radserve("models", "build-variants", "--model", "tiny-ct", "--pipeline",
                        str(pipeline), "--models-dir", str(models), "--small", "--seeds", "0-1",
                        "--calibration-seeds", "1000", "--precision", "int8,fp16")  # fmt: skip
    assert done.returncode == 0, done.stderr
    bundle = models / "tiny-ct" / "1.0.0"
    labels = [
        label["name"] for label in yaml.safe_load((bundle / "model.yaml").read_text())["labels"]
    ]
    gate = json.loads((bundle / "gate.json").read_text())
    assert gate["fp32_metrics"]["dice_mean"] < 0.5  # the truth check measures little here
    assert set(gate["variants"]) == {"int8", "fp16"}
    for precision, record in gate["variants"].items():
        agreement = record["metrics"]["agreement_vs_fp32"]
        assert list(agreement) == labels, agreement
        measured = [v for v in agreement.values() if v is not None]
        assert measured and all(0.0 <= v <= 1.0 for v in measured)
        low = [
            f"{name} agrees with fp32 at {value:.4f} < 0.95 (Dice)"
            for name, value in agreement.items()
            if value is not None and value < 0.95
        ]
        assert [r for r in record["reasons"] if "agrees with fp32" in r] == low
        assert record["accepted"] == (not record["reasons"])

        study = tmp_path / "phantom"
        if not study.exists():
            made = run_radserve("phantom", "--seed", "3", "--small", "--out", str(study))
            assert made.returncode == 0, made.stderr
        run = run_radserve("run", str(study / "dicom"), "--pipeline", str(pipeline), "--models-dir",
                           str(models), "--precision", precision, "--out",
                           str(tmp_path / f"out-{precision}"), "--no-key-images")  # fmt: skip
        if record["accepted"]:
            assert run.returncode == 0, run.stderr
        else:
            assert run.returncode != 0 and "rejected by its accuracy gate" in run.stderr
            assert record["reasons"][0] in run.stderr


def _ct_study(folder: Path, seed: int) -> Path:
    ct = synthetic_ct((20, 64, 64), seed=seed)
    ct[ct == 0] = -1000.0  # DICOM CT: air outside the field of view
    make_ct_series(folder, n_slices=20, rows=64, cols=64, spacing=(3.0, 2.0, 2.0),
                   hu=np.clip(np.round(ct), -1024, 3071))  # fmt: skip
    return folder


@pytest.mark.slow
def test_an_imported_model_is_gated_on_the_sites_own_studies(tmp_path: Path) -> None:
    """``build-variants --studies``: the variants judged on DICOM studies like those the
    model serves (no phantom, no ground truth) by their agreement with its FP32 labels.
    The recorded agreement is checked against ``radserve run`` at each precision on the
    same studies, computed here from the label maps it writes."""
    models, pipeline = _imported_tiny_ct(tmp_path)
    studies = [_ct_study(tmp_path / "studies" / name, seed) for name, seed in (("a", 5), ("b", 8))]
    _ct_study(tmp_path / "calibration" / "c", 11)
    gate = ("models", "build-variants", "--model", "tiny-ct", "--pipeline", str(pipeline),
            "--models-dir", str(models), "--studies", str(tmp_path / "studies"))  # fmt: skip

    refused = run_radserve(*gate, "--precision", "int8")
    assert refused.returncode != 0 and "INT8 is calibrated on studies other than" in refused.stderr
    shared = run_radserve(*gate, "--calibration-studies", str(tmp_path / "studies"))
    assert shared.returncode != 0 and "share studies" in shared.stderr
    junk = tmp_path / "junk" / "not-a-study"
    junk.mkdir(parents=True)
    (junk / "x.dcm").write_bytes(b"not DICOM")
    bad = run_radserve(*gate[:-1], str(junk.parent), "--precision", "fp16")
    assert bad.returncode != 0 and f"study {junk}: no DICOM image series" in bad.stderr
    assert not (models / "tiny-ct" / "1.0.0" / "gate.json").exists()

    done = run_radserve(*gate, "--calibration-studies", str(tmp_path / "calibration"),
                        "--precision", "int8,fp16")  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads((models / "tiny-ct" / "1.0.0" / "gate.json").read_text())
    assert report["studies"] == ["a", "b"] and report["calibration_studies"] == ["c"]
    assert report["seeds"] == [] and report["fp32_metrics"]["dice_mean"] is None

    _check_gate_against_runs(report, studies, pipeline, models, "tiny-ct", tmp_path)


def _check_gate_against_runs(
    report: dict, studies: list[Path], pipeline: Path, models: Path, model: str, tmp: Path
) -> None:
    """Each variant of ``report`` (a gate on ``studies``): accepted exactly when every
    label agrees >= 0.95; a rejected one refused by ``radserve run`` with its reason; an
    accepted one's recorded agreement equal to the pooled Dice of the label maps
    ``radserve run`` writes at that precision and at FP32 on the same studies."""
    labels = {
        label["value"]: label["name"]
        for label in yaml.safe_load((models / model / "1.0.0" / "model.yaml").read_text())["labels"]
    }

    def label_maps(precision: str) -> list[np.ndarray]:
        maps = []
        for study in studies:
            out = tmp / f"out-{precision}-{study.name}"
            run = run_radserve("run", str(study), "--pipeline", str(pipeline), "--models-dir",
                               str(models), "--precision", precision, "--out", str(out),
                               "--no-key-images")  # fmt: skip
            assert run.returncode == 0, run.stderr
            maps.append(load_nifti(out / f"{model}.nii.gz").array)
        return maps

    reference = label_maps("fp32")
    for precision, record in report["variants"].items():
        metrics = record["metrics"]
        assert metrics["n_studies"] == len(studies)
        assert "judged by agreement with fp32 only" in metrics["notes"][0]
        agreement = metrics["agreement_vs_fp32"]
        assert list(agreement) == list(labels.values())
        assert record["accepted"] == all(v is None or v >= 0.95 for v in agreement.values())
        if not record["accepted"]:
            run = run_radserve("run", str(studies[0]), "--pipeline", str(pipeline), "--models-dir",
                               str(models), "--precision", precision, "--out",
                               str(tmp / "refused"))  # fmt: skip
            assert run.returncode != 0 and record["reasons"][0] in run.stderr
            continue
        pairs = list(zip(reference, label_maps(precision), strict=True))
        for value, name in labels.items():
            both = sum(int(((a == value) & (b == value)).sum()) for a, b in pairs)
            size = sum(int((a == value).sum() + (b == value).sum()) for a, b in pairs)
            expected = round(2 * both / size, 6) if size else None
            assert agreement[name] == expected, (precision, name)


@pytest.mark.slow
def test_a_pet_ct_model_is_gated_on_pet_ct_studies_not_on_phantoms(tmp_path: Path) -> None:
    """A CT + PET model reads two series; the CT phantoms have one, so the phantom gate
    refuses it, naming the way that works: ``--studies`` with PET/CT studies, where each
    variant runs on both channels (the PET as SUVbw on the CT grid, as in serving)."""
    folder = make_results_folder(tmp_path / "results", folds=(0,), spacing=(4.0, 3.0, 3.0),
                                 patch=(32, 64, 64),
                                 schemes=("CTNormalization", "ZScoreNormalization"),
                                 channel_names=("CT", "noNorm"))  # fmt: skip
    models = tmp_path / "models"
    done = run_radserve("models", "import", "nnunet", str(folder), "--models-dir", str(models),
                        "--name", "petct", "--channel", "1=PT")  # fmt: skip
    assert done.returncode == 0, done.stderr
    pipeline = tmp_path / "petct.yaml"
    pipeline.write_text(
        "name: petct-nnunet\nversion: 1.0.0\nseries_selection: {modalities: [CT]}\n"
        "steps:\n  - model: petct\n"
    )
    gate = ("models", "build-variants", "--model", "petct", "--pipeline", str(pipeline),
            "--models-dir", str(models), "--precision", "int8,fp16")  # fmt: skip
    refused = run_radserve(*gate, "--small", "--seeds", "0", "--calibration-seeds", "1000")
    assert refused.returncode != 0
    assert (
        "reads 2 series and a phantom is one CT" in refused.stderr and "--studies" in refused.stderr
    )

    for seed, where in ((0, "studies/s0"), (1, "studies/s1"), (2, "calibration/s2")):
        made = run_radserve("phantom", "--seed", str(seed), "--small", "--pet", "--slices", "24",
                            "--out", str(tmp_path / f"p{seed}"))  # fmt: skip
        assert made.returncode == 0, made.stderr
        (tmp_path / where).parent.mkdir(exist_ok=True)
        (tmp_path / f"p{seed}" / "dicom").rename(tmp_path / where)
    done = run_radserve(*gate, "--studies", str(tmp_path / "studies"), "--calibration-studies",
                        str(tmp_path / "calibration"))  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads((models / "petct" / "1.0.0" / "gate.json").read_text())
    assert report["studies"] == ["s0", "s1"] and report["calibration_studies"] == ["s2"]
    studies = [tmp_path / "studies" / "s0", tmp_path / "studies" / "s1"]
    _check_gate_against_runs(report, studies, pipeline, models, "petct", tmp_path)

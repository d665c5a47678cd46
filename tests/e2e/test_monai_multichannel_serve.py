"""A multi-sequence MR MONAI Bundle from the CLI to ``radserve run`` and ``radserve serve``.

The bundle (built in the test: ``LoadImaged`` of three keys joined by ``ConcatItemsd``,
``NormalizeIntensityd(nonzero, channel_wise)``, a tiny 3-channel UNet with seeded
weights) names its third channel ``dark_fluid``, which says no series: the import is
refused naming ``--channel``, then imported with ``--channel "2=MR:(?i)flair"``. The
study is ``radserve phantom --small --mr`` (a CT and T1/T2/FLAIR series of one anatomy,
one Frame of Reference); the pipeline selects the T1 (the reference channel), the model
reads the T2 and FLAIR beside it, and the labels of ``radserve run`` and of the server's
SEG equal MONAI's own run of the bundle on the three series' NIfTIs. The same with
``--mr-grids`` (each sequence on its own grid: a 3D T1, a thick-slice small-FOV T2, an
oblique FLAIR with a slice gap): MONAI is given the T2 and FLAIR resampled onto the T1's
grid by the test itself from the files' headers (tests/factories/dicom_resample.py), and
the report flags the share of the T1 volume each covers. A FLAIR in another Frame of
Reference (``--mr-second-frame FLAIR``) is refused by name.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from tests.factories.dciodvfy import dciodvfy_errors
from tests.factories.dicom_resample import onto, read_grid
from tests.factories.imported_serve import import_cli, run_cli, serve_and_read_seg
from tests.factories.server_process import run_radserve

from radserve.ingest import discover_series, load_series
from radserve.models.manifest import load_manifest

DESCRIPTIONS = {"t1": "T1 SE AX", "t2": "T2 TSE AX", "flair": "T2 FLAIR AX"}


@dataclass(frozen=True)
class ImportedBundle:
    """The bundle, what its import without ``--channel`` answered, and its import with it
    (the models folder and what the import printed)."""

    bundle: Path
    refused: subprocess.CompletedProcess[str]
    models: Path
    printed: str


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> ImportedBundle:
    """The bundle built and imported once for both grids: the import does not depend on
    the study, and each import is a fresh interpreter loading torch and MONAI and an ONNX
    export (about 8 CPU-seconds each, twice per grid before). Only read afterwards."""
    pytest.importorskip("monai")
    pytest.importorskip("torch")
    from tests.factories import monai_bundle as mb

    root = tmp_path_factory.mktemp("mr-bundle")
    meta = mb.metadata(modality="MR", inputs={"0": "T1", "1": "T2", "2": "dark_fluid"})
    bundle = mb.write_monai_bundle(
        root / "bundle", pre=mb.MR_CONCAT_PRE, network=mb.MR_NETWORK, meta=meta
    )
    models = root / "models"
    args = ["monai-bundle", str(bundle), "--models-dir", str(models), "--name", "mr-seq"]
    refused = run_radserve("models", "import", *args)
    printed = import_cli(*args, "--channel", "2=MR:(?i)flair")
    return ImportedBundle(bundle, refused, models, printed)


@pytest.mark.slow
def test_a_channel_named_after_no_series_is_refused_naming_the_channel_option(
    imported: ImportedBundle,
) -> None:
    refused = imported.refused
    assert refused.returncode != 0 and "channel 2 is named 'dark_fluid'" in refused.stderr
    assert "--channel 2=" in refused.stderr


@pytest.mark.slow
@pytest.mark.parametrize("own_grids", [False, True], ids=["one_grid", "own_grids"])
def test_multi_sequence_monai_bundle_runs_and_serves_on_the_mr_phantom(
    tmp_path: Path, own_grids: bool, imported: ImportedBundle
) -> None:
    from tests.factories import monai_bundle as mb

    bundle, models, printed = imported.bundle, imported.models, imported.printed
    spec = load_manifest(models / "mr-seq" / "1.0.0" / "model.yaml")
    reference = spec.input.reference_channel
    assert reference is not None and reference.name == "t1"
    # the import says how a pipeline selects the reference series: the T1
    selection = printed.split("series_selection: ")[1].strip()
    assert json.loads(selection) == {
        "modalities": ["MR"],
        "series_description": reference.series_description,
    }

    # the sequences on the CT's grid, or each on its own (--mr-grids: the T2 and FLAIR
    # resampled onto the T1's grid as the import says, linear as the bundle's Spacingd)
    grids = ["--mr-grids"] if own_grids else []
    phantom = ["phantom", "--seed", "0", "--small", "--mr", *grids]
    done = run_radserve(*phantom, "--out", str(tmp_path / "ph"))
    assert done.returncode == 0, done.stderr
    assert spec.input.channel_interpolation == "linear"
    study = tmp_path / "ph" / "dicom"
    series = {h.series_description: h for h in discover_series(study) if h.modality == "MR"}
    volumes = {key: load_series(series[d]).volume for key, d in DESCRIPTIONS.items()}
    if own_grids:  # MONAI stacks channels of one grid: give it the T2 and FLAIR on the T1's
        t1 = read_grid(sorted(study.glob("MR-T1-*.dcm")))
        assert np.allclose(t1.affine, volumes["t1"].affine, atol=1e-4)
        for key, sequence in (("t2", "T2"), ("flair", "FLAIR")):
            on_t1, covered = onto(read_grid(sorted(study.glob(f"MR-{sequence}-*.dcm"))), t1, 1)
            assert 0.3 < covered.mean() < 0.95
            volumes[key] = volumes["t1"].with_array(on_t1.astype(np.float32))
    nifti = {k: str(mb.write_nifti(v, tmp_path / f"{k}.nii.gz")) for k, v in volumes.items()}
    want = mb.run_monai_bundle(bundle, nifti).labels
    counts = np.bincount(want.ravel(), minlength=3)
    assert (counts > 0.005 * want.size).sum() >= 2, counts  # not one class everywhere

    ran, out = run_cli(tmp_path, models, "mr-seq", study, selection)
    full_report = json.loads((out / "report.json").read_text())
    report = full_report["series_selection"]
    t1_uid = series[DESCRIPTIONS["t1"]].series_instance_uid
    assert report["selected"]["series_instance_uid"] == t1_uid
    assert [r["modality"] for r in report["rejected"]] == ["CT"], "T2 and FLAIR are used"
    partial = [w["message"] for w in full_report["warnings"] if "partial_coverage" in w["message"]]
    assert len(partial) == (2 if own_grids else 0), partial
    ran_agreement = float((ran == want).mean())

    served = serve_and_read_seg(
        tmp_path / "serve", models / "mr-seq" / "1.0.0", sorted(study.glob("*.dcm")),
        selection=selection,
    )  # fmt: skip
    served_agreement = float((served.labels == want).mean())
    print(f"vs MONAI: radserve run {ran_agreement:.5f}, served {served_agreement:.5f}")
    assert ran_agreement >= 0.999 and served_agreement >= 0.999
    for path in [*served.results, out / "mr-seq-seg.dcm", out / "measurements-sr.dcm"]:
        assert dciodvfy_errors(path) == [], path

    # a FLAIR in another Frame of Reference: radserve does not register series
    done = run_radserve(*phantom, "--mr-second-frame", "FLAIR", "--out", str(tmp_path / "ph2"))
    assert done.returncode == 0, done.stderr
    moved = tmp_path / "moved"
    moved.mkdir()
    for path in (tmp_path / "ph2" / "dicom").glob("MR-*.dcm"):
        shutil.copy(path, moved)
    pipeline = tmp_path / "run-pipeline.yaml"
    done = run_radserve("run", str(moved), "--pipeline", str(pipeline), "--out",
                     str(tmp_path / "moved-out"), "--models-dir", str(models))  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "error [channel_series_unavailable]" in done.stderr
    assert "channel 'dark_fluid' is not in the reference series' Frame of Reference" in done.stderr

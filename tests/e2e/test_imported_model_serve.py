"""Imported models served by a real ``radserve serve``.

Each model is built in the test (a MONAI Bundle with a real inference.json and seeded
random UNet weights, or the MONAI Model Zoo's spleen_ct_segmentation config as shipped
with its UNet's weights seeded, never downloaded; an nnU-Net v2 results folder with tiny
plans and random weights),
imported from the CLI (``radserve models import monai-bundle`` / ``nnunet``), zipped and
installed into the module's one running server over ``POST /v1/models``; a DICOM CT sent
over STOW-RS
runs a pipeline whose one step is that model, and the SEG the server wrote is read back
with highdicom (tests/factories/imported_serve.py) and compared with the framework's own
predictor on the same CT (MONAI's bundle run; ``nnUNetPredictor``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from tests.factories.dciodvfy import dciodvfy_errors
from tests.factories.dicom_series import make_ct_series, new_uid
from tests.factories.imported_serve import (
    ImportedModelServer,
    import_cli,
    imported_model_server,
    run_cli,
)

from radserve.domain.volume import Volume
from radserve.models.manifest import load_manifest
from radserve.phantom import PhantomSpec, generate_phantom, write_dicom_series


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ImportedModelServer]:
    """One server for every case: each installs its own model (its own name) into it."""
    with imported_model_server(tmp_path_factory.mktemp("serve")) as running:
        yield running


def phantom_ct(folder: Path) -> tuple[list[Path], Volume]:
    """``radserve phantom --seed 0 --small`` cut to 64x64 pixels (a 17 cm field of view)
    and 12 slices: four of spleen_ct_segmentation's 96^3 windows at its 1.5 x 1.5 x 2 mm
    grid. Its DICOM files and its CT."""
    spec = dataclasses.replace(PhantomSpec.random(0, small=True), rows=64, columns=64)
    phantom = generate_phantom(spec.with_slices(12))
    return write_dicom_series(phantom, folder, study_uid=new_uid()), phantom.ct


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["plain", "crop_foreground", "nearest", "spleen_zoo"])
def test_imported_monai_bundle_serves_and_its_seg_reads_back(
    server: ImportedModelServer, tmp_path: Path, variant: str
) -> None:
    """``nearest``: ``Invertd(nearest_interp=True)`` (MONAI's default), 2.5 -> 2 mm
    half-voxel ties every 4th slice; run by ``radserve run`` as well as served.
    ``spleen_zoo``: the Model Zoo's spleen_ct_segmentation bundle (its configs as shipped,
    its 4.8 M-parameter UNet with seeded weights) on a phantom CT (:func:`phantom_ct`),
    served and run by ``radserve run``, every SEG and SR on both paths dciodvfy-clean."""
    pytest.importorskip("monai")
    pytest.importorskip("torch")
    from tests.factories import monai_bundle as mb

    crop = variant == "crop_foreground"
    pre, post = None, None
    if crop:  # spleen_ct_segmentation's CropForegroundd, after ScaleIntensityRanged
        pre = mb.cropped_pre()
    if variant == "nearest":
        post = [mb.POST[0], {**mb.POST[1], "nearest_interp": True}, *mb.POST[2:]]
    if variant == "spleen_zoo":
        bundle = mb.zoo_bundle("spleen_ct_segmentation", tmp_path / "bundle")
    else:
        bundle = mb.write_monai_bundle(tmp_path / "bundle", pre=pre, post=post)
    imported, name = tmp_path / "imported", variant.replace("_", "-")
    import_cli("monai-bundle", str(bundle), "--models-dir", str(imported), "--name", name)

    if variant == "spleen_zoo":
        files, volume = phantom_ct(tmp_path / "study")
    else:
        hu, (n, rows, cols) = mb.served_hu(air=crop), mb.SERVED_SHAPE
        spacing, origin = mb.SERVED_SPACING, mb.SERVED_ORIGIN
        files = make_ct_series(tmp_path / "study", n_slices=n, rows=rows, cols=cols,
                               spacing=spacing, origin=origin, hu=hu,
                               study_uid=new_uid())  # fmt: skip
        volume = Volume.from_geometry(hu.astype(np.float32), spacing=spacing, origin=origin)
    served = server.serve(imported / name / "1.0.0", files, tmp_path / "served")

    # MONAI's own run of the bundle on the same CT (its NIfTI, same geometry)
    monai = mb.run_monai_bundle(bundle, mb.write_nifti(volume, tmp_path / "ct.nii.gz"))
    want = monai.labels
    counts = np.bincount(want.ravel(), minlength=3)
    assert (counts > 0.005 * want.size).sum() >= 2, counts
    spec = load_manifest(imported / name / "1.0.0" / "model.yaml")
    assert served.segment_names == sorted(lb.name for lb in spec.labels if lb.value in want)
    differ = served.labels != want
    agreement = float(1.0 - differ.mean())
    print(f"served vs MONAI: {agreement:.5f} ({int(differ.sum())} differ)")
    assert agreement >= 0.999, agreement
    # a voxel may differ only where MONAI's two leading classes are a float32 rounding
    # apart (crop case: 1 voxel, 0.33744258 vs 0.33744260; MONAI's own label there
    # flips with torch's thread count): never at the box's zero padding or a nearest tie
    assert monai.scores is not None
    ties = mb.float_ties(monai.scores)
    assert not (differ & ~ties).any(), np.argwhere(differ & ~ties)[:5]
    results = list(served.results)
    if variant in ("nearest", "spleen_zoo"):
        ran, out = run_cli(tmp_path, imported, name, files[0].parent)
        print(f"radserve run vs MONAI: {float((ran == want).mean()):.5f}")
        assert float((ran == want).mean()) >= 0.999
        results += [out / f"{name}-seg.dcm", out / "measurements-sr.dcm"]
    if variant == "spleen_zoo":
        assert sorted(p.name.split("-")[0] for p in served.results) == ["SEG", "SR"]
        for path in results:
            assert dciodvfy_errors(path) == [], path


@pytest.mark.slow
def test_imported_nnunet_model_serves_and_agrees_with_nnunet_predictor(
    server: ImportedModelServer, tmp_path: Path
) -> None:
    pytest.importorskip("nnunetv2", reason="the nnunet extra is not installed")
    from tests.factories.agreement import synthetic_ct
    from tests.factories.nnunet_folder import make_results_folder

    from radserve.importers.nnunet import load_predictor, read_results_folder

    folder = make_results_folder(tmp_path / "results", folds=(0,), spacing=(4.0, 2.5, 2.5))
    imported = tmp_path / "imported"
    import_cli("nnunet", str(folder), "--models-dir", str(imported), "--name", "tiny-nnunet")

    ct = synthetic_ct((20, 64, 64), seed=5)
    ct[ct == 0] = -1000.0  # DICOM CT: air outside the field of view
    ct = np.clip(np.round(ct), -1024, 3071)
    spacing = (3.0, 2.0, 2.0)
    files = make_ct_series(tmp_path / "study", n_slices=20, rows=64, cols=64, spacing=spacing,
                           hu=ct, study_uid=new_uid())  # fmt: skip
    served = server.serve(imported / "tiny-nnunet" / "1.0.0", files, tmp_path / "served")

    predictor = load_predictor(read_results_folder(folder))
    theirs = predictor.predict_single_npy_array(
        ct[None].astype(np.float32), {"spacing": list(spacing)}
    )
    counts = np.bincount(np.asarray(theirs).ravel())
    assert (counts > 0.005 * theirs.size).sum() >= 2, counts  # not one class everywhere
    spec = load_manifest(imported / "tiny-nnunet" / "1.0.0" / "model.yaml")
    present = {lb.name for lb in spec.labels if lb.value in np.unique(served.labels)}
    assert served.segment_names == sorted(present)
    agreement = float((served.labels == theirs).mean())
    assert agreement >= 0.999, agreement


@pytest.mark.slow
def test_imported_pet_ct_nnunet_model_serves_on_a_pet_ct_study(
    server: ImportedModelServer, tmp_path: Path
) -> None:
    """A CT + PET nnU-Net model (channel 1 named "PET": read from the PT series in SUVbw)
    on the PET/CT phantom sent over STOW-RS: the server uses both series, and its SEG
    matches ``nnUNetPredictor`` fed the CT and the SUV on the CT grid, not the CT alone."""
    pytest.importorskip("nnunetv2", reason="the nnunet extra is not installed")
    from tests.factories.nnunet_folder import make_results_folder

    from radserve.importers.nnunet import load_predictor, read_results_folder
    from radserve.ingest import discover_series, load_series
    from radserve.ingest.suv import series_to_suv
    from radserve.phantom import PhantomSpec, generate_phantom, write_dicom_series
    from radserve.phantom.pet import generate_pet, write_pet_series
    from radserve.preprocess.onto_grid import resample_onto

    folder = make_results_folder(
        tmp_path / "results",
        folds=(0,),
        spacing=(4.0, 3.0, 3.0),
        # 27 patches over the phantom (tiny_plans' 16x32x32 made it 216: per-patch
        # overhead, twice in nnUNetPredictor, was most of this file's CPU-seconds)
        patch=(32, 64, 64),
        schemes=("CTNormalization", "ZScoreNormalization"),
        channel_names=("CT", "PET"),
    )
    imported = tmp_path / "imported"
    import_cli("nnunet", str(folder), "--models-dir", str(imported), "--name", "petct-nnunet")

    # the study `radserve phantom --seed 0 --small --pet` writes, cut to its middle 24
    # slices (120 mm: one patch deep at the model's 4 mm, 9 patches per run where its 43
    # slices took 27; three runs: the server's, nnUNetPredictor's with and without PET)
    phantom = generate_phantom(PhantomSpec.random(0, small=True).with_slices(24))
    study = tmp_path / "study"
    files = write_dicom_series(phantom, study) + write_pet_series(generate_pet(phantom), study)
    served = server.serve(imported / "petct-nnunet" / "1.0.0", files, tmp_path / "served")
    assert served.report["series_selection"]["selected"]["modality"] == "CT"
    assert served.report["series_selection"]["rejected"] == [], "the PET is used, not passed over"

    headers = {h.modality: h for h in discover_series(study)}
    ct = load_series(headers["CT"]).volume
    suv, _ = series_to_suv(load_series(headers["PT"]))
    predictor = load_predictor(read_results_folder(folder))

    def theirs(pet: np.ndarray) -> np.ndarray:
        image = np.stack([ct.array, pet]).astype(np.float32)
        return np.asarray(predictor.predict_single_npy_array(image, {"spacing": list(ct.spacing)}))

    want = theirs(resample_onto(suv, ct, order=3).array)  # cubic, nnU-Net's data order
    assert served.labels.shape == want.shape == ct.shape
    assert len(np.unique(want)) >= 2
    agreement = float((served.labels == want).mean())
    assert agreement >= 0.999, agreement
    # the PET channel changes the labels: without it they would not agree this well
    without_pet = float((served.labels == theirs(np.zeros(ct.shape, np.float32))).mean())
    print(f"agreement {agreement:.5f}; with the PET channel zeroed {without_pet:.5f}")
    assert without_pet < agreement - 0.001, (agreement, without_pet)

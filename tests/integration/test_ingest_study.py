"""Whole studies: a zip upload and a messy folder through discover → load."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
from tests.factories.dicom_series import (
    make_ct_series,
    make_enhanced_series,
    make_mr_series,
    new_uid,
    oblique_orientation,
    ramp_hu,
    series_affine,
    write_not_dicom,
)

from radserve.ingest import IngestPolicy, discover_series, load_series, load_study


def test_zip_upload_loads_like_the_folder(tmp_path: Path) -> None:
    orientation = oblique_orientation(12.0)
    study = new_uid()
    ct = make_ct_series(tmp_path / "ct", orientation=orientation, order="shuffled", study_uid=study)
    enhanced = make_enhanced_series(tmp_path / "mf", modality="MR", study_uid=study)
    archive = tmp_path / "study.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in [*ct, enhanced]:
            zf.write(path, f"{path.parent.name}/{path.name}")
        zf.writestr("DICOMDIR-notes.txt", "not dicom")

    headers = discover_series(archive)
    assert sorted(h.modality for h in headers) == ["CT", "MR"]
    assert [s.reason for s in headers[0].skipped] == ["not DICOM (no 'DICM' marker)"]
    ct_header = next(h for h in headers if h.modality == "CT")
    from_zip = load_series(ct_header, required_modality="CT", workers=2)
    from_folder = load_series(discover_series(tmp_path / "ct")[0])
    np.testing.assert_array_equal(from_zip.volume.array, from_folder.volume.array)
    np.testing.assert_allclose(from_zip.volume.affine, series_affine(orientation=orientation))
    assert from_zip.source_slices[0].source.member.startswith("ct/")
    mr = load_series(next(h for h in headers if h.modality == "MR"), workers=3)
    np.testing.assert_array_equal(mr.volume.array, ramp_hu(8, 16, 12) + 1000)


def test_load_study_records_every_rejection(tmp_path: Path) -> None:
    study = new_uid()
    make_ct_series(tmp_path / "ct", study_uid=study, series_number=2)
    make_ct_series(tmp_path / "gap", study_uid=study, series_number=3, drop=[2])
    make_mr_series(tmp_path / "mr", n_slices=3, study_uid=study, series_number=4)
    write_not_dicom(tmp_path / "junk" / "thumbs.db")

    result = load_study(tmp_path, required_modality="CT")
    assert [s.header.series_number for s in result.series] == [2]
    assert [(r.header.series_number, r.code) for r in result.rejected] == [
        (3, "geometry_invalid"),
        (4, "unsupported_modality"),
    ]
    assert "missing slices" in result.rejected[0].reason
    assert [s.source.name for s in result.skipped] == ["thumbs.db"]

    lenient = load_study(
        tmp_path,
        policy=IngestPolicy(missing_slices="resample"),
        select=lambda h: h.modality == "CT",
    )
    assert [s.volume.shape for s in lenient.series] == [(8, 16, 12), (8, 16, 12)]
    assert lenient.rejected == ()

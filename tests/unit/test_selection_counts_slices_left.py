"""The selection rules' slice count holds for the stack as loaded, not only for the
header's count of instances: a series of 12 instances at one position (a sender's copies
of one slice, a repeated acquisition) met ``min_slices`` by its headers, its duplicates
were dropped as identical copies, and the job ran on the one slice left, reporting
"no findings" with only a warning. Now that series fails like a one-image series, and a
qualifying series beside it is used instead."""

from __future__ import annotations

from pathlib import Path

import pydicom
import pytest
from tests.factories.bundles import write_test_pipeline
from tests.factories.dicom_series import make_ct_series, new_uid

from radserve.errors import StudyError
from radserve.pipeline.inputs import ingest_study
from radserve.pipeline.spec import PipelineSpec, load_pipeline

GRID = {"n_slices": 12, "rows": 16, "cols": 16, "spacing": (2.0, 1.5, 1.5)}


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> PipelineSpec:
    return load_pipeline(write_test_pipeline(tmp_path_factory.mktemp("pipeline"), min_slices=3))


def _copies_of_one_slice(folder: Path, study: str, number: int) -> None:
    """12 instances, each a copy of the first slice (same position, same pixels)."""
    make_ct_series(folder, study_uid=study, series_number=number, **GRID)
    files = sorted(folder.glob("*.dcm")) or sorted(p for p in folder.iterdir() if p.is_file())
    first = pydicom.dcmread(files[0])
    for path in files[1:]:
        ds = pydicom.dcmread(path)
        ds.ImagePositionPatient = first.ImagePositionPatient
        ds.SliceLocation = first.get("SliceLocation", 0)
        ds.PixelData = first.PixelData
        ds.save_as(path)


def test_a_series_of_copies_of_one_slice_is_refused(pipeline: PipelineSpec, tmp_path: Path) -> None:
    _copies_of_one_slice(tmp_path / "s1", new_uid(), 1)
    with pytest.raises(StudyError) as refused:
        ingest_study(tmp_path, pipeline=pipeline)
    assert refused.value.code == "study_invalid"
    assert "1 slice left of its 12 images" in refused.value.message
    assert "a single image" in refused.value.message


def test_a_qualifying_series_beside_it_is_used(pipeline: PipelineSpec, tmp_path: Path) -> None:
    study = new_uid()
    _copies_of_one_slice(tmp_path / "s1", study, 1)
    make_ct_series(tmp_path / "s2", study_uid=study, series_number=2, **{**GRID, "n_slices": 6})
    ingested = ingest_study(tmp_path, pipeline=pipeline)
    assert ingested.loaded.header.series_number == 2
    assert ingested.loaded.volume.shape[0] == 6

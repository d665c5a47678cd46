"""An Enhanced CT (multi-frame) study from a real PACS (Orthanc) gets its DICOM SEG and SR
back: the SEG stored in Orthanc has the Enhanced instance as its source and names the
source frame of each of its frames (the frames are stored shuffled, so frame k + 1 is not
slice k), and the SR names the frame of each image it references. A series that a SEG
cannot reference (one volume from two Enhanced instances) is still refused at ingest,
before any model runs, with the reason in the job and a failure SR in the PACS. Skips
without the ``Orthanc`` binary."""

from __future__ import annotations

import io
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pydicom
import pytest
from tests.factories.dicom_net import Orthanc
from tests.factories.dicom_series import make_enhanced_series, new_uid
from tests.factories.pacs import pacs_and_gateway, terminal_jobs
from tests.factories.service import GRID, ORIGIN, lesion_hu
from tests.factories.waits import wait_until

from radserve.service import Service
from radserve.store import JobState

pytestmark = [
    pytest.mark.tools,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("Orthanc") is None, reason="Orthanc is not installed"),
]

SEG = "1.2.840.10008.5.1.4.1.1.66.4"
SR_3D = "1.2.840.10008.5.1.4.1.1.88.34"


@pytest.fixture
def pacs_and_server(tmp_path: Path) -> Iterator[tuple[Orthanc, Service]]:
    with pacs_and_gateway(tmp_path, warm=True) as peers:
        yield peers


def _count_model_runs(service: Service) -> list[int]:
    """Counts the organ model's batches (the first model of the test pipeline)."""
    session = service.catalog.sessions.get(service.catalog.registry.get("organs-test"), "fp32")
    calls = [0]
    run = session.run

    def counted(batch: Any) -> Any:
        calls[0] += 1
        return run(batch)

    session.run = counted  # type: ignore[method-assign]
    return calls


def _instances(orthanc: Orthanc, study_id: str, sop_class: str) -> list[pydicom.Dataset]:
    return [
        pydicom.dcmread(io.BytesIO(orthanc.file(i["ID"])))
        for i in orthanc.get(f"/studies/{study_id}/instances")
        if orthanc.get(f"/instances/{i['ID']}/simplified-tags")["SOPClassUID"] == sop_class
    ]


def _enhanced(folder: Path, study_uid: str, **options: Any) -> Path:
    grid = {"n_frames": GRID["n_slices"], "origin": ORIGIN, **options}
    return make_enhanced_series(
        folder,
        rows=GRID["rows"],
        cols=GRID["cols"],
        spacing=GRID["spacing"],
        hu=lesion_hu(),
        study_uid=study_uid,
        **grid,
    )


def _image_references(item: pydicom.Dataset) -> Iterator[pydicom.Dataset]:
    for child in item.get("ContentSequence", []):
        if child.ValueType == "IMAGE":
            yield child.ReferencedSOPSequence[0]
        yield from _image_references(child)


def test_enhanced_ct_gets_seg_and_sr_naming_its_frames_and_two_instances_are_refused(
    pacs_and_server: tuple[Orthanc, Service], tmp_path: Path
) -> None:
    orthanc, service = pacs_and_server
    runs = _count_model_runs(service)
    half = GRID["n_slices"] // 2
    same = {"series_uid": new_uid(), "frame_of_reference_uid": new_uid(), "n_frames": half}
    study_uid = new_uid()
    top = (ORIGIN[0], ORIGIN[1], ORIGIN[2] + half * GRID["spacing"][0])
    files = [
        _enhanced(tmp_path / "two", study_uid, filename="a.dcm", **same),
        _enhanced(tmp_path / "two", study_uid, filename="b.dcm", origin=top, **same),
    ]
    study = orthanc.upload(files)
    orthanc.push("radserve", [study])
    [refused] = terminal_jobs(service, 1)
    assert refused.state is JobState.FAILED
    assert refused.error_code == "source_frames_unsupported"  # the study's, not ours
    assert "2 instances, 2 of them Enhanced" in refused.error_message
    assert "before inference" in refused.error_message
    assert runs[0] == 0  # refused at ingest: no model ran for it
    # the PACS is told, in that study: the failure SR (and no SEG)
    assert wait_until(lambda: len(_instances(orthanc, study, SR_3D)) == 1, 60)
    assert _instances(orthanc, study, SEG) == []

    # one Enhanced instance, frames stored shuffled: SEG and SR come back
    path = _enhanced(tmp_path / "enhanced", new_uid(), frame_order="shuffled", seed=3)
    source = pydicom.dcmread(path, stop_before_pixels=True)
    study = orthanc.upload([path])
    orthanc.push("radserve", [study])
    job = terminal_jobs(service, 2)[1]
    assert job.state is JobState.SUCCEEDED, (job.error_code, job.error_message)
    assert runs[0] > 0
    assert wait_until(lambda: len(_instances(orthanc, study, SR_3D)) == 1, 60)
    assert wait_until(lambda: len(_instances(orthanc, study, SEG)) >= 1, 60)

    positions = {
        n: np.asarray(item.PlanePositionSequence[0].ImagePositionPatient, float)
        for n, item in enumerate(source.PerFrameFunctionalGroupsSequence, start=1)
    }
    for seg in _instances(orthanc, study, SEG):
        assert seg.StudyInstanceUID == source.StudyInstanceUID
        for frame in seg.PerFrameFunctionalGroupsSequence:
            [ref] = frame.DerivationImageSequence[0].SourceImageSequence
            assert ref.ReferencedSOPInstanceUID == source.SOPInstanceUID
            where = np.asarray(frame.PlanePositionSequence[0].ImagePositionPatient, float)
            np.testing.assert_allclose(where, positions[int(ref.ReferencedFrameNumber)], atol=1e-6)
        [series] = seg.ReferencedSeriesSequence
        assert [i.ReferencedSOPInstanceUID for i in series.ReferencedInstanceSequence] == [
            source.SOPInstanceUID
        ]
    [sr] = _instances(orthanc, study, SR_3D)
    frames = [
        ref.get("ReferencedFrameNumber")
        for ref in _image_references(sr)
        if ref.ReferencedSOPInstanceUID == source.SOPInstanceUID
    ]
    assert frames and all(f is not None for f in frames)

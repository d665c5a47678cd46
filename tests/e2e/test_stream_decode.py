"""A JPEG 2000 study enters the organ model while its later slices still decode, and the
labels are the ones a whole decode gives, voxel for voxel.

The reference pipeline (organs 2.5D with a body crop, then lesions on the organs' ROI)
on a slab of the bench patient, as scanned for the bench and with a field of view so
small that the body reaches both side edges of the image: the body box is found on the
same slices (decoded first), so the crop, the network inputs and every label are
identical.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from radserve.bench.study import bench_spec
from radserve.ingest import discover_series, load_series
from radserve.ingest.decode import shutdown_decode_workers
from radserve.models.registry import ModelRegistry
from radserve.phantom import generate_phantom, write_dicom_series
from radserve.pipeline import SessionPool, load_pipeline, run_study
from radserve.preprocess.crop import body_bbox, body_sample_slices
from radserve.report.nifti import read_nifti

pytestmark = pytest.mark.slow

SLAB = range(112, 144)  # liver and lungs of the 300-slice bench patient (1.33 mm slices)
FOV_PIXEL_MM = {"inside": 0.8092, "edge": 0.62}  # bench: body inside; edge: body cut off


@pytest.fixture(scope="module", params=sorted(FOV_PIXEL_MM))
def study(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Path]]:
    folder = tmp_path_factory.mktemp(f"j2k-{request.param}")
    spec = dataclasses.replace(bench_spec(300), pixel_spacing_mm=FOV_PIXEL_MM[request.param])
    phantom = generate_phantom(spec, slice_indices=SLAB)
    try:
        write_dicom_series(phantom, folder, transfer_syntax="jpeg2000")
    except RuntimeError as exc:  # no JPEG 2000 encoder installed here
        pytest.skip(f"cannot encode JPEG 2000 here: {exc}")
    yield request.param, folder
    shutdown_decode_workers()


def _labels(out: Path) -> dict[str, np.ndarray]:
    return {p.name: read_nifti(p).array for p in sorted(out.glob("*.nii.gz"))}


def test_streamed_decode_gives_the_labels_of_a_whole_decode(
    study: tuple[str, Path], tmp_path: Path
) -> None:
    kind, study = study  # type: ignore[assignment]
    loaded = load_series(discover_series(study)[0], workers=2, decode_first=body_sample_slices)
    assert loaded.arrival is not None  # JPEG 2000 in processes: returned while decoding
    loaded.wait_decoded()
    whole = load_series(discover_series(study)[0], workers=2)
    assert whole.arrival is None
    np.testing.assert_array_equal(loaded.volume.array, whole.volume.array)
    box = body_bbox(whole.volume)
    at_edge = box[2] == slice(0, whole.volume.shape[2])  # the body reaches the side edges
    assert at_edge == (kind == "edge")
    assert body_sample_slices(whole.volume.shape, whole.volume.spacing).step == 2

    registry, sessions = ModelRegistry(), SessionPool()
    pipeline = load_pipeline("ct-chest-abdomen")
    runs = {
        stream: run_study(
            study,
            pipeline=pipeline,
            out_dir=tmp_path / str(stream),
            registry=registry,
            sessions=sessions,
            key_images=False,
            stream_decode=stream,
        )
        for stream in (True, False)
    }
    streamed, decoded = _labels(tmp_path / "True"), _labels(tmp_path / "False")
    assert streamed.keys() == decoded.keys() and len(streamed) >= 2
    for name, labels in streamed.items():
        np.testing.assert_array_equal(labels, decoded[name], err_msg=name)
    assert any(labels.any() for labels in streamed.values())
    organs = runs[True].volume_result.organ_step
    assert organs is not None and organs.labels.array.any()
    assert [f.model_dump(exclude={"finding_id"}) for f in runs[True].report.findings] == [
        f.model_dump(exclude={"finding_id"}) for f in runs[False].report.findings
    ]
    assert runs[True].report.organ_measurements == runs[False].report.organ_measurements

"""The work between the networks and in the report, spread over threads, gives the
serial order's label maps, report and drift features.

The reference pipeline on a slab of the bench patient (liver and lungs, so the organ
clean-up drops specks and the lesion step has its ROI), once with ``array_threads=1``
(the order before the work was spread) and once with four threads.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from radserve.bench.study import bench_spec
from radserve.models.registry import ModelRegistry
from radserve.phantom import generate_phantom, write_dicom_series
from radserve.pipeline import SessionPool, load_pipeline, run_study
from radserve.report.nifti import read_nifti

pytestmark = pytest.mark.slow

SLAB = range(112, 144)  # liver and lungs of the 300-slice bench patient


def _report(out: Path) -> dict[str, object]:
    """report.json without what differs between any two runs (times, the clock)."""
    report = json.loads((out / "report.json").read_text())
    for key in ("timings", "generated_at"):
        report.pop(key)
    return report


def test_threaded_postprocess_and_report_equal_the_serial_order(tmp_path: Path) -> None:
    study = tmp_path / "study"
    write_dicom_series(generate_phantom(bench_spec(300), slice_indices=SLAB), study)
    registry, sessions = ModelRegistry(), SessionPool()
    pipeline = load_pipeline("ct-chest-abdomen")
    runs = {
        threads: run_study(
            study,
            pipeline=pipeline,
            out_dir=tmp_path / str(threads),
            registry=registry,
            sessions=sessions,
            array_threads=threads,
        )
        for threads in (1, 4)
    }
    maps = {t: sorted((tmp_path / str(t)).glob("*.nii.gz")) for t in runs}
    assert [p.name for p in maps[1]] == [p.name for p in maps[4]] and len(maps[1]) >= 2
    for serial, threaded in zip(maps[1], maps[4], strict=True):
        np.testing.assert_array_equal(read_nifti(serial).array, read_nifti(threaded).array)
    organs = runs[1].volume_result.organ_step
    assert organs is not None and organs.labels.array.any()
    assert len(runs[1].report.organ_measurements) == len(organs.bundle.spec.region_labels)
    assert _report(tmp_path / "1") == _report(tmp_path / "4")
    assert runs[1].features is not None and runs[1].features == runs[4].features
    pngs = {t: sorted(p.name for p in (tmp_path / str(t)).rglob("*.png")) for t in runs}
    assert pngs[1] == pngs[4]

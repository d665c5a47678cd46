"""``radserve bench --slices N`` gives a study the benchmarked pipeline selects for any N
(before session 29 fewer than 80 slices were spread over the full coverage, wider than
its 5 mm limit, and the run died in a traceback), and a run that fails says why in one
line."""

from __future__ import annotations

from pathlib import Path

import pytest

from radserve.bench import PIPELINE
from radserve.bench.errors import BenchError
from radserve.bench.run import _run_child
from radserve.bench.study import bench_spec
from radserve.error_table import lookup
from radserve.pipeline.spec import load_pipeline


@pytest.mark.parametrize("n_slices", [20, 60, 79, 80, 150, 300])
def test_every_slice_count_is_a_study_the_pipeline_selects(n_slices: int) -> None:
    widest = load_pipeline(PIPELINE).series_selection.max_slice_thickness_mm
    full = bench_spec(300)
    spec = bench_spec(n_slices)
    assert spec.n_slices == n_slices
    assert spec.slice_thickness_mm <= widest and spec.slice_spacing_mm <= widest
    coverage = spec.n_slices * spec.slice_spacing_mm
    if n_slices >= 80:  # the same patient's whole coverage, more or less finely sampled
        assert coverage == pytest.approx(full.n_slices * full.slice_spacing_mm, abs=0.5)
    else:  # fewer slices at the widest spacing: less of the patient, centred
        assert spec.slice_spacing_mm == widest
        middle = spec.first_slice_z_mm + coverage / 2
        assert middle == pytest.approx(
            full.first_slice_z_mm + full.n_slices * full.slice_spacing_mm / 2, abs=widest
        )


def test_a_failed_run_is_one_line_naming_the_cause(tmp_path: Path) -> None:
    empty = tmp_path / "study"
    empty.mkdir()
    (empty / "notes.txt").write_text("not DICOM")
    with pytest.raises(BenchError) as failed:
        _run_child("radserve", empty, tmp_path / "work", "fp32")
    message = failed.value.message
    assert message.startswith("the radserve run failed: ") and "\n" not in message
    assert "DICOM" in message  # the child's own error, not "exit status 1"
    assert failed.value.code == "bench_failed" and lookup(failed.value).exit == 2

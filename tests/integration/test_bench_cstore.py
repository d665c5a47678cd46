"""``radserve bench --scenario cstore`` on a few instances: every mode stores every
instance (the bench raises otherwise) and reports a rate and a ratio per row."""

from __future__ import annotations

from pathlib import Path

import pytest

from radserve.bench.cstore import MODES, dcmtk_storescu, run_cstore_bench

pytestmark = [
    pytest.mark.tools,
    pytest.mark.skipif(dcmtk_storescu() is None, reason="dcmtk is not installed"),
]


def test_cstore_bench_runs_every_mode(tmp_path: Path) -> None:
    summary = run_cstore_bench(
        n_instances=8, associations=(1, 2), repeats=1, cache_dir=tmp_path, log=lambda _: None
    )
    rows = summary["rows"]
    assert [(r["mode"], r["associations"]) for r in rows] == [
        (label, n) for label, _, _ in MODES for n in (1, 2)
    ]
    assert all(r["instances_per_s"] > 0 and len(r["runs"]) == 1 for r in rows)
    assert all(r["ratio_vs_per_instance"] == 1.0 for r in rows if r["mode"] == "per_instance")
    assert all(r["mean_batch"] >= 1.0 for r in rows if r["mode"] != "per_instance")
    assert summary["instances"] == 8

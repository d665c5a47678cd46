"""``radserve bench --scenario cstore`` on a few instances: every mode and both floors
(the disk, a bare pynetdicom SCP) store every instance (the bench raises otherwise) and
report a rate, a ratio, the CPU and its bound per row, the receiving CPU split where the
SCP receives in the bench's process, and the floor summary names what is below the
goal."""

from __future__ import annotations

from pathlib import Path

import pytest

from radserve.bench.cstore import (
    BARE_VARIANTS,
    DEFAULT_MODE,
    DISK,
    MODES,
    SPLIT,
    dcmtk_storescu,
    run_cstore_bench,
)

pytestmark = [
    pytest.mark.tools,
    pytest.mark.skipif(dcmtk_storescu() is None, reason="dcmtk is not installed"),
]


def test_cstore_bench_runs_every_mode(tmp_path: Path) -> None:
    summary = run_cstore_bench(
        n_instances=8, associations=(1, 2), repeats=1, cache_dir=tmp_path, log=lambda _: None
    )
    rows = summary["rows"]
    labels = [label for label, _ in MODES] + [label for label, _ in BARE_VARIANTS] + [DISK]
    assert [(r["mode"], r["associations"]) for r in rows] == [
        (label, n) for label in labels for n in (1, 2)
    ]
    assert all(r["instances_per_s"] > 0 and len(r["runs"]) == 1 for r in rows)
    # os.times ticks are 10 ms: a cell of 8 instances may read 0, the whole run cannot
    assert all(r["cpu_ms_per_instance"] >= 0 for r in rows)
    assert sum(r["cpu_ms_per_instance"] for r in rows) > 0
    assert all(r["ratio_vs_default"] == 1.0 for r in rows if r["mode"] == DEFAULT_MODE)
    grouped = [r for r in rows if r["mode"].startswith("group")]
    assert all(r["mean_batch"] >= 1.0 and r["largest_batch"] >= 1 for r in grouped)
    assert all(r["committer_busy"] > 0 for r in grouped)
    assert all(r["mean_batch"] is None for r in rows if not r["mode"].startswith("group"))
    assert summary["instances"] == 8
    floors = summary["floors"]
    assert set(floors) == {"1", "2"}
    for floor in floors.values():
        assert floor["radserve_best_mode"] in labels[: len(MODES)]
        assert floor["bare_pynetdicom"] > 0 and floor["disk"] > 0
        # 8 instances cannot reach 300/s through storescu's start-up: all below the goal
        assert "radserve" in floor["below_goal"]


def test_cstore_bench_reports_the_cpu_bound_and_the_receiving_split(tmp_path: Path) -> None:
    summary = run_cstore_bench(
        n_instances=12, associations=(2,), repeats=1, cache_dir=tmp_path, log=lambda _: None
    )
    cores = summary["cpus"]
    for row in summary["rows"]:
        spent = row["cpu_ms_per_instance"] + row["sender_cpu_ms_per_instance"]
        assert row["cpu_bound_instances_per_s"] == pytest.approx(cores * 1000 / spent)
    one_process = [
        r for r in summary["rows"] if r["mode"] in dict(MODES) and r["mode"].endswith("1 process")
    ]
    assert one_process
    for row in one_process:
        split = row["cpu_split_ms"]
        assert list(split) == list(SPLIT)
        # the parts are measured (thread CPU clocks) or the remainder: they sum to the total
        assert sum(split.values()) == pytest.approx(row["cpu_ms_per_instance"])
        # pynetdicom decoded every PDU and radserve read and stored every instance
        assert split["pynetdicom_receive"] > 0
        assert split["parse"] > 0 and split["durable"] > 0 and split["handler_other"] > 0
    # receiving processes and the floors keep their ledgers elsewhere, or have none
    others = [r for r in summary["rows"] if r not in one_process]
    assert others and all(r["cpu_split_ms"] is None for r in others)
    assert summary["floors"]["2"]["radserve_cpu_bound"] > 0

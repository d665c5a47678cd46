"""`radserve bench --scenario j2k` on a small study: the streamed and the whole-decode
runs give the same labels, and every figure of goal 2 is there (both end-to-end times,
the decode + work CPU floor and the ratios to it, GDCM's threaded decode beside
radserve's, the load average). No time is asserted beyond its sign: those are what the
scenario measures, not what a test can promise on a shared machine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from radserve.cli import cli

pytestmark = pytest.mark.slow

SLICES = 80  # 5 mm apart over the whole coverage (fewer cover less: radserve.bench.study)


def test_j2k_scenario_reports_goal_2_beside_identical_labels(tmp_path: Path) -> None:
    out = tmp_path / "j2k.json"
    args = ["bench", "--scenario", "j2k", "--slices", str(SLICES), "--repeats", "1"]
    result = CliRunner().invoke(
        cli, [*args, "--cache-dir", str(tmp_path / "studies"), "--json", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "streamed / floor" in result.output
    summary = json.loads(out.read_text())
    assert summary["labels_identical"] is True
    median = summary["median"]
    for key in ("radserve_s", "radserve_whole_s", "decode_radserve_s", "decode_gdcm_s"):
        assert median[key] > 0.0
    # the floor counts the decoder processes' CPU, not only the bench child's own
    assert 0.0 < median["decode_cpu_s_in_whole_run"] < median["radserve_whole_cpu_s"]
    assert median["floor_s"] == pytest.approx(median["radserve_whole_cpu_s"] / summary["cores"])
    assert median["radserve_over_floor"] == pytest.approx(median["radserve_s"] / median["floor_s"])
    assert len(summary["load_average_before"]) == 3

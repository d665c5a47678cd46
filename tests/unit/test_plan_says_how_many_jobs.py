"""``radserve plan``'s text says how many measured jobs its service times come from, and
calls a plan from fewer than ``MIN_RATIOS`` of them rough: a first-time user's plan after
three jobs printed only "measured", as one after thousands does."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from radserve.cli import cli
from radserve.turnaround.plan import MIN_RATIOS

TRACE = Path(__file__).parents[1] / "data" / "eta-traces" / "eta-quiet-xeon-180bc3a-s0.json.gz"


def _first_jobs(times: dict[str, Any], n: int) -> dict[str, Any]:
    """The service-time model of the trace's first ``n`` jobs: every per-job list cut."""
    jobs = len(times["sizes"])

    def cut(value: Any) -> Any:
        if isinstance(value, list) and len(value) == jobs:
            return value[:n]
        if isinstance(value, list):
            return [cut(v) for v in value]
        if isinstance(value, dict):
            return {k: cut(v) for k, v in value.items()}
        return value

    return cut(times)


def _plan(tmp_path: Path, model: Path) -> str:
    args = ["plan", "--data-dir", str(tmp_path / "data"), "--service-times", str(model)]
    result = CliRunner().invoke(cli, [*args, "--rate", "urgent=20/h", "--hours", "0.5"])
    assert result.exit_code == 0, result.output
    return result.output.splitlines()[0]


def test_the_plan_names_its_measured_job_count_and_calls_few_rough(tmp_path: Path) -> None:
    times = json.loads(gzip.decompress(TRACE.read_bytes()))["service_times"]
    jobs = len(times["sizes"])
    assert jobs >= MIN_RATIOS
    few, many = tmp_path / "few.json", tmp_path / "many.json"
    few.write_text(json.dumps(_first_jobs(times, 3)))
    many.write_text(json.dumps(times))
    rough = f", measured from 3 job(s) (fewer than {MIN_RATIOS}: a rough plan); "
    assert rough in _plan(tmp_path, few)
    line = _plan(tmp_path, many)
    assert f", measured from {jobs} job(s); " in line and "rough" not in line

"""``radserve plan``'s outputs against inputs a user trial tried (2026-12-07).

- ``--target urgent=1e308d`` is finite in days and infinite in seconds: the --json
  document said ``"URGENT": Infinity``, which is not JSON (jq refuses the whole plan).
- ``--replay N --plot``: the curve's Poisson streams lasted the replay's own span, so a
  burst (jobs stored within milliseconds) drew no arrival at any rate and the plot said
  "no arrivals" everywhere; a replay of one job plotted against 900-7,200 arrivals an
  hour, a rate made up from one arrival.
- ``--target urgent=1e+3s`` was refused as malformed while ``--rate urgent=1e+3/h`` was
  read: the targets' pattern took a negative exponent's sign only.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from tests.factories.finished_jobs import stored_burst

from radserve.cli import cli
from radserve.domain.priority import PriorityClass
from radserve.turnaround.plan import PlanInputError, parse_targets

OUT = PriorityClass.OUTPATIENT


def _run(data: Path, *args: str) -> Result:
    return CliRunner().invoke(cli, ["plan", "--data-dir", str(data), *args])


@pytest.mark.parametrize("target", ["urgent=1e308d", "urgent=1e306h", "urgent=3e306min"])
def test_a_target_infinite_in_seconds_is_refused(tmp_path: Path, target: str) -> None:
    with pytest.raises(PlanInputError, match="a finite time above 0"):
        parse_targets(target)
    result = _run(tmp_path / "data", "--rate", "urgent=20/h", "--target", target, "--json")
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--target'" in result.output


def test_a_large_finite_target_still_plans_as_json(tmp_path: Path) -> None:
    assert parse_targets("urgent=1e300d") == {PriorityClass.URGENT: 1e300 * 86400}
    args = ["--rate", "urgent=20/h", "--hours", "0.5", "--target", "urgent=1e300d", "--json"]
    result = _run(tmp_path / "data", *args)
    assert result.exit_code == 0, result.output
    # strict JSON: no Infinity / NaN anywhere
    report = json.loads(result.stdout, parse_constant=lambda c: pytest.fail(f"not JSON: {c}"))
    assert math.isfinite(report["targets_p95_s"]["URGENT"])


def test_a_replayed_bursts_plot_is_drawn_from_streams_long_enough(tmp_path: Path) -> None:
    """Three jobs 2 s apart (0.75 a second, 2,700 an hour): plotted from streams of 4 s
    at 0.25-2 times that rate, the quarter rate drew no arrival; now long enough to
    draw some at every rate, and at that rate 2 devices keep up: figures, not "no
    arrivals"."""
    data = tmp_path / "data"
    stored_burst(data, 3, gap_ms=2000)
    page = tmp_path / "tat.html"
    args = ["--replay", "3", "--devices", "2", "--host-cores", "0", "--plot", str(page)]
    result = _run(data, *args, "--json")
    assert result.exit_code == 0, result.output
    html = page.read_text()
    rows = html.split("<tbody>")[1].split("</tbody>")[0].split("</tr>")[:-1]
    assert len(rows) == 7
    assert "no arrivals" not in rows[0] and "overloaded" not in rows[0], rows[0]


def test_a_replay_of_one_job_has_no_rate_to_plot(tmp_path: Path) -> None:
    data = tmp_path / "data"
    stored_burst(data, 1)
    page = tmp_path / "tat.svg"
    result = _run(data, "--replay", "1", "--plot", str(page))
    assert result.exit_code == 1, result.output
    assert "a replay of one job has none" in result.output
    assert not page.exists()
    assert _run(data, "--replay", "1", "--json").exit_code == 0  # the plan itself is fine


def test_a_target_reads_an_exponent_with_its_sign_as_a_rate_does() -> None:
    """``--rate urgent=1e+3/h`` was read and ``--target urgent=1e+3s`` refused as
    malformed: the targets' pattern took ``e-3`` but not ``e+3``."""
    assert parse_targets("urgent=1e+3s,inpatient=2E+1min") == {
        PriorityClass.URGENT: 1000.0,
        PriorityClass.INPATIENT: 1200.0,
    }

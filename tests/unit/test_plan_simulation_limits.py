"""The planner's simulation at the edges a user trial reached (2026-12-07).

- A finite stream is simulated until its every job has finished. The run used to stop at
  ten times the last arrival plus an hour, whatever was left: ``radserve plan --replay``
  of a burst (jobs stored within a second, e.g. a batch import) whose work takes longer
  than that planned its TATs from the jobs that had finished by then and left the rest
  out (200 jobs of a minute's work: 62 counted, p95 3,423 s; all 190 after the warm-up:
  p95 9,350 s), and the text said nothing of it.
- Idle simulated threads cost nothing. Every idle thread was a SimPy process woken by
  every change, so ``--devices 1024 --cpu-workers 1024`` (the options' documented
  maximum: a million threads) simulated 38 jobs for over two minutes in a gigabyte.
  Threads beyond the first 256 of a kind are now started only once all the started ones
  are busy, so an idle one always stands by, as before.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

from click.testing import CliRunner
from tests.factories.finished_jobs import stored_burst

from radserve.cli import cli
from radserve.domain.priority import PriorityClass
from radserve.turnaround.simulate import (
    Arrival,
    JobService,
    SimConfig,
    SimResult,
    poisson_trace,
    simulate,
)

OUT = PriorityClass.OUTPATIENT
URGENT = PriorityClass.URGENT


def _minute_job(rng: object, cls: PriorityClass) -> JobService:
    return JobService(20.0, (20.0,), 20.0)


def test_a_burst_longer_than_the_old_horizon_is_simulated_to_its_last_job() -> None:
    """200 jobs within 0.2 s, a minute of work each on one device: about 4,000 s of
    device work, past the old horizon (10 x 0.2 s + 3,600 s)."""
    trace = [Arrival(i / 1000, OUT) for i in range(200)]
    result = simulate(trace, _minute_job, SimConfig(devices=1, cpu_workers=2))
    assert result.unfinished == 0
    assert result.classes[OUT].jobs == 200
    # the last job waited behind the other 199 device minutes (20 s each on the device)
    assert max(result.classes[OUT].tat_p99_s, 0) > 199 * 20 * 0.95


def test_plan_replays_a_burst_to_its_end(tmp_path: Path) -> None:
    """``radserve plan --replay`` of 100 jobs stored within 0.1 s, with the prior set to
    a minute a study: every replayed job after the warm-up is in the TATs."""
    data = tmp_path / "data"
    stored_burst(data, 100)
    config = tmp_path / "radserve.yaml"
    config.write_text("turnaround:\n  prior_fixed_s: 60\n")
    args = ["plan", "--config", str(config), "--data-dir", str(data), "--replay", "100"]
    result = CliRunner().invoke(cli, [*args, "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    (plan,) = report["plans"]
    assert plan["unfinished"] == 0
    assert plan["classes"]["OUTPATIENT"]["jobs"] == report["arrivals_counted"]


def _timed(config: SimConfig, trace: list[Arrival], limit_s: float) -> SimResult:
    """``simulate`` on a thread, which must end within ``limit_s``."""
    out: list[SimResult] = []
    worker = threading.Thread(
        target=lambda: out.append(simulate(trace, _small_job, config, seed=3)), daemon=True
    )
    worker.start()
    worker.join(limit_s)
    assert out, f"{config.devices} devices x {config.cpu_workers} CPU threads: over {limit_s} s"
    return out[0]


def _small_job(rng: object, cls: PriorityClass) -> JobService:
    return JobService(1.0, (2.0, 2.0), 1.5)


def test_a_huge_pool_of_idle_threads_costs_nothing_and_changes_nothing() -> None:
    """38 jobs on 64 devices with 200,000 CPU threads: seconds, not hours, and the same
    TATs as with 300 threads (no more than a few dozen are ever busy at once)."""
    trace = poisson_trace({URGENT: 20 / 3600, OUT: 60 / 3600}, 1800, 0)
    huge = _timed(SimConfig(devices=64, cpu_workers=200_000), trace, 60.0)
    some = _timed(SimConfig(devices=64, cpu_workers=300), trace, 60.0)
    assert huge.unfinished == some.unfinished == 0
    assert {c: r.tat_p95_s for c, r in huge.classes.items()} == {
        c: r.tat_p95_s for c, r in some.classes.items()
    }
    assert huge.classes[OUT].jobs + huge.classes[URGENT].jobs == len(trace)


def test_plan_at_the_options_largest_host_answers(tmp_path: Path) -> None:
    """``--devices 1024 --cpu-workers 1024`` (each option's maximum) for half an hour at
    80 studies an hour: before, over two minutes and a gigabyte for 38 jobs."""
    from tests.factories.child_python import run_python

    done = run_python(
        [
            "-c",
            "from radserve.cli import main; main()",
            "plan",
            "--data-dir",
            str(tmp_path / "data"),
            "--rate",
            "urgent=20/h,outpatient=60/h",
            "--hours",
            "0.5",
            "--devices",
            "1024",
            "--cpu-workers",
            "1024",
            "--host-cores",
            "0",
            "--json",
        ],
        timeout_s=90,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    (plan,) = json.loads(done.stdout)["plans"]
    assert plan["devices"] == 1024 and plan["unfinished"] == 0

"""``radserve plan``: rates and targets parsed, deterministic answers, the device search,
and the plot file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from radserve.cli import cli
from radserve.domain.priority import PriorityClass
from radserve.turnaround.plan import PlanInputError, parse_rates, parse_targets
from radserve.turnaround.service_time import ServiceTimeModel, StudySize


def test_rates_and_targets_parse_with_units() -> None:
    rates = parse_rates("urgent=2/h, inpatient=1/min,outpatient=0.5")
    assert rates[PriorityClass.URGENT] == pytest.approx(2 / 3600)
    assert rates[PriorityClass.INPATIENT] == pytest.approx(1 / 60)
    assert rates[PriorityClass.OUTPATIENT] == pytest.approx(0.5 / 3600)  # default per hour
    targets = parse_targets("stat=300s,inpatient=10min")
    assert targets == {PriorityClass.URGENT: 300.0, PriorityClass.INPATIENT: 600.0}
    for bad in ("urgent=fast", "nobody=1/h", "urgent=2/week"):
        with pytest.raises(PlanInputError):
            parse_rates(bad)


def _model_file(path: Path) -> Path:
    """A service-time model as a bench run would write it: 20 s jobs on one device."""
    model = ServiceTimeModel()
    for slices in (100, 200, 300, 400):
        model.observe(
            pipeline="ct",
            device="cpu",
            precision="fp32",
            size=StudySize(slices),
            timings={
                "ingest": 0.01 * slices,
                "organs: infer": 0.05 * slices,
                "report": 1.0,
                "run": 0.06 * slices + 1,
            },
        )
    path.write_text(json.dumps(model.to_json()))
    return path


def _plan(tmp_path: Path, *args: str) -> dict:  # type: ignore[type-arg]
    result = CliRunner().invoke(
        cli,
        [
            "plan",
            "--data-dir",
            str(tmp_path / "data"),
            "--service-times",
            str(_model_file(tmp_path / "model.json")),
            "--json",
            *args,
        ],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    return json.loads(result.output)  # type: ignore[no-any-return]


def test_find_devices_is_deterministic_and_grows_with_the_load(tmp_path: Path) -> None:
    args = ["--seed", "5", "--find-devices", "--target", "urgent=120s"]
    args += ["--host-cores", "0"]  # the device as separate hardware: the counts below
    light = _plan(tmp_path, "--rate", "urgent=6/h,outpatient=60/h", "--hours", "3", *args)
    again = _plan(tmp_path, "--rate", "urgent=6/h,outpatient=60/h", "--hours", "3", *args)
    assert light == again
    assert light["service_times"]["measured"] is True
    # ~15 s of device time per job: 66 jobs/h need one device; 600/h need several (an
    # hour of them, ~600 jobs, plans the count three hours did: URGENT p95 ~26 s of 120)
    heavy = _plan(tmp_path, "--rate", "urgent=60/h,outpatient=540/h", "--hours", "1", *args)
    assert light["smallest_devices"] == 1
    assert heavy["smallest_devices"] >= 3
    chosen = heavy["plans"][-1]
    assert chosen["meets_targets"] is True
    assert chosen["classes"]["URGENT"]["tat_p95_s"] <= 120
    # ~2.5 device-erlangs offered: 1 and 2 devices are overloaded, not simulated — the
    # plans are the counts from the first simulated one up to the answer, each short of
    # the targets but the last
    assert heavy["overloaded_below"] == 3
    simulated = [p["devices"] for p in heavy["plans"]]
    assert simulated == list(range(3, heavy["smallest_devices"] + 1))
    assert [p["meets_targets"] for p in heavy["plans"]] == [False] * (len(simulated) - 1) + [True]


def test_plot_is_written(tmp_path: Path) -> None:
    out = _plan(
        tmp_path,
        "--rate",
        "urgent=6/h,outpatient=60/h",
        "--hours",
        "0.5",  # the file and its curves, not their values, are checked
        "--plot",
        str(tmp_path / "tat.svg"),
    )
    assert out["plot"]["format"] == "svg"
    svg = (tmp_path / "tat.svg").read_text()
    assert svg.startswith("<svg") and "URGENT p95" in svg and "<polyline" in svg


def test_host_cores_make_a_cpu_device_share_them_with_the_cpu_stages(tmp_path: Path) -> None:
    """Service times of a CPU device: by default its batches and the CPU stages share
    this host's cores (--host-cores N: N cores), which lengthens routine TAT against the
    device simulated as separate hardware (--host-cores 0)."""
    from radserve.host import usable_cores

    args = ["--rate", "outpatient=150/h", "--hours", "1", "--seed", "3"]
    apart = _plan(tmp_path, *args, "--host-cores", "0")
    default = _plan(tmp_path, *args)
    shared = _plan(tmp_path, *args, "--host-cores", "2")
    assert apart["service_times"]["host_cores_per_device"] is None
    assert apart["service_times"]["solo"] is False
    assert default["service_times"]["host_cores_per_device"] == usable_cores()
    assert shared["service_times"]["host_cores_per_device"] == 2
    assert shared["service_times"]["solo"] is True
    tat = [p["plans"][0]["classes"]["OUTPATIENT"]["tat_p50_s"] for p in (shared, apart)]
    assert tat[0] > tat[1]


def test_an_empty_store_plans_with_the_prior(tmp_path: Path) -> None:
    """No finished job to learn from (nor to divide the sharing out of): the prior."""
    result = CliRunner().invoke(
        cli,
        ["plan", "--data-dir", str(tmp_path / "data"), "--rate", "urgent=2/h", "--json"],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)  # stderr: the note that there is no data folder
    assert out["service_times"]["measured"] is False
    assert out["plans"][0]["classes"]["URGENT"]["jobs"] > 20
    assert not (tmp_path / "data").exists()  # planning only reads: no store created


def test_a_cpu_host_learns_times_alone_from_the_store(tmp_path: Path) -> None:
    """Two jobs that ran at the same time in the store: the planner learns their steps
    with the sharing divided out (never more than measured), and as measured with
    --host-cores 0."""
    from tests.factories.finished_jobs import finished_jobs

    from radserve.commands.plan import _history, _learn_history
    from radserve.store import init_store
    from radserve.turnaround.service_time import ServiceTimeModel

    store = init_store(f"sqlite:///{tmp_path / 'radserve.db'}")
    try:
        finished_jobs(store, tmp_path / "results", 2, PriorityClass.OUTPATIENT, 1800)
        history = _history(store, lambda: "cpu")
        as_measured = _learn_history(ServiceTimeModel(), history, "cpu", None, 2)
        alone = _learn_history(ServiceTimeModel(), history, "cpu", 2, 2)
    finally:
        store.close()
    size = StudySize(40)
    measured = as_measured.step_seconds(pipeline="ct", device="cpu", precision="fp32", size=size)
    solo = alone.step_seconds(pipeline="ct", device="cpu", precision="fp32", size=size)
    assert measured["organs: infer"] == pytest.approx(2.0)
    assert set(solo) == set(measured)
    assert all(0 < solo[k] <= measured[k] + 1e-9 for k in solo)


def test_more_devices_run_more_jobs_at_once(tmp_path: Path) -> None:
    """``scheduler.max_running`` is per device in a plan, as the CPU workers are. Kept at
    one device's (session 36's probe), 4 and 8 devices gave the same TATs and
    --find-devices answered that no count works."""

    def plan(devices: int) -> dict:  # type: ignore[type-arg]
        result = CliRunner().invoke(
            cli,
            [
                "plan", "--data-dir", str(tmp_path / "data"),
                "--service-times", str(_model_file(tmp_path / "model.json")),
                "--json", "--seed", "3", "--host-cores", "0", "--rate", "outpatient=400/h",
                "--hours", "0.5", "--devices", str(devices),
            ],
            env={"RADSERVE_SCHEDULER__MAX_RUNNING": "1"},
            catch_exceptions=False,
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        (chosen,) = json.loads(result.output)["plans"]
        return chosen  # type: ignore[no-any-return]

    two, four = plan(2), plan(4)
    assert (two["max_running"], four["max_running"]) == (2, 4)
    routine = [p["classes"]["OUTPATIENT"]["tat_p95_s"] for p in (two, four)]
    assert routine[1] < 0.8 * routine[0], routine

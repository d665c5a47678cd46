"""``radserve plan`` answers every input at once: a clear refusal for what it cannot
read, "overloaded" for a load the host cannot serve (not hours of simulating a queue
that only grows), and never a traceback or a silent substitute."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from radserve.cli import cli
from radserve.config import SchedulerSettings
from radserve.domain.priority import PriorityClass
from radserve.turnaround.model_file import read_model_file
from radserve.turnaround.plan import (
    MAX_ARRIVALS,
    ModelSampler,
    OfferedLoad,
    PlanInputError,
    check_arrivals,
    offered_load,
    parse_rates,
    parse_targets,
    run_plan,
)
from radserve.turnaround.service_time import Prior, ServiceTimeModel
from radserve.turnaround.simulate import poisson_trace

TRACES = Path(__file__).parents[1] / "data" / "eta-traces"
TRACE = TRACES / "eta-quiet-xeon-180bc3a-s0.json.gz"
OUT = PriorityClass.OUTPATIENT


def _run(tmp_path: Path, *args: str) -> Result:
    return CliRunner().invoke(cli, ["plan", "--data-dir", str(tmp_path / "data"), *args])


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("urgent=2/h,urgent=3/h", "given twice"),
        ("urgent=1.2.3/h", "expected CLASS=NUMBER/UNIT"),
        ("urgent=1e400/h", "must be a finite number >= 0"),  # inf
        ("urgent=0/h", "no arrivals"),
        ("", "no arrivals"),
        (" , ", "no arrivals"),
        ("urgent=2/week", "expected CLASS=NUMBER/UNIT"),
    ],
)
def test_rates_that_say_nothing_or_twice_are_refused(text: str, why: str) -> None:
    with pytest.raises(PlanInputError, match=why):
        parse_rates(text)


def test_units_are_read_in_any_case_and_targets_must_be_times_above_zero() -> None:
    assert parse_rates("URGENT=2/H,Outpatient=1/Min") == {
        PriorityClass.URGENT: pytest.approx(2 / 3600),
        OUT: pytest.approx(1 / 60),
    }
    assert parse_targets("urgent=5MIN,inpatient=1d") == {
        PriorityClass.URGENT: 300.0,
        PriorityClass.INPATIENT: 86400.0,
    }
    for bad in ("urgent=0s", "urgent=-5s", "urgent=5s,urgent=6s", "", "urgent=1e400s"):
        with pytest.raises(PlanInputError):
            parse_targets(bad)


def test_a_rate_typed_per_second_is_refused_before_anything_is_drawn() -> None:
    rates = parse_rates("outpatient=3000/s")  # meant per hour: 259 million a day
    with pytest.raises(PlanInputError, match="check the rates' units"):
        check_arrivals(rates, 24 * 3600)
    many = parse_rates("outpatient=20000/h")  # real, but more than one plan simulates
    with pytest.raises(PlanInputError, match=r"--hours 12\.5 or less"):
        check_arrivals(many, 24 * 3600)
    check_arrivals(many, 12 * 3600)  # 240,000: within MAX_ARRIVALS
    assert MAX_ARRIVALS >= 240_000


def test_a_cpu_device_carries_its_batches_and_the_cpu_stages_on_the_same_cores() -> None:
    load = OfferedLoad(device=0.9, cpu=0.9)  # busy seconds per second, each as run alone
    # separate hardware: each part on its own (90 % of one device, 45 % of two workers)
    assert load.utilisation(1, 2, None) == pytest.approx(0.9)
    assert load.fewest_devices(2, None) == 1
    # a CPU device of 2 cores: a batch holds both, a CPU stage one; 0.9 x 2 + 0.9 core
    # seconds every second on 2 cores
    assert load.utilisation(1, 2, 2) == pytest.approx(1.35)
    assert load.utilisation(2, 2, 2) == pytest.approx(0.675)
    assert load.fewest_devices(2, 2) == 2
    assert load.fewest_devices(2, 2, below=1.0) == 2
    # the CPU workers still bound it when there are few of them
    assert OfferedLoad(0.0, 3.0).utilisation(1, 2, 8) == pytest.approx(1.5)
    assert OfferedLoad(1e299, 0.0).fewest_devices(2, 2) is None  # a prior set absurdly high
    heavy = OfferedLoad(device=37.0, cpu=5.0)
    n = heavy.fewest_devices(2, 4)
    assert heavy.utilisation(n, 2, 4) < 0.95 <= heavy.utilisation(n - 1, 2, 4)


def test_a_cpu_host_the_arrivals_keep_busier_than_it_can_be_is_answered_overloaded(
    tmp_path: Path,
) -> None:
    """The prior's ~5.6 s jobs (half of them batches on both cores) at 1,200 an hour:
    the device alone is 93 % busy, so the search used to take one device; but the
    batches and the CPU stages share the two cores, 140 % busy. Simulated on one device
    the queue only grows (TAT doubles with the hours simulated); the planner now says
    so instead of simulating for minutes, and its search starts at two devices."""
    args = ["--rate", "outpatient=1200/h", "--host-cores", "2", "--json"]
    plain = _run(tmp_path, *args)
    assert plain.exit_code == 0, plain.output
    report = json.loads(plain.stdout)
    (plan,) = report["plans"]
    assert plan["overloaded"] is True and plan["utilisation"] > 1.2
    assert "classes" not in plan  # no TAT for a queue without a steady state
    assert report["devices_needed"] == 2
    searched = _run(
        tmp_path, *args, "--hours", "1", "--find-devices", "--target", "outpatient=10min"
    )
    found = json.loads(searched.stdout)
    assert found["overloaded_below"] == 2 and found["smallest_devices"] == 2
    assert found["plans"][0]["classes"]["OUTPATIENT"]["tat_p95_s"] < 600

    # the verdict, checked by the simulation itself: one device falls further behind
    sampler = ModelSampler(ServiceTimeModel(Prior()), "", "cpu", "fp32", batch_slices=8)
    p50 = []
    for hours in (0.5, 1.0):
        trace = poisson_trace({OUT: 1200 / 3600}, hours * 3600, 0)
        plan_1 = run_plan(
            trace,
            sampler,
            devices=1,
            cpu_workers=2,
            scheduler=SchedulerSettings(),
            seed=0,
            warmup_s=0.0,
            cores_per_device=2,
        )
        p50.append(plan_1.result.classes[OUT].tat_p50_s)
    assert p50[1] > 1.6 * p50[0] > 100


def test_the_plot_asks_for_a_known_format_and_folder_before_simulating(tmp_path: Path) -> None:
    for path, why in (
        (tmp_path / "tat.txt", "must end in .png, .svg, .html"),
        (tmp_path / "no" / "such" / "tat.svg", "no folder"),
    ):
        result = _run(tmp_path, "--rate", "urgent=2/h", "--plot", str(path))
        assert result.exit_code == 2 and why in result.output, result.output
        assert not path.exists()
    assert not (tmp_path / "data").exists()  # refused before the store was looked for


def test_an_html_plot_holds_the_curve_its_figures_and_the_overloaded_rates(
    tmp_path: Path,
) -> None:
    """At 600 an hour the prior's jobs keep two cores ~70 % busy: 1.5x and 2x of that are
    overloaded, so those rates are marked, not simulated."""
    page = tmp_path / "tat.html"
    args = ["--rate", "outpatient=600/h", "--hours", "1", "--host-cores", "2"]
    result = _run(tmp_path, *args, "--plot", str(page), "--json")
    assert result.exit_code == 0, result.output
    plot = json.loads(result.stdout)["plot"]
    assert plot["format"] == "html" and plot["path"] == str(page)
    assert plot["overloaded_from_per_h"] == pytest.approx(900.0)  # 1.5 x 600
    html = page.read_text()
    assert html.startswith("<!doctype html>") and "<svg" in html and "<polyline" in html
    rows = html.split("<tbody>")[1].split("</tbody>")[0].split("</tr>")
    assert [r.count("overloaded") for r in rows[:-1]] == [0, 0, 0, 0, 0, 2, 2]
    assert "overloaded from 900 arrivals/h" in html


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"root:x:0:0:root:/root:/bin/bash\n", "not JSON"),
        (b"\xff\xfe\x00garbage", "not JSON"),
        (b"[1, 2]", "not a service-time model"),
        (b'{"samples": []}', "holds no measured job"),
        (b'{"samples": [{"pipeline": "p"}]}', "'step' must be text"),
        (
            b'{"samples": [{"pipeline": "p", "step": "run", "device": "cpu", '
            b'"precision": "fp32", "slices": [10, 20], "seconds": [NaN, 1]}]}',
            "finite seconds",
        ),
        (
            b'{"samples": [{"pipeline": "p", "step": "run", "device": "cpu", '
            b'"precision": "fp32", "slices": [10, 20], "seconds": [1, -5]}]}',
            "finite seconds",
        ),
        (
            b'{"samples": [{"pipeline": "p", "step": "run", "device": "cpu", '
            b'"precision": "fp32", "slices": [10], "seconds": [1, 2]}]}',
            "1 slice counts for 2 times",
        ),
        (
            b'{"prior": {"fixed_s": "x"}, "samples": [{"pipeline": "p", "step": "run", '
            b'"device": "cpu", "precision": "fp32", "slices": [10], "seconds": [1]}]}',
            "prior fixed_s",
        ),
        (gzip.compress(b"{not json"), "not JSON"),
        (b"\x1f\x8b\x08broken gzip", "cannot be read"),
    ],
)
def test_a_service_time_file_that_is_no_model_is_refused_with_why(
    tmp_path: Path, content: bytes, why: str
) -> None:
    path = tmp_path / "model.json"
    path.write_bytes(content)
    result = _run(tmp_path, "--rate", "urgent=2/h", "--service-times", str(path))
    assert result.exit_code == 2, result.output
    assert "--service-times" in result.output and why in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_a_bench_summary_plans_with_its_service_times(tmp_path: Path) -> None:
    """The help says `radserve bench --scenario eta` writes the file: its summary (here a
    kept one, gzipped and not) plans with the measured times, as its model alone does."""
    summary = json.loads(gzip.decompress(TRACE.read_bytes()))
    plain = tmp_path / "bench.json"
    plain.write_text(json.dumps(summary))
    alone = tmp_path / "model.json"
    alone.write_text(json.dumps(summary["service_times"]))
    shutil.copy(TRACE, tmp_path / "bench.json.gz")
    args = ["--rate", "urgent=20/h,outpatient=200/h", "--hours", "0.5", "--json"]
    reports = []
    for path in (plain, alone, tmp_path / "bench.json.gz"):
        result = _run(tmp_path, *args, "--service-times", str(path))
        assert result.exit_code == 0, result.output
        reports.append(json.loads(result.stdout))
    assert reports[0] == reports[1] == reports[2]
    assert reports[0]["service_times"]["measured"] is True
    assert reports[0]["service_times"]["pipeline"] == "ct-chest-abdomen"
    assert read_model_file(TRACE).groups() == [("ct-chest-abdomen", "openvino", "fp32")]


def test_names_that_match_nothing_measured_are_refused_not_planned_with_the_prior(
    tmp_path: Path,
) -> None:
    args = ["--rate", "urgent=2/h", "--service-times", str(TRACE)]
    for option, value in (("--pipeline", "ct-head"), ("--device", "cuda:0")):
        result = _run(tmp_path, *args, option, value)
        assert result.exit_code == 2, result.output
        assert "measured: pipeline ct-chest-abdomen on openvino at fp32" in result.output


def test_every_refusal_is_a_usage_error_and_a_stream_without_arrivals_says_so(
    tmp_path: Path,
) -> None:
    cases = {
        ("--rate", "outpatient=300/s"): "--rate",  # its units: not --hours (since 2026-12-07)
        ("--rate", "urgent=2/h,urgent=1/h"): "--rate",
        ("--rate", "urgent=2/h", "--find-devices", "--target", "urgent=soon"): "--target",
    }
    for args, option in cases.items():
        result = _run(tmp_path, *args)
        assert result.exit_code == 2 and f"Invalid value for '{option}'" in result.output
    none = _run(tmp_path, "--rate", "urgent=1/d", "--hours", "0.5")
    assert none.exit_code == 1 and "no arrival was drawn in 0.5 h" in none.output


def test_a_replay_is_finite_so_a_burst_in_it_is_simulated_not_called_overloaded(
    tmp_path: Path,
) -> None:
    """Four URGENT jobs stored within milliseconds: over their span they bring far more
    work than the host serves, but a replay ends, and its queue drains after it. A
    replay of one job has no rate at all."""
    from tests.factories.finished_jobs import finished_jobs

    from radserve.store import init_store
    from radserve.turnaround.simulate import Arrival

    data = tmp_path / "data"
    data.mkdir()
    store = init_store(f"sqlite:///{data / 'radserve.db'}")
    try:
        finished_jobs(store, tmp_path / "results", 4, PriorityClass.URGENT, 60)
    finally:
        store.close()
    result = _run(tmp_path, "--replay", "10", "--json")
    assert result.exit_code == 0, result.output
    (plan,) = json.loads(result.stdout)["plans"]
    assert "overloaded" not in plan and plan["unfinished"] == 0
    assert plan["classes"]["URGENT"]["jobs"] >= 3  # the warm-up may leave the first out
    sampler = ModelSampler(ServiceTimeModel(Prior()), "", "cpu", "fp32")
    assert offered_load([Arrival(5.0, PriorityClass.URGENT)], sampler, 0) == OfferedLoad(0, 0)


def test_a_target_under_the_service_time_ends_the_search_when_devices_stop_helping(
    tmp_path: Path,
) -> None:
    """An URGENT p95 target of 1 s against the prior's ~5.6 s studies: no device count
    meets it, and the search used to simulate all 64 counts (over ten minutes for a day
    at 220 an hour). It stops once two more devices in a row shortened URGENT's p95 by
    less than 2 %, and says so."""
    args = ["--rate", "urgent=20/h,outpatient=200/h", "--hours", "2", "--host-cores", "2"]
    search = ["--find-devices", "--target", "urgent=1s"]
    result = _run(tmp_path, *args, *search, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["smallest_devices"] is None
    p95 = [p["classes"]["URGENT"]["tat_p95_s"] for p in report["plans"]]
    assert len(p95) < 8 and min(p95) > 5  # what is left is the studies' own time
    assert report["plateau_from"] == report["plans"][-3]["devices"]
    assert all(p95[i] - p95[i + 1] < 0.02 * p95[i] for i in (-3, -2))
    text = _run(tmp_path, *args, *search)
    assert "more devices no longer shorten the missed classes' p95 TAT" in text.output


def test_a_short_replay_searches_from_one_device_and_says_what_it_did_not_count(
    tmp_path: Path,
) -> None:
    """Session 36's probe: a 2-job history with --find-devices called 1-4 devices
    overloaded (its load over a span of about 0 s) and answered 5; the warm-up dropped
    replayed jobs without a word; a target of a class with no arrivals 'met'."""
    from tests.factories.finished_jobs import finished_jobs

    from radserve.store import init_store

    data = tmp_path / "data"
    data.mkdir()
    store = init_store(f"sqlite:///{data / 'radserve.db'}")
    try:
        finished_jobs(store, tmp_path / "results", 2, PriorityClass.OUTPATIENT, 60)
    finally:
        store.close()
    args = ["--replay", "100", "--find-devices", "--target", "urgent=60s,outpatient=600s"]
    result = _run(tmp_path, *args, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["overloaded_below"] == 1 and report["smallest_devices"] == 1
    assert report["targets_unassessed"] == ["URGENT"]
    assert report["arrivals"] - report["arrivals_counted"] >= 0
    assert report["warmup_s"] >= 0
    text = _run(tmp_path, *args).output
    assert "not assessed (no arrivals counted): targets for URGENT" in text


def test_a_replay_says_how_many_cache_answers_it_left_out(tmp_path: Path) -> None:
    """Jobs answered from the result cache took no server time, so a replay leaves them
    out; it used to do so without a word (10 jobs asked for, fewer replayed), and a
    history of cache answers only was "no jobs to replay"."""
    import datetime as dt

    from tests.factories.finished_jobs import FIELDS, finished_jobs

    from radserve.store import init_store

    data = tmp_path / "data"
    data.mkdir()
    store = init_store(f"sqlite:///{data / 'radserve.db'}")
    try:
        (source,) = finished_jobs(store, tmp_path / "results", 1, OUT, 600)
        only_cached = _run(tmp_path, "--replay", "1")
        for n in range(3):
            store.create_job(
                priority_class=OUT,
                deadline=dt.timedelta(seconds=600),
                study_path="studies/cached",
                fingerprint=f"{n}" * 64,
                cached_from=source,
                **FIELDS,  # type: ignore[arg-type]
            )
    finally:
        store.close()
    assert only_cached.exit_code == 0, only_cached.output  # the one job the server ran
    last_three = _run(tmp_path, "--replay", "3")
    assert last_three.exit_code == 1
    assert "its last 3 job(s) were all answered from the result cache" in last_three.output
    report = json.loads(_run(tmp_path, "--replay", "10", "--json").stdout)
    assert report["arrivals"] == 1 and report["cache_answers_left_out"] == 3
    text = _run(tmp_path, "--replay", "10").output
    assert "3 replayed job(s) were answered from the result cache: left out" in text
    rates = json.loads(_run(tmp_path, "--rate", "urgent=10/h", "--json").stdout)
    assert rates["cache_answers_left_out"] is None


# --- 2026-12-07: a user trial's probes (b_*.json): the model file's whole class, the options


def _model(**changes: object) -> dict[str, object]:
    """The kept trace's service-time model, with ``changes`` made to it."""
    model = json.loads(gzip.decompress(TRACE.read_bytes()))["service_times"]
    model.update(changes)
    return model  # type: ignore[no-any-return]


def _refused_file(tmp_path: Path, content: object, *why: str) -> None:
    path = tmp_path / "probe.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    result = _run(
        tmp_path,
        "--rate",
        "urgent=6/h,outpatient=30/h",
        "--hours",
        "1",
        "--service-times",
        str(path),
    )
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Invalid value for '--service-times'" in result.output and str(path) in result.output
    for word in why:
        assert word in result.output, result.output


def test_a_model_file_nested_too_deeply_is_refused_not_a_recursion_error(tmp_path: Path) -> None:
    _refused_file(tmp_path, "[" * 100_000 + "]" * 100_000, "nested too deeply")
    _refused_file(tmp_path, '{"samples": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested")


def test_steps_naming_a_step_without_samples_are_refused(tmp_path: Path) -> None:
    """b_one.json: one sample row, ``steps`` naming eleven: the estimate ended in an
    AttributeError ('NoneType' has no attribute 'seconds')."""
    model = _model()
    model["samples"] = [r for r in model["samples"] if r["step"] == "ingest"]  # type: ignore[attr-defined]
    _refused_file(tmp_path, model, "steps[0]", "'organs: prepare'", "has no samples")
    twice = _model()
    twice["steps"][0]["steps"].append("ingest")  # type: ignore[index]
    _refused_file(tmp_path, twice, "steps[0]", "twice")
    total = _model()
    total["steps"][0]["steps"].append("run")  # type: ignore[index]
    _refused_file(tmp_path, total, "'run'", "not a step")
    _refused_file(tmp_path, _model(steps=[{"steps": [1, 2]}]), "steps[0]", "'pipeline'")


def test_slices_and_times_out_of_range_are_refused_not_a_memory_error(tmp_path: Path) -> None:
    """b_hugeslices.json (1e15 slices) ended in a MemoryError splitting a study into
    batches; 1e12 s a step planned 'overloaded' as if measured."""
    huge = _model()
    huge["samples"][0]["slices"][0] = 1e15  # type: ignore[index]
    huge["sizes"][0] = 1e15  # type: ignore[index]
    _refused_file(tmp_path, huge, "samples[0]", "'slices'", "at most 50,000", "ingest.max_frames")
    sizes = _model()
    sizes["sizes"][0] = 10**400  # type: ignore[index]
    _refused_file(tmp_path, sizes, "sizes holds", "not a slice count")
    slow = _model()
    slow["samples"][0]["seconds"][0] = 1e12  # type: ignore[index]
    _refused_file(tmp_path, slow, "samples[0]", "'seconds'", "1e+12", "largest prior")
    for trace in sorted(TRACES.glob("*.json.gz")):  # no model the project wrote is refused
        assert read_model_file(trace).groups(), trace


def test_a_model_of_no_time_or_no_sizes_is_refused_not_planned(tmp_path: Path) -> None:
    """Every time 0 s planned every TAT as 0.0 s; ``sizes`` empty beside measured jobs
    drew every study at 300 slices (the measured ones had 40-47): a different plan."""
    zero = _model()
    for row in zero["samples"]:  # type: ignore[attr-defined]
        row["seconds"] = [0.0] * len(row["seconds"])
    _refused_file(tmp_path, zero, "every time of pipeline 'ct-chest-abdomen'", "is 0 s")
    _refused_file(tmp_path, _model(sizes=[]), "'sizes' is empty")
    empty = _model()
    empty["samples"][0]["slices"] = empty["samples"][0]["seconds"] = []  # type: ignore[index]
    _refused_file(tmp_path, empty, "samples[0]", "no samples")
    wait = _model()
    wait["samples"][0]["step"] = "queue"  # type: ignore[index]
    _refused_file(tmp_path, wait, "samples[0]", "'queue' is not a step")
    lane = _model()
    lane["lane_samples"] = [dict(lane["samples"][0])]  # type: ignore[index]
    _refused_file(tmp_path, lane, "lane_samples[0]", "'run <lane>'")


@pytest.mark.parametrize(
    ("prior", "field", "most"),
    [
        ({"fixed_s": 1e308, "per_slice_s": 1e308, "device_share": 1e308}, "fixed_s", "3600"),
        ({"device_share": 5}, "device_share", "1"),
        ({"per_slice_s": 61}, "per_slice_s", "60"),
    ],
)
def test_a_prior_out_of_the_settings_bounds_is_refused(
    tmp_path: Path, prior: dict[str, float], field: str, most: str
) -> None:
    """b_prior.json planned every TAT 0.0 s, b_share.json changed the answer: the file's
    prior is held to turnaround.prior_*'s bounds (config.PRIOR_MAX, one definition)."""
    _refused_file(
        tmp_path, _model(prior=prior), f"prior {field}", f"from 0 to {most}", f"prior_{field}"
    )
    from radserve.config import PRIOR_MAX, TurnaroundSettings

    for name, bound in PRIOR_MAX.items():  # the settings refuse above the same bounds
        TurnaroundSettings(**{f"prior_{name}": bound})
        with pytest.raises(ValueError, match=f"prior_{name}"):
            TurnaroundSettings(**{f"prior_{name}": bound * 1.01})


def test_the_html_table_says_no_arrivals_where_a_class_had_none_not_overloaded(
    tmp_path: Path,
) -> None:
    """At a quarter of 6 URGENT an hour, one hour drew no URGENT arrival: the table said
    "overloaded" for it, the word of the rates not simulated."""
    page = tmp_path / "tat.html"
    args = ["--rate", "urgent=6/h,outpatient=30/h", "--hours", "1", "--plot", str(page)]
    result = _run(tmp_path, *args)
    assert result.exit_code == 0, result.output
    html = page.read_text()
    rows = html.split("<tbody>")[1].split("</tbody>")[0].split("</tr>")
    assert rows[0].count("no arrivals") == 2 and "overloaded" not in html
    assert "No arrivals: the class had no job at that rate" in html


def test_too_many_arrivals_name_the_rate_and_print_the_count_readably(tmp_path: Path) -> None:
    result = _run(tmp_path, "--hours", "1", "--rate", "urgent=1e308/h")
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--rate': 1e+308 arrivals expected over 1 h" in result.output
    assert "--hours" not in result.output and len(result.output) < 600
    both = _run(tmp_path, "--rate", "outpatient=20000/h")
    assert "Invalid value for '--rate' / '--hours': 480,000 arrivals" in both.output
    with pytest.raises(PlanInputError, match=r"more than 1\.8e"):
        check_arrivals(parse_rates("urgent=1.7e308/s"), 24 * 3600)  # overflows to inf


@pytest.mark.parametrize("rate", ["-1", "nan", "inf", "-nan", "1e400"])
def test_a_negative_or_not_finite_rate_says_so(tmp_path: Path, rate: str) -> None:
    result = _run(tmp_path, "--rate", f"urgent={rate}/h")
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--rate'" in result.output
    assert f"{rate} must be a finite number >= 0" in result.output


def test_conflicting_options_are_refused_naming_the_right_one(tmp_path: Path) -> None:
    """--devices beside --find-devices and --hours beside --replay were ignored without a
    word; a --precision nothing measured was blamed on --pipeline; --host-cores on a
    device that is not the host's CPU was taken and ignored."""
    search = ["--rate", "urgent=6/h", "--find-devices", "--target", "urgent=5min"]
    devices = _run(tmp_path, *search, "--devices", "3")
    assert devices.exit_code == 2 and "--devices conflicts with --find-devices" in devices.output
    replay = _run(tmp_path, "--replay", "5", "--hours", "1000")
    assert replay.exit_code == 2 and "--hours conflicts with --replay" in replay.output
    assert not (tmp_path / "data").exists()  # refused before a store was looked for
    file = ["--rate", "urgent=6/h", "--service-times", str(TRACE)]
    precision = _run(tmp_path, *file, "--precision", "int8")
    assert precision.exit_code == 2, precision.output
    assert "Invalid value for '--precision': no service times measured for --precision int8" in (
        precision.output
    )
    cores = _run(tmp_path, "--rate", "urgent=6/h", "--device", "cuda:0", "--host-cores", "4")
    assert cores.exit_code == 2 and "Invalid value for '--host-cores'" in cores.output
    assert (
        _run(tmp_path, "--rate", "urgent=6/h", "--device", "cuda:0", "--host-cores", "0").exit_code
        == 0
    )


def test_a_plot_format_is_named_in_lower_case_whatever_the_suffix(tmp_path: Path) -> None:
    plot = tmp_path / "tat.SVG"
    result = _run(tmp_path, "--rate", "urgent=6/h", "--hours", "1", "--plot", str(plot), "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["plot"]["format"] == "svg"
    text = _run(tmp_path, "--rate", "urgent=6/h", "--hours", "1", "--plot", str(plot))
    assert f"plot (svg): {plot}" in text.output

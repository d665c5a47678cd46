"""``radserve plan``: how the scheduling policy would cope with a load, and how many
devices meet the turnaround targets (a SimPy simulation; radserve.turnaround)."""

from __future__ import annotations

import functools
import json
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from radserve.commands.config import CONFIG_OPTION, DATA_DIR_OPTION
from radserve.commands.params import SEED, FiniteFloatRange


@click.command("plan")
@CONFIG_OPTION
@DATA_DIR_OPTION
@click.option(
    "--rate",
    "rates",
    default=None,
    help="Poisson arrivals per class, e.g. urgent=2/h,inpatient=10/h,outpatient=20/h "
    "(units /s /min /h /d; default /h).",
)
@click.option(
    "--replay",
    type=click.IntRange(1, 100_000),
    default=None,
    help="Instead of --rate: replay the arrivals of the store's last N jobs.",
)
@click.option(
    "--service-times",
    "service_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="A service-time model JSON, or a `radserve bench --scenario eta --json` "
    "summary (its service times; gzipped too); default: learned from the store's "
    "finished jobs.",
)
@click.option("--pipeline", default=None, help="Pipeline whose service times to use.")
@click.option("--precision", default=None, help="Precision whose service times to use.")
@click.option(
    "--device",
    "device_name",
    default=None,
    help="Device whose service times to use, named as the server and GET "
    "/v1/ops/service-times name it (cpu, openvino, cuda:N); it must be one the data "
    "was measured on [default: the one device the data has].",
)
@click.option("--devices", type=click.IntRange(1, 1024), default=1, show_default=True)
@click.option(
    "--cpu-workers",
    type=click.IntRange(1, 1024),
    default=2,
    show_default=True,
    help="CPU-pool threads per device.",
)
@click.option(
    "--host-cores",
    type=click.IntRange(0, 4096),
    default=None,
    help="Cores per device when the device is the host's CPU (cpu, openvino): its "
    "batches (on every core) and the CPU stages share them as the OS does (processor "
    "sharing), with service times alone: those learned from the store have the sharing "
    "they ran under divided out; a --service-times file is taken as times alone. "
    "0: the device as separate hardware with the times as measured (before "
    "2026-12-02) [default: this host's usable cores on a CPU device] "
    "(docs/turnaround.md, the planner's model of the host).",
)
@click.option("--hours", type=FiniteFloatRange(0.01, 24 * 365), default=24.0, show_default=True)
@click.option("--seed", type=SEED, default=0, show_default=True)
@click.option(
    "--target",
    "targets",
    default=None,
    help="p95 TAT targets, e.g. urgent=300s,inpatient=10min.",
)
@click.option(
    "--find-devices", is_flag=True, help="Smallest device count meeting --target (1..64)."
)
@click.option(
    "--plot",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write TAT vs arrival rate: .png (with matplotlib installed, else an .svg beside "
    "it), .svg, or .html (the plot and its figures).",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout.")
def command(
    config_file: Path | None,
    data_dir: Path | None,
    rates: str | None,
    replay: int | None,
    service_file: Path | None,
    pipeline: str | None,
    precision: str | None,
    device_name: str | None,
    devices: int,
    cpu_workers: int,
    host_cores: int | None,
    hours: float,
    seed: int,
    targets: str | None,
    find_devices: bool,
    plot: Path | None,
    as_json: bool,
) -> None:
    """Simulate the scheduler under a load: per-class TAT p50/p95/p99 and deadline-miss
    rate; with --find-devices the smallest number of devices meeting --target."""
    from radserve.config import load_settings
    from radserve.turnaround import plan as planner
    from radserve.turnaround.model_file import ModelFileError, read_model_file
    from radserve.turnaround.service_time import Prior, ServiceTimeModel
    from radserve.turnaround.simulate import Arrival, poisson_trace

    if (rates is None) == (replay is None):
        raise click.UsageError("give exactly one of --rate and --replay")
    if find_devices and not targets:
        raise click.UsageError("--find-devices needs --target")
    _refuse_conflicts(replay=replay, find_devices=find_devices)
    duration = hours * 3600
    # every input checked before a store is opened or anything simulated
    goal = _checked(planner.parse_targets, targets, "--target") if targets is not None else {}
    per_s = _checked(planner.parse_rates, rates, "--rate") if rates is not None else {}
    _checked(lambda d: planner.check_arrivals(per_s, d), duration, "--hours")
    if plot is not None:
        _checked(planner.plot_format, plot, "--plot")
        _check_plot_path(plot)
    settings = load_settings(config_file, data_dir=data_dir)
    scheduler = settings.scheduler
    t = settings.turnaround
    store = None
    if service_file is not None:
        try:
            model = read_model_file(service_file, max_slices=settings.ingest.max_frames)
        except ModelFileError as exc:
            raise click.BadParameter(str(exc), param_hint="'--service-times'") from None
    else:
        model = ServiceTimeModel(Prior(t.prior_fixed_s, t.prior_per_slice_s, t.prior_device_share))
    if service_file is None or replay is not None:
        from radserve.service.turnaround import history_arrivals
        from radserve.store.audited import missing_data, open_audited

        missing = missing_data(settings) if replay is None else None
        if missing is None:  # --replay without a store: NoDataError, nothing written
            store, _trail = open_audited(settings, create=False)
        else:
            click.echo(f"note: {missing}: no measured service times; the prior is used", err=True)

    @functools.cache
    def server_device() -> str:
        return _server_device(settings)

    try:
        history = None
        cache_answers = None  # --replay: the jobs read that the result cache answered
        if service_file is None and store is not None:
            history = _history(store, server_device)
            measured = list(dict.fromkeys((r.pipeline_name, d, r.precision) for r, _, d in history))
        else:
            measured = model.groups()
        device = _device(device_name, measured, server_device)
        if history is not None:
            cores = _cores_per_device(device, host_cores)
            model = _learn_history(model, history, device, cores, cpu_workers)
        if replay is not None:
            assert store is not None
            replayed = history_arrivals(store, replay)
            cache_answers = replayed.cache_answers
            trace = [Arrival(at, cls) for at, cls in replayed.arrivals]
            if not trace:
                raise click.ClickException(
                    "the store has no jobs to replay"
                    + (
                        f": its last {cache_answers} job(s) were all answered from the "
                        "result cache (they took no server time)"
                        if cache_answers
                        else ""
                    )
                )
            duration = trace[-1].at
            if plot is not None and len(trace) < 2:  # before anything is simulated
                raise click.ClickException(
                    "--plot draws TAT against the arrival rate, and a replay of one job "
                    "has none: replay more jobs, or plot with --rate"
                )
        else:
            trace = poisson_trace(per_s, duration, seed)
            if not trace:
                raise click.ClickException(
                    f"no arrival was drawn in {hours:g} h at these rates (seed {seed}): "
                    "plan over more --hours"
                )
    finally:
        if store is not None:
            store.close()
    groups = model.groups()
    group = _group(groups, pipeline, device, precision)
    cores = _cores_per_device(group[1], host_cores)
    scheduler = _as_served(scheduler, group[1])
    sampler = planner.ModelSampler(
        model, group[0], group[1], group[2], batch_slices=scheduler.max_batch_size
    )
    warmup = min(3600.0, duration * 0.05)
    # targets of classes with no job measured after the warm-up: not met, not missed
    counted = Counter(a.cls for a in trace if a.at >= warmup)
    report: dict[str, Any] = {
        "service_times": {
            "pipeline": group[0],
            "device": group[1],
            "precision": group[2],
            "measured": bool(groups),
            "jobs_seen": len(model.sizes()),
            "host_cores_per_device": cores,
            # times alone (the sharing divided out) or as measured
            "solo": cores is not None,
        },
        "arrivals": len(trace),
        # --replay: the jobs read that were answered from the result cache (not replayed:
        # they took no server time); None without --replay
        "cache_answers_left_out": cache_answers,
        # the first 5 % (at most an hour) start an empty server: not counted in the TATs
        "warmup_s": round(warmup, 3),
        "arrivals_counted": sum(counted.values()),
        "hours": round(duration / 3600, 3),
        "seed": seed,
        "targets_p95_s": {c.value: v for c, v in goal.items()},
        "targets_unassessed": [c.value for c in goal if not counted[c]],
    }
    load = planner.offered_load(trace, sampler, seed)
    report["offered_load"] = load.as_dict()
    if find_devices:
        best, tried, first = planner.find_devices(
            trace,
            sampler,
            targets=goal,
            cpu_workers_per_device=cpu_workers,
            scheduler=scheduler,
            seed=seed,
            warmup_s=warmup,
            cores_per_device=cores,
            finite=replay is not None,
        )
        report["smallest_devices"] = best.devices if best is not None else None
        report["max_devices"] = planner.MAX_DEVICES
        # the search stopped because more devices stopped helping (planner.plateaued)
        report["plateau_from"] = (
            tried[-planner.PLATEAU_STEPS - 1].devices
            if best is None and planner.plateaued(tried, goal)
            else None
        )
        # fewer devices than this could not keep up with the offered load at all
        report["overloaded_below"] = first
        report["plans"] = [p.as_dict() for p in tried]
        devices = best.devices if best is not None else devices
    elif (busy := load.utilisation(devices, cpu_workers, cores)) >= 1.0 and replay is None:
        # the queue grows for as long as one simulates: TATs would be the hours simulated
        # (a replay is finite: its queue drains after its last arrival, so it is simulated)
        report["plans"] = [
            {
                "devices": devices,
                "overloaded": True,
                "utilisation": round(busy, 4),
                "meets_targets": False if goal else None,
            }
        ]
        report["devices_needed"] = load.fewest_devices(cpu_workers, cores, below=1.0)
    else:
        chosen = planner.run_plan(
            trace,
            sampler,
            devices=devices,
            cpu_workers=cpu_workers * devices,
            scheduler=scheduler,
            seed=seed,
            warmup_s=warmup,
            targets=goal or None,
            cores_per_device=cores,
        )
        report["plans"] = [{**chosen.as_dict(), "utilisation": round(busy, 4)}]
    if plot is not None:
        curve_rates = per_s or _rates_of(trace, duration)
        curve = planner.tat_curve(
            curve_rates,
            sampler,
            devices=devices,
            cpu_workers=cpu_workers * devices,
            scheduler=scheduler,
            duration_s=_curve_seconds(duration, curve_rates, replayed=not per_s),
            seed=seed,
            cores_per_device=cores,
        )
        written = planner.write_plot(curve, curve_rates, plot)
        report["plot"] = {
            "path": str(written),
            "format": written.suffix[1:].lower(),  # tat.PNG is a png, as tat.png is
            "devices": devices,
            "overloaded_from_per_h": (
                round(min(curve.overloaded) * sum(curve_rates.values()) * 3600, 3)
                if curve.overloaded
                else None
            ),
        }
        if written != plot:
            click.echo(f"note: matplotlib is not installed: wrote {written}, not {plot}", err=True)
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    _print(report)


def _check_plot_path(plot: Path) -> None:
    """The plot's file can be written (before the simulation, not after it); a .png
    without matplotlib is written as an .svg beside it: that one too."""
    import importlib.util

    from radserve.commands.config import check_output_file

    check_output_file(plot, "--plot")
    if plot.suffix.lower() == ".png" and importlib.util.find_spec("matplotlib") is None:
        check_output_file(plot.with_suffix(".svg"), "--plot")


def _checked(parse: Any, value: Any, option: str) -> Any:
    """``parse(value)``, its PlanInputError as the usage error of the options it names
    (too many arrivals: --rate, or --rate and --hours), else of ``option``."""
    from radserve.turnaround.plan import PlanInputError

    try:
        return parse(value)
    except PlanInputError as exc:
        hint = " / ".join(f"'{o}'" for o in exc.options or (option,))
        raise click.BadParameter(str(exc), param_hint=hint) from None


def _given(name: str) -> bool:
    """The option ``name`` (its parameter's name) was given, not left at its default."""
    from click.core import ParameterSource

    source = click.get_current_context().get_parameter_source(name)
    return source not in (None, ParameterSource.DEFAULT, ParameterSource.DEFAULT_MAP)


def _refuse_conflicts(*, replay: int | None, find_devices: bool) -> None:
    """Options that another one given makes meaningless are refused, not ignored: before,
    ``--find-devices --devices 3`` searched from one device and ``--replay 5 --hours
    1000`` replayed the jobs' own span, both without a word."""
    if find_devices and _given("devices"):
        raise click.UsageError(
            "--devices conflicts with --find-devices, which searches the device counts "
            "itself (1..64): give one of them"
        )
    if replay is not None and _given("hours"):
        raise click.UsageError(
            "--hours conflicts with --replay: a replay lasts as long as the replayed "
            "jobs' arrivals did; give --hours with --rate"
        )


def _group(
    groups: list[tuple[str, str, str]],
    pipeline: str | None,
    device: str | None,
    precision: str | None,
) -> tuple[str, str, str]:
    """The measured (pipeline, device, precision) the options pick, the first one when
    they name none; with nothing measured, the prior under the names given. Names that
    match nothing measured are refused: the prior in their place would answer for a
    pipeline the store knows nothing of as if it did."""
    named = {"--pipeline": pipeline, "--device": device, "--precision": precision}
    for g in groups:
        if all(v is None or g[i] == v for i, v in enumerate(named.values())):
            return g
    if groups:
        known = "; ".join(f"pipeline {g[0]} on {g[1]} at {g[2]}" for g in groups)
        # --device is always set here (the one measured by default): named only if given
        given = {
            o: v
            for o, v in named.items()
            if v is not None and (o != "--device" or _given("device_name"))
        }
        # the options naming what nothing measured has; else the combination given
        unmeasured = [
            o
            for i, (o, v) in enumerate(named.items())
            if o in given and v not in {g[i] for g in groups}
        ] or list(given)
        said = ", ".join(f"{o} {given[o]}" for o in unmeasured)
        raise click.BadParameter(
            f"no service times measured for {said}; measured: {known}",
            param_hint=" / ".join(f"'{o}'" for o in unmeasured),
        )
    return (pipeline or "", device or "cpu", precision or "fp32")


# the device names the server gives (RuntimeChoice.device): what a report's runtime, the
# store's history and GET /v1/ops/service-times call a device
_SERVER_DEVICE = re.compile(r"cpu|openvino|cuda:\d+")


def _server_device(settings: Any) -> str:
    """The device a server with these settings runs on here (RuntimeChoice.device, as
    GET /v1/ops/service-times names it): the name for jobs whose report states none,
    and the prior's device when nothing is measured."""
    from radserve.errors import ModelError
    from radserve.inference.providers import choose_runtime

    try:
        runtime = choose_runtime(
            prefer=settings.runtime.providers or None, threads=settings.runtime.threads
        )
    except ModelError:  # providers configured that cannot run here: the host's best
        runtime = choose_runtime()
    return runtime.device


def _device(
    device: str | None, measured: list[tuple[str, str, str]], server_device: Callable[[], str]
) -> str:
    """The device whose service times to plan with: ``device`` if the data was measured
    on it, else refused with the measured ones; by default the one device measured.
    With nothing measured the prior stands for any device the server can name (default:
    this host's). Before, ``--device`` renamed the store's samples, so any word (gpu)
    planned with the CPU's times as "measured"."""
    devices = list(dict.fromkeys(g[1] for g in measured))
    listed = "; ".join(f"pipeline {g[0]} on {g[1]} at {g[2]}" for g in measured)
    if not devices:
        if device is None:
            return server_device()
        if _SERVER_DEVICE.fullmatch(device) is None:
            raise click.BadParameter(
                f"{device!r} is no device name (cpu, openvino, cuda:N, as GET "
                "/v1/ops/service-times names them); nothing is measured yet",
                param_hint="'--device'",
            )
        return device
    if device is None:
        if len(devices) == 1:
            return devices[0]
        raise click.BadParameter(
            f"service times were measured on {len(devices)} devices, name one; measured: {listed}",
            param_hint="'--device'",
        )
    if device not in devices:
        raise click.BadParameter(
            f"no service times measured on {device!r}; measured: {listed}",
            param_hint="'--device'",
        )
    return device


def _cores_per_device(device: str, host_cores: int | None) -> int | None:
    """Cores each simulated device shares with its CPU stages on a CPU device
    (``--host-cores``, default this host's usable cores), or None: separate hardware."""
    from radserve.host import usable_cores
    from radserve.turnaround.eta import on_host_cores

    if not on_host_cores(device):
        if host_cores:  # before, taken and ignored without a word
            raise click.BadParameter(
                f"{host_cores} cores per device: the device {device} is not the host's CPU "
                "(--host-cores applies to cpu and openvino; 0: separate hardware)",
                param_hint="'--host-cores'",
            )
        return None
    if host_cores == 0:
        return None
    return host_cores if host_cores is not None else usable_cores()


def _as_served(scheduler: Any, device: str) -> Any:
    """The scheduler settings as the server runs them on ``device``: on a CPU device its
    batches are capped (RuntimeChoice.max_batch_size), so URGENT work overtakes sooner."""
    from radserve.inference.providers import CPU_MAX_BATCH
    from radserve.turnaround.eta import on_host_cores

    return scheduler.capped(CPU_MAX_BATCH if on_host_cores(device) else None)


def _report_facts(result_dir: Path) -> tuple[Any, str | None] | None:
    """A finished job's study size and the device its report says it ran on (its
    ``runtime.device``, None when unstated), from one read; None when unreadable."""
    from radserve.turnaround.service_time import StudySize

    try:
        data = json.loads((result_dir / "report.json").read_text())
        size = StudySize.from_stored_shape(data["geometry"]["shape"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    runtime = data.get("runtime")
    device = runtime.get("device") if isinstance(runtime, dict) else None
    return size, device if isinstance(device, str) and device else None


def _history(store: Any, unstated: Callable[[], str]) -> list[tuple[Any, Any, str]]:
    """The store's last 1,000 succeeded jobs with timings and a readable report, oldest
    first: (record, study size, the device it ran on). The device is the report's, so
    the planner's names are the server's; ``unstated()`` names it where a report has
    none."""
    from radserve.store import JobState as StoredState

    out = []
    for r in reversed(store.list_jobs(state=StoredState.SUCCEEDED, limit=1000).items):
        if r.cached_from or not (r.result_path and r.stage_timings):
            continue
        facts = _report_facts(Path(r.result_path))
        if facts is not None:
            out.append((r, facts[0], facts[1] or unstated()))
    return out


def _learn_history(
    model: Any,
    history: list[tuple[Any, Any, str]],
    device: str,
    cores: int | None,
    cpu_workers: int,
) -> Any:
    """The service times of the jobs in ``history`` that ran on ``device``: as measured,
    or with the sharing of ``cores`` they ran under divided out (radserve.turnaround.solo)."""
    from radserve.service.turnaround import learn_records
    from radserve.turnaround.solo import JobRun, solo_model

    ran = [(r, size) for r, size, d in history if d == device]
    if cores is None:  # the sizes read with the devices: no report read a second time
        sizes = {r.id: size for r, size in ran}
        learn_records(model, [r for r, _ in ran], device, size_of=lambda r: sizes[r.id])
        return model
    runs = []
    for r, size in ran:
        if r.started and r.finished:
            times = (r.arrival.timestamp(), r.started.timestamp(), r.finished.timestamp())
            runs.append(
                JobRun(
                    r.priority_class,
                    *times,
                    size.slices,
                    dict(r.stage_timings),
                    r.pipeline_name,
                    r.precision,
                )
            )
    return solo_model(
        runs,
        cores,
        prior=model.prior,
        pipeline="",
        device=device,
        precision="",
        # the server's CPU workers, its URGENT lane and a batch on every core
        max_threads=cpu_workers + 1 + cores,
    )


# a replay's curve: its streams last long enough for this many arrivals at its own rate
CURVE_ARRIVALS = 200


def _curve_seconds(duration: float, rates: dict[Any, float], *, replayed: bool) -> float:
    """How long the plot's Poisson streams last: the plan's hours, at most 6; a replay's
    at least long enough for ``CURVE_ARRIVALS`` at its rate (its own span drew none
    from a burst: 5 jobs stored within 5 ms were plotted from 5 ms streams, "no
    arrivals" at every rate)."""
    seconds = min(duration, 6 * 3600)
    total = sum(rates.values())
    if replayed and total > 0:
        seconds = min(max(seconds, CURVE_ARRIVALS / total), 6 * 3600)
    return seconds


def _rates_of(trace: list[Any], duration: float) -> dict[Any, float]:
    out: dict[Any, float] = {}
    for a in trace:
        out[a.cls] = out.get(a.cls, 0.0) + 1.0 / max(duration, 1.0)
    return out


def _print(report: dict[str, Any]) -> None:
    from radserve.turnaround.plan import MIN_RATIOS

    st = report["service_times"]
    source = "prior (nothing measured yet)"
    if st["measured"]:
        seen = st["jobs_seen"]
        # each simulated study draws its work from the MIN_RATIOS measured jobs nearest its
        # size: with fewer, every study draws from the same few (a first plan on a new host)
        few = f" (fewer than {MIN_RATIOS}: a rough plan)" if seen < MIN_RATIOS else ""
        source = f"measured from {seen} job(s){few}"
    click.echo(
        f"service times: {st['pipeline'] or '-'} on {st['device']} at {st['precision']}, "
        f"{source}; {report['arrivals']} arrivals over {report['hours']} h, seed {report['seed']}"
    )
    if report["cache_answers_left_out"]:
        click.echo(
            f"{report['cache_answers_left_out']} replayed job(s) were answered from the result "
            "cache: left out (they took no server time)"
        )
    cut = report["arrivals"] - report["arrivals_counted"]
    if cut:
        click.echo(
            f"the first {report['warmup_s']:g} s warm the simulated server up: their "
            f"{cut} arrival(s) run but are not counted in the TATs"
        )
    if report["targets_unassessed"]:
        click.echo(
            f"not assessed (no arrivals counted): targets for "
            f"{', '.join(report['targets_unassessed'])}"
        )
    if "smallest_devices" in report:
        n = report["smallest_devices"]
        if report["overloaded_below"] > 1:
            click.echo(
                f"fewer than {report['overloaded_below']} device(s): overloaded "
                "(their busiest resource >= 95 % busy), not simulated"
            )
        if n is not None:
            click.echo(f"smallest device count meeting the targets: {n}")
        elif report.get("plateau_from") is not None:
            click.echo(
                f"no device count meets the targets: from {report['plateau_from']} device(s) "
                "on, more devices no longer shorten the missed classes' p95 TAT (what is left "
                "is their service time, not waiting)"
            )
        else:
            click.echo(f"no device count up to {report['max_devices']} meets the targets")
    for plan in report["plans"]:
        if plan.get("overloaded"):
            needed = report["devices_needed"]
            click.echo(
                f"\n{plan['devices']} device(s): overloaded: the arrivals keep its busiest "
                f"resource {plan['utilisation']:.3g}x as busy as it can be, so the queue "
                "grows without bound and no TAT settles (not simulated); "
                + (
                    f"{needed} device(s) keep up"
                    if needed is not None
                    else "no count up to a million devices keeps up (check the service times)"
                )
            )
            continue
        verdict = {True: " meets targets", False: " misses targets", None: ""}[
            plan["meets_targets"]
        ]
        click.echo(
            f"\n{plan['devices']} device(s): device busy {plan['device_utilisation']:.0%}, "
            f"CPU busy {plan['cpu_utilisation']:.0%}{verdict}"
        )
        click.echo(
            f"  {'class':<11} {'jobs':>6} {'p50 s':>9} {'p95 s':>9} {'p99 s':>9} {'missed':>7}"
        )
        for row in plan["classes"].values():
            click.echo(
                f"  {row['class']:<11} {row['jobs']:>6} {row['tat_p50_s']:>9.1f} "
                f"{row['tat_p95_s']:>9.1f} {row['tat_p99_s']:>9.1f} "
                f"{row['deadline_miss_rate']:>7.1%}"
            )
    if "plot" in report:
        click.echo(f"\nplot ({report['plot']['format']}): {report['plot']['path']}")
        if report["plot"]["overloaded_from_per_h"] is not None:
            click.echo(
                f"  not simulated from {report['plot']['overloaded_from_per_h']:g} arrivals/h: "
                "overloaded"
            )

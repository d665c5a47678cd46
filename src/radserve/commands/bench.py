"""``radserve bench``: radserve and its baselines side by side, in one run."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from radserve.commands.params import SEED, FiniteFloatRange, positive_seconds
from radserve.config import IngestSettings


@click.command("bench")
@click.option(
    "--scenario",
    type=click.Choice(
        [
            "pipeline",
            "priority",
            "providers",
            "scale",
            "cstore",
            "eta",
            "nnunet",
            "swap",
            "floor",
            "j2k",
            "critical",
        ]
    ),
    default="pipeline",
    show_default=True,
    help="pipeline: radserve vs baselines on one study; priority: an URGENT study's "
    "turnaround behind a queue of routine ones; providers: each model on ONNX Runtime's "
    "CPU provider vs every provider and precision this host serves; scale: one queue "
    "of studies drained in process, by 1 and by 2 Ray workers (--studies, --slices); "
    "cstore: C-STORE ingest rate (storescu, --slices instances) per gateway "
    "configuration (durability modes, a 1 MiB advertised PDU, 2 receiving processes) "
    "beside a bare pynetdicom SCP and the disk; "
    "eta: ETA accuracy on a mixed-class stream of small phantom studies through a real "
    "in-process server (--studies, --load), the planner's simulation of the same trace "
    "against the measured TATs, and the cost of one ETA recomputation with 100 / 1,000 / "
    "5,000 queued jobs; "
    "swap: a model version deployed mid-run under steady submissions and status "
    "reads against a spawned server (--studies, --interval); "
    "nnunet: an imported nnU-Net 3d_fullres model, radserve vs nnUNetPredictor "
    "(--size full|medium|ci, --weights trained|fitted|random, --precision; needs the "
    "nnunet extra); "
    "floor: where the memory (per import, per model, per stage) and the CPU-seconds "
    "(per stage, against each stage's lower bound) of the explicit study go, per "
    "--precision [default: fp32, int8] (--provider); "
    "j2k: the JPEG 2000 study end to end with the decode streamed into the organ model "
    "and decoded whole first, GDCM's threaded decode, and the decode + work CPU floor "
    "(--slices, --repeats); "
    "critical: result -> acknowledgement of critical-finding pushes to a webhook, a TLS "
    "syslog collector and a FHIR server on loopback, through a real server, beside the "
    "job's ordinary FHIR delivery (--studies, --routine as the studies in flight).",
)
@click.option(
    "--size",
    type=click.Choice(["full", "medium", "ci"]),
    default="full",
    show_default=True,
    help="nnunet scenario: 512x512x300 with the default architecture (64 patches), its "
    "centre 144x356x356 (4 patches), or a small CI size.",
)
@click.option(
    "--weights",
    type=click.Choice(["trained", "fitted", "random"]),
    default="trained",
    show_default=True,
    help="nnunet scenario: the whole network trained briefly to CT intensity classes "
    "(10 Adam steps before timing; decisive logits), only the segmentation head fitted "
    "to them on random weights, or all random (the last two: nearly tied logits).",
)
@click.option(
    "--provider",
    default="auto",
    show_default=True,
    help="floor scenario: the execution provider (auto: what serving chooses).",
)
@click.option("--json", "json_path", type=click.Path(path_type=Path), help="Write the summary.")
@click.option(
    "--syntax",
    "syntaxes",
    multiple=True,
    default=("explicit", "jpeg2000"),
    show_default=True,
    type=click.Choice(["explicit", "jpeg2000", "rle"]),
)
@click.option(
    "--baseline",
    "baselines",
    multiple=True,
    default=("naive", "naive-ort", "monai"),
    show_default=True,
    type=click.Choice(["naive", "naive-ort", "monai", "none"]),
    help="Baselines to run beside radserve ('none': radserve alone, e.g. to repeat it).",
)
@click.option(
    "--slices",
    # at most what the ingest takes by default (ingest.max_voxels): 1e8 slices ended in
    # a MemoryError traceback
    type=click.IntRange(1, IngestSettings().max_voxels // (512 * 512)),
    default=300,
    show_default=True,
    help="Slices of the 512x512 study.",
)
@click.option(
    "--precision",
    "precisions",
    multiple=True,
    help="radserve's precision(s); the first is the headline [default: fp32, then bf16 "
    "and int8 where this host serves them]. Baselines always run fp32.",
)
@click.option(
    "--cache-dir", type=click.Path(path_type=Path), help="Where phantom studies are kept."
)
@click.option(
    "--routine",
    type=click.IntRange(min=0),
    default=8,
    show_default=True,
    help="priority scenario: OUTPATIENT studies queued before the URGENT one.",
)
@click.option(
    "--studies",
    type=click.IntRange(min=1),
    default=6,
    show_default=True,
    help="scale scenario: studies in the queue; swap, eta and critical scenarios: studies "
    "submitted.",
)
@click.option(
    "--interval",
    type=positive_seconds(),
    default=4.0,
    show_default=True,
    help="swap scenario: seconds between submissions (the steady load).",
)
@click.option(
    "--load",
    default=1.5,
    show_default=True,
    type=FiniteFloatRange(min=0.05),
    help="eta scenario: arrival rate after the first burst, as a multiple of one "
    "study's solo service rate; the server runs several at once, so the load it offers "
    "is printed as measured (1.5: ~1.4 on 2 cores, a queue that grows; 1.0: ~0.85).",
)
@click.option(
    "--seed",
    "eta_seed",
    type=SEED,
    default=0,
    show_default=True,
    help="eta scenario: seed of the arrival trace (classes and gaps).",
)
@click.option(
    "--repeats",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="cstore and j2k scenarios: alternating repeats of every mode; priority scenario: "
    "rounds of solo, before and after (medians are reported).",
)
def command(
    scenario: str,
    json_path: Path | None,
    syntaxes: tuple[str, ...],
    baselines: tuple[str, ...],
    slices: int,
    precisions: tuple[str, ...],
    cache_dir: Path | None,
    routine: int,
    studies: int,
    repeats: int,
    size: str,
    weights: str,
    interval: float,
    load: float,
    provider: str,
    eta_seed: int,
) -> None:
    """Time the reference pipeline against a naive baseline (and MONAI) on a phantom study,
    or (--scenario priority) the scheduler's URGENT turnaround under load."""
    from radserve.commands.config import check_output_file, check_output_folder

    # before the run, not after it: a --json naming a folder or an unwritable place
    # ended in a traceback once the whole run was done
    if json_path is not None:
        check_output_file(json_path, "--json", make_parents=True)
    if cache_dir is not None:
        check_output_folder(cache_dir, "--cache-dir")
    console = Console(width=max(Console().width, 120))
    if scenario == "critical":
        _critical(console, json_path, studies, concurrency=max(1, min(routine, 4)))
        return
    if scenario == "eta":
        if studies < 2:  # its errors are measured against the jobs queued behind others
            raise click.BadParameter(
                "the eta scenario needs 2 studies or more", param_hint="'--studies'"
            )
        _eta(console, json_path, studies, load, eta_seed)
        return
    if scenario == "j2k":
        _j2k(console, json_path, slices, repeats, precisions, cache_dir)
        return
    if scenario == "floor":
        _floor(console, json_path, slices, precisions or ("fp32", "int8"), provider, cache_dir)
        return
    if scenario == "nnunet":
        _nnunet(console, json_path, size, weights, precisions[0] if precisions else "fp32")
        return
    if scenario == "providers":
        _providers(console, json_path, slices)
        return
    if scenario == "scale":
        _scale(console, json_path, slices, cache_dir, studies)
        return
    if scenario == "cstore":
        _cstore(console, json_path, slices, cache_dir, repeats)
        return
    if scenario == "swap":
        _swap(console, json_path, studies, interval)
        return
    if scenario == "priority":
        precision = precisions[0] if precisions else "fp32"
        _priority(console, json_path, slices, precision, cache_dir, routine, repeats)
        return
    from radserve.bench.run import radserve_mode, run_bench

    precisions = precisions or default_precisions(console)
    summary = run_bench(
        syntaxes=syntaxes,
        cache_dir=cache_dir,
        n_slices=slices,
        precisions=precisions,
        baselines=tuple(b for b in baselines if b != "none"),
        log=_progress(console),
    )
    table = Table(title=f"radserve bench: 512x512x{slices} phantom CT")
    for column in (
        "syntax",
        "contestant",
        "seconds",
        "radserve faster by",
        "Dice vs radserve",
        "peak RSS MB",
    ):
        table.add_column(column, justify="left" if column in ("syntax", "contestant") else "right")

    def fmt(value: object, spec: str = ".2f") -> str:
        return "-" if value is None else format(value, spec)

    for syntax, first in summary["by_transfer_syntax"].items():  # type: ignore[union-attr]
        for i, (precision, e) in enumerate(first["by_precision"].items()):
            mine = radserve_mode(precision, first=i == 0)
            table.add_row(
                syntax if i == 0 else "",
                f"{mine} ({precision})",
                fmt(e["radserve_s"]),
                "",
                "",
                fmt(e["peak_rss_mb"], ".0f"),
            )
            for name, label in (
                ("naive", f"naive ({e.get('naive_engine') or '-'})"),
                ("naive_ort", f"naive ({e.get('naive_ort_engine') or '-'})"),
                ("monai", "MONAI"),
            ):
                if e.get(f"{name}_s") is None:
                    continue
                table.add_row(
                    "",
                    f"  {label}",
                    fmt(e[f"{name}_s"]),
                    fmt(e[f"speedup_vs_{name}"], ".1f") + "x",
                    fmt(e[f"dice_vs_{name}"], ".4f"),
                    fmt(e.get(f"{name}_peak_rss_mb"), ".0f"),
                )
        e = first
        table.add_row(
            "", "radserve peak RSS / int16 volume", fmt(e["peak_rss_over_int16_volume"]), "", "", ""
        )
        table.add_row(
            "",
            "  above the warm process "
            f"({fmt(e.get('rss_after_warmup_mb'), '.0f')} MiB) / int16 volume",
            fmt(e.get("pipeline_rss_over_int16_volume")),
            "",
            "",
            fmt(e.get("pipeline_rss_mb"), ".0f"),
        )
        if e.get("workers_peak_rss_mb"):
            table.add_row(
                "",
                "  with decoder processes (tree peak: their PSS; RSS)",
                fmt(e.get("tree_pss_over_int16_volume")),
                "",
                "",
                f"{fmt(e.get('tree_peak_pss_mb'), '.0f')}; {fmt(e.get('tree_peak_rss_mb'), '.0f')}",
            )
    console.print(table)
    stages = Table(title="radserve stages (s), first syntax")
    stages.add_column("stage")
    stages.add_column("s", justify="right")
    for stage, seconds in summary["stages"].items():  # type: ignore[union-attr]
        stages.add_row(stage, f"{seconds:.2f}")
    console.print(stages)
    console.print(f"MONAI: {summary['monai']}")
    _save_summary(console, json_path, summary)


def _j2k(
    console: Console,
    json_path: Path | None,
    slices: int,
    repeats: int,
    precisions: tuple[str, ...],
    cache_dir: Path | None,
) -> None:
    from radserve.bench.j2k import run_j2k

    summary = run_j2k(
        n_slices=slices,
        repeats=repeats,
        precision=precisions[0] if precisions else "fp32",
        cache_dir=cache_dir,
        log=_progress(console),
    )
    table = Table(
        title=f"radserve bench --scenario j2k: 512x512x{slices} JPEG 2000 CT, "
        f"{summary['cores']} cores, medians of {repeats}"
    )
    table.add_column("figure", justify="left")
    table.add_column("median", justify="right")
    rows = (
        ("radserve, decode streamed into the organ model (s)", "radserve_s", ".2f"),
        ("radserve, stack decoded whole first (s)", "radserve_whole_s", ".2f"),
        ("floor: whole run's CPU-s (decode + work) / cores (s)", "floor_s", ".2f"),
        ("  of which decode CPU-s", "decode_cpu_s_in_whole_run", ".2f"),
        ("streamed / floor", "radserve_over_floor", ".3f"),
        ("whole / floor", "radserve_whole_over_floor", ".3f"),
        ("whole / streamed", "whole_over_streamed", ".3f"),
        ("decode only: radserve processes (s)", "decode_radserve_s", ".2f"),
        ("decode only: GDCM threaded, file by file (s)", "decode_gdcm_s", ".2f"),
        ("GDCM decode / radserve decode", "gdcm_decode_over_radserve_decode", ".2f"),
    )
    median = summary["median"]
    for label, key, spec in rows:
        table.add_row(label, format(median[key], spec))  # type: ignore[index]
    console.print(table)
    console.print(
        f"labels identical (streamed vs whole, every repeat): {summary['labels_identical']}; "
        f"load average before {summary['load_average_before']}, "
        f"after {summary['load_average_after']}"
    )
    _save_summary(console, json_path, summary)


def _floor(
    console: Console,
    json_path: Path | None,
    slices: int,
    precisions: tuple[str, ...],
    provider: str,
    cache_dir: Path | None,
) -> None:
    from radserve.bench.floor import run_floor

    summary = run_floor(
        n_slices=slices,
        precisions=precisions,
        provider=provider,
        cache_dir=cache_dir,
        log=_progress(console),
    )
    volume = summary["study"]["int16_volume_mb"]
    table = Table(
        title="radserve bench --scenario floor: the warm process, one fresh process a step"
    )
    for column in ("step", "RSS MiB", "+ MiB", "anon MiB", "file-backed MiB"):
        table.add_column(column, justify="left" if column == "step" else "right")
    for row in summary["imports"]:
        delta = row["delta_mb"]
        table.add_row(
            row["step"],
            f"{row['VmRSS']:.0f}",
            "-" if delta is None else f"{delta:+.0f}",
            f"{row['RssAnon']:.0f}",
            f"{row['RssFile']:.0f}",
        )
    for precision, run in summary["runs"].items():
        previous = None
        for row in run["memory_warm"]:
            delta = None if previous is None else row["VmRSS"] - previous
            previous = row["VmRSS"]
            table.add_row(
                f"{precision}: {row['step']}",
                f"{row['VmRSS']:.0f}",
                "-" if delta is None else f"{delta:+.0f}",
                f"{row['RssAnon']:.0f}",
                f"{row['RssFile']:.0f}",
            )
    console.print(table)
    for precision, run in summary["runs"].items():
        stages = Table(
            title=f"{precision} on {run['providers'][0]}: {run['total_cpu_s']:.2f} CPU-s, "
            f"peak RSS {run['peak_rss_mb']:.0f} MiB = {run['peak_rss_mb'] / volume:.2f}x "
            f"the int16 volume ({volume:.0f} MiB)"
        )
        for column in ("stage", "CPU-s", "floor CPU-s", "gap", "floor from", "peak RSS MiB"):
            table_left = column in ("stage", "floor from")
            stages.add_column(column, justify="left" if table_left else "right")
        for row in run["floor"]:
            bound = row["floor_cpu_s"]
            peak = run["stage_peak"].get(row["stage"], {}).get("VmRSS")
            stages.add_row(
                row["stage"],
                f"{row['cpu_s']:.2f}",
                "-" if bound is None else f"{bound:.2f}",
                "-" if bound is None else f"{row['gap_cpu_s']:.2f}",
                row["basis"],
                "-" if peak is None else f"{peak:.0f}",
            )
        console.print(stages)
    j2k = summary["jpeg2000_reduced_decode"]
    decode = Table(
        title=f"JPEG 2000 decode by resolution level ({j2k['frames']} frames of 512x512): "
        "body box rows / columns (> -500 HU) in native pixels"
    )
    for column in ("level", "decoder", "CPU-ms / frame", "x cheaper", "body box"):
        decode.add_column(column, justify="left" if column == "decoder" else "right")
    full = j2k["rows"][0]["cpu_ms"]
    for row in j2k["rows"]:
        decode.add_row(
            str(row["level"]),
            row["decoder"],
            f"{row['cpu_ms']:.2f}",
            f"{full / row['cpu_ms']:.1f}",
            "{}:{}, {}:{}".format(*row["box"]),
        )
    console.print(decode)
    console.print(
        f"[dim]copy bandwidth {summary['copy_gib_per_cpu_s']:.1f} GiB read+written per "
        f"CPU-s; {summary['note']}[/dim]"
    )
    _save_summary(console, json_path, summary)


def _progress(console: Console) -> Callable[[str], None]:
    """A scenario's progress lines, dimmed."""
    return lambda msg: console.print(f"[dim]{msg}[/dim]")


def _save_summary(console: Console, json_path: Path | None, summary: Any) -> None:
    """Write a scenario's summary as JSON where --json asks, and say where."""
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(summary, indent=2))
        console.print(f"summary: {json_path}")


def _providers(console: Console, json_path: Path | None, slices: int) -> None:
    from radserve.bench.providers import run_providers_bench

    summary = run_providers_bench(n_slices=min(slices, 120), log=_progress(console))
    table = Table(title="radserve bench --scenario providers (median of 10 batches)")
    for column in ("model", "provider", "precision", "ms / slice", "x CPU fp32", "labels agree"):
        table.add_column(column, justify="left" if column in ("model", "provider") else "right")
    for key, entry in summary["models"].items():  # type: ignore[union-attr]
        for i, row in enumerate(entry["rows"]):
            table.add_row(
                f"{key} {entry['batch_shape']}" if i == 0 else "",
                row["provider"],
                row["precision"],
                f"{row['ms_per_slice']:.2f}",
                f"{row['speedup_vs_cpu_fp32']:.2f}",
                f"{row['label_agreement']:.5f}",
            )
    console.print(table)
    _save_summary(console, json_path, summary)


def _swap(console: Console, json_path: Path | None, studies: int, interval: float) -> None:
    from radserve.bench.swap import run_swap_bench

    summary = run_swap_bench(
        n_studies=studies,
        interval_s=interval,
        log=_progress(console),
    )
    swap = summary["swap"]
    table = Table(
        title=f"radserve bench --scenario swap: {summary['studies']} small studies, one every "
        f"{summary['interval_s']:g} s, {swap['from']} -> {swap['to']} mid-run"
    )
    for column in ("failed requests", "failed jobs", "straddling", "its time s", "median s"):
        table.add_column(column, justify="right")
    table.add_column("added latency s", justify="right")

    def fmt(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    table.add_row(
        str(summary["failed_requests"]),
        str(summary["failed_jobs"]),
        str(summary["straddling_jobs"]),
        fmt(summary["straddling_service_s"]),
        fmt(summary["median_other_service_s"]),
        fmt(summary["added_latency_s"]),
    )
    console.print(table)
    console.print(
        "[dim]times: a job's service time (started -> finished); turnaround (with its queue "
        f"wait): straddling {fmt(summary['straddling_turnaround_s'])} s, median of the others "
        f"{fmt(summary['median_other_turnaround_s'])} s[/dim]"
    )
    console.print(
        f"[dim]deploy answered in {swap['deploy_seconds']:.2f} s (HTTP {swap['deploy_status']});"
        f" versions served: {summary['versions_served']}; requests: {summary['requests']}[/dim]"
    )
    _save_summary(console, json_path, summary)


def _cstore(
    console: Console, json_path: Path | None, slices: int, cache_dir: Path | None, repeats: int
) -> None:
    from radserve.bench.cstore import run_cstore_bench

    summary = run_cstore_bench(
        n_instances=slices,
        repeats=repeats,
        cache_dir=cache_dir,
        log=_progress(console),
    )
    table = Table(
        title=f"radserve bench --scenario cstore: {summary['instances']} instances of "
        f"{summary['instance_kib']:.0f} KiB by storescu, median of {repeats} alternating runs, "
        f"{summary['cpus']} cores, load average {summary['load_average'][0]:.1f} -> "
        f"{summary['load_average'][1]:.1f}"
    )
    columns = (
        "configuration",
        "associations",
        "instances/s",
        "runs",
        "x default",
        "CPU-ms/instance",
        "CPU bound/s",
        "batch (largest)",
        "committer busy",
    )
    for column in columns:
        table.add_column(column, justify="left" if column == "configuration" else "right")
    for row in summary["rows"]:
        batch = "-"
        if row["mean_batch"] is not None:
            batch = f"{row['mean_batch']:.1f} ({row['largest_batch']})"
        busy = "-" if row["committer_busy"] is None else f"{row['committer_busy']:.0%}"
        bound = row["cpu_bound_instances_per_s"]
        table.add_row(
            row["mode"] + (" (writers)" if row["mode"] == "disk" else ""),
            str(row["associations"]),
            f"{row['instances_per_s']:.0f}",
            " ".join(f"{r:.0f}" for r in row["runs"]),
            f"{row['ratio_vs_default']:.2f}",
            f"{row['cpu_ms_per_instance']:.1f} + {row['sender_cpu_ms_per_instance']:.1f}",
            "-" if bound is None else f"{bound:.0f}",
            batch,
            busy,
        )
    console.print(table)
    for row in summary["rows"]:
        if row["cpu_split_ms"] is not None:
            parts = ", ".join(f"{k} {v:.2f}" for k, v in row["cpu_split_ms"].items())
            console.print(f"{row['mode']}, {row['associations']}: SCP CPU-ms an instance: {parts}")
    for n, floor in summary.get("floors", {}).items():
        console.print(
            f"{n} association(s): radserve ({floor['radserve_best_mode']}) "
            f"{floor['radserve']:.0f}/s = {floor['radserve_vs_bare']:.2f}x the bare pynetdicom "
            f"SCP ({floor['bare_pynetdicom']:.0f}/s); the disk's durable writes "
            f"{floor['disk']:.0f}/s; below the goal: {', '.join(floor['below_goal']) or 'none'}"
        )
    console.print(
        f"[dim]goal: >= {summary['goal_instances_per_s']:.0f}/s; every success was sent after "
        "the instance was durable; CPU-ms: the SCP (this process and its receiving processes) "
        f"+ the storescu senders; CPU bound: {summary['cpus']} cores x 1000 / (SCP + senders "
        "CPU-ms an instance); data on the "
        f"file system of {summary['file_system_of']}[/dim]"
    )
    _save_summary(console, json_path, summary)


def _critical(console: Console, json_path: Path | None, studies: int, *, concurrency: int) -> None:
    from radserve.bench.critical import run_critical_bench

    summary = run_critical_bench(n_studies=studies, concurrency=concurrency, log=_progress(console))
    host = summary["host"]
    table = Table(
        title=f"radserve bench --scenario critical: {summary['succeeded']}/{summary['studies']} "
        f"studies, {summary['critical_findings']} critical findings in "
        f"{summary['studies_with_critical_findings']}, {summary['concurrency']} in flight, "
        f"{host['usable_cores']} cores, load average {host['loadavg_before'][0]:.1f} -> "
        f"{host['loadavg_after'][0]:.1f}"
    )
    for column in ("result -> acknowledged", "n", "median s", "p95 s", "max s", "<= 1.5 s"):
        table.add_column(column, justify="left" if column.startswith("result") else "right")
    kinds = {"ward": "webhook", "siem": f"syslog ({summary['syslog_transport']})", "ehr": "fhir"}
    rows = [
        (f"critical push: {kinds.get(name, name)}", stats)
        for name, stats in summary["result_to_ack"].items()
    ]
    rows += [
        (f"  first notice of each study: {kinds.get(name, name)}", stats)
        for name, stats in summary["first_notice_result_to_ack"].items()
    ]
    rows.append(("result recorded (SEG/SR/FHIR rows prepared)", summary["result_to_recorded"]))
    rows.append(
        ("the job's own FHIR Bundle (ordinary path)", summary["job_fhir_bundle_result_to_ack"])
    )
    for label, stats in rows:
        if not stats["n"]:
            table.add_row(label, "0", "-", "-", "-", "-")
            continue
        table.add_row(
            label,
            str(stats["n"]),
            f"{stats['median_s']:.3f}",
            f"{stats['p95_s']:.3f}",
            f"{stats['max_s']:.3f}",
            f"{stats['within_limit']}/{stats['n']}",
        )
    console.print(table)
    _save_summary(console, json_path, summary)


def _eta(console: Console, json_path: Path | None, studies: int, load: float, seed: int) -> None:
    from radserve.bench.eta import eta_cost
    from radserve.bench.eta_trace import run_eta_trace

    summary = run_eta_trace(n_studies=studies, load=load, seed=seed, log=_progress(console))
    _eta_tables(console, summary)
    rows = [eta_cost(n) for n in (100, 1000, 5000)]
    table = Table(title="radserve bench --scenario eta: one ETA recomputation (order + walk)")
    for column in ("queued jobs", "median ms", "max ms", "repeats"):
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(
            str(row["jobs"]), f"{row['median_ms']:.1f}", f"{row['max_ms']:.1f}", str(row["repeats"])
        )
    console.print(table)
    _save_summary(console, json_path, {**summary, "recompute": rows})


def _eta_tables(console: Console, summary: dict[str, Any]) -> None:
    """ETA error per reading point, and the planner against the measured TATs."""
    host = summary["host"]
    table = Table(
        title=f"radserve bench --scenario eta: {summary['studies']} studies "
        f"{summary['classes']}, load {summary['load']:g} (offered "
        f"{summary.get('offered_load') or float('nan'):.2f}), {host['usable_cores']} cores, "
        f"load average {host['loadavg_before'][0]:.1f} -> {host['loadavg_after'][0]:.1f}"
    )
    for column in ("ETA read", "jobs", "median |err|/TAT", "p90", "median |err| s", "bias"):
        table.add_column(column, justify="left" if column == "ETA read" else "right")
    for name, errors in (("", summary["eta_error"]), ("band end, ", summary["eta_error_late"])):
        for point in ("submission", "start", "halfway"):
            for subset, stats in errors[point].items():
                if not stats["jobs"]:
                    continue
                table.add_row(
                    f"{name}{point} ({subset.replace('_', ' ')})",
                    str(stats["jobs"]),
                    f"{stats['median_rel']:.1%}",
                    f"{stats['p90_rel']:.1%}",
                    f"{stats['median_abs_s']:.2f}",
                    f"{stats['median_signed_rel']:+.1%}",
                )
    console.print(table)
    console.print("[dim]bias: median (predicted - actual finish) / TAT; < 0: ETAs early[/dim]")
    misses = summary["deadline_misses"]
    console.print(
        f"[dim]goal: median error at submission <= 20 % for jobs behind >= 3: "
        f"{summary['eta_error']['meets_goal']}; deadline misses {misses['misses']} "
        f"(stream {summary['deadline_misses_stream']['misses']}, URGENT burst of "
        f"{summary['miss_burst']['studies']}: {summary['miss_burst']['misses']}), "
        f"predicted ahead {misses['predicted']} (lead p50 {misses['lead_s_p50']} s, "
        f"min {misses['lead_s_min']} s); ETA bias factors {summary['eta_bias']}[/dim]"
    )
    planner = summary["planner"]
    others = {
        "trace times, separate hardware": summary.get("planner_separate_hardware"),
        "trace times, shared cores": summary.get("planner_shared_cores"),
        "warm-up times, shared cores": summary.get("planner_host_model"),
    }
    table = Table(
        title=f"planner: radserve plan's simulation of this trace by its default model "
        f"({summary.get('planner_model', 'trace times')}), median of {planner['seeds']} "
        "seeds, vs measured TAT"
    )
    for column in ("class", "jobs", "p50 measured", "p50 planned", "p95 measured", "p95 planned"):
        table.add_column(column, justify="left" if column == "class" else "right")

    def fmt(r: dict[str, Any], q: str) -> str:
        return f"{r[f'predicted_{q}_s']:.1f} s ({r[f'diff_{q}']:.0%})"

    for cls, row in planner["classes"].items():
        table.add_row(
            cls,
            str(row["jobs"]),
            f"{row['measured_p50_s']:.1f} s",
            fmt(row, "p50"),
            f"{row['measured_p95_s']:.1f} s",
            fmt(row, "p95"),
        )
    console.print(table)
    console.print(
        f"[dim]planner within 25 % (every class's p50 and p95, the default model): "
        f"{planner['within_goal']}, {_cells_within(planner)}[/dim]"
    )
    for name, other in others.items():
        if other:
            cells = ", ".join(
                f"{cls} p50 {fmt(r, 'p50')}, p95 {fmt(r, 'p95')}"
                for cls, r in other["classes"].items()
            )
            console.print(f"[dim]older model, {name}: {_cells_within(other)}; {cells}[/dim]")


def _cells_within(check: dict[str, Any]) -> str:
    rows = check.get("classes", {}).values()
    goal = check.get("goal_rel", 0.25)
    within = sum((r["diff_p50"] <= goal) + (r["diff_p95"] <= goal) for r in rows)
    return f"{within} of {2 * len(rows)} cells"


def default_precisions(console: Console) -> tuple[str, ...]:
    """fp32, then bf16 and int8 where every pipeline model may serve them on this host
    (fp16 is left out: no CPU here does float16 arithmetic faster than float32)."""
    from radserve.bench.child import PIPELINE
    from radserve.inference import choose_runtime
    from radserve.models.registry import ModelRegistry
    from radserve.pipeline.spec import load_pipeline

    runtime = choose_runtime()
    registry = ModelRegistry()
    bundles = [registry.get(s.model, s.version) for s in load_pipeline(PIPELINE).steps]
    chosen = ["fp32"]
    for precision in ("bf16", "int8"):
        if precision == "bf16" and not runtime.runs_bf16:
            continue
        why = next((w for b in bundles if (w := b.rejection(precision))), None)
        if why:
            console.print(f"[dim]{precision} not benchmarked: {why}[/dim]")
            continue
        chosen.append(precision)
    return tuple(chosen)


def _priority(
    console: Console,
    json_path: Path | None,
    slices: int,
    precision: str,
    cache_dir: Path | None,
    routine: int,
    repeats: int,
) -> None:
    from radserve.bench.priority import run_priority_bench

    s = run_priority_bench(
        n_routine=routine,
        n_slices=slices,
        precision=precision,
        cache_dir=cache_dir,
        repeats=repeats,
        log=_progress(console),
    )
    rounds, before = s["rounds"], s["before"]
    title = (
        f"radserve bench --scenario priority: {routine} OUTPATIENT + 1 URGENT, "
        f"median of {repeats} rounds"
    )
    table = Table(title=title)
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_column("per round", justify="right")

    def each(key: str) -> str:
        return ", ".join(f"{v:.2f}" for v in rounds[key])

    paused = s["routine_paused_s"]

    rows = [
        ("URGENT alone (s)", f"{s['urgent_solo_s']:.2f}", each("solo_s")),
        ("URGENT under load, before (s)", f"{before['urgent_tat_s']:.2f}", each("before_tat_s")),
        ("URGENT under load, after (s)", f"{s['urgent_tat_s']:.2f}", each("after_tat_s")),
        ("ratio before", f"{before['urgent_tat_ratio']:.2f}", each("before_ratio")),
        (
            "ratio after (goal <= 1.3)",
            f"{s['urgent_tat_ratio']:.2f}" + ("" if s["meets_goal"] else " MISSED"),
            each("after_ratio"),
        ),
        (
            "load average (1 min), start/end",
            "",
            ", ".join(f"{v:.1f}" for v in s["load_average_1min"]),
        ),
        ("queue drain, scheduled (s)", f"{s['drain_s']:.2f}", ""),
        ("same studies, sequential (s)", f"{s['sequential_s']:.2f}", ""),
        (
            "results match sequential",
            str(s["results_match_sequential"]),
            ", ".join(s["result_differences"]),  # the studies that differ (details: --json)
        ),
        (
            "routine paused for URGENT, drained run (s)",
            f"{paused['total']:.2f}",
            f"{paused['jobs_paused']} of {paused['jobs']} jobs, longest {paused['max']:.2f}",
        ),
    ]
    for row in rows:
        table.add_row(*row)
    console.print(table)
    _save_summary(console, json_path, s)


def _nnunet(
    console: Console, json_path: Path | None, size: str, weights: str, precision: str
) -> None:
    from radserve.bench.nnunet import run_nnunet_bench

    s = run_nnunet_bench(size=size, weights=weights, precision=precision, log=_progress(console))
    table = Table(
        title=f"radserve bench --scenario nnunet --size {size} --weights {weights}: "
        f"CT {s['volume']} at "
        f"{s['spacing_mm']} mm, model {s['model_spacing_mm']} mm, patch {s['patch']} "
        f"({s['patches']} patches), {s['cores']} cores; weights made in "
        f"{s['model_build_s']:.0f} s ({s['train_steps']} training steps)"
    )
    for column in ("contestant", "seconds", "peak RSS MB (above start)", "labels"):
        table.add_column(column, justify="left" if column == "contestant" else "right")
    table.add_row(
        f"radserve ({s['provider']}, {s['precision']})",
        f"{s['radserve_s']:.1f}",
        f"{s['radserve_peak_rss_mb']:.0f}",
        f"agreement {s['label_agreement']:.5f} "
        f"({s['label_agreement_nnunet_fp32_sums']:.5f} with nnU-Net's sums in float32)",
    )
    where = f"{s['torch_threads']} threads" if s["device"] == "cpu" else f"{s['device']}, autocast"
    table.add_row(
        f"nnUNetPredictor (torch, {where})",
        f"{s['nnunet_s']:.1f}",
        f"{s['nnunet_peak_rss_mb']:.0f}",
        f"reference (its float16 vs float32 sums: {s['nnunet_fp16_vs_fp32_sums']:.5f})",
    )
    console.print(table)
    if s["radserve_cold_s"] is not None:
        console.print(
            f"warm second runs compared; first runs (kernel choice included): radserve "
            f"{s['radserve_cold_s']:.1f} s, nnU-Net {s['nnunet_cold_s']:.1f} s"
        )
    console.print(f"radserve faster by {s['speedup']:.2f}x")
    if json_path:
        json_path.write_text(json.dumps(s, indent=2))


def _scale(
    console: Console, json_path: Path | None, slices: int, cache_dir: Path | None, studies: int
) -> None:
    from radserve.bench.scale import run_scale_bench

    summary = run_scale_bench(
        n_studies=studies,
        n_slices=slices,
        cache_dir=cache_dir,
        log=_progress(console),
    )
    table = Table(
        title=f"radserve bench --scenario scale: {studies} studies x {slices} slices, "
        f"{summary['cores']} cores"
    )
    for column in (
        "executor",
        "workers",
        "drain s",
        "studies/h",
        "device busy",
        "batches",
        "mean batch ms",
        "URGENT TAT s",
        "OUTPATIENT TAT median/max s",
    ):
        table.add_column(column, justify="left" if column == "executor" else "right")
    for run in summary["runs"]:
        tat = run["tat_by_class"]
        routine = tat.get("OUTPATIENT", {})
        table.add_row(
            run["executor"],
            str(run["workers"]),
            f"{run['drain_s']:.1f}",
            f"{run['studies_per_hour']:.0f}",
            f"{run['device_busy_fraction']:.2f}",
            str(run["batches"]),
            f"{run['mean_batch_s'] * 1000:.1f}",
            f"{tat.get('URGENT', {}).get('median_s', 0):.1f}",
            f"{routine.get('median_s', 0):.1f}/{routine.get('max_s', 0):.1f}",
        )
    console.print(table)
    if "ray_overhead_per_batch_ms" in summary:
        console.print(
            f"Ray executor overhead per batch (ray-1 minus inprocess, same threads): "
            f"{summary['ray_overhead_per_batch_ms']:.1f} ms"
        )
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(summary, indent=2))

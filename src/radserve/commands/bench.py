"""``radserve bench``: radserve and its baselines side by side, in one run."""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table


@click.command("bench")
@click.option(
    "--scenario",
    type=click.Choice(["pipeline", "priority", "providers"]),
    default="pipeline",
    show_default=True,
    help="pipeline: radserve vs baselines on one study; priority: an URGENT study's "
    "turnaround behind a queue of routine ones; providers: each model on ONNX Runtime's "
    "CPU provider vs every provider and precision this host serves.",
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
@click.option("--slices", default=300, show_default=True, help="Slices of the 512x512 study.")
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
    default=8,
    show_default=True,
    help="priority scenario: OUTPATIENT studies queued before the URGENT one.",
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
) -> None:
    """Time the reference pipeline against a naive baseline (and MONAI) on a phantom study,
    or (--scenario priority) the scheduler's URGENT turnaround under load."""
    console = Console(width=max(Console().width, 120))
    if scenario == "providers":
        _providers(console, json_path, slices)
        return
    if scenario == "priority":
        _priority(
            console, json_path, slices, precisions[0] if precisions else "fp32", cache_dir, routine
        )
        return
    from radserve.bench.run import radserve_mode, run_bench

    precisions = precisions or default_precisions(console)
    summary = run_bench(
        syntaxes=syntaxes,
        cache_dir=cache_dir,
        n_slices=slices,
        precisions=precisions,
        baselines=tuple(b for b in baselines if b != "none"),
        log=lambda msg: console.print(f"[dim]{msg}[/dim]"),
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
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(summary, indent=2))
        console.print(f"summary: {json_path}")


def _providers(console: Console, json_path: Path | None, slices: int) -> None:
    from radserve.bench.providers import run_providers_bench

    summary = run_providers_bench(
        n_slices=min(slices, 120), log=lambda msg: console.print(f"[dim]{msg}[/dim]")
    )
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
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(summary, indent=2))
        console.print(f"summary: {json_path}")


def default_precisions(console: Console) -> tuple[str, ...]:
    """fp32, then bf16 and int8 where every pipeline model may serve them on this host
    (fp16 is left out: no CPU here does float16 arithmetic faster than float32)."""
    from radserve.bench.child import PIPELINE
    from radserve.inference import choose_runtime
    from radserve.models.registry import ModelRegistry
    from radserve.pipelines.spec import load_pipeline

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
) -> None:
    from radserve.bench.priority import run_priority_bench

    summary = run_priority_bench(
        n_routine=routine,
        n_slices=slices,
        precision=precision,
        cache_dir=cache_dir,
        log=lambda msg: console.print(f"[dim]{msg}[/dim]"),
    )
    table = Table(title=f"radserve bench --scenario priority: {routine} OUTPATIENT + 1 URGENT")
    table.add_column("measure")
    table.add_column("value", justify="right")
    rows = [
        ("URGENT turnaround under load (s)", f"{summary['urgent_tat_s']:.2f}"),
        ("URGENT alone (s)", f"{summary['urgent_solo_s']:.2f}"),
        (
            "ratio (goal <= 1.3)",
            f"{summary['urgent_tat_ratio']:.2f}" + ("" if summary["meets_goal"] else " MISSED"),
        ),
        ("queue drain, scheduled (s)", f"{summary['drain_s']:.2f}"),
        ("same studies, sequential (s)", f"{summary['sequential_s']:.2f}"),
        ("results match sequential", str(summary["results_match_sequential"])),
    ]
    for row in rows:
        table.add_row(*row)
    console.print(table)
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(summary, indent=2))
        console.print(f"summary: {json_path}")

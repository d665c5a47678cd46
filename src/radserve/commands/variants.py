"""``radserve models build-variants``: FP16/INT8 files and the BF16 runtime precision,
evaluated, timed and gated."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import click
import numpy as np
from rich.console import Console
from rich.table import Table

from radserve.commands.evaluate import (
    DEFAULT_PIPELINE,
    organ_label_values,
    parse_precisions,
    pipeline_specs,
)
from radserve.evaluation.runner import HELD_OUT_SEED_LIMIT, evaluate, parse_seeds
from radserve.evaluation.summary import EvalSummary
from radserve.models.gate import GateReport
from radserve.models.registry import ModelRegistry, bundled_model_dir
from radserve.models.variants import build_and_gate

logger = logging.getLogger(__name__)


def default_variants() -> str:
    """fp16 and int8 everywhere; bf16 where it can run (OpenVINO, native bfloat16)."""
    from radserve.inference import choose_runtime

    return "fp16,int8,bf16" if choose_runtime().runs_bf16 else "fp16,int8"


def _report_rows(table: Table, name: str, report: GateReport) -> None:
    fp32 = report.fp32_speed
    table.add_row(name, "fp32", "reference", f"{fp32.ms_per_slice:.2f}" if fp32 else "", "1.00", "")
    for precision, record in report.variants.items():
        speed = record.speed
        table.add_row(
            name,
            precision,
            "accepted" if record.accepted else "[red]REJECTED[/red]",
            f"{speed.ms_per_slice:.2f}" if speed else "",
            f"{speed.ratio_vs_fp32:.2f}" if speed and speed.ratio_vs_fp32 else "",
            "; ".join(record.reasons),
        )


@click.command("build-variants")
@click.option(
    "--model",
    "model_choice",
    default="all",
    show_default=True,
    help="Model to build variants of (organs, lesions, ...) or 'all' of the pipeline.",
)
@click.option(
    "--calibration-seeds",
    default="1000-1003",
    show_default=True,
    help="Phantom seeds for INT8 calibration (training range, >= 1000).",
)
@click.option(
    "--seeds",
    default="0-9",
    show_default=True,
    help="Held-out phantom seeds the variants are evaluated on (< 1000).",
)
@click.option("--small", is_flag=True, help="Small phantoms (quick check).")
@click.option(
    "--precision",
    "precision_text",
    default=None,
    help="Comma-separated variants [default: fp16,int8, and bf16 where this host runs it].",
)
@click.option(
    "--threads",
    type=int,
    default=None,
    help="CPU threads for the speed comparison (default: usable cores).",
)
@click.option("--pipeline", default=DEFAULT_PIPELINE, show_default=True)
@click.option(
    "--models-dir",
    "models_dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Model root to build in (default: the bundled models).",
)
def command(
    model_choice: str,
    calibration_seeds: str,
    seeds: str,
    small: bool,
    precision_text: str | None,
    threads: int | None,
    pipeline: str,
    models_dir: Path | None,
) -> None:
    """Build FP16/INT8 variants, evaluate them against FP32 on held-out phantoms, time
    them on the CPU, and record the accuracy gate in gate.json next to model.yaml."""
    from radserve.evaluation.pipeline_runs import pipeline_predictor, record_model_inputs
    from radserve.evaluation.runner import phantom_truth
    from radserve.inference import probe_host

    try:
        eval_seeds, calib_seeds = parse_seeds(seeds), parse_seeds(calibration_seeds)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    overlap = sorted(set(eval_seeds) & set(calib_seeds))
    if overlap:
        raise click.BadParameter(f"calibration and evaluation share seeds {overlap[:5]}")
    if any(s >= HELD_OUT_SEED_LIMIT for s in eval_seeds):
        raise click.BadParameter(f"evaluation seeds must be below {HELD_OUT_SEED_LIMIT}")
    precisions = [p for p in parse_precisions(precision_text or default_variants()) if p != "fp32"]
    threads = threads or probe_host().usable_cores
    root = models_dir or bundled_model_dir()
    specs = pipeline_specs(ModelRegistry([root]), pipeline)
    organ_labels = organ_label_values(specs)
    names = [s.name for s in specs] if model_choice == "all" else [model_choice]
    calibration_cts = [phantom_truth(s, small=small).ct for s in calib_seeds]

    console = Console()
    table = Table(title="Precision variants vs fp32")
    for col in ("model", "variant", "gate", "ms/slice", "x fp32 time", "reasons"):
        table.add_column(col)
    for name in names:
        registry = ModelRegistry([root])
        bundle = registry.get(name)
        batches = record_model_inputs(registry, pipeline, name, calibration_cts)
        if not batches:
            raise click.ClickException(f"the pipeline fed {name} no batches on calibration seeds")

        def run_eval(wanted: Sequence[str], _name: str = name) -> Mapping[str, EvalSummary]:
            ungated = ModelRegistry([root], allow_ungated=True)
            predict = pipeline_predictor(ungated, pipeline, vary=_name)
            return evaluate(
                predict,
                seeds=eval_seeds,
                organ_labels=organ_labels,
                precisions=wanted,
                small=small,
            )

        def calibration(_batches: list[np.ndarray] = batches) -> Iterator[np.ndarray]:
            return iter(_batches)

        report = build_and_gate(
            bundle,
            evaluate_precisions=run_eval,
            calibration=calibration,
            speed_batch=max(batches, key=len),
            threads=threads,
            precisions=precisions,
            calibration_seeds=calib_seeds,
        )
        _report_rows(table, name, report)
        console.print(f"wrote {bundle.directory / 'gate.json'}")
    console.print(table)

"""``radserve models build-variants``: FP16/INT8 files and the BF16 runtime precision,
evaluated, timed and gated."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import click

from radserve.commands.config import CONFIG_OPTION, DEFAULT_PIPELINE
from radserve.domain.device_slot import MAX_THREADS

if TYPE_CHECKING:
    from rich.table import Table

    from radserve.models.gate import GateReport

logger = logging.getLogger(__name__)


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


def study_folders(folder: Path) -> list[Path]:
    """One study per sub-folder of ``folder`` (sorted), or ``folder`` itself when it holds
    files and no sub-folder."""
    subfolders = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    return subfolders or [folder]


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
    help="Comma-separated variants [default: fp16,int8, and bf16 where the server serves "
    "with OpenVINO first on a CPU with native bfloat16].",
)
@click.option(
    "--threads",
    type=click.IntRange(1, MAX_THREADS),  # checked before the variants are built
    default=None,
    help="CPU threads for the speed comparison (default: usable cores).",
)
@click.option(
    "--studies",
    "studies_dir",
    type=click.Path(path_type=Path, exists=True, file_okay=False),
    default=None,
    help="Judge the variants on these studies instead of phantoms (one folder of DICOM "
    "files per study inside it): by agreement with the model's FP32 output, for models "
    "the CT phantoms cannot gate (MR, PET/CT, other anatomy).",
)
@click.option(
    "--calibration-studies",
    "calibration_dir",
    type=click.Path(path_type=Path, exists=True, file_okay=False),
    default=None,
    help="With --studies: the studies INT8 is calibrated on (other than those it is judged on).",
)
@click.option(
    "--pipeline",
    default=DEFAULT_PIPELINE,
    show_default=True,
    help="Pipeline (name, or a YAML file) whose run feeds the model.",
)
@click.option(
    "--models-dir",
    "models_dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Model root to build in (default: the bundled models).",
)
@CONFIG_OPTION
def command(
    model_choice: str,
    calibration_seeds: str,
    seeds: str,
    small: bool,
    precision_text: str | None,
    threads: int | None,
    studies_dir: Path | None,
    calibration_dir: Path | None,
    pipeline: str,
    models_dir: Path | None,
    config_file: Path | None,
) -> None:
    """Build FP16/INT8 variants, evaluate them against FP32 on held-out phantoms (or on
    --studies), time them, and record the accuracy gate in gate.json next to model.yaml;
    every session runs on the providers the server of --config serves with
    (runtime.providers), as they will serve. On an installed version the variants are
    built in a copy and moved in with install.json's record of them, so a kill leaves the
    version as it was or with all of them."""
    # here, not at the top: `radserve models` adds this command to its group, and these
    # load ONNX, SciPy and the evaluation (~1 CPU-s) that its other commands never use
    from rich.console import Console
    from rich.table import Table

    from radserve.commands.evaluate import parse_precisions, pipeline_specs
    from radserve.commands.models import serving_providers
    from radserve.errors import RadserveError
    from radserve.evaluation.runner import HELD_OUT_SEED_LIMIT, parse_seeds
    from radserve.models.registry import ModelRegistry, bundled_model_dir
    from radserve.pipeline.spec import load_pipeline
    from radserve.variants import (
        build_and_gate_on_phantoms,
        build_and_gate_on_studies,
        default_precisions,
    )

    try:
        eval_seeds, calib_seeds = parse_seeds(seeds), parse_seeds(calibration_seeds)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    overlap = sorted(set(eval_seeds) & set(calib_seeds))
    if overlap:
        raise click.BadParameter(f"calibration and evaluation share seeds {overlap[:5]}")
    if any(s >= HELD_OUT_SEED_LIMIT for s in eval_seeds):
        raise click.BadParameter(f"evaluation seeds must be below {HELD_OUT_SEED_LIMIT}")
    # as `models install --build-variants` does (variant_builder): chosen, evaluated and
    # timed on what the server serves with; before 2026-12-07 on the host's default
    # (OpenVINO here) whatever runtime.providers said, bf16 included
    providers = serving_providers(config_file)
    wanted = parse_precisions(precision_text) if precision_text else default_precisions(providers)
    precisions = [p for p in wanted if p != "fp32"]
    root = models_dir or bundled_model_dir()
    spec = load_pipeline(pipeline)
    specs = pipeline_specs(ModelRegistry([root]), pipeline)
    names = [s.name for s in specs] if model_choice == "all" else [model_choice]

    console = Console()
    table = Table(title="Precision variants vs fp32")
    for col in ("model", "variant", "gate", "ms/slice", "x fp32 time", "reasons"):
        table.add_column(col)
    if calibration_dir is not None and studies_dir is None:
        raise click.BadParameter("--calibration-studies goes with --studies")
    for name in names:
        try:
            if studies_dir is not None:
                report = build_and_gate_on_studies(
                    ModelRegistry([root]),
                    spec,
                    name,
                    studies=study_folders(studies_dir),
                    calibration_studies=study_folders(calibration_dir) if calibration_dir else [],
                    precisions=precisions,
                    threads=threads,
                    providers=providers,
                )
            else:
                report = build_and_gate_on_phantoms(
                    ModelRegistry([root]),
                    spec,
                    name,
                    eval_seeds=eval_seeds,
                    calibration_seeds=calib_seeds,
                    precisions=precisions,
                    small=small,
                    threads=threads,
                    providers=providers,
                )
        except RadserveError as exc:
            raise click.ClickException(exc.message) from exc
        _report_rows(table, name, report)
        directory = ModelRegistry([root]).get(name, report.version).directory
        console.print(f"wrote {directory / 'gate.json'}")
    console.print(table)

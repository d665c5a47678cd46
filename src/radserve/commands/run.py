"""``radserve run STUDY --pipeline NAME --out DIR``."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console

from radserve.commands._console import RichProgress, summary_tables, write_dicom_objects


@click.command("run")
@click.argument("study", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option("--pipeline", "pipeline_name", default="ct-chest-abdomen", show_default=True)
@click.option("--out", "out_dir", required=True, type=click.Path(path_type=Path))
@click.option(
    "--precision",
    type=click.Choice(["fp32", "fp16", "int8", "bf16"]),
    default=None,
    help="Model precision (default: the pipeline's). Only gated variants are served; "
    "bf16 also needs OpenVINO and a CPU with AMX or AVX-512 BF16.",
)
@click.option(
    "--models-dir",
    type=click.Path(path_type=Path, file_okay=False),
    multiple=True,
    help="Extra model bundle roots, searched before the bundled models.",
)
@click.option(
    "--provider",
    "providers",
    multiple=True,
    help="ONNX Runtime execution provider(s) to use, in order, e.g. CPUExecutionProvider "
    "(default: the host's best: TensorRT > CUDA > OpenVINO > CPU).",
)
@click.option("--no-key-images", is_flag=True, help="Skip the PNG key images.")
@click.option(
    "--dicom/--no-dicom", default=True, show_default=True, help="Also write DICOM SEG and SR."
)
@click.option(
    "--sc-key-images",
    is_flag=True,
    help="Also write the key images as DICOM Secondary Capture (viewers without SEG).",
)
def command(
    study: tuple[Path, ...],
    pipeline_name: str,
    out_dir: Path,
    precision: str | None,
    models_dir: tuple[Path, ...],
    providers: tuple[str, ...],
    no_key_images: bool,
    dicom: bool,
    sc_key_images: bool,
) -> None:
    """Run a study (folder, zip or DICOM files) through a pipeline; write the report to OUT."""
    from radserve.inference import choose_runtime
    from radserve.models.registry import ModelRegistry, bundled_model_dir
    from radserve.pipeline import SessionPool
    from radserve.pipelines.spec import load_pipeline
    from radserve.study import run_study

    console = Console()
    pipeline = load_pipeline(pipeline_name)
    sources = list(study) if len(study) > 1 else study[0]
    with RichProgress(console) as progress:
        result = run_study(
            sources,
            pipeline=pipeline,
            out_dir=out_dir,
            registry=ModelRegistry([*models_dir, bundled_model_dir()]),
            sessions=SessionPool(choose_runtime(prefer=providers or None)),
            precision=precision,  # type: ignore[arg-type]
            progress=progress,
            key_images=not no_key_images,
        )
    for table in summary_tables(result.report):
        console.print(table)
    if dicom:
        for path in write_dicom_objects(result, console, key_images=sc_key_images):
            console.print(f"DICOM: {path}")
    console.print(f"report: {result.report_path}")

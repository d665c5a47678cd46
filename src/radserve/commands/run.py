"""``radserve run STUDY --pipeline NAME --out DIR``."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console

from radserve.commands._console import RichProgress, summary_tables


@click.command("run")
@click.argument("study", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option("--pipeline", "pipeline_name", default="ct-chest-abdomen", show_default=True)
@click.option("--out", "out_dir", required=True, type=click.Path(path_type=Path))
@click.option(
    "--precision",
    type=click.Choice(["fp32", "fp16", "int8"]),
    default=None,
    help="Model precision (default: the pipeline's). Only gated variants are served.",
)
@click.option("--no-key-images", is_flag=True, help="Skip the PNG key images.")
def command(
    study: tuple[Path, ...],
    pipeline_name: str,
    out_dir: Path,
    precision: str | None,
    no_key_images: bool,
) -> None:
    """Run a study (folder, zip or DICOM files) through a pipeline; write the report to OUT."""
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
            precision=precision,  # type: ignore[arg-type]
            progress=progress,
            key_images=not no_key_images,
        )
    for table in summary_tables(result.report):
        console.print(table)
    console.print(f"report: {result.report_path}")

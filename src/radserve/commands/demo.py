"""``radserve demo``: a phantom CT study through the reference pipeline, no setup needed."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console

from radserve.commands._console import RichProgress, summary_tables, write_dicom_objects
from radserve.commands.params import SEED


@click.command("demo")
@click.option(
    "--out", "out_dir", default="out/demo", show_default=True, type=click.Path(path_type=Path)
)
@click.option(
    "--seed", type=SEED, default=7, show_default=True, help="Phantom seed (held out from training)."
)
@click.option("--pipeline", "pipeline_name", default="ct-chest-abdomen", show_default=True)
@click.option(
    "--dicom/--no-dicom", default=True, show_default=True, help="Also write DICOM SEG and SR."
)
@click.option("--small", is_flag=True, help="Small fast phantom (128x128, 40-60 slices).")
@click.option(
    "--serve",
    "serve",
    is_flag=True,
    help="Then serve the web console, with the study submitted, until Ctrl-C "
    "(data under OUT/server; prints the address and a demo admin key).",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="With --serve: address.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8000,
    show_default=True,
    help="With --serve: port (0: any free one, printed).",
)
def command(
    out_dir: Path,
    seed: int,
    pipeline_name: str,
    dicom: bool,
    small: bool,
    serve: bool,
    host: str,
    port: int,
) -> None:
    """Generate a phantom CT study, run the reference pipeline, print where the report is
    (with --serve, then open the web console on it)."""
    from radserve.phantom import (
        PhantomSpec,
        generate_phantom,
        write_dicom_series,
        write_ground_truth,
    )
    from radserve.pipeline.spec import load_pipeline
    from radserve.pipeline.study import run_study

    if serve:
        _refuse_a_taken_port(host, port)
    console = Console()
    with console.status("generating phantom CT study"):
        phantom = generate_phantom(PhantomSpec.random(seed, small=small))
        study_dir = out_dir / "study"
        write_dicom_series(phantom, study_dir)
        write_ground_truth(phantom, out_dir / "ground_truth")
    console.print(
        f"phantom: seed {seed}, {phantom.ct.shape[0]} slices of "
        f"{phantom.ct.shape[1]}x{phantom.ct.shape[2]}, {len(phantom.lesion_list)} lesions "
        f"-> {study_dir}"
    )
    with RichProgress(console) as progress:
        result = run_study(
            study_dir,
            pipeline=load_pipeline(pipeline_name),
            out_dir=out_dir / "result",
            progress=progress,
        )
    for table in summary_tables(result.report):
        console.print(table)
    if dicom:
        for path in write_dicom_objects(result, console):
            console.print(f"DICOM: {path}")
    console.print(f"ground truth: {out_dir / 'ground_truth'}")
    console.print(f"report: {result.report_path}")
    if serve:
        from radserve.commands.demo_serve import serve_demo

        serve_demo(out_dir, study_dir, host, port)


def _refuse_a_taken_port(host: str, port: int) -> None:
    """Before minutes of demo work, the check the server makes of its port at start: a
    second ``make demo-serve`` (the first still serving) or another service on 8000 used
    to run the whole demo and only then refuse."""
    from radserve.commands.doctor import ports_in_use
    from radserve.lifecycle.doctor import port_check

    check = port_check("http port", host, port)
    if check.status == "ok":
        return
    hint = (
        ": is a radserve server already running on this host? Stop it, or give another port"
        if ports_in_use([check])
        else ""
    )
    raise click.BadParameter(
        f"{check.detail}{hint} (`make demo-serve PORT=N`; 0: any free one)",
        param_hint="'--port'",
    )

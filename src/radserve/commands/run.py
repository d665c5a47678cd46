"""``radserve run STUDY --out DIR``: one study through a pipeline, on this machine.

It reads the same settings as ``radserve serve`` (``--config FILE`` or
``$RADSERVE_CONFIG``, then ``RADSERVE_*`` environment variables): the ingest policy
(``ingest.*``), model folders and precision (``models.*``), the ONNX Runtime providers
and threads (``runtime.*``), pipeline folders and the default pipeline (``pipelines.*``)
and whether Secondary Capture key images are written (``results.*``). Flags override
settings; ``--ingest NAME=VALUE`` sets one ingest choice, as the ingest errors suggest.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from radserve.commands._console import RichProgress, summary_tables, write_dicom_objects
from radserve.commands._outputs import refuse_unusable, staged
from radserve.commands.config import CONFIG_OPTION
from radserve.errors import RadserveError


def _ingest_choices() -> str:
    from radserve.config import IngestSettings

    return ", ".join(IngestSettings.model_fields)


def _parse_ingest(
    ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> dict[str, str]:
    """``NAME=VALUE`` pairs -> ``ingest__NAME`` overrides (validated with the settings)."""
    from radserve.config import IngestSettings

    overrides: dict[str, str] = {}
    for item in values:
        name, sep, value = item.partition("=")
        name = name.strip().replace("-", "_")
        if not sep or not name or not value.strip():
            raise click.BadParameter(f"{item!r} is not NAME=VALUE, e.g. missing_slices=resample")
        if name not in IngestSettings.model_fields:
            raise click.BadParameter(f"{name!r} is no ingest setting; one of: {_ingest_choices()}")
        overrides[f"ingest__{name}"] = value.strip()
    return overrides


@click.command("run")
@click.argument("study", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(path_type=Path),
    help="Output folder, new or empty (created); the results appear in it only when all "
    "are written, report.json last.",
)
@click.option(
    "--pipeline",
    "pipeline_name",
    default=None,
    help="Pipeline name, or path to its YAML file (default: pipelines.default, "
    "ct-chest-abdomen unless configured).",
)
@CONFIG_OPTION
@click.option(
    "--ingest",
    "ingest",
    multiple=True,
    metavar="NAME=VALUE",
    callback=_parse_ingest,
    help="One ingest choice, e.g. --ingest missing_slices=resample --ingest "
    "gantry_tilt=correct (overrides ingest.* of the settings; repeatable).",
)
@click.option(
    "--precision",
    type=click.Choice(["fp32", "fp16", "int8", "bf16"]),
    default=None,
    help="Model precision (default: models.precision, else the pipeline's). Only gated "
    "variants are served; bf16 also needs OpenVINO and a CPU with AMX or AVX-512 BF16.",
)
@click.option(
    "--models-dir",
    type=click.Path(path_type=Path, file_okay=False),
    multiple=True,
    help="Extra model bundle roots, searched before models.dirs and the bundled models.",
)
@click.option(
    "--provider",
    "providers",
    multiple=True,
    help="ONNX Runtime execution provider(s) to use, in order, e.g. CPUExecutionProvider "
    "(default: runtime.providers, else the host's best: TensorRT > CUDA > OpenVINO > CPU).",
)
@click.option("--no-key-images", is_flag=True, help="Skip the PNG key images.")
@click.option(
    "--dicom/--no-dicom", default=True, show_default=True, help="Also write DICOM SEG and SR."
)
@click.option(
    "--sc-key-images/--no-sc-key-images",
    default=None,
    help="Also write the key images as DICOM Secondary Capture (viewers without SEG) "
    "(default: results.secondary_capture_key_images).",
)
@click.option(
    "--stream-decode/--no-stream-decode",
    default=True,
    show_default=True,
    help="JPEG 2000: start the organ model while the later slices still decode (same "
    "labels; --no-stream-decode decodes the whole stack first).",
)
@click.option(
    "--json-logs",
    is_flag=True,
    help="Log records on stderr as JSON lines, as radserve serve writes them (warnings, "
    "what the decoding processes' native code printed), instead of plain text.",
)
def command(
    study: tuple[Path, ...],
    out_dir: Path,
    pipeline_name: str | None,
    config_file: Path | None,
    ingest: dict[str, str],
    precision: str | None,
    models_dir: tuple[Path, ...],
    providers: tuple[str, ...],
    no_key_images: bool,
    dicom: bool,
    sc_key_images: bool | None,
    stream_decode: bool,
    json_logs: bool,
) -> None:
    """Run a study (folder, zip, DICOM files or one NIfTI volume) through a pipeline; write
    the report to OUT."""
    from radserve.config import load_settings
    from radserve.inference import choose_runtime
    from radserve.ingest.decode import shutdown_decode_workers
    from radserve.ingest.policy import IngestPolicy
    from radserve.lifecycle.install import site_registry
    from radserve.pipeline import SessionPool
    from radserve.pipeline.inputs import NIFTI_SUFFIXES, NiftiInput
    from radserve.pipeline.study import run_study

    _check_out_dir(out_dir)
    overrides: dict[str, Any] = {
        **ingest,
        "models__precision": precision,
        "runtime__providers": providers or None,
        "results__secondary_capture_key_images": sc_key_images,
    }
    settings = load_settings(config_file, **overrides)
    console = Console()
    pipeline = _pipeline(pipeline_name or settings.pipelines.default, settings.pipelines.dirs)
    # one NIfTI volume, as the server takes it (before session 35: "not DICOM")
    nifti = (
        len(study) == 1 and study[0].is_file() and study[0].name.lower().endswith(NIFTI_SUFFIXES)
    )
    sources: Any = NiftiInput(study[0]) if nifti else list(study) if len(study) > 1 else study[0]
    runtime = choose_runtime(
        prefer=settings.runtime.providers or None, threads=settings.runtime.threads
    )
    if json_logs:
        from radserve.security.logs import configure_logging

        configure_logging(logging.getLogger().level, json_lines=True)
    policy = IngestPolicy.from_settings(settings.ingest)
    written: list[Path] = []
    refused: RadserveError | None = None
    # written into a staging folder inside --out and moved out whole, report.json last:
    # stopped (Ctrl-C, a failure) it leaves nothing that looks like a finished result
    with staged(out_dir, "--out", last=("report.json",)) as staging:
        try:
            with RichProgress(console) as progress:
                result = run_study(
                    sources,
                    pipeline=pipeline,
                    out_dir=staging,
                    # judged on the providers it runs on, as a server's catalog judges
                    # them: a bf16 variant on a CPU-provider run was served on a provider
                    # without bf16
                    registry=site_registry(
                        [*models_dir, *settings.models.dirs],
                        settings.data_dir,
                        serving=runtime.serving,
                    ),
                    sessions=SessionPool(runtime),
                    precision=settings.models.precision,
                    policy=policy,
                    progress=progress,
                    key_images=not no_key_images,
                    stream_decode=stream_decode,
                )
        finally:
            # as the server at its stop: the decoding processes' stderr is read by a
            # thread of this process (log_routing.WorkerLogs), which logs what is left and
            # removes its FIFO only when they stop; left to exit, the FIFO's folder stayed
            # in $TMPDIR. Not helpers=True: the fork server and resource tracker end with
            # this process, and stopping the tracker first made it report the pool's
            # semaphores as leaked
            shutdown_decode_workers()
        for table in summary_tables(result.report):
            console.print(table)
        if dicom and nifti:
            console.print("no DICOM SEG/SR: a NIfTI volume has no DICOM study to reference")
        elif dicom:
            scs = settings.results.secondary_capture_key_images
            try:
                written = write_dicom_objects(result, console, key_images=scs, policy=policy)
            except RadserveError as exc:
                # the study's own values refuse DICOM results (a Type 1 value too long to
                # cut): the report, which says why they are missing, and the label maps
                # are kept; the command still fails, naming it
                refused = exc
    if refused is not None:
        raise refused
    for path in written:
        console.print(f"DICOM: {out_dir / path.relative_to(staging)}")
    console.print(f"report: {out_dir / result.report_path.relative_to(staging)}")


def _check_out_dir(out_dir: Path) -> None:
    """Refuse an ``--out`` that cannot take the results before any work (one line, exit
    2): a file there, a file or nothing writable above it, a folder that already holds
    files. Found only when the report was written, after the whole inference, it ended in
    a FileExistsError/FileNotFoundError traceback; a folder holding an earlier run's
    results got this run's beside them (until 2026-12-08, exit 1)."""
    refuse_unusable(out_dir, "--out")


def _pipeline(name: str, folders: tuple[Path, ...]) -> Any:
    """A pipeline by path, or by name from the configured folders, then the bundled ones."""
    from radserve.pipeline.spec import load_pipeline

    if Path(name).suffix in (".yaml", ".yml"):
        return load_pipeline(name)
    for folder in folders:
        if (Path(folder) / f"{name}.yaml").is_file():
            return load_pipeline(name, Path(folder))
    return load_pipeline(name)

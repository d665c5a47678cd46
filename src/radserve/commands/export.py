"""``radserve export JOB --deidentify --out DIR``: a job's results for research or vendor
support, de-identified (PS3.15 Basic Profile, see :mod:`radserve.audit.deid`) and
recorded in the audit trail (``export.deidentified``, with the SHA-256 of every file)."""

from __future__ import annotations

from pathlib import Path

import click

from radserve.commands.config import CONFIG_OPTION, DATA_DIR_OPTION, check_output_folder


@click.command("export")
@click.argument("job_id")
@click.option("--out", "out", required=True, type=click.Path(path_type=Path, file_okay=False))
@click.option(
    "--deidentify/--no-deidentify",
    default=True,
    show_default=True,
    help="Apply the PS3.15 Basic Application Level Confidentiality Profile (required: "
    "identified export is not offered).",
)
@CONFIG_OPTION
@DATA_DIR_OPTION
def command(
    job_id: str, out: Path, deidentify: bool, config_file: Path | None, data_dir: Path | None
) -> None:
    """Write JOB's report JSON, SEG, SR and NIfTI label maps, de-identified, into --out."""
    from radserve.audit.chain import AuditEvent
    from radserve.audit.deid import (
        Pseudonyms,
        deidentify_file,
        deidentify_nifti,
        write_report,
    )
    from radserve.audit.digests import file_sha256
    from radserve.audit.events import Action
    from radserve.config import load_settings
    from radserve.errors import RadserveError
    from radserve.store.audited import open_audited

    if not deidentify:
        raise click.UsageError("only de-identified export is offered: use --deidentify")
    # a file in the way, or a folder this process may not write: one line, exit 2, before
    # the store is opened (a NotADirectoryError/PermissionError traceback before)
    check_output_folder(out, "--out")
    settings = load_settings(config_file, data_dir=data_dir)
    store, trail = open_audited(settings, create=False)  # no store: no job to export
    try:
        job = store.get_job(job_id)
        if job.result_path is None:
            raise RadserveError(
                f"job {job_id} has no result to export (it is {job.state})", code="no_result"
            )
        source = Path(job.result_path)
        out.mkdir(parents=True, exist_ok=True)
        if any(out.iterdir()):
            raise RadserveError(f"{out} is not empty", code="export_target_not_empty")
        names = Pseudonyms(trail.key.secret)
        written: dict[str, str] = {}
        for path in sorted(source.iterdir()):
            target = out / path.name
            if path.name == "report.json":
                write_report(path, target, names)
            elif path.suffix == ".dcm":
                deidentify_file(path, target, names)
            elif path.name.endswith(".nii.gz"):
                deidentify_nifti(path, target)
            else:
                continue  # key images and anything else are not exported
            written[target.name] = file_sha256(target)
        store.append_audit(
            AuditEvent(
                action=Action.EXPORT_DEIDENTIFIED,
                subject=job_id,
                payload={
                    "profile": "113100",
                    "files": written,
                    "pseudonymous_job": names.job_id(job_id),
                },
            )
        )
    finally:
        store.close()
    click.echo(f"exported {len(written)} de-identified file(s) of job {job_id} to {out}")

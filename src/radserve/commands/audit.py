"""``radserve audit verify|export``: check the audit chain (HMACs, links, head, and the
signed checkpoints kept outside the database); write it out as JSONL."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click

from radserve.commands.config import CONFIG_OPTION, DATA_DIR_OPTION
from radserve.commands.keys import open_store


@click.group("audit")
def group() -> None:
    """Audit log: verify the hash chain, export records."""


@group.command("verify")
@click.option(
    "--expect-head",
    "expect_heads",
    multiple=True,
    metavar="SEQ:HASH",
    help="A head seen elsewhere (the syslog collector, an earlier verify): the chain must "
    "still hold record SEQ with this hash. Repeatable.",
)
@click.option(
    "--no-checkpoint",
    is_flag=True,
    help="Do not check against the checkpoint file (audit.checkpoint_file).",
)
@CONFIG_OPTION
@DATA_DIR_OPTION
def verify(
    expect_heads: tuple[str, ...],
    no_checkpoint: bool,
    config_file: Path | None,
    data_dir: Path | None,
) -> None:
    """Recompute every record's HMAC and link, compare the head with the newest signed
    checkpoint and every --expect-head; exit status 1 if records were edited, forged,
    deleted, cut from the end or wiped. A checkpoint line a crash cut short (a torn
    append) is said and fails nothing: the checkpoint before it is checked instead."""
    from radserve.audit.seal import CheckpointFile, ExpectedHead, checkpoint_path, verify_sealed
    from radserve.config import load_settings
    from radserve.store.store import read_by_command

    try:
        expected = [ExpectedHead.parse(text) for text in expect_heads]
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--expect-head") from None
    settings = load_settings(config_file, data_dir=data_dir)
    checkpoints = None if no_checkpoint else CheckpointFile(checkpoint_path(settings))
    store = open_store(config_file, data_dir, create=False)
    try:
        with read_by_command(store):
            report, checkpoint = verify_sealed(store, checkpoints, expected)
    finally:
        store.close()
    for note in report.notes:
        click.echo(f"note: {note}", err=True)
    if report.ok:
        click.echo(
            f"audit chain OK: {report.records} record(s); "
            f"head seq {report.head_seq} hash {report.head_hash}"
        )
        if checkpoint is not None:
            click.echo(f"matches the checkpoint of {checkpoint.ts} (seq {checkpoint.seq})")
        elif checkpoints is not None:
            click.echo(f"no checkpoint in {checkpoints.path} to compare with", err=True)
        click.echo(f"head: {report.head_seq}:{report.head_hash}")
        return
    click.echo(f"audit chain BROKEN: {len(report.problems)} problem(s)", err=True)
    for problem in report.problems:
        click.echo(f"  {problem}", err=True)
    raise SystemExit(1)


@group.command("export")
@click.option("--out", "out", required=True, type=click.Path(path_type=Path, dir_okay=False))
@CONFIG_OPTION
@DATA_DIR_OPTION
def export(out: Path, config_file: Path | None, data_dir: Path | None) -> None:
    """Write every audit record, oldest first, as one JSON object per line."""
    from radserve.store.store import read_by_command

    store = open_store(config_file, data_dir, create=False)
    count, last_hash = 0, None
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        with read_by_command(store), open(out, "w", encoding="utf-8") as handle:
            for record in store.iter_audit():
                handle.write(json.dumps(record.to_json(), sort_keys=True) + "\n")
                count, last_hash = count + 1, record.hash
            handle.flush()
            os.fsync(handle.fileno())
    finally:
        store.close()
    click.echo(f"exported {count} audit record(s) to {out}; last hash {last_hash or '-'}")

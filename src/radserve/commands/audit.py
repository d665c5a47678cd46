"""``radserve audit verify|export``: check the audit chain (HMACs, links, head, and the
signed checkpoints kept outside the database); write it out as JSONL."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import click

from radserve.commands.config import CONFIG_OPTION, DATA_DIR_OPTION, check_output_file
from radserve.commands.keys import open_store

if TYPE_CHECKING:
    from radserve.config import Settings


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
    from radserve.config import load_settings
    from radserve.durable import make_dirs, temporary_path
    from radserve.store.store import read_by_command

    _refuse_own_files(out, load_settings(config_file, data_dir=data_dir))
    check_output_file(out, "--out", make_parents=True)  # a file in the way: one line, exit 2
    store = open_store(config_file, data_dir, create=False)
    count, last_hash = 0, None
    try:
        make_dirs(out.parent)
        # written beside it and renamed when whole: a failure midway leaves no export that
        # looks complete, nor an earlier one cut short
        partial = temporary_path(out)
        try:
            with read_by_command(store), open(partial, "w", encoding="utf-8") as handle:
                for record in store.iter_audit():
                    handle.write(json.dumps(record.to_json(), sort_keys=True) + "\n")
                    count, last_hash = count + 1, record.hash
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(partial, out)
        finally:
            partial.unlink(missing_ok=True)
    finally:
        store.close()
    click.echo(f"exported {count} audit record(s) to {out}; last hash {last_hash or '-'}")


def _refuse_own_files(out: Path, settings: Settings) -> None:
    """An export never goes over a file radserve keeps: the audit key, the checkpoint file,
    the SQLite store and the files beside it (``--out <data dir>/audit/audit.key``
    replaced the key with the records: the chain could not be verified again)."""
    from radserve.audit.seal import checkpoint_path, key_file_path
    from radserve.store.db import sqlite_file

    own = [
        (key_file_path(settings), "the audit key"),
        (checkpoint_path(settings), "the audit checkpoint file"),
    ]
    database = sqlite_file(settings.effective_database_url)
    if database is not None:
        own.append((database, "the SQLite store"))
        own += [
            (database.with_name(database.name + suffix), "a file of the SQLite store")
            for suffix in ("-wal", "-shm", "-journal", ".lock")
        ]
    target = out.resolve()
    for path, what in own:
        if target == path.resolve():
            raise click.BadParameter(
                f"{out} is {what}: write the export elsewhere", param_hint="'--out'"
            )

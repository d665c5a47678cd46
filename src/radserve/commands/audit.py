"""``radserve audit verify|export``: check the audit hash chain; write it out as JSONL."""

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
@CONFIG_OPTION
@DATA_DIR_OPTION
def verify(config_file: Path | None, data_dir: Path | None) -> None:
    """Recompute every record's hash; exit status 1 if any record was edited or deleted."""
    store = open_store(config_file, data_dir)
    try:
        report = store.verify_audit()
    finally:
        store.close()
    if report.ok:
        click.echo(
            f"audit chain OK: {report.records} record(s); "
            f"head seq {report.head_seq} hash {report.head_hash}"
        )
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
    store = open_store(config_file, data_dir)
    count, last_hash = 0, None
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(out, "w", encoding="utf-8") as handle:
            for record in store.iter_audit():
                handle.write(json.dumps(record.to_json(), sort_keys=True) + "\n")
                count, last_hash = count + 1, record.hash
            handle.flush()
            os.fsync(handle.fileno())
    finally:
        store.close()
    click.echo(f"exported {count} audit record(s) to {out}; last hash {last_hash or '-'}")

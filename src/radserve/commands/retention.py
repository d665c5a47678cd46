"""``radserve retention run [--dry-run]``: one pass of the retention policy
(``storage.*_retention_days``, radserve.service.retention) against a data dir's store,
with or without a running server (a pass is safe beside the server's own). Prints
counts and sizes only: no study, patient or path."""

from __future__ import annotations

import json
from pathlib import Path

import click

from radserve.commands.config import CONFIG_OPTION, DATA_DIR_OPTION


@click.group("retention")
def group() -> None:
    """What the data folder keeps: studies, received copies, results, model comparisons
    (storage.*_retention_days)."""


@group.command("run")
@click.option(
    "--dry-run", is_flag=True, help="Count what a pass would remove; remove nothing, audit nothing."
)
@click.option("--json", "as_json", is_flag=True, help="The pass as one JSON object.")
@CONFIG_OPTION
@DATA_DIR_OPTION
def run(dry_run: bool, as_json: bool, config_file: Path | None, data_dir: Path | None) -> None:
    """One pass of the retention policy: removes at most storage.retention_max_per_pass
    folders of each kind (sources, incoming, results, comparisons) and audits it as
    retention.swept."""
    from radserve.commands.keys import open_store
    from radserve.config import load_settings
    from radserve.service.retention import KINDS, SETTING_OF, Retention
    from radserve.store.store import read_by_command

    settings = load_settings(config_file, data_dir=data_dir)
    store = open_store(config_file, data_dir, create=False)  # no store: nothing to keep
    try:
        with read_by_command(store):
            done = Retention(settings.data_dir, settings.storage, store).sweep(dry_run=dry_run)
    finally:
        store.close()
    if as_json:
        click.echo(json.dumps(done.payload(), sort_keys=True))
        return
    storage = settings.storage
    for kind in KINDS:
        setting = SETTING_OF[kind]
        days = getattr(storage, setting)
        tally = done.removed[kind]
        if days is None:
            click.echo(f"{kind:9} kept for good (storage.{setting}: null)")
            continue
        verb = "would remove" if dry_run else "removed"
        click.echo(
            f"{kind:9} {verb} {tally.folders} folder(s), {tally.bytes / 2**20:.1f} MiB "
            f"(older than {days:g} days)"
        )
    if done.console_volumes:
        click.echo(f"          and {done.console_volumes} cached console volume(s) of them")
    for why, count in sorted(done.kept.items()):
        click.echo(f"kept      {count} old enough but {why.replace('_', ' ')}")
    if done.more:
        click.echo("more remain: run it again (a server's pass goes on by itself)")

"""``radserve outbox list|retry``: what waits for or failed delivery to the PACS and
the FHIR server, and re-arming it, against a data dir's store (no server needed; a
running server picks a re-armed row up at its next look, within 30 s)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from radserve.commands.config import CONFIG_OPTION, DATA_DIR_OPTION

if TYPE_CHECKING:
    from radserve.service.outbox import OutboxOps
    from radserve.store import Store


def _open(config_file: Path | None, data_dir: Path | None) -> tuple[Store, OutboxOps]:
    from radserve.config import load_settings
    from radserve.service.outbox import OutboxOps
    from radserve.store.audited import open_audited

    settings = load_settings(config_file, data_dir=data_dir)
    # a retry is audited: keyed like the server's; no store there: nothing to list or retry
    store, _trail = open_audited(settings, create=False)
    return store, OutboxOps(settings, store)


@click.group("outbox")
def group() -> None:
    """Deliveries of results to DICOM peers and the FHIR server: list, retry."""


@group.command("list")
@click.option(
    "--state",
    type=click.Choice(["pending", "sending", "committing", "sent", "failed_permanent"]),
    default=None,
    help="Only rows in this state.",
)
@click.option("--destination", default=None, help="Only rows for this destination.")
@click.option("--kind", type=click.Choice(["dicom", "fhir"]), default=None)
@click.option("--limit", type=click.IntRange(1, 100_000), default=1000, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@CONFIG_OPTION
@DATA_DIR_OPTION
def list_rows(
    state: str | None,
    destination: str | None,
    kind: str | None,
    limit: int,
    as_json: bool,
    config_file: Path | None,
    data_dir: Path | None,
) -> None:
    """Per destination: pending, retrying, failed; then the rows (oldest first)."""
    store, ops = _open(config_file, data_dir)
    try:
        statuses = ops.status()
        items = ops.items(state=state, destination=destination, kind=kind, limit=limit)
    finally:
        store.close()
    if as_json:
        for item in items:
            click.echo(
                json.dumps(
                    {
                        "id": item.id,
                        "kind": item.kind.value,
                        "destination": item.destination,
                        "state": item.state.value,
                        "job_id": item.job_id,
                        "sop_instance_uid": item.sop_instance_uid,
                        "attempts": item.attempts,
                        "next_attempt_at": item.next_attempt_at.isoformat(),
                        "last_error": item.last_error,
                        "created": item.created.isoformat(),
                    }
                )
            )
        return
    for st in statuses:
        click.echo(
            f"{st.kind.value} {st.destination}: {st.pending} pending ({st.retrying} retrying), "
            f"{st.sending} sending, {st.committing} awaiting commitment, "
            f"{st.failed_permanent} failed"
            + (f"; last error: {st.last_error}" if st.last_error else "")
        )
    click.echo(f"{'ID':>6}  {'KIND':<5}  {'DESTINATION':<16}  {'STATE':<16}  {'TRIES':>5}  ERROR")
    for item in items:
        click.echo(
            f"{item.id:>6}  {item.kind.value:<5}  {item.destination:<16}  "
            f"{item.state.value:<16}  {item.attempts:>5}  {item.last_error or '-'}"
        )


@group.command("retry")
@click.argument("ids", nargs=-1, type=int)
@click.option("--all-failed", is_flag=True, help="Every failed_permanent row (of --destination).")
@click.option("--destination", default=None, help="With --all-failed: only this one.")
@CONFIG_OPTION
@DATA_DIR_OPTION
def retry(
    ids: tuple[int, ...],
    all_failed: bool,
    destination: str | None,
    config_file: Path | None,
    data_dir: Path | None,
) -> None:
    """Send rows IDS again (failed or committing -> pending, or a pending one due now;
    a committing row is asked under a new storage commitment transaction); audited."""
    if not ids and not all_failed:
        raise click.UsageError("name the row ids to retry, or pass --all-failed")
    store, ops = _open(config_file, data_dir)
    try:
        chosen = list(ids)
        if all_failed:
            failed = ops.items(state="failed_permanent", destination=destination, limit=100_000)
            chosen += [item.id for item in failed if item.id not in chosen]
        for item_id in chosen:
            item = ops.retry(item_id, actor_key_id=None, client="cli")
            click.echo(f"row {item.id} ({item.kind.value} to {item.destination}): pending, due now")
    finally:
        store.close()
    if not chosen:
        click.echo("no failed row to retry")

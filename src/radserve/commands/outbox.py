"""``radserve outbox list|retry``: what waits for or failed delivery to the PACS and
the FHIR server, and re-arming it, against a data dir's store (no server needed; a
running server picks a re-armed row up at its next look, within 30 s)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from radserve.commands.config import CONFIG_OPTION, DATA_DIR_OPTION
from radserve.store.outbox import DestinationStatus, OutboxKind

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


# what --kind takes: every kind of row the outbox holds (and the list and
# ``GET /v1/ops/outbox?kind=`` show), critical-finding notices included
KINDS = [kind.value for kind in OutboxKind]


def _destination(statuses: list[DestinationStatus], name: str | None) -> str | None:
    """The destination ``--destination`` names, as the list shows it and
    ``GET /v1/ops/outbox?destination=`` matches it (the stored name). A critical receiver
    is stored as ``critical:<receiver>``: its bare name (as in ``critical.receivers``)
    matched nothing, silently; it names that receiver unless a destination has that name."""
    if name is None:
        return None
    known = {status.destination for status in statuses}
    receiver = f"critical:{name}"
    if name not in known and receiver in known:
        return receiver
    if name not in known:
        click.echo(
            f"no outbox rows for destination {name!r}; destinations: "
            + (", ".join(sorted(known)) or "none"),
            err=True,
        )
    return name


@click.group("outbox")
def group() -> None:
    """Deliveries to DICOM peers, the FHIR server and critical receivers: list, retry."""


@group.command("list")
@click.option(
    "--state",
    type=click.Choice(["pending", "sending", "committing", "sent", "failed_permanent"]),
    default=None,
    help="Only rows in this state.",
)
@click.option(
    "--destination",
    default=None,
    help="Only rows for this destination, as listed (a critical receiver: critical:NAME or NAME).",
)
@click.option("--kind", type=click.Choice(KINDS), default=None, help="Only rows of this kind.")
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
        destination = _destination(statuses, destination)
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
        # the summary lines of the destinations asked for, as the rows below: `--kind
        # critical` printed every PACS's line above an empty list
        if (kind and st.kind.value != kind) or (destination and st.destination != destination):
            continue
        click.echo(
            f"{st.kind.value} {st.destination}: {st.pending} pending ({st.retrying} retrying), "
            f"{st.sending} sending, {st.committing} awaiting commitment, "
            f"{st.failed_permanent} failed"
            + (f"; last error: {st.last_error}" if st.last_error else "")
        )
    click.echo(f"{'ID':>6}  {'KIND':<8}  {'DESTINATION':<16}  {'STATE':<16}  {'TRIES':>5}  ERROR")
    for item in items:
        click.echo(
            f"{item.id:>6}  {item.kind.value:<8}  {item.destination:<16}  "
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
            where = _destination(ops.status(), destination)
            failed = ops.items(state="failed_permanent", destination=where, limit=100_000)
            chosen += [item.id for item in failed if item.id not in chosen]
        for item_id in chosen:
            item = ops.retry(item_id, actor_key_id=None, client="cli")
            click.echo(f"row {item.id} ({item.kind.value} to {item.destination}): pending, due now")
    finally:
        store.close()
    if not chosen:
        click.echo("no failed row to retry")

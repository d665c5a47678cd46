"""``radserve keys create|revoke|list``: manage API keys in a data dir's store, offline."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from radserve.commands.config import CONFIG_OPTION, DATA_DIR_OPTION
from radserve.labels import label_problem, printable_label

if TYPE_CHECKING:
    from radserve.store import Store


def open_store(
    config_file: Path | None,
    data_dir: Path | None,
    *,
    create: bool = True,
    existing: bool = False,
) -> Store:
    """The store the server with these settings uses (no running server needed), with
    the audit key: records this command appends are keyed and checkpointed. A command
    that only reads passes ``create=False``: no store there is an error, not a new one.
    ``existing`` (a command that changes rows a store must already hold, ``keys
    revoke``): no store there is refused the same way, before anything is created (a
    mistyped --data-dir got a new folder, store and audit key, then "no API key")."""
    from sqlalchemy import exc as sa_exc

    from radserve.config import load_settings
    from radserve.store.audited import missing_data, open_audited
    from radserve.store.errors import NoDataError
    from radserve.store.store import unreadable

    settings = load_settings(config_file, data_dir=data_dir)
    if existing and (why := missing_data(settings)) is not None:
        raise NoDataError(
            f"no radserve store at {settings.data_dir} ({why}): nothing was created. A "
            "server's data folder is its --data-dir, RADSERVE_DATA_DIR or the config "
            "file's data_dir"
        )
    try:
        store, _trail = open_audited(settings, create=create)
    except sa_exc.DatabaseError as exc:  # a page past those the open read (the audit head)
        raise unreadable(settings.effective_database_url, exc) from exc
    return store


@click.group("keys")
def group() -> None:
    """API keys: create, revoke, list."""


def _label(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A key's name, site or submitter: one line of printable text (a newline in a name
    forged a row in ``keys list``)."""
    if value is None:
        return None
    problem = label_problem(value)
    if problem is not None:
        raise click.BadParameter(f"{problem}: give one line of printable text")
    return value


@group.command("create")
@click.option(
    "--role",
    type=click.Choice(["admin", "submit", "read"]),
    required=True,
    help="admin ⊇ submit ⊇ read.",
)
@click.option(
    "--name",
    default=None,
    callback=_label,
    help="A label for the key (default: ROLE key, e.g. admin key).",
)
@click.option(
    "--site", default=None, callback=_label, help="Site of the key (security.visibility: site)."
)
@click.option(
    "--submitter",
    default=None,
    callback=_label,
    help="Submitter of the key (security.visibility: own_submitter).",
)
@CONFIG_OPTION
@DATA_DIR_OPTION
def create(
    role: str,
    name: str | None,
    site: str | None,
    submitter: str | None,
    config_file: Path | None,
    data_dir: Path | None,
) -> None:
    """Create a key; the key itself is printed once, as the last line."""
    from radserve.store.store import read_by_command

    store = open_store(config_file, data_dir)
    try:
        with read_by_command(store):
            record, token = store.create_api_key(
                name=name or f"{role} key", role=role, site=site, submitter=submitter
            )
    finally:
        store.close()
    click.echo(f"created API key {record.id} (role {record.role}, name {record.name!r})", err=True)
    click.echo("store it now: it cannot be shown again", err=True)
    click.echo(token)


@group.command("revoke")
@click.argument("key_id")
@CONFIG_OPTION
@DATA_DIR_OPTION
def revoke(key_id: str, config_file: Path | None, data_dir: Path | None) -> None:
    """Revoke the key KEY_ID; a running server refuses it within 10 s (it remembers a
    key it has checked that long)."""
    from radserve.store.store import read_by_command

    store = open_store(config_file, data_dir, existing=True)
    try:
        with read_by_command(store):
            record = store.revoke_api_key(key_id)
    finally:
        store.close()
    click.echo(
        f"revoked API key {record.id} ({record.role}, {record.name!r}); a running server "
        "refuses it within 10 s"
    )


@group.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.option("--active", is_flag=True, help="Leave out revoked keys.")
@CONFIG_OPTION
@DATA_DIR_OPTION
def list_keys(as_json: bool, active: bool, config_file: Path | None, data_dir: Path | None) -> None:
    """List keys (ids, roles, names, dates; never the keys themselves)."""
    from radserve.store.store import read_by_command

    store = open_store(config_file, data_dir, create=False)
    try:
        with read_by_command(store):
            keys = store.list_api_keys(include_revoked=not active)
    finally:
        store.close()
    if as_json:
        for key in keys:
            revoked = key.revoked.isoformat() if key.revoked else None
            row = {
                "id": key.id,
                "name": key.name,
                "role": key.role,
                "created": key.created.isoformat(),
                "revoked": revoked,
                "site": key.site,
                "submitter": key.submitter,
            }
            click.echo(json.dumps(row))
        return
    click.echo(f"{'ID':<16}  {'ROLE':<6}  {'CREATED (UTC)':<19}  {'REVOKED (UTC)':<19}  NAME")
    for key in keys:
        revoked = key.revoked.strftime("%Y-%m-%d %H:%M:%S") if key.revoked else "-"
        created = key.created.strftime("%Y-%m-%d %H:%M:%S")
        name = printable_label(key.name)  # one stored before such names were refused
        click.echo(f"{key.id:<16}  {key.role:<6}  {created:<19}  {revoked:<19}  {name}")

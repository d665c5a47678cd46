"""``radserve console hash-password``: the scrypt hash of a local console user's password,
for ``console.users`` in the settings file (the settings never hold a clear password);
``radserve console users``: the local users the settings list, with role, site and
submitter (never their hashes)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from radserve.commands.config import CONFIG_OPTION


@click.group("console")
def group() -> None:
    """The web console: local users and their password hashes."""


def _label(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A user's site or submitter: one line of printable text, as a key's."""
    from radserve.labels import label_problem

    problem = None if value is None else label_problem(value)
    if problem is not None:
        raise click.BadParameter(f"{problem}: give one line of printable text")
    return value


def _yaml_text(value: str) -> str:
    """``value`` as a YAML scalar (a site such as ``no`` or ``1`` stays a string)."""
    return json.dumps(value, ensure_ascii=False)


@group.command("hash-password")
@click.option(
    "--stdin",
    "from_stdin",
    is_flag=True,
    help="Read the password from the first line of standard input (scripts) instead of "
    "asking twice at the terminal. Never pass a password as an argument: it would stay "
    "in shell history and the process list.",
)
@click.option("--username", default=None, help="Also print a console.users entry (YAML).")
@click.option(
    "--role",
    type=click.Choice(["read", "submit", "admin"]),
    default="read",
    show_default=True,
    help="The role of the printed console.users entry.",
)
@click.option(
    "--site",
    default=None,
    callback=_label,
    help="The user's site in the printed entry (security.visibility: site), as a key's.",
)
@click.option(
    "--submitter",
    default=None,
    callback=_label,
    help="The user's submitter in the printed entry (security.visibility: own_submitter).",
)
def hash_password_command(
    from_stdin: bool,
    username: str | None,
    role: str,
    site: str | None,
    submitter: str | None,
) -> None:
    """Print the password's hash (scrypt, N=2^15, r=8, p=1, a random 16-byte salt)."""
    from pydantic import ValidationError

    from radserve.config import ConsoleUser
    from radserve.passwords import MAX_LENGTH, MIN_LENGTH, hash_password

    if from_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = click.prompt(
            f"Password ({MIN_LENGTH}-{MAX_LENGTH} characters)",
            hide_input=True,
            confirmation_prompt=True,
            err=True,
        )
    try:
        encoded = hash_password(password)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    if username is None:
        if site is not None or submitter is not None:
            raise click.UsageError("--site and --submitter go into an entry: give --username")
        click.echo(encoded)
        return
    try:
        ConsoleUser(
            username=username,
            role=role,  # type: ignore[arg-type]
            password_hash=encoded,  # type: ignore[arg-type]
            site=site,
            submitter=submitter,
        )
    except ValidationError as exc:
        # the reason, not the last line of pydantic's text (its documentation link only)
        problem = exc.errors()[0]
        where = ".".join(str(part) for part in problem["loc"]) or "username"
        reason = problem["msg"].removeprefix("Value error, ")
        raise click.BadParameter(f"{where}: {reason}", param_hint="--username") from None
    click.echo("console:\n  users:")
    click.echo(f"    - username: {username}\n      role: {role}")
    if site is not None:
        click.echo(f"      site: {_yaml_text(site)}")
    if submitter is not None:
        click.echo(f"      submitter: {_yaml_text(submitter)}")
    click.echo(f"      password_hash: '{encoded}'")


@group.command("users")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@CONFIG_OPTION
def list_users(as_json: bool, config_file: Path | None) -> None:
    """List the local users of the settings (name, role, site, submitter; never the
    password hashes), as `radserve serve` with the same settings reads them."""
    from radserve.config import CONFIG_ENV, load_settings
    from radserve.labels import printable_label

    users = load_settings(config_file).console.users
    source = config_file if config_file is not None else os.environ.get(CONFIG_ENV) or None
    if as_json:
        for user in users:
            row = {
                "username": user.username,
                "role": user.role,
                "site": user.site,
                "submitter": user.submitter,
            }
            click.echo(json.dumps(row, ensure_ascii=False))
        return
    if not users and source is None:
        # what a first try gives: the users are in a file that neither command was given
        click.echo(
            f"no local users: no settings file given (--config FILE or ${CONFIG_ENV}); "
            "`radserve serve` reads console.users from the file it is given the same way"
        )
        return
    if not users:
        click.echo(f"no local users in {source} (console.users is empty)")
        return
    click.echo(f"{'USERNAME':<27}  {'ROLE':<6}  {'SITE':<20}  SUBMITTER")
    for user in users:
        site = printable_label(user.site) if user.site is not None else "-"
        submitter = printable_label(user.submitter) if user.submitter is not None else "-"
        click.echo(f"{user.username:<27}  {user.role:<6}  {site:<20}  {submitter}")

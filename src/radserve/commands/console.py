"""``radserve console hash-password``: the scrypt hash of a local console user's password,
for ``console.users`` in the settings file (the settings never hold a clear password)."""

from __future__ import annotations

import sys

import click


@click.group("console")
def group() -> None:
    """The web console: local users' password hashes."""


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
def hash_password_command(from_stdin: bool, username: str | None, role: str) -> None:
    """Print the password's hash (scrypt, N=2^15, r=8, p=1, a random 16-byte salt)."""
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
        click.echo(encoded)
        return
    try:
        ConsoleUser(username=username, role=role, password_hash=encoded)  # type: ignore[arg-type]
    except ValueError as exc:
        raise click.BadParameter(str(exc).splitlines()[-1], param_hint="--username") from None
    click.echo("console:\n  users:")
    click.echo(f"    - username: {username}\n      role: {role}\n      password_hash: '{encoded}'")

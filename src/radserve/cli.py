"""``radserve`` command line: one click group; each subcommand lives in ``radserve.commands``."""

from __future__ import annotations

import importlib
import logging
import sys

import click

from radserve import __version__
from radserve.error_table import lookup
from radserve.errors import RadserveError

# command name = module name in radserve.commands -> attribute holding the click command
# (or group)
_COMMANDS: tuple[tuple[str, str], ...] = (
    ("run", "command"),
    ("demo", "command"),
    ("models", "group"),
    ("phantom", "command"),
    ("evaluate", "command"),
    ("bench", "command"),
    ("keys", "group"),
    ("outbox", "group"),
    ("retention", "group"),
    ("audit", "group"),
    ("export", "command"),
    ("config", "group"),
    ("gateway", "group"),
    ("serve", "command"),
    ("doctor", "command"),
    ("plan", "command"),
    ("console", "group"),
)


class _LazyCommands(click.Group):
    """The subcommands, each imported when it is looked up (click's lazy group pattern).

    Importing every command module at start made ``radserve run`` load what only other
    commands use (the gateway's pynetdicom, the store's SQLAlchemy, highdicom): 180.6
    MiB resident after imports against 105.3 MiB with the run command alone, measured
    in fresh processes (docs/benchmarking.md). ``radserve --help`` still imports them
    all, for their one-line help.
    """

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *(name for name, _ in _COMMANDS)})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        attr = dict(_COMMANDS).get(cmd_name)
        if attr is None or cmd_name in self.commands:
            return super().get_command(ctx, cmd_name)
        command: click.Command = getattr(
            importlib.import_module(f"radserve.commands.{cmd_name}"), attr
        )
        self.add_command(command, cmd_name)
        return command


@click.group(cls=_LazyCommands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="radserve")
@click.option("-v", "--verbose", count=True, help="More log output (-v info, -vv debug).")
def cli(verbose: int) -> None:
    """radserve: on-premise radiology AI inference."""
    from radserve.security.logs import configure_logging

    # plain text for a terminal; library warnings and header values redacted as in the server
    configure_logging(logging.WARNING - 10 * min(verbose, 2), json_lines=False)


def main() -> None:
    """Entry point: RadserveErrors become one clear line and the exit status of their
    row in :mod:`radserve.error_table` (2), not a traceback."""
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except RadserveError as exc:
        from radserve.security.logs import redact_names

        click.secho(f"error [{exc.code}]: {redact_names(exc.message)}", fg="red", err=True)
        sys.exit(lookup(exc).exit)

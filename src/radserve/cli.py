"""``radserve`` command line: one click group; each subcommand lives in ``radserve.commands``."""

from __future__ import annotations

import importlib
import logging
import sys

import click

from radserve import __version__
from radserve.errors import RadserveError

# module name in radserve.commands -> attribute holding the click command (or group)
_COMMANDS: tuple[tuple[str, str], ...] = (
    ("run", "command"),
    ("demo", "command"),
    ("models", "group"),
    ("phantom", "command"),
    ("evaluate", "command"),
    ("bench", "command"),
    ("keys", "group"),
    ("audit", "group"),
    ("config", "group"),
    ("gateway", "group"),
    ("serve", "command"),
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="radserve")
@click.option("-v", "--verbose", count=True, help="More log output (-v info, -vv debug).")
def cli(verbose: int) -> None:
    """radserve: on-premise radiology AI inference."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


for _module, _attr in _COMMANDS:
    cli.add_command(getattr(importlib.import_module(f"radserve.commands.{_module}"), _attr))


def main() -> None:
    """Entry point: RadserveErrors become one clear line and exit status 2, not a traceback."""
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except RadserveError as exc:
        click.secho(f"error [{exc.code}]: {exc.message}", fg="red", err=True)
        sys.exit(2)

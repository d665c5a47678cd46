"""``radserve config show``: the effective configuration, secrets masked."""

from __future__ import annotations

from pathlib import Path

import click

# the pipeline `radserve evaluate` and `radserve models build-variants` use by default
DEFAULT_PIPELINE = "ct-chest-abdomen"

CONFIG_OPTION = click.option(
    "--config",
    "config_file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="YAML or TOML settings file (default: $RADSERVE_CONFIG).",
)
DATA_DIR_OPTION = click.option(
    "--data-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Data folder (overrides the config file and RADSERVE_DATA_DIR).",
)


@click.group("config")
def group() -> None:
    """Configuration: show the effective settings."""


@group.command("show")
@CONFIG_OPTION
@DATA_DIR_OPTION
def show(config_file: Path | None, data_dir: Path | None) -> None:
    """Print the settings in effect (defaults < file < environment < flags) as YAML."""
    from radserve.config import load_settings

    settings = load_settings(config_file, data_dir=data_dir)
    click.echo(settings.to_yaml(), nl=False)

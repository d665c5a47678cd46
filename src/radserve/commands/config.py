"""``radserve config show``: the effective configuration, secrets masked; and the
commands' shared options and output-path checks."""

from __future__ import annotations

import contextlib
import tempfile
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


def check_output_file(path: Path, option: str, *, make_parents: bool = False) -> None:
    """Fail fast, as a one-line usage error, when ``path`` cannot be written as a file:
    a folder, a parent that is missing (``make_parents``: the nearest existing one must
    take new folders), or a place this process may not write. ``radserve plan --plot
    /sys/tat.svg`` and ``radserve bench --json <a folder>`` ended in a traceback after
    the whole simulation or run. Leaves nothing behind (an existing file is opened for
    appending, unchanged; a new one is removed again)."""
    hint = f"'{option}'"
    if path.is_dir():
        raise click.BadParameter(f"{path} is a folder; give a file path", param_hint=hint)
    parent = path.parent
    if not parent.is_dir():
        if parent.exists():  # said "folder X does not exist" of a file
            raise click.BadParameter(f"{parent} is a file, not a folder", param_hint=hint)
        if not make_parents:
            raise click.BadParameter(f"folder {parent} does not exist", param_hint=hint)
        _check_new_folder(parent, hint)
        return
    existed = path.exists() or path.is_symlink()
    try:
        with open(path, "ab"):
            pass
    except OSError as exc:
        raise click.BadParameter(
            f"cannot write {path}: {exc.strerror or type(exc).__name__}", param_hint=hint
        ) from None
    if not existed:
        with contextlib.suppress(OSError):
            path.unlink()


def check_output_folder(path: Path, option: str) -> None:
    """Fail fast, as a one-line usage error, when ``path`` cannot be a folder files are
    written into: an existing file, or a place this process may not write (missing
    folders are made later: the nearest existing one must take them)."""
    hint = f"'{option}'"
    if path.exists() and not path.is_dir():
        raise click.BadParameter(f"{path} is a file, not a folder", param_hint=hint)
    _check_new_folder(path, hint)


def _check_new_folder(folder: Path, hint: str) -> None:
    """``folder``, or its nearest existing ancestor, takes a new file (tried for real:
    permissions alone say yes to root on a read-only or virtual file system)."""
    existing = folder.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise click.BadParameter(f"{existing} is a file, not a folder", param_hint=hint)
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        raise click.BadParameter(
            f"cannot write in {existing}: {exc.strerror or type(exc).__name__}", param_hint=hint
        ) from None

"""``radserve models``: what is installed and which precision variants may serve."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console
from rich.table import Table


@click.group("models")
def group() -> None:
    """Model bundles: list, build precision variants."""


@group.command("list")
@click.option(
    "--models-dir",
    type=click.Path(path_type=Path, file_okay=False),
    multiple=True,
    help="Extra bundle roots, searched before the bundled models.",
)
def list_models(models_dir: tuple[Path, ...]) -> None:
    """List model bundles, their labels and servable precisions."""
    from radserve.models.registry import ModelRegistry, bundled_model_dir

    registry = ModelRegistry([*models_dir, bundled_model_dir()])
    table = Table(title="Model bundles")
    for column in ("model", "version", "task", "input", "labels", "servable", "not servable"):
        table.add_column(column)
    for name in registry.names():
        for version in registry.versions(name):
            bundle = registry.get(name, version)
            spec = bundle.spec
            servable = bundle.available_precisions()
            refused = [
                f"{p}: {bundle.rejection(p)}"
                for p in spec.files
                if p not in servable and bundle.rejection(p)
            ]
            table.add_row(
                name,
                version,
                spec.task,
                f"{spec.input.mode} @ {spec.input.spacing[1]:g}x{spec.input.spacing[2]:g} mm",
                ", ".join(label.name for label in spec.labels),
                ", ".join(servable),
                "\n".join(refused),
            )
    Console().print(table)


def _add_variant_commands() -> None:
    from radserve.commands import variants

    group.add_command(variants.command)


_add_variant_commands()

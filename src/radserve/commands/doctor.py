"""``radserve doctor``: can this host serve? A table by default, ``--json`` for machines;
exit status 1 when a check blocks serving (``radserve serve`` runs the same checks)."""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from radserve.commands._console import table_console
from radserve.commands.config import CONFIG_OPTION, DATA_DIR_OPTION


@click.command("doctor")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--no-ports", is_flag=True, help="Skip the port checks (server running).")
@click.option(
    "--sessions",
    "load_sessions",
    is_flag=True,
    help="Load the default pipeline's models and report each session's memory.",
)
@CONFIG_OPTION
@DATA_DIR_OPTION
def command(
    as_json: bool,
    no_ports: bool,
    load_sessions: bool,
    config_file: Path | None,
    data_dir: Path | None,
) -> None:
    """Check versions, providers, bundles' requirements, disk, database, ports, clock."""
    from radserve.config import load_settings
    from radserve.lifecycle.doctor import blocking, run_doctor

    settings = load_settings(config_file, data_dir=data_dir)
    sessions = served_sessions(settings) if load_sessions else []
    models, providers = served_by(settings)
    checks = run_doctor(
        settings,
        serving=models,
        check_ports=not no_ports,
        sessions=sessions,
        providers=providers,
    )
    if as_json:
        click.echo(json.dumps([c.as_json() for c in checks], indent=2))
    else:
        table = Table(title="radserve doctor")
        for column in ("check", "status", "detail"):
            table.add_column(column)
        colour = {"ok": "green", "warn": "yellow", "fail": "red"}
        for c in checks:
            mark = f"[{colour[c.status]}]{c.status}{' (blocks)' if c.blocking else ''}[/]"
            table.add_row(c.name, mark, c.detail)
        table_console().print(table)
    taken = ports_in_use(checks)
    if taken:
        click.echo(
            f"note: {' and '.join(taken)} in use, perhaps by this host's running `radserve "
            "serve`: `radserve doctor --no-ports` checks the rest, and `GET /v1/ops/doctor` "
            "(admin key) asks that server",
            err=True,
        )
    if blocking(checks):
        raise SystemExit(1)


def ports_in_use(checks: Sequence[Any]) -> list[str]:
    """The addresses (``host:port``) of the port checks that failed because something
    already listens there (a running server, most often), not for another reason."""
    in_use = os.strerror(errno.EADDRINUSE)
    return [
        c.detail.partition(" not bindable")[0]
        for c in checks
        if c.name.endswith(" port") and c.status == "fail" and c.detail.endswith(in_use)
    ]


def served_by(settings: object) -> tuple[set[tuple[str, str]], tuple[str, ...]]:
    """The (model, version) pairs the default pipeline would serve, and the execution
    providers it would serve them with (``Catalog.serving_providers``), which doctor
    checks each bundle's ``requires:`` against: from one catalog, as choosing its runtime
    probes the providers. Empty where unknown (``serve`` then says why; no providers:
    the host's)."""
    from radserve.errors import RadserveError
    from radserve.service.catalog import Catalog

    try:
        catalog = Catalog.from_settings(settings)  # type: ignore[arg-type]
    except RadserveError:
        return set(), ()
    try:
        models = set(catalog.resolve().model_versions.items())
    except RadserveError:
        models = set()
    return models, catalog.serving_providers


def served_sessions(settings: object) -> list[Any]:
    """Load each model the default pipeline serves, at its precision, as the server
    would (same runtime choice); the loaded sessions."""
    from radserve.service.catalog import Catalog

    catalog = Catalog.from_settings(settings)  # type: ignore[arg-type]
    resolved = catalog.resolve()
    for step in resolved.spec.steps:
        bundle = catalog.registry.get(step.model, step.version)
        catalog.sessions.get(bundle, resolved.precision)
    return catalog.sessions.loaded()

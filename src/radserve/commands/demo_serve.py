"""``radserve demo --serve``: after the demo, the web console on a local server that
already holds the demo's study, so it can be looked at without any setup.

The server is ``radserve serve``'s own start-up (:func:`radserve.commands.serve.run_server`)
on a data dir under the demo's ``--out`` (SQLite unless the settings name a database;
the gateway only if the settings enable it). The demo makes an admin API key, prints it
once (a local demo: anyone who can read the terminal can use it) and submits the study
over HTTP through ``POST /v1/studies``, the same intake any client uses.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import click

logger = logging.getLogger(__name__)
_WILDCARD = {"0.0.0.0": "127.0.0.1", "::": "[::1]", "[::]": "[::1]"}


def serve_demo(out_dir: Path, study_dir: Path, host: str, port: int) -> None:
    """Serve the console on ``host:port`` (0: any free port) until SIGINT/SIGTERM."""
    from radserve.commands.serve import run_server
    from radserve.config import load_settings
    from radserve.store.audited import open_audited

    settings = load_settings(data_dir=out_dir / "server", server__host=host, server__port=port)
    if settings.server.tls is not None:
        raise click.ClickException(
            "demo --serve serves plain HTTP on a local address: unset server.tls "
            "(or use `radserve serve` with your settings)"
        )
    if not settings.console.enabled:
        raise click.ClickException("demo --serve shows the web console: console.enabled is off")
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    store, _trail = open_audited(settings, upgrade=True)
    try:
        _record, token = store.create_api_key(name="demo admin key", role="admin")
    finally:
        store.close()

    def started(url: str) -> None:
        local = url
        for wildcard, loopback in _WILDCARD.items():
            local = local.replace(f"//{wildcard}:", f"//{loopback}:")
        # the upload waits for the server's event loop, so not on it
        threading.Thread(
            target=_submit_and_announce, args=(local, token, study_dir), daemon=True
        ).start()

    click.echo(f"serving the demo from {settings.data_dir} (Ctrl-C stops it)")
    run_server(settings, cpu_workers=1, on_started=started)
    click.echo("demo server stopped")


def _submit_and_announce(url: str, token: str, study_dir: Path) -> None:
    """Submit the demo study, then print the console's address and the key."""
    import httpx

    paths = sorted(p for p in study_dir.iterdir() if p.is_file())
    try:
        files = [("files", (p.name, p.read_bytes(), "application/dicom")) for p in paths]
        answer = httpx.post(
            f"{url}/v1/studies",
            files=files,
            headers={"Authorization": f"Bearer {token}"},
            timeout=600,
        )
        if answer.status_code in (200, 202):
            click.echo(f"demo study submitted: job {answer.json()['id']} (see the worklist)")
        else:
            click.echo(f"demo study refused ({answer.status_code}): {answer.text}", err=True)
    except (OSError, httpx.HTTPError) as exc:
        click.echo(f"demo study not submitted: {exc}", err=True)
    click.echo("local demo: this admin key is shown once and is not protected; do not reuse it")
    click.echo(f"console: {url}/  (sign in with key {token})")

"""``radserve serve``: the HTTP API, the scheduler and its workers (and the DICOM gateway
when ``gateway.enabled``) in one process.

One process on purpose: the scheduler, its job table and the in-memory job cache live
in it, so it is not forked into several uvicorn workers (two schedulers over one store
would both resume the same unfinished jobs). Status reads are served from memory, so
one event loop answers them fast enough (see ``python -m radserve.bench.load``).
"""

from __future__ import annotations

import logging
from pathlib import Path

import click

from radserve.commands.config import CONFIG_OPTION, DATA_DIR_OPTION


@click.command("serve")
@click.option("--host", default=None, help="Address to listen on (default: server.host).")
@click.option(
    "--port", type=click.IntRange(0, 65535), default=None, help="Port (default: server.port)."
)
@CONFIG_OPTION
@DATA_DIR_OPTION
@click.option(
    "--log-level",
    default="info",
    show_default=True,
    type=click.Choice(["debug", "info", "warning", "error"]),
)
@click.option("--plain-logs", is_flag=True, help="Human-readable logs instead of JSON lines.")
@click.option(
    "--access-log", is_flag=True, help="Log every HTTP request (off: metrics count them)."
)
@click.option(
    "--cpu-workers",
    default=2,
    show_default=True,
    type=click.IntRange(1, 64),
    help="CPU-pool threads (ingest, post-processing, reports).",
)
@click.option(
    "--worker-nice",
    default=5,
    show_default=True,
    type=click.IntRange(0, 19),
    help="Lower the inference workers' CPU priority by this much (Linux nice), so the "
    "API stays responsive while studies are processed on a small host; 0: same priority.",
)
def command(
    host: str | None,
    port: int | None,
    config_file: Path | None,
    data_dir: Path | None,
    log_level: str,
    plain_logs: bool,
    access_log: bool,
    cpu_workers: int,
    worker_nice: int,
) -> None:
    """Serve the inference API until interrupted (SIGINT/SIGTERM stop it cleanly)."""
    import uvicorn

    from radserve.api import create_app
    from radserve.config import load_settings
    from radserve.service import Service
    from radserve.service.logs import configure_logging

    configure_logging(getattr(logging, log_level.upper()), json_lines=not plain_logs)
    settings = load_settings(config_file, data_dir=data_dir, server__host=host, server__port=port)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    service = Service(settings, cpu_workers=cpu_workers, worker_nice=worker_nice)
    app = create_app(service)
    config = uvicorn.Config(
        app,
        host=settings.server.host,
        port=settings.server.port,
        log_config=None,
        access_log=access_log,
        timeout_keep_alive=30,
        server_header=False,
    )
    logging.getLogger(__name__).info(
        "radserve serving on http://%s:%d (data in %s)",
        settings.server.host,
        settings.server.port,
        settings.data_dir,
    )
    uvicorn.Server(config).run()

"""``radserve serve``: the HTTP API, the scheduler and its workers (and the DICOM gateway
when ``gateway.enabled``) in one process. HTTPS when ``server.tls`` has a certificate
(TLS 1.2+; with ``server.tls.ca``, API clients need a certificate signed by it).

One process on purpose: the scheduler, its job table and the in-memory job cache live
in it, so it is not forked into several uvicorn workers (two schedulers over one store
would both resume the same unfinished jobs). Status reads are served from memory, so
one event loop answers them fast enough (see ``python -m radserve.bench.load``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from radserve.commands.config import CONFIG_OPTION, DATA_DIR_OPTION

if TYPE_CHECKING:
    from radserve.config import Settings


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
    from radserve.config import load_settings
    from radserve.service.logs import configure_logging

    configure_logging(getattr(logging, log_level.upper()), json_lines=not plain_logs)
    settings = load_settings(config_file, data_dir=data_dir, server__host=host, server__port=port)
    run_server(settings, cpu_workers=cpu_workers, worker_nice=worker_nice, access_log=access_log)


def run_server(
    settings: Settings,
    *,
    cpu_workers: int = 2,
    worker_nice: int = 5,
    access_log: bool = False,
    on_started: Callable[[str], None] | None = None,
) -> None:
    """Start the service, the API and the console on ``settings`` and serve until
    SIGINT/SIGTERM (a clean stop then exits 0; a second Ctrl-C forces it). One start-up
    path for ``radserve serve`` and ``radserve demo --serve``: ``on_started`` gets the
    base URL once the socket is bound (the real port when ``server.port`` is 0), on the
    event loop, so it must not block."""
    import signal
    from types import FrameType

    import uvicorn

    from radserve.api import create_app
    from radserve.api.http_limits import BoundedHttpToolsProtocol
    from radserve.console import install as install_console
    from radserve.service import Service
    from radserve.tls import server_context

    settings.data_dir.mkdir(parents=True, exist_ok=True)
    # HTTPS: the context is built (and its files read) before anything starts
    https = None if settings.server.tls is None else server_context(settings.server.tls, "HTTPS")
    scheme = "http" if https is None else "https"
    service = Service(settings, cpu_workers=cpu_workers, worker_nice=worker_nice)
    _doctor(settings, service)
    app = create_app(service)
    install_console(app, service)  # the web console at / (console.enabled)
    config = uvicorn.Config(
        app,
        http=BoundedHttpToolsProtocol,  # a bound on request heads (uvicorn's has none)
        host=settings.server.host,
        port=settings.server.port,
        log_config=None,
        access_log=access_log,
        timeout_keep_alive=30,
        server_header=False,
        ssl_context_factory=None if https is None else (lambda _config, _default: https),
    )
    log = logging.getLogger(__name__)

    class _Server(uvicorn.Server):
        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            port = int(self.servers[0].sockets[0].getsockname()[1])
            url = f"{scheme}://{settings.server.host}:{port}"
            log.info("radserve serving on %s (data in %s)", url, settings.data_dir)
            if settings.console.enabled:
                # a log record, not a plain line: stderr is the server's (JSON) log stream
                log.info("console: %s/", url)
            if on_started is not None:
                on_started(url)

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            # uvicorn's own re-raises the signal after the clean stop (exit -15 / 130)
            if self.should_exit and sig == signal.SIGINT:
                self.force_exit = True
            self.should_exit = True

    _Server(config).run()


def _doctor(settings: Any, service: Any) -> None:
    """``radserve doctor`` before anything binds: refuse to start, saying why, when a
    check blocks serving (a model the default pipeline serves whose requirements this
    host does not meet, a changed installed bundle, no disk, no database, a taken port)."""
    from radserve.errors import RadserveError
    from radserve.lifecycle.doctor import blocking, run_doctor

    try:
        serving = set(service.catalog.resolve().model_versions.items())
    except RadserveError:
        serving = set()
    failed = blocking(run_doctor(settings, serving=serving))
    for check in failed:
        click.secho(f"doctor: {check.name}: {check.detail}", fg="red", err=True)
    if failed:
        service.store.close()
        raise click.ClickException("radserve doctor found problems that block serving")

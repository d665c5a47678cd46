"""``radserve serve``: the HTTP API, the scheduler and its workers (and the DICOM gateway
when ``gateway.enabled``) in one process. HTTPS when ``server.tls`` has a certificate
(TLS 1.2+; with ``server.tls.ca``, API clients need a certificate signed by it).

One serving process: the scheduler, its job table and the in-memory job cache live in
it, so it is not forked into several uvicorn workers (two schedulers over one store
would both resume the same unfinished jobs). With API reader processes
(``server.read_processes``: "auto", the default, is 2 on a host with >= 2 cores) it binds
the public socket and hands it to that many API reader processes
(:mod:`radserve.api.reader`), which answer job status and report reads without sharing
the inference's GIL and forward everything else to this process, which then listens on
a private Unix socket only.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from radserve.commands.config import CONFIG_OPTION, DATA_DIR_OPTION

if TYPE_CHECKING:
    import socket

    from radserve.config import Settings
    from radserve.store.data_dir_lock import ServeLock


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
    from radserve.config import CONFIG_ENV, load_settings
    from radserve.service.logs import configure_logging

    configure_logging(getattr(logging, log_level.upper()), json_lines=not plain_logs)
    settings = load_settings(config_file, data_dir=data_dir, server__host=host, server__port=port)
    if config_file is None and os.environ.get(CONFIG_ENV):
        config_file = Path(os.environ[CONFIG_ENV])
    run_server(
        settings,
        cpu_workers=cpu_workers,
        worker_nice=worker_nice,
        access_log=access_log,
        config_file=config_file,
    )


def _raise_open_files_limit() -> None:
    """The soft limit of open files up to the hard one (1024 under systemd's default): an
    upload's files past its in-memory budget each hold a temporary file until the request
    ends (:mod:`radserve.spool`), and a study has thousands of slices."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if soft == resource.RLIM_INFINITY or soft >= target:
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        logging.getLogger(__name__).warning("could not raise the open-files limit %d", soft)


def run_server(
    settings: Settings,
    *,
    cpu_workers: int = 2,
    worker_nice: int = 5,
    access_log: bool = False,
    on_started: Callable[[str], None] | None = None,
    config_file: Path | None = None,
) -> None:
    """Start the service, the API and the console on ``settings`` and serve until
    SIGINT/SIGTERM (a clean stop then exits 0; a second Ctrl-C forces it), or until a newer
    radserve migrates the database (a clean stop, then :class:`SchemaChangedError`). One start-up
    path for ``radserve serve`` and ``radserve demo --serve``: ``on_started`` gets the
    base URL once the socket is bound (the real port when ``server.port`` is 0), on the
    event loop, so it must not block.

    On a store that is not shared (SQLite, ``outbox.replicas`` 1) it holds the store's
    serving lock while it runs (:mod:`radserve.store.data_dir_lock`): a second server on
    the same data dir refuses at once (``data_dir_in_use``, exit 2) instead of claiming
    this one's jobs."""
    _make_data_dir(settings.data_dir)
    lock = hold_store(settings)
    try:
        _serve(
            settings,
            cpu_workers=cpu_workers,
            worker_nice=worker_nice,
            access_log=access_log,
            on_started=on_started,
            config_file=config_file,
        )
    finally:
        if lock is not None:
            lock.release()


def _make_data_dir(folder: Path) -> None:
    """The data dir, created if need be; one line naming it if it cannot be."""
    import errno

    from radserve.store.errors import StoreError

    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        read_only = exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM)
        why = "it is on a read-only file system or not writable" if read_only else exc.strerror
        raise StoreError(f"cannot create the data dir {folder}: {why}") from exc


def hold_store(settings: Settings) -> ServeLock | None:
    """The serving lock of ``settings``' store where it is not shared (a SQLite file and
    ``outbox.replicas`` 1: this server owns every unfinished job); None where it is
    (PostgreSQL, or replicas whose job leases share the jobs)."""
    from radserve.store.data_dir_lock import acquire
    from radserve.store.db import sqlite_file

    database = sqlite_file(settings.effective_database_url)
    if database is None or settings.outbox.replicas > 1:
        return None
    return acquire(database, data_dir=settings.data_dir)


def _serve(
    settings: Settings,
    *,
    cpu_workers: int,
    worker_nice: int,
    access_log: bool,
    on_started: Callable[[str], None] | None,
    config_file: Path | None,
) -> None:
    """:func:`run_server` once the store is held."""
    import asyncio
    from types import FrameType

    import uvicorn
    from sqlalchemy import exc as sa_exc

    from radserve.api import create_app
    from radserve.api.http_limits import forwarded_trust, uvicorn_protocols
    from radserve.api.https_port import public_protocols
    from radserve.api.reader import CleanStopServer
    from radserve.console import install as install_console
    from radserve.service import Service
    from radserve.store.store import unreadable
    from radserve.tls import server_context

    _raise_open_files_limit()
    # HTTPS: the context is built (and its files read) before anything starts
    https = None if settings.server.tls is None else server_context(settings.server.tls, "HTTPS")
    scheme = "http" if https is None else "https"
    try:
        service = Service(settings, cpu_workers=cpu_workers, worker_nice=worker_nice)
    except sa_exc.DatabaseError as exc:  # a corrupt page past those the open read
        raise unreadable(settings.effective_database_url, exc) from exc
    _doctor(settings, service)
    app = create_app(service)
    install_console(app, service, config_file)  # the web console at / (console.enabled)
    common: dict[str, Any] = {
        # bounds on request heads' size and time, bodies' rate (uvicorn's has none)
        **uvicorn_protocols(settings.server),
        "log_config": None,
        "access_log": access_log,
        "timeout_keep_alive": 30,
        "server_header": False,
    }
    count = settings.server.reader_count()
    readers = _Readers.of(settings, service, access_log, count) if count else None
    sockets: list[socket.socket] | None = None
    if readers is None:
        # HTTPS: a plain socket for uvicorn, TLS (and plain HTTP answered 400) by the
        # protocol (radserve.api.https_port); bound here, where uvicorn's "running on"
        # line can say https://
        if settings.server.tls is not None:
            host, port, tls = settings.server.host, settings.server.port, settings.server.tls
            sockets = [bind_public_socket(host, port, cert=tls.cert)]
        config = uvicorn.Config(
            app,
            host=settings.server.host,
            port=settings.server.port,
            **forwarded_trust(settings.server),
            **{**common, **public_protocols(settings.server, https)},
        )
    else:  # the readers' upstream: they replace any client's X-Forwarded-* with what they
        # saw (radserve.api.proxy), and only this user reaches the socket (a 0700 folder)
        config = uvicorn.Config(
            app, uds=readers.spec.socket_path, forwarded_allow_ips="*", **common
        )
    log = logging.getLogger(__name__)

    class _Server(CleanStopServer):
        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            if readers is None:
                port = int(self.servers[0].sockets[0].getsockname()[1])
            else:
                port = readers.start()
            url = f"{scheme}://{settings.server.host}:{port}"
            log.info("radserve serving on %s (data in %s)", url, settings.data_dir)
            if settings.console.enabled:
                # a log record, not a plain line: stderr is the server's (JSON) log stream
                log.info("console: %s/", url)
            if on_started is not None:
                on_started(url)

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            # a Ctrl-C reaches the readers too: they stop, and are not started again
            if readers is not None and readers.pool is not None:
                readers.pool.stopping()
            super().handle_exit(sig, frame)

        async def shutdown(self, sockets: Any = None) -> None:
            if readers is not None:  # no new reads or forwarded requests first
                await asyncio.to_thread(readers.stop)
            await super().shutdown(sockets)

    server = _Server(config)
    stopped_for: list[str] = []

    def stop_for(why: str) -> None:  # from the lease keeper's thread: uvicorn polls it
        stopped_for.append(why)
        server.should_exit = True

    # a newer radserve migrated the database beneath it (radserve.service.schema_watch):
    # a clean stop, then the start's one line and exit 2
    service.stop_requested = stop_for
    try:
        server.run(sockets=sockets)
    finally:
        if readers is not None:
            readers.close()
    if stopped_for:
        from radserve.service.schema_watch import SchemaChangedError

        raise SchemaChangedError(stopped_for[0])


class _Readers:
    """The public socket, the job snapshot and the reader processes of one server."""

    def __init__(
        self, settings: Settings, service: Any, spec: Any, run_dir: Path, count: int
    ) -> None:
        from radserve.api.job_snapshot import SnapshotWriter

        self.settings = settings
        self.count = count
        self.service = service
        self.spec = spec
        self.run_dir = run_dir
        tls = settings.server.tls
        self.sock = bind_public_socket(
            settings.server.host, settings.server.port, cert=None if tls is None else tls.cert
        )
        self.snapshot = SnapshotWriter(service.jobs, service.cache, spec.snapshot_path)
        self.pool: Any = None

    @classmethod
    def of(cls, settings: Settings, service: Any, access_log: bool, count: int) -> _Readers:
        import os
        import tempfile

        from radserve.api.reader import ReaderSpec
        from radserve.security.logs import JsonFormatter

        # a private folder (0700) for this process's socket and the job snapshot
        run_dir = Path(tempfile.mkdtemp(prefix=f"radserve-api-{os.getpid()}-"))
        remove_stale_run_dirs(run_dir.parent)
        root = logging.getLogger()
        spec = ReaderSpec(
            settings,
            socket_path=str(run_dir / "api.sock"),
            snapshot_path=run_dir / "jobs.snapshot",
            log_level=root.level,
            json_logs=any(isinstance(h.formatter, JsonFormatter) for h in root.handlers),
            access_log=access_log,
        )
        return cls(settings, service, spec, run_dir, count)

    def start(self) -> int:
        """Publish the jobs, start the readers; the public port."""
        from radserve.api.reader_pool import ReaderPool, metrics_sink

        self.snapshot.start()
        self.pool = ReaderPool(self.spec, self.sock, self.count, metrics_sink(self.service.metrics))
        self.pool.start()
        self.service.metrics.processes.add(self.pool.processes)
        logging.getLogger(__name__).info("%d API reader processes started", self.count)
        return int(self.sock.getsockname()[1])

    def stop(self) -> None:
        if self.pool is not None:
            self.pool.stop()
        self.snapshot.stop()

    def close(self) -> None:
        import shutil

        self.sock.close()
        shutil.rmtree(self.run_dir, ignore_errors=True)


def _doctor(settings: Any, service: Any) -> None:
    """``radserve doctor`` before anything binds: refuse to start, saying why, when a
    check blocks serving (a model the default pipeline serves whose requirements this
    host does not meet, a changed installed bundle, no disk, no database, a taken port)."""
    from radserve.commands.doctor import ports_in_use
    from radserve.errors import RadserveError
    from radserve.lifecycle.doctor import blocking, run_doctor

    try:
        serving = set(service.catalog.resolve().model_versions.items())
    except RadserveError:
        serving = set()
    providers = service.catalog.serving_providers
    failed = blocking(run_doctor(settings, serving=serving, providers=providers))
    for check in failed:
        click.secho(f"doctor: {check.name}: {check.detail}", fg="red", err=True)
    taken = ports_in_use(failed)
    if taken:
        click.echo(
            f"note: {' and '.join(taken)} in use: is a radserve server already running on "
            "this host? Stop it, or start this one on other ports (--port, gateway.port)",
            err=True,
        )
    if failed:
        service.store.close()
        raise click.ClickException("radserve doctor found problems that block serving")


def bind_public_socket(host: str, port: int, *, cert: Path | None = None) -> socket.socket:
    """The public listening socket the reader processes share, bound as uvicorn binds.

    ``cert`` (HTTPS): only for uvicorn's "running on" line, which then says https://
    (uvicorn reads the file in ``Config.load``, not called here; the socket is a plain
    one: TLS is the protocol's, :mod:`radserve.api.https_port`).

    ``log_config=None``: a ``uvicorn.Config`` built with uvicorn's default logging
    configuration re-installs uvicorn's own stderr handlers on its loggers, so every
    uvicorn line of the serving process after it (start, stop, errors, the access log)
    would skip radserve's JSON format and its redacting filter."""
    import uvicorn

    bind = uvicorn.Config(None, host=host, port=port, log_config=None, ssl_certfile=cert)  # type: ignore[arg-type]
    sock = bind.bind_socket()
    sock.listen(2048)  # connections wait here until a reader accepts them
    return sock


def remove_stale_run_dirs(parent: Path) -> None:
    """The private folders of serving processes that no longer run (a kill -9 leaves its
    socket and job snapshot behind); the creator's process id is in each name."""
    import os
    import shutil

    for folder in parent.glob("radserve-api-*-*"):
        pid = folder.name.split("-")[2]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
        except PermissionError:  # alive, another user's
            continue

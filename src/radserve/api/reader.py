"""An API reader process: job status and report reads on the public port, no inference.

``server.read_processes`` > 0 runs this many of them beside the serving process (see
:mod:`radserve.api.reader_pool`). Each accepts on the shared listening socket and answers
``GET /v1/jobs/{id}`` and ``GET /v1/jobs/{id}/report`` with an API key through the same
route functions, key check, visibility rule, audit (the ``phi.read`` record committed to
the shared store's chain before the answer), limits and error table as the serving
process; every other request (and a console session's, which carries no key) is
forwarded to the serving process (:mod:`radserve.api.proxy`). Why: inference in the
serving process holds its GIL, and reads sharing it were bounded by that, not by the
cores (docs/api-performance.md).
"""

from __future__ import annotations

import logging
import re
import signal
import socket
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from types import FrameType
from typing import Any

import uvicorn
from starlette.datastructures import State
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from radserve.api import errors
from radserve.api.auth import KeyVerifier, Principal, require_read
from radserve.api.job_snapshot import SnapshotReader
from radserve.api.limits import limits
from radserve.api.negotiation import check_acceptable, offered_types
from radserve.api.routes import jobs as job_routes
from radserve.api.status_bodies import StatusBodies
from radserve.audit.chain import AuditEvent, AuditRecord
from radserve.config import Settings
from radserve.errors import RadserveError
from radserve.security.access import ReadAccess, local_scopes
from radserve.service.job_view import JobView
from radserve.service.jobcache import JobCache
from radserve.service.jobs import JobAccess
from radserve.store import JobRecord, JobState, Store

logger = logging.getLogger(__name__)

_READS = re.compile(r"/v1/jobs/(?P<job_id>[^/]+)(?P<report>/report)?")
# ("http", method, route, status, seconds) | ("error", code); the pool adds ("restart", process)
Event = tuple[Any, ...]


class ReaderJobs(JobAccess):
    """Jobs as a reader process sees them: the serving process's published views
    (position, ETA), else the store; finished records are kept (they never change)."""

    def __init__(self, store: Store, snapshot: SnapshotReader, cache_records: int) -> None:
        cache = JobCache(cache_records)
        super().__init__(store, cache, scheduler=None, hooks=None)  # type: ignore[arg-type]
        self.snapshot = snapshot

    def cached(self, job_id: str) -> JobRecord | None:
        view = self.snapshot.get(job_id)
        return view.record if view is not None else self.cache.get(job_id)

    def get(self, job_id: str) -> JobRecord:
        record = self.cached(job_id)
        return record if record is not None else self._read(job_id)

    def _read(self, job_id: str) -> JobRecord:
        record = self.store.get_job(job_id)
        if record.terminal:
            self.cache.put(record)
        return record

    def view(self, record: JobRecord) -> JobView:
        view = self.snapshot.get(record.id)  # the newest published, else what the store says
        return view if view is not None else JobView(record, None)

    def report_cached(self, record: JobRecord) -> bytes | None:
        # a published view may lag the store by a moment: report_bytes asks the store
        return super().report_cached(record) if record.state is JobState.SUCCEEDED else None

    def report_bytes(self, record: JobRecord) -> bytes:
        if record.state is not JobState.SUCCEEDED:
            record = self._read(record.id)
        return super().report_bytes(record)


@dataclass(frozen=True)
class ReaderState:
    """What the shared route functions read from ``app.state.service`` in a reader."""

    settings: Settings
    store: Store
    jobs: ReaderJobs


def reader_app(
    settings: Settings,
    store: Store,
    snapshot: SnapshotReader,
    upstream: ASGIApp,
    emit: Any,
    audit: Callable[[AuditEvent], Future[AuditRecord]] | None = None,
) -> ASGIApp:
    """The reads answered here, everything else sent to ``upstream``; ``emit(event)``
    passes each metric event on to the serving process; ``audit`` commits the
    ``phi.read`` records (default: this process's store, else the audit writer's
    :meth:`AuditWriterClient.submit`)."""
    state = State()
    jobs = ReaderJobs(store, snapshot, settings.jobs.cache_records)
    state.service = ReaderState(settings, store, jobs)
    # the console's local users as this process started: their jobs' visibility to keys
    # (a user's site changed in the settings file counts here after a restart)
    users = local_scopes(settings.console.users)
    state.read_access = ReadAccess(
        store, settings.security.visibility, audit=audit, local_scopes=lambda: users
    )
    state.keys = KeyVerifier(store, wait_s=settings.server.store_wait_s)
    state.status_bodies = StatusBodies()
    reads: ASGIApp = _Reads(_Holder(state), lambda code: emit(("error", code)))
    for middleware, options in limits(settings.server, lambda *event: emit(("http", *event))):
        reads = middleware(reads, **options)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and scope["method"] == "GET"
            and _route_of(scope["path"]) is not None
            and any(k in (b"x-api-key", b"authorization") for k, _ in scope["headers"])
        ):
            await reads(scope, receive, send)
        else:
            await upstream(scope, receive, send)

    return app


@dataclass(frozen=True)
class _Route:
    """A read route: its template (the metrics label, as FastAPI's route's ``path``) and
    the media types it answers with (as the serving process's route declares them)."""

    path: str
    endpoint: Callable[[Request, str, Principal], Awaitable[Response]]
    offered: tuple[str, ...]

    @classmethod
    def of(cls, path: str) -> _Route:
        route = next(r for r in job_routes.router.routes if getattr(r, "path", None) == path)
        return cls(path, route.endpoint, offered_types(route))  # type: ignore[arg-type]


_ROUTES = {False: _Route.of("/v1/jobs/{job_id}"), True: _Route.of("/v1/jobs/{job_id}/report")}


def _route_of(path: str) -> tuple[_Route, str] | None:
    match = _READS.fullmatch(path)
    if match is None:
        return None
    return _ROUTES[match["report"] is not None], match["job_id"]


@dataclass(frozen=True)
class _Holder:
    """``scope["app"]``: what ``request.app.state`` reads in the shared route code."""

    state: State


class _Reads:
    """The two reads without FastAPI's routing and dependency solving, which took most
    of a read's CPU in a reader (docs/api-performance.md): the same route functions,
    the same key dependency (:func:`require_read`) and the same error table."""

    def __init__(self, holder: _Holder, count: Callable[[str], None]) -> None:
        self.holder = holder
        self.count = count

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = _route_of(scope["path"])
        assert found is not None  # the dispatcher sent only these paths
        route, job_id = found
        scope["app"], scope["route"] = self.holder, route
        request = Request(scope, receive)
        try:
            check_acceptable(request.headers.get("accept"), route.offered)
            who = await require_read(request)
            response = await route.endpoint(request, job_id, who)
        except RadserveError as exc:
            self.count(exc.code)
            response = errors.error_response(exc)
        except Exception as exc:  # the serving process's last-resort handler, same body
            self.count("internal_error")
            response = errors.unexpected_response(request, exc)
        await response(scope, receive, send)


class EventLink:
    """Metric events to the serving process, sent in batches every ``interval_s``; when
    the serving process is gone (the pipe breaks) this reader stops itself."""

    def __init__(self, conn: Connection, *, interval_s: float = 0.25) -> None:
        self.conn = conn
        self.interval_s = interval_s
        self._events: list[Event] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="reader-events", daemon=True)
        self._thread.start()

    def emit(self, event: Event) -> None:
        self._events.append(event)  # atomic under the GIL; swapped out by the sender

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            events, self._events = self._events, []
            try:
                self.conn.send(events)  # also the heartbeat: empty when idle
            except OSError:
                logger.warning("the serving process is gone; this API reader stops")
                signal.raise_signal(signal.SIGTERM)
                return

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        events, self._events = self._events, []
        try:
            if events:
                self.conn.send(events)
            self.conn.close()
        except OSError:
            pass


class CleanStopServer(uvicorn.Server):
    """uvicorn, minus its re-raise of SIGTERM/SIGINT after the stop (which would end the
    process before its own clean-up ran); a second SIGINT forces the stop."""

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
        self.should_exit = True


@dataclass(frozen=True)
class ReaderSpec:
    """How the serving process starts each reader (pickled into the child)."""

    settings: Settings
    socket_path: str  # the serving process's Unix socket
    snapshot_path: Path
    log_level: int
    json_logs: bool
    access_log: bool

    @property
    def audit_socket_path(self) -> str:
        """The audit writer process's socket, beside the serving process's."""
        return str(Path(self.socket_path).with_name("audit.sock"))


def serve_reader(spec: ReaderSpec, sock: socket.socket, conn: Connection) -> None:
    """The reader process's main: serve on ``sock`` until SIGTERM/SIGINT."""
    import asyncio

    from radserve.api.audit_writer import AuditWriterClient
    from radserve.api.http_limits import STOP_GRACE_S, STOP_LINGER_S, forwarded_trust
    from radserve.api.https_port import public_protocols
    from radserve.api.proxy import Upstream
    from radserve.service.logs import configure_logging
    from radserve.store.audited import open_audited
    from radserve.tls import server_context

    configure_logging(spec.log_level, json_lines=spec.json_logs)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per forwarded request
    settings = spec.settings
    tls = None if settings.server.tls is None else server_context(settings.server.tls, "HTTPS")
    store, trail = open_audited(settings, upgrade=True)
    trail.start()
    link = EventLink(conn)
    upstream = Upstream(spec.socket_path)
    audit = AuditWriterClient(spec.audit_socket_path)
    snapshot = SnapshotReader(spec.snapshot_path)
    app = reader_app(settings, store, snapshot, upstream, link.emit, audit.submit)
    config = uvicorn.Config(
        app,
        # HTTPS: TLS (and plain HTTP answered 400) by the protocol, not uvicorn's ssl=;
        # at a stop, every request still running after STOP_GRACE_S is cut off (a 503
        # when nothing was answered yet): a console event stream would hold a stop
        # forever, and uvicorn's own cancel of what is left answered a text/plain 500
        # and logged a traceback
        **public_protocols(settings.server, tls, stop_cuts_all=True),
        **forwarded_trust(settings.server),
        log_config=None,
        access_log=spec.access_log,
        timeout_keep_alive=30,
        # a backstop only: the requests were cut off, and ended, before it
        timeout_graceful_shutdown=STOP_GRACE_S + STOP_LINGER_S + 1,
        lifespan="off",  # nothing to start: the store is open already
        server_header=False,
    )
    try:
        CleanStopServer(config).run(sockets=[sock])
    finally:
        link.close()
        audit.close()
        asyncio.run(upstream.aclose())
        trail.stop()
        store.close()


__all__ = ["CleanStopServer", "ReaderJobs", "ReaderSpec", "reader_app", "serve_reader"]

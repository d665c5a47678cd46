"""Python warnings and worker processes' log records, into this process's logging.

``warnings.warn`` left alone prints a plain two-line ``UserWarning`` on stderr (pydicom
warns with the offending header value); :func:`capture_warnings` makes each warning one
record of the ``py.warnings`` logger instead, which :mod:`radserve.security.logs`
redacts and formats like any other. Worker processes (the decode pool: forkserver or
spawn) start with Python's defaults; :class:`WorkerLogs` and
:func:`forward_worker_logs` carry their records and warnings to this process's loggers.

No radserve imports: ingest's decode pool and the security package's log set-up both
use it, and neither may import the other's package.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import tempfile
import threading
import warnings
from logging.handlers import QueueHandler, QueueListener
from pathlib import Path
from typing import Any, TextIO

from radserve import durable

WARNINGS_LOGGER = "py.warnings"
NATIVE_STDERR_LOGGER = "radserve.native_stderr"
_STOP = b"\0radserve-worker-stderr-stop\n"
_LINE_MAX = 4096  # a longer run of bytes without a newline is logged in pieces


def _showwarning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: TextIO | None = None,
    line: str | None = None,
) -> None:
    """``warnings.showwarning`` replacement: one record on ``py.warnings`` (redacted by
    the handler's filter), instead of a plain two-line text on stderr."""
    logging.getLogger(WARNINGS_LOGGER).warning(
        "%s: %s", category.__name__, message, extra={"source": _module_of(filename)}
    )


def _module_of(filename: str) -> str:
    """``.../site-packages/pydicom/valuerep.py`` -> ``pydicom.valuerep`` (no home paths)."""
    parts = re.split(r"[\\/]", filename)
    for anchor in ("site-packages", "dist-packages", "src"):
        if anchor in parts:
            parts = parts[parts.index(anchor) + 1 :]
            break
    else:
        parts = parts[-1:]
    return ".".join(parts).removesuffix(".py")


# the HTTP client's loggers: httpx logs each request at INFO ("HTTP Request: POST
# http://admin:hunter2@host/hook?apikey=... "HTTP/1.1 200 OK""), httpcore its steps at DEBUG
HTTP_CLIENT_LOGGERS = ("httpx", "httpcore")
_URL = re.compile(r"(?i)\b[a-z][a-z0-9+.-]*://[^\s\"'<>]+")
_USERINFO = re.compile(r"^([^:/]+://)([^/?#@]*)@")


def redact_url(url: str) -> str:
    """``url`` without what may be a credential: the password of its userinfo
    (``user:***@``; a userinfo without one may be a token: ``***@``) and every query
    value (``?apikey=***``); scheme, user, host, path and query keys stay (they say
    which receiver it was)."""

    def userinfo(match: re.Match[str]) -> str:
        user, colon, _ = match.group(2).partition(":")
        return f"{match.group(1)}{user + ':' if colon else ''}***@"

    url = _USERINFO.sub(userinfo, url)
    base, mark, rest = url.partition("?")
    if not mark:
        return url
    query, hash_mark, fragment = rest.partition("#")
    items = []
    for item in query.split("&"):
        key, equals, value = item.partition("=")
        items.append(f"{key}=***" if equals and value else item)
    return f"{base}?{'&'.join(items)}{hash_mark}{'***' if fragment else ''}"


def redact_urls(text: str) -> str:
    """Every URL in ``text`` through :func:`redact_url`."""
    return _URL.sub(lambda m: redact_url(m.group(0)), text)


class _ClientUrlFilter(logging.Filter):
    """On the HTTP client's loggers: each record's URLs lose their userinfo and query
    values before any handler sees it. A receiver's URL may carry a password or a token
    (``http://admin:pw@.../hook?apikey=``), and httpx logged it whole at INFO into the
    server's log (the handlers' redaction keeps URLs' letters)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: keep the template only
            message = str(record.msg)
        record.msg, record.args = redact_urls(message), ()
        return True


_CLIENT_URL_FILTER = _ClientUrlFilter()


def guard_http_client_logs() -> None:
    """Put :class:`_ClientUrlFilter` on the HTTP client's loggers (once; done when this
    module is imported, which every process that sets up logging does)."""
    for name in HTTP_CLIENT_LOGGERS:
        logger = logging.getLogger(name)
        if _CLIENT_URL_FILTER not in logger.filters:
            logger.addFilter(_CLIENT_URL_FILTER)


def capture_warnings() -> None:
    """Send every Python warning through the logging system (see :func:`_showwarning`)."""
    warnings.showwarning = _showwarning
    guard_http_client_logs()  # again, should a set-up have cleared the loggers' filters


class WorkerLogs:
    """Log records and warnings of worker processes, handled by this process's logging.

    A worker process (forkserver or spawn) starts with Python's defaults: a pydicom
    warning there (``Invalid value for VR IS: '1.0'`` while decoding a frame) is printed
    as a plain two-line ``UserWarning`` on the inherited stderr, unredacted and not
    JSON. Workers started with ``initializer=forward_worker_logs, initargs=
    logs.initargs()`` send each record (and each warning, as one ``py.warnings`` record)
    over a queue; a listener thread here hands it to the logger of the same name, so
    it passes through this process's handlers: :class:`RedactingFilter`, the JSON or
    plain format, the de-duplication of library messages. Call :meth:`stop` once no
    worker is left.
    """

    def __init__(self, context: Any) -> None:
        self.queue: Any = context.Queue()
        self._listener: QueueListener | None = QueueListener(self.queue, _ToLogger())
        self._listener.start()
        self._stderr: _NativeStderr | None = _NativeStderr()

    def initargs(self) -> tuple[Any, int, tuple[str, ...], str | None]:
        """For the workers: the queue, this process's level, the loggers it holds at
        WARNING (see :func:`radserve.security.logs.configure_logging`), and the FIFO
        their file descriptor 2 is to write to."""
        return self.queue, *levels(), self._stderr.path if self._stderr else None

    def stop(self) -> None:
        """Handle what is queued, stop the listener, and let the queue go: its locks are
        freed (and unregistered from the resource tracker) before a stopping server
        stops the tracker, which would otherwise report them as leaked, on stderr."""
        listener, self._listener = self._listener, None
        queue, self.queue = self.queue, None
        stderr, self._stderr = self._stderr, None
        if stderr is not None:
            stderr.stop()
        if listener is None or queue is None:
            return
        with contextlib.suppress(Exception):  # the listener thread already ended
            listener.stop()
        queue.close()
        queue.join_thread()


_FOLDER_STEM = "radserve-worker-stderr"
_FOLDER_GLOB = f".{_FOLDER_STEM}.*{durable.TEMPORARY_SUFFIX}"
_LEGACY_GLOB = f"{_FOLDER_STEM}-*"


class _NativeStderr:
    """What worker processes write on file descriptor 2 themselves — a C or C++ library
    inside a decoder (GDCM's libjpeg: "Bogus marker length"; a C++ exception that ends
    the process: "terminate called after throwing ..."), Python's own last words —
    read here, one record per line on :data:`NATIVE_STDERR_LOGGER` (redacted and
    formatted by this process's handlers), instead of plain lines among the JSON log.

    A FIFO, read by a thread of *this* process: a worker that dies still has what it
    wrote before dying read and logged. Opened read-write here, so opening it never
    blocks a worker and the reader never sees end-of-file between workers.
    """

    def __init__(self) -> None:
        # owner-named (host, pid), so a later start removes the folder of a server that
        # was killed (SIGKILL, OOM: stop() never ran), as model-install staging is swept
        base = Path(tempfile.gettempdir())
        durable.sweep(base, _FOLDER_GLOB)
        durable.sweep_unowned(base, _LEGACY_GLOB)  # mkdtemp names before 2026-12-03
        self._folder = str(durable.temporary_dir(base, _FOLDER_STEM))
        self.path = os.path.join(self._folder, "stderr")
        os.mkfifo(self.path, 0o600)
        self._fd = os.open(self.path, os.O_RDWR)
        self._thread = threading.Thread(
            target=self._relay, name="radserve-worker-stderr", daemon=True
        )
        self._thread.start()

    def _relay(self) -> None:
        logger = logging.getLogger(NATIVE_STDERR_LOGGER)
        pending = b""
        while True:
            try:
                chunk = os.read(self._fd, 65536)
            except OSError:
                return
            pending += chunk
            *lines, pending = pending.split(b"\n")
            if len(pending) > _LINE_MAX:
                lines, pending = [*lines, pending], b""
            for line in lines:
                if line + b"\n" == _STOP:
                    return
                text = line.decode("utf-8", "replace").strip()
                if text:
                    logger.warning("a worker process wrote on stderr: %s", text)

    def stop(self) -> None:
        """Log what is left, then stop reading and remove the FIFO."""
        with contextlib.suppress(OSError):
            os.write(self._fd, _STOP)
        self._thread.join(5)
        with contextlib.suppress(OSError):
            os.close(self._fd)
        shutil.rmtree(self._folder, ignore_errors=True)


def levels() -> tuple[int, tuple[str, ...]]:
    """This process's level and the loggers it holds at WARNING, for a worker's
    :func:`forward_worker_logs`."""
    root = logging.getLogger()
    quiet = tuple(
        name
        for name, logger in root.manager.loggerDict.items()
        if isinstance(logger, logging.Logger) and logger.level >= logging.WARNING
    )
    return root.getEffectiveLevel(), quiet


class _ToLogger(logging.Handler):
    """The listener's handler: a worker's record goes to this process's logger of the
    same name (its level and handlers, as if it had been logged here)."""

    def handle(self, record: logging.LogRecord) -> bool:  # type: ignore[override]
        logger = logging.getLogger(record.name)
        if logger.isEnabledFor(record.levelno):
            logger.handle(record)
        return True

    def emit(self, record: logging.LogRecord) -> None:  # pragma: no cover - handle() does it
        pass


_ROUTER = _ToLogger()


def route_record(record: logging.LogRecord) -> None:
    """A worker's record, handled here as if it had been logged in this process."""
    _ROUTER.handle(record)


def forward_worker_logs(
    queue: Any, level: int, quiet: tuple[str, ...] = (), stderr_fifo: str | None = None
) -> None:
    """A worker process's initializer (see :class:`WorkerLogs`): every record at
    ``level`` or above (``quiet`` loggers: WARNING and above), and every warning, goes
    to ``queue``; nothing to stderr. ``stderr_fifo``: file descriptor 2 (what native
    code writes there) goes to it, to be logged by the parent."""
    if stderr_fifo is not None:
        fd = os.open(stderr_fifo, os.O_WRONLY)
        os.dup2(fd, 2)
        os.close(fd)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(QueueHandler(queue))
    root.setLevel(level)
    for name in quiet:
        logging.getLogger(name).setLevel(max(level, logging.WARNING))
    capture_warnings()


guard_http_client_logs()

__all__ = [
    "HTTP_CLIENT_LOGGERS",
    "WARNINGS_LOGGER",
    "WorkerLogs",
    "capture_warnings",
    "forward_worker_logs",
    "guard_http_client_logs",
    "levels",
    "redact_url",
    "redact_urls",
    "route_record",
]

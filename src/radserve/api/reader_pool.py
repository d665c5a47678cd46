"""The serving process's API reader processes: started on the bound public socket,
restarted when one dies, stopped before the service stops; and the one audit writer
process that commits their ``phi.read`` records (:mod:`radserve.api.audit_writer`).

Each reader gets the listening socket (the kernel hands each new connection to one of
them), the serving process's Unix socket to forward to, the audit writer's socket, and
a pipe on which it sends its metric events; the serving process adds those to its own
metrics, so ``/metrics`` counts every request whichever process answered it.
"""

from __future__ import annotations

import logging
import multiprocessing
import socket
import threading
from collections.abc import Callable, Iterable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

from radserve.api.audit_writer import serve_audit_writer
from radserve.api.reader import Event, ReaderSpec, serve_reader
from radserve.service.metrics import Metrics

logger = logging.getLogger(__name__)


class ReaderPool:
    """``count`` reader processes on ``sock``, kept alive until :meth:`stop`."""

    def __init__(
        self,
        spec: ReaderSpec,
        sock: socket.socket,
        count: int,
        on_events: Callable[[Iterable[Event]], None],
        *,
        check_s: float = 0.5,
    ) -> None:
        self.spec = spec
        self.sock = sock
        self.count = count
        self.on_events = on_events
        self.check_s = check_s
        self.restarts = 0
        self._context = multiprocessing.get_context("spawn")  # no fork of a threaded process
        self._processes: list[BaseProcess | None] = [None] * count
        self._writer: BaseProcess | None = None
        self._writer_pipe: Connection | None = None
        self._stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="api-readers", daemon=True)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._processes if p is not None and p.pid is not None]

    @property
    def writer_pid(self) -> int | None:
        return self._writer.pid if self._writer is not None else None

    def processes(self) -> list[tuple[str, int]]:
        """(label, PID) of the audit writer and each reader (``reader-<index>``: a
        reader started again after it died keeps its predecessor's label)."""
        named = [("audit_writer", self.writer_pid)]
        named += [
            (f"reader-{index}", p.pid if p is not None else None)
            for index, p in enumerate(self._processes)
        ]
        return [(name, pid) for name, pid in named if pid is not None]

    def start(self) -> None:
        self._spawn_writer()
        for index in range(self.count):
            self._spawn(index)
        self._watcher.start()

    def _spawn_writer(self, ready_timeout_s: float = 60.0) -> None:
        """The audit writer, listening before this returns (the readers' first report
        reads find it), or an error."""
        mine, theirs = self._context.Pipe(duplex=True)
        spec = self.spec
        process = self._context.Process(
            target=serve_audit_writer,
            args=(spec.settings, spec.audit_socket_path, theirs, spec.log_level, spec.json_logs),
            name="radserve-api-audit-writer",
            daemon=True,
        )
        process.start()
        theirs.close()
        if not mine.poll(ready_timeout_s):
            process.kill()
            raise RuntimeError(f"the API audit writer did not start within {ready_timeout_s} s")
        mine.recv()
        if self._writer_pipe is not None:  # the pipe of a writer that died
            self._writer_pipe.close()
        self._writer, self._writer_pipe = process, mine

    def _spawn(self, index: int) -> None:
        receiving, sending = self._context.Pipe(duplex=False)
        process = self._context.Process(
            target=serve_reader,
            args=(self.spec, self.sock, sending),
            name=f"radserve-api-reader-{index}",
            daemon=True,
        )
        process.start()
        sending.close()
        self._processes[index] = process
        threading.Thread(
            target=self._receive, args=(receiving,), name=f"reader-{index}-events", daemon=True
        ).start()

    def _receive(self, conn: Connection) -> None:
        while True:
            try:
                events = conn.recv()
            except (EOFError, OSError):
                conn.close()
                return
            if events:
                try:
                    self.on_events(events)
                except Exception:  # a bad event never stops the metrics of the others
                    logger.exception("API reader metric events failed")

    def _watch(self) -> None:
        while not self._stop.wait(self.check_s):
            writer = self._writer
            if writer is not None and not writer.is_alive() and not self._stop.is_set():
                logger.warning(
                    "the API audit writer (pid %s) exited with %s; starting another",
                    writer.pid,
                    writer.exitcode,
                )
                self.restarts += 1
                self._count_restart("audit_writer")
                try:
                    self._spawn_writer()
                except Exception:  # tried again at the next check
                    logger.exception("could not start the API audit writer")
            for index, process in enumerate(self._processes):
                if process is not None and not process.is_alive() and not self._stop.is_set():
                    logger.warning(
                        "API reader %d (pid %s) exited with %s; starting another",
                        index,
                        process.pid,
                        process.exitcode,
                    )
                    self.restarts += 1
                    self._count_restart("reader")
                    self._spawn(index)

    def _count_restart(self, process: str) -> None:
        try:
            self.on_events([("restart", process)])
        except Exception:  # counting never stops the restart
            logger.exception("API process restart not counted")

    def stopping(self) -> None:
        """Restart no reader from now on (the server is stopping)."""
        self._stop.set()

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM each reader (it finishes its requests), then the audit writer (it
        commits and answers what they sent); SIGKILL what is left after ``timeout_s``."""
        self._stop.set()
        if self._watcher.is_alive():
            self._watcher.join()
        for group in (self._processes, [self._writer]):
            for process in group:
                if process is not None and process.is_alive():
                    process.terminate()
            for process in group:
                if process is not None:
                    process.join(timeout_s)
                    if process.is_alive():
                        process.kill()
                        process.join()
        if self._writer_pipe is not None:
            self._writer_pipe.close()


def metrics_sink(metrics: Metrics) -> Callable[[Iterable[Event]], None]:
    """Readers' events -> the serving process's HTTP and error metrics."""

    def apply(events: Iterable[Event]) -> None:
        for event in events:
            if event[0] == "http":
                metrics.observe_http(*event[1:])
            elif event[0] == "error":
                metrics.errors.labels(event[1]).inc()
            elif event[0] == "restart":  # the pool's own: a reader or the audit writer
                metrics.api_process_restarts.labels(event[1]).inc()

    return apply


__all__ = ["ReaderPool", "metrics_sink"]

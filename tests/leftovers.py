"""Processes a test module left running: stopped after the module, named at the end.

A server, Orthanc or Ray process that outlives its test (a failure before its ``finally``,
a fixture that stops the parent but not its children) keeps using the CPU for the rest of
the run: on a 2-core CI runner a few of them made every later test slower, and the
timing-bound ones failed. After each module this plugin waits briefly for the module's
processes to end, kills what is still there (with its own children) and lists them in
the run's summary, so a leak costs one line, not the rest of the run. Also stops the
decoding worker pool, which a module may have started with another size than the next
one expects (``radserve.ingest.decode`` keeps one pool per process).

multiprocessing's fork server and resource tracker are this process's own helpers, kept
for its life: they are not counted.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

GRACE_S = 5.0  # a stopped server's children may need a moment to follow it
_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


@dataclass(frozen=True)
class Leftover:
    module: str
    pid: int
    command: str


_found: list[Leftover] = []


def _children_by_parent() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses
        fields = stat[stat.rfind(")") + 2 :].split()
        if fields[0] == "Z":  # exited, waiting to be reaped: uses nothing
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    return children


def _command(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def descendants(pid: int, by_parent: dict[int, list[int]] | None = None) -> list[int]:
    """Every live process below ``pid``, parents before their children (``by_parent``:
    one reading of the process table, when the caller walks it more than once)."""
    by_parent = _children_by_parent() if by_parent is None else by_parent
    found: list[int] = []
    queue = list(by_parent.get(pid, []))
    while queue:
        child = queue.pop(0)
        found.append(child)
        queue.extend(by_parent.get(child, []))
    return found


def running_below(pid: int) -> list[int]:
    """``descendants`` without multiprocessing's own long-lived helpers (and theirs)."""
    table = _children_by_parent()
    below = descendants(pid, table)
    helpers = {p for p in below if any(h in _command(p) for h in _HELPERS)}
    below_helpers = {c for h in helpers for c in descendants(h, table)}
    return [p for p in below if p not in helpers and p not in below_helpers]


def stop_leftovers(module: str, grace_s: float = GRACE_S) -> list[Leftover]:
    """Wait up to ``grace_s`` for this process's children to end, then kill those left."""
    me = os.getpid()
    deadline = time.monotonic() + grace_s
    left = running_below(me)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = running_below(me)
    found = [Leftover(module, pid, _command(pid)[:200]) for pid in left]
    for pid in left:  # not reaped here: a Popen that waits on one would read exit code 0
        with contextlib.suppress(OSError):  # ended meanwhile
            os.kill(pid, signal.SIGKILL)
    return found


@pytest.fixture(scope="module", autouse=True)
def _no_process_outlives_its_module(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    from radserve.ingest.decode import shutdown_decode_workers

    shutdown_decode_workers()
    _found.extend(stop_leftovers(request.module.__name__))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _found:
        return
    terminalreporter.section("processes left running by a test module (killed)")
    for item in _found:
        terminalreporter.write_line(f"{item.module}: pid {item.pid}: {item.command}")

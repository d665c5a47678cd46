"""Where the suite's time goes per test FILE: a pytest plugin (loaded by tests/conftest.py).

``--durations=N`` names the slowest test phases; on a 2,700-test suite whose time is spread
over many files that says little. With ``--durations`` given, this plugin adds, at the end,
the ``--file-durations`` (default 25) slowest files by summed wall time of their phases
(setup + call + teardown: a module or session fixture counts where it is first built), the
CPU-seconds each spent (pytest and its threads, plus the children it reaped meanwhile:
servers a test starts and stops, ``radserve run`` children; not what a daemon leaves
unreaped: a PostgreSQL started by ``pg_ctl``, a local Ray's raylet), and the suite's
totals. Wall well above CPU marks a file that waits on timers (leases, probes, retries,
sleeps) or on such daemons rather than working; on a loaded host compare CPU-s.
"""

from __future__ import annotations

import resource
import time
from collections import defaultdict
from collections.abc import Generator
from dataclasses import dataclass

import pytest


def _cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@dataclass
class _File:
    wall_s: float = 0.0
    cpu_s: float = 0.0
    tests: int = 0


class FileDurations:
    """Sums each test's phases and CPU-seconds by the file that holds it."""

    def __init__(self, top: int) -> None:
        self.top = top
        self.files: dict[str, _File] = defaultdict(_File)
        self.started = time.monotonic()
        self.cpu_at_start = _cpu_seconds()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Generator[None, None, None]:
        before = _cpu_seconds()
        yield
        self.files[item.location[0]].cpu_s += _cpu_seconds() - before

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        entry = self.files[report.location[0]]
        entry.wall_s += report.duration
        entry.tests += report.when == "setup"

    @pytest.hookimpl(trylast=True)  # after --durations' phases: the last lines of the log
    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.files:
            return
        write = terminalreporter.write_line
        ranked = sorted(self.files.items(), key=lambda kv: -kv[1].wall_s)
        terminalreporter.write_sep("=", f"slowest {min(self.top, len(ranked))} test files")
        write(f"{'wall_s':>8} {'cpu_s':>8} {'tests':>6}  file")
        for path, entry in ranked[: self.top]:
            write(f"{entry.wall_s:8.1f} {entry.cpu_s:8.1f} {entry.tests:6d}  {path}")
        phases = sum(entry.wall_s for entry in self.files.values())
        cpu = _cpu_seconds() - self.cpu_at_start
        write(
            f"suite: {len(self.files)} files, {sum(e.tests for e in self.files.values())} tests;"
            f" test phases {phases:.1f} s wall; session {time.monotonic() - self.started:.1f} s"
            f" wall (collection included), {cpu:.1f} CPU-s (pytest + reaped children)"
        )


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--file-durations",
        type=int,
        default=25,
        metavar="N",
        help="with --durations: also list the N slowest test files (summed wall, CPU-s)",
    )


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("durations") is not None and config.getoption("file_durations") > 0:
        config.pluginmanager.register(FileDurations(config.getoption("file_durations")))

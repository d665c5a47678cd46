"""The suite's guard against processes that outlive their test module (tests/leftovers.py):
it finds a child and a grandchild, leaves multiprocessing's helpers alone, and kills what
is left after the grace period."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.factories.waits import until
from tests.leftovers import descendants, running_below, stop_leftovers


def test_a_child_and_its_child_are_found_and_killed() -> None:
    # a shell that starts a sleeping grandchild and sleeps itself
    parent = subprocess.Popen(["sh", "-c", "sleep 300 & exec sleep 301"])
    try:
        until(lambda: len(descendants(parent.pid)) == 1, "the grandchild to start", 30)
        below = running_below(os.getpid())
        assert parent.pid in below
        grandchild = descendants(parent.pid)[0]
        found = stop_leftovers("a module", grace_s=0.2)
        assert {item.pid for item in found} >= {parent.pid}
        assert any("sleep 301" in item.command for item in found)
        assert parent.wait(timeout=30) == -9
        until(lambda: grandchild not in running_below(os.getpid()), "the grandchild to go", 30)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def test_a_child_that_ends_within_the_grace_period_is_not_listed() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])
    found = stop_leftovers("a module", grace_s=30)
    assert [item for item in found if item.pid == child.pid] == []
    assert child.wait(timeout=30) == 0


def test_multiprocessing_helpers_are_not_leftovers() -> None:
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()
    tracker = resource_tracker._resource_tracker._pid  # the stdlib has no public accessor
    assert tracker in descendants(os.getpid())
    assert tracker not in running_below(os.getpid())

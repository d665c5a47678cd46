"""Where the receiving process's CPU goes, per C-STORE, counted as it runs.

Issue 19 goal 6 (300 durable instances/s on two cores shared with the senders) is bounded
by CPU, so the bench reports the bound beside the rate from the same run: ``cores x
1000 / (receiver + sender CPU-ms an instance)``, and where the receiver's milliseconds
go. A profiler cannot give that without changing it (cProfile inflated the receive path
6x), so each section reads its own thread's CPU clock (``time.thread_time``: user +
system of that thread, about a microsecond a read) at its start and end:

- ``receive``: each association's DUL thread, its whole life: socket reads, PDU decoding,
  the data set's fragments written to the spool file (pynetdicom);
- ``handler``: radserve's C-STORE handler, of which ``parse`` (the header read) and
  ``durable`` (link, fsync, link, folder fsync) are counted apart too.

What the sections do not cover (the association threads' DIMSE work: the command set
decoded, the response encoded, events; the accept loop; wake-ups) is the process's CPU
less their sum, worked out by the reader who has the process total (the bench).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

SECTIONS = ("receive", "handler", "parse", "durable")


class CpuLedger:
    """CPU seconds per section, summed over threads; thread-safe."""

    def __init__(self) -> None:
        self._seconds = dict.fromkeys(SECTIONS, 0.0)
        self._lock = threading.Lock()

    def add(self, section: str, seconds: float) -> None:
        with self._lock:
            self._seconds[section] += seconds

    @contextmanager
    def section(self, name: str) -> Iterator[None]:
        """Count the calling thread's CPU inside the block under ``name``."""
        start = time.thread_time()
        try:
            yield
        finally:
            self.add(name, time.thread_time() - start)

    def snapshot(self) -> dict[str, float]:
        """The CPU seconds so far, per section (take two and subtract for a run)."""
        with self._lock:
            return dict(self._seconds)

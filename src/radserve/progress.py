"""How long-running stages report progress without knowing who is watching.

The core is synchronous and UI-free: it calls a ``ProgressSink``. The CLI passes a rich
progress bar; the server will pass its metrics/job-state updater; tests pass nothing.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol


class ProgressSink(Protocol):
    def start(self, stage: str, total: int | None) -> None: ...

    def advance(self, stage: str, amount: int = 1) -> None: ...

    def finish(self, stage: str, seconds: float) -> None: ...


class NullProgress:
    def start(self, stage: str, total: int | None) -> None:
        pass

    def advance(self, stage: str, amount: int = 1) -> None:
        pass

    def finish(self, stage: str, seconds: float) -> None:
        pass


class StageTimer:
    """Collects wall time per named stage and tells the progress sink."""

    def __init__(self, progress: ProgressSink | None = None) -> None:
        self.progress: ProgressSink = progress or NullProgress()
        self.seconds: dict[str, float] = {}

    @contextmanager
    def stage(self, name: str, total: int | None = None) -> Iterator[None]:
        self.progress.start(name, total)
        t0 = time.perf_counter()
        try:
            yield
        finally:
            elapsed = time.perf_counter() - t0
            self.seconds[name] = self.seconds.get(name, 0.0) + elapsed
            self.progress.finish(name, elapsed)

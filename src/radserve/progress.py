"""How long-running stages report progress without knowing who is watching.

The core is synchronous and UI-free: it calls a ``ProgressSink``. The CLI passes a rich
progress bar; the server will pass its metrics/job-state updater; tests pass nothing.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

from radserve.checkpoints import paused_within


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
    """Collects wall time per named stage and tells the progress sink. ``paused``: of
    each stage's seconds, those a routine unit spent paused at checkpoints while URGENT
    work ran (:mod:`radserve.checkpoints`), so a slow stage that only waited says so."""

    def __init__(self, progress: ProgressSink | None = None) -> None:
        self.progress: ProgressSink = progress or NullProgress()
        self.seconds: dict[str, float] = {}
        self.paused: dict[str, float] = {}

    @contextmanager
    def stage(self, name: str, total: int | None = None) -> Iterator[None]:
        self.progress.start(name, total)
        t0 = time.perf_counter()
        try:
            yield
        finally:
            elapsed = self._add(name, t0, time.perf_counter())
            self.progress.finish(name, elapsed)

    def record(self, name: str, t0: float) -> None:
        """Set ``name`` to the time since ``t0`` (a ``time.perf_counter`` reading),
        replacing what an earlier try of the stage recorded."""
        self.seconds.pop(name, None)
        self.paused.pop(name, None)
        self._add(name, t0, time.perf_counter())

    def update(self, seconds: dict[str, float], paused: dict[str, float]) -> None:
        """Take another timer's stages (and their paused parts) as they are."""
        self.seconds.update(seconds)
        self.paused.update(paused)

    def _add(self, name: str, t0: float, t1: float) -> float:
        elapsed = t1 - t0
        self.seconds[name] = self.seconds.get(name, 0.0) + elapsed
        paused = paused_within(t0, t1)
        if paused > 0:
            self.paused[name] = self.paused.get(name, 0.0) + paused
        return elapsed

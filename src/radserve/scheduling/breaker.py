"""Per-model circuit breakers: a model that fails N times in a row stops taking work.

Open means "broken until someone reloads it": there is no half-open timer, because a
model that produced N failures in a row (bad file, device lost, wrong outputs) rarely
heals by itself; ``reset`` is called when the model is reloaded.
"""

from __future__ import annotations

import threading


class CircuitBreakers:
    def __init__(self, threshold: int) -> None:
        self.threshold = threshold
        self._failures: dict[str, int] = {}
        self._open: set[str] = set()
        self._lock = threading.Lock()

    def failure(self, model: str) -> bool:
        """Count a failure; True when this one opened the breaker."""
        with self._lock:
            count = self._failures.get(model, 0) + 1
            self._failures[model] = count
            if count >= self.threshold and model not in self._open:
                self._open.add(model)
                return True
            return False

    def success(self, model: str) -> None:
        with self._lock:
            if model not in self._open:
                self._failures[model] = 0

    def failures(self, model: str) -> int:
        with self._lock:
            return self._failures.get(model, 0)

    def is_open(self, model: str) -> bool:
        with self._lock:
            return model in self._open

    def reset(self, model: str) -> bool:
        """Close the breaker (the model was reloaded); True if it was open."""
        with self._lock:
            self._failures[model] = 0
            if model in self._open:
                self._open.discard(model)
                return True
            return False

    def open_models(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(sorted(self._open))


__all__ = ["CircuitBreakers"]

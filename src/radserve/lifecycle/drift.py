"""Drift of a model's inputs and outputs: a rolling window of studies compared with a
reference profile using standard statistics.

A *record* is one study's features for one model (:func:`model_record` of
:func:`radserve.pipeline.profile.study_features`): ``hist`` (histograms as fractions),
``num`` (continuous: a value, a list of values pooled across studies, or None) and
``cat`` (categorical). Each feature is compared with the reference by its kind:

* histograms: PSI (population stability index) of the window's mean histogram against
  the reference's, bins floored at 1e-4: warn at ``psi_warn`` (0.1), alert at
  ``psi_alert`` (0.25), the usual reading of PSI;
* continuous: two-sample Kolmogorov-Smirnov (``scipy.stats.ks_2samp``);
* categorical: chi-square test of homogeneity on the 2 x categories table
  (``scipy.stats.chi2_contingency``).

The tests' p-values are judged against ``p_warn`` / ``p_alert`` divided by the number of
tests made in that comparison (Bonferroni): with some twenty features compared after
every study, an uncorrected 0.001 would raise false alerts on normal traffic.

Pure bookkeeping, like :mod:`.guardrails`: the server feeds records and acts on state
changes (metrics, API, audit).
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from enum import IntEnum
from typing import Any, Protocol

import numpy as np

_PSI_FLOOR = 1e-4
_MIN_VALUES = 5  # fewer values on either side: the feature is not judged


class DriftState(IntEnum):
    """Ordered: a model's state is its worst feature's. The metric's value."""

    OK = 0
    WARN = 1
    ALERT = 2

    @property
    def label(self) -> str:
        return self.name.lower()


class DriftLimits(Protocol):
    window: int
    min_window: int
    psi_warn: float
    psi_alert: float
    p_warn: float
    p_alert: float


@dataclass(frozen=True)
class FeatureDrift:
    feature: str
    test: str  # psi | ks | chi2
    statistic: float
    p_value: float | None  # None for PSI
    state: DriftState
    n_reference: int
    n_window: int

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["state"] = self.state.label
        return out


def model_record(features: Mapping[str, Any], model: str) -> dict[str, Any]:
    """One model's record of a study: the inputs plus that model's outputs."""
    outputs = (features.get("models") or {}).get(model) or {}
    return {
        "hist": dict(features.get("hist") or {}),
        "num": {**(features.get("num") or {}), **(outputs.get("num") or {})},
        "cat": {**(features.get("cat") or {}), **(outputs.get("cat") or {})},
    }


def psi(reference: np.ndarray, window: np.ndarray) -> float:
    """Population stability index of two histograms (any scale; normalised here)."""
    r = np.maximum(reference / max(reference.sum(), 1e-12), _PSI_FLOOR)
    w = np.maximum(window / max(window.sum(), 1e-12), _PSI_FLOOR)
    return float(np.sum((w - r) * np.log(w / r)))


def _values(records: Iterable[Mapping[str, Any]], name: str) -> list[float]:
    out: list[float] = []
    for record in records:
        value = record.get("num", {}).get(name)
        if value is None:
            continue
        items = value if isinstance(value, list | tuple) else [value]
        out.extend(float(v) for v in items if v is not None and math.isfinite(float(v)))
    return out


def _names(records: Sequence[Mapping[str, Any]], kind: str) -> set[str]:
    return {name for record in records for name in (record.get(kind) or {})}


def compare(
    reference: Sequence[Mapping[str, Any]],
    window: Sequence[Mapping[str, Any]],
    limits: DriftLimits,
) -> dict[str, FeatureDrift]:
    """Each feature both sides carry, compared; states judged against ``limits``.

    SciPy's stats is imported here, not with the module: it was 0.8 s of every ``radserve
    serve`` start (the API imports this module), for a comparison made once samples exist."""
    from scipy import stats

    out: dict[str, FeatureDrift] = {}
    tests: list[tuple[str, str, float, float, int, int]] = []  # name, test, stat, p, n_r, n_w
    for name in sorted(_names(reference, "hist") & _names(window, "hist")):
        ref = [np.asarray(r["hist"][name], float) for r in reference if name in r.get("hist", {})]
        win = [np.asarray(r["hist"][name], float) for r in window if name in r.get("hist", {})]
        if len(ref) < _MIN_VALUES or len(win) < _MIN_VALUES:
            continue
        if len({a.shape for a in ref + win}) != 1:
            continue  # bins changed between versions of the extractor: not comparable
        value = psi(np.mean(ref, axis=0), np.mean(win, axis=0))
        state = (
            DriftState.ALERT
            if value >= limits.psi_alert
            else DriftState.WARN
            if value >= limits.psi_warn
            else DriftState.OK
        )
        out[name] = FeatureDrift(name, "psi", value, None, state, len(ref), len(win))
    for name in sorted(_names(reference, "num") & _names(window, "num")):
        ref_v, win_v = _values(reference, name), _values(window, name)
        if len(ref_v) < _MIN_VALUES or len(win_v) < _MIN_VALUES:
            continue
        result = stats.ks_2samp(ref_v, win_v)
        tests.append(
            (name, "ks", float(result.statistic), float(result.pvalue), len(ref_v), len(win_v))
        )
    for name in sorted(_names(reference, "cat") & _names(window, "cat")):
        ref_c = [str(r["cat"][name]) for r in reference if name in r.get("cat", {})]
        win_c = [str(r["cat"][name]) for r in window if name in r.get("cat", {})]
        if len(ref_c) < _MIN_VALUES or len(win_c) < _MIN_VALUES:
            continue
        categories = sorted(set(ref_c) | set(win_c))
        if len(categories) < 2:
            tests.append((name, "chi2", 0.0, 1.0, len(ref_c), len(win_c)))
            continue
        table = np.array([[side.count(c) for c in categories] for side in (ref_c, win_c)])
        chi2, p, _, _ = stats.chi2_contingency(table)
        tests.append((name, "chi2", float(chi2), float(p), len(ref_c), len(win_c)))
    n = max(len(tests), 1)
    for name, test, statistic, p, n_ref, n_win in tests:
        state = (
            DriftState.ALERT
            if p < limits.p_alert / n
            else DriftState.WARN
            if p < limits.p_warn / n
            else DriftState.OK
        )
        out[name] = FeatureDrift(name, test, statistic, p, state, n_ref, n_win)
    return out


@dataclass(frozen=True)
class StateChange:
    model: str
    version: str
    feature: str  # a feature name, or "" for the model's overall state
    before: DriftState
    after: DriftState
    detail: FeatureDrift | None = None


@dataclass
class DriftMonitor:
    """One model version: its reference records, its rolling window, its states.

    Without a reference (``reference`` empty and ``collect`` > 0) the first ``collect``
    records become the reference (:attr:`on_reference` is told, to persist them).
    """

    model: str
    version: str
    limits: DriftLimits
    reference: list[dict[str, Any]] = field(default_factory=list)
    collect: int = 0
    reference_source: str = "none"
    on_reference: Callable[[DriftMonitor], None] | None = None
    window: deque[dict[str, Any]] = field(init=False)
    features: dict[str, FeatureDrift] = field(default_factory=dict)
    studies: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        self.window = deque(maxlen=self.limits.window)

    @property
    def state(self) -> DriftState:
        return max((f.state for f in self.features.values()), default=DriftState.OK)

    @property
    def collecting(self) -> bool:
        return len(self.reference) < max(self.collect, _MIN_VALUES)

    def add(self, record: dict[str, Any]) -> list[StateChange]:
        """Add one study; the state changes it caused (features, then the overall)."""
        with self._lock:
            self.studies += 1
            if self.collecting:
                self.reference.append(record)
                if not self.collecting:
                    self.reference_source = f"first {len(self.reference)} studies served"
                    if self.on_reference is not None:
                        self.on_reference(self)
                return []
            self.window.append(record)
            if len(self.window) < self.limits.min_window:
                return []
            before_all, before = self.state, self.features
            self.features = compare(self.reference, list(self.window), self.limits)
            changes: list[StateChange] = []
            for name, drift in self.features.items():
                was = before[name].state if name in before else DriftState.OK
                if drift.state != was:
                    changes.append(
                        StateChange(self.model, self.version, name, was, drift.state, drift)
                    )
            if self.state != before_all:
                changes.append(StateChange(self.model, self.version, "", before_all, self.state))
            return changes

    def saved_state(self) -> dict[str, Any]:
        """What a restart needs to go on where this left off: the window, the studies
        seen, and a reference still being collected (the complete one is saved apart)."""
        with self._lock:
            return {
                "window": list(self.window),
                "studies": self.studies,
                "collected": list(self.reference) if self.collecting else [],
            }

    def restore(self, saved: Mapping[str, Any]) -> None:
        """Go on from :meth:`saved_state`: the window's states judged again at once, with
        no state change announced (they were announced before the restart), so an alert
        does not go quiet because the server restarted."""
        window = [r for r in saved.get("window", []) if isinstance(r, dict)]
        collected = [r for r in saved.get("collected", []) if isinstance(r, dict)]
        with self._lock:
            self.studies = max(self.studies, int(saved.get("studies", 0)))
            if self.collecting and collected and not self.reference:
                self.reference = collected[: max(self.collect, _MIN_VALUES)]
            self.window.extend(window)
            if not self.collecting and len(self.window) >= self.limits.min_window:
                self.features = compare(self.reference, list(self.window), self.limits)

    def summary(self) -> dict[str, Any]:
        with self._lock:
            return {
                "model": self.model,
                "version": self.version,
                "state": self.state.label,
                "reference": {"studies": len(self.reference), "source": self.reference_source},
                "collecting_reference": self.collecting,
                "window": {"studies": len(self.window), "size": self.limits.window},
                "studies": self.studies,
                "features": {n: f.as_json() for n, f in sorted(self.features.items())},
            }


__all__ = [
    "DriftLimits",
    "DriftMonitor",
    "DriftState",
    "FeatureDrift",
    "StateChange",
    "compare",
    "model_record",
    "psi",
]

"""Canary guardrails: the running record of a candidate version and the rule that rolls
it back (failure rate, p95 of its own step's time against stable's over the same span,
disagreement with stable).

Pure bookkeeping: :class:`VersionRecord` collects what happened; :func:`breach` says
whether the settings' thresholds are crossed and why. The server acts on the answer.

Speed is judged on what a version controls, its own step's stages (``<step>: prepare``,
``: infer``, ``: merge``, ``: postprocess``), not the job's turnaround: a turnaround holds
the wait in the queue and the other steps, so a good canary deployed into a burst looked
several times slower than stable's quiet record and was rolled back. Stable's side is
taken from the same span of time as the canary's (the load both saw) where it has enough
jobs there, else its latest jobs, as many as the canary's.

Every comparison reads "the version under trial minus stable": its ``serving_*`` side is
the stable version's, its ``candidate_*`` side the shadow's or the canary's
(:meth:`radserve.service.lifecycle.ModelLifecycle.run_comparison`), so a record's
``mean_volume_diff_rel`` and ``mean_latency_diff_seconds`` are positive where the
version under trial measures more (before 2026-12-07 a canary's were stable minus
canary). A canary is judged only on its comparisons with the stable version it is
judged against (:func:`breach`): ones made with an earlier stable are left out.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np

from radserve.lifecycle.compare import Comparison

WINDOW = 200  # studies per version kept for the percentiles and means
# slow jobs a p95 rollback needs: over a few jobs the p95 is almost their slowest one, so
# one slow job (a garbage collection, a cold cache, a neighbour's burst) rolled back a
# good version; from 40 jobs on, a p95 over the threshold has at least two above it anyway
MIN_SLOW_JOBS = 2


def own_seconds(timings: Mapping[str, float] | None, step: str) -> float | None:
    """The seconds a job spent in ``step``'s own stages; None when it ran none (a cached
    result)."""
    prefix = f"{step}: "
    parts = [v for k, v in (timings or {}).items() if k.startswith(prefix)]
    return float(sum(parts)) if parts else None


def _p95(values: Sequence[float]) -> float:
    return float(np.percentile(values, 95))


@dataclass(frozen=True)
class JobTime:
    """One succeeded job of a version: when it finished (``time.monotonic``), its
    turnaround (arrival to finish) and the seconds of the version's own stages."""

    at: float
    turnaround: float | None
    own: float | None


class GuardrailLimits(Protocol):
    auto_rollback: bool
    min_studies: int
    max_failure_rate: float
    max_p95_ratio: float
    min_comparisons: int
    min_lesion_agreement: float
    min_dice: float
    min_answer_agreement: float


@dataclass
class VersionRecord:
    """What one version of one step did since it was deployed."""

    step: str
    version: str
    finished: int = 0
    failed: int = 0
    times: deque[JobTime] = field(default_factory=lambda: deque(maxlen=WINDOW))
    comparisons: deque[Comparison] = field(default_factory=lambda: deque(maxlen=WINDOW))

    def add_job(
        self, ok: bool, turnaround: float | None, own: float | None = None, at: float = 0.0
    ) -> None:
        self.finished += 1
        self.failed += not ok
        if ok and (turnaround is not None or own is not None):
            self.times.append(JobTime(at, turnaround, own))

    @property
    def failure_rate(self) -> float:
        return self.failed / self.finished if self.finished else 0.0

    def p95(self) -> float | None:
        """p95 turnaround of the recent jobs (shown, not judged: it holds the queue)."""
        values = [t.turnaround for t in self.times if t.turnaround is not None]
        return _p95(values) if values else None

    def own_times(self) -> list[tuple[float, float]]:
        """(finished at, own step seconds) of the recent jobs that ran the step."""
        return [(t.at, t.own) for t in self.times if t.own is not None]

    def own_p95(self) -> float | None:
        """p95 of the version's own step seconds over its recent jobs."""
        values = [own for _, own in self.own_times()]
        return _p95(values) if values else None

    def mean_lesion_agreement(self) -> float | None:
        values = [c.lesion_agreement for c in self.comparisons if c.lesion_agreement is not None]
        return float(np.mean(values)) if values else None

    def mean_dice(self) -> float | None:
        values = [c.mean_dice for c in self.comparisons if c.mean_dice is not None]
        return float(np.mean(values)) if values else None

    def answer_agreement(self) -> float | None:
        """The share of compared studies a classification step answered alike."""
        alike = [c.answer_agrees for c in self.comparisons if c.answer_agrees is not None]
        return sum(alike) / len(alike) if alike else None

    def summary(self) -> dict[str, Any]:
        """The record as ``GET /v1/models/comparisons`` shows it. Differences are the
        version under trial minus stable: ``mean_volume_diff_rel`` (relative to stable's
        volume), ``mean_latency_diff_seconds``; ``lesions_by_stratum``'s
        ``serving_only`` are lesions only stable found, ``candidate_only`` only the
        version under trial (this record's, for a shadow or a canary)."""
        strata: dict[str, dict[str, int]] = {}
        for comparison in self.comparisons:
            for name, s in comparison.lesions.items():
                acc = strata.setdefault(name, {"both": 0, "serving_only": 0, "candidate_only": 0})
                acc["both"] += s.both
                acc["serving_only"] += s.serving_only
                acc["candidate_only"] += s.candidate_only
        dice: dict[str, list[float]] = {}
        volumes: dict[str, list[float]] = {}
        for comparison in self.comparisons:
            for name, value in comparison.dice.items():
                dice.setdefault(name, []).append(value)
            for name, value in comparison.volume_diff_rel.items():
                volumes.setdefault(name, []).append(value)
        latency = [
            c.candidate_seconds - c.serving_seconds
            for c in self.comparisons
            if c.candidate_seconds is not None and c.serving_seconds is not None
        ]
        return {
            "step": self.step,
            "version": self.version,
            "finished": self.finished,
            "failed": self.failed,
            "failure_rate": self.failure_rate,
            "p95_seconds": self.p95(),
            "p95_step_seconds": self.own_p95(),
            "comparisons": len(self.comparisons),
            "mean_dice": self.mean_dice(),
            "dice": {k: float(np.mean(v)) for k, v in dice.items()},
            "lesion_agreement": self.mean_lesion_agreement(),
            "answer_agreement": self.answer_agreement(),
            "lesions_by_stratum": strata,
            "mean_volume_diff_rel": {k: float(np.mean(v)) for k, v in volumes.items()},
            "mean_latency_diff_seconds": float(np.mean(latency)) if latency else None,
        }


def breach(
    canary: VersionRecord, stable: VersionRecord | None, limits: GuardrailLimits
) -> str | None:
    """Why the canary must be rolled back, or None. Its comparisons count only where
    made with ``stable``'s version (:func:`_compared_with`)."""
    judged = _compared_with(canary, stable)
    if canary.finished >= limits.min_studies and canary.failure_rate > limits.max_failure_rate:
        return (
            f"failure rate {canary.failure_rate:.0%} over {canary.finished} studies exceeds "
            f"{limits.max_failure_rate:.0%}"
        )
    if (why := _slower(canary, stable, limits)) is not None:
        return why
    if len(judged.comparisons) >= limits.min_comparisons:
        agreement = judged.mean_lesion_agreement()
        if agreement is not None and agreement < limits.min_lesion_agreement:
            return (
                f"lesion agreement with stable {agreement:.0%} over {len(judged.comparisons)} "
                f"studies is below {limits.min_lesion_agreement:.0%}"
            )
        dice = judged.mean_dice()
        if dice is not None and dice < limits.min_dice:
            return (
                f"mean Dice with stable {dice:.2f} over {len(judged.comparisons)} studies is "
                f"below {limits.min_dice:.2f}"
            )
        answers = judged.answer_agreement()
        if answers is not None and answers < limits.min_answer_agreement:
            return (
                f"classification answers alike with stable on {answers:.0%} of "
                f"{len(judged.comparisons)} studies, below {limits.min_answer_agreement:.0%}"
            )
    return None


def _compared_with(canary: VersionRecord, stable: VersionRecord | None) -> VersionRecord:
    """``canary`` with only its comparisons that involve ``stable``'s version (all of
    them without a stable record): a comparison waiting for an idle queue while the
    stable version changed was made with the earlier one, and judging the canary on it
    judged it against a version no longer serving."""
    if stable is None:
        return canary
    kept = [
        c for c in canary.comparisons if stable.version in (c.serving_version, c.candidate_version)
    ]
    if len(kept) == len(canary.comparisons):
        return canary
    return replace(canary, comparisons=deque(kept, maxlen=WINDOW))


def _slower(
    canary: VersionRecord, stable: VersionRecord | None, limits: GuardrailLimits
) -> str | None:
    """The canary's own step p95 against stable's over the same span of time, or over
    stable's latest jobs, as many as the canary's, where too few of its jobs ended in
    that span (a 100 % canary leaves stable none); at least ``MIN_SLOW_JOBS`` of the
    canary's jobs must be over the limit."""
    mine = canary.own_times()
    if len(mine) < limits.min_studies or stable is None:
        return None
    theirs = stable.own_times()
    same_span = [t for t in theirs if t[0] >= mine[0][0]]
    base_jobs = same_span if len(same_span) >= limits.min_studies else theirs[-len(mine) :]
    if len(base_jobs) < limits.min_studies:
        return None
    p95 = _p95([own for _, own in mine])
    base = _p95([own for _, own in base_jobs])
    limit = limits.max_p95_ratio * base
    slow = sum(own > limit for _, own in mine)
    if base <= 0 or p95 <= limit or slow < MIN_SLOW_JOBS:
        return None
    span = "the same span" if base_jobs is same_span else f"its latest {len(base_jobs)} jobs"
    return (
        f"p95 of its own step {p95:.2f} s over {len(mine)} jobs ({slow} of them slower) is "
        f"over {limits.max_p95_ratio:g}x stable's {base:.2f} s ({span})"
    )


__all__ = ["MIN_SLOW_JOBS", "GuardrailLimits", "JobTime", "VersionRecord", "breach", "own_seconds"]

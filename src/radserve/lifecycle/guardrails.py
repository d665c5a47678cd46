"""Canary guardrails: the running record of a candidate version and the rule that rolls
it back (failure rate, p95 turnaround against stable, disagreement with stable).

Pure bookkeeping: :class:`VersionRecord` collects what happened; :func:`breach` says
whether the settings' thresholds are crossed and why. The server acts on the answer.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from radserve.lifecycle.compare import Comparison

WINDOW = 200  # studies per version kept for the percentiles and means


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
    seconds: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))
    comparisons: deque[Comparison] = field(default_factory=lambda: deque(maxlen=WINDOW))

    def add_job(self, ok: bool, seconds: float | None) -> None:
        self.finished += 1
        self.failed += not ok
        if ok and seconds is not None:
            self.seconds.append(seconds)

    @property
    def failure_rate(self) -> float:
        return self.failed / self.finished if self.finished else 0.0

    def p95(self) -> float | None:
        return float(np.percentile(list(self.seconds), 95)) if self.seconds else None

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
    """Why the canary must be rolled back, or None."""
    if canary.finished >= limits.min_studies and canary.failure_rate > limits.max_failure_rate:
        return (
            f"failure rate {canary.failure_rate:.0%} over {canary.finished} studies exceeds "
            f"{limits.max_failure_rate:.0%}"
        )
    p95, base = canary.p95(), stable.p95() if stable is not None else None
    if (
        p95 is not None
        and base
        and len(canary.seconds) >= limits.min_studies
        and len(stable.seconds if stable else ()) >= limits.min_studies
        and p95 > limits.max_p95_ratio * base
    ):
        return f"p95 turnaround {p95:.2f} s is over {limits.max_p95_ratio:g}x stable's {base:.2f} s"
    if len(canary.comparisons) >= limits.min_comparisons:
        agreement = canary.mean_lesion_agreement()
        if agreement is not None and agreement < limits.min_lesion_agreement:
            return (
                f"lesion agreement with stable {agreement:.0%} over {len(canary.comparisons)} "
                f"studies is below {limits.min_lesion_agreement:.0%}"
            )
        dice = canary.mean_dice()
        if dice is not None and dice < limits.min_dice:
            return (
                f"mean Dice with stable {dice:.2f} over {len(canary.comparisons)} studies is "
                f"below {limits.min_dice:.2f}"
            )
        answers = canary.answer_agreement()
        if answers is not None and answers < limits.min_answer_agreement:
            return (
                f"classification answers alike with stable on {answers:.0%} of "
                f"{len(canary.comparisons)} studies, below {limits.min_answer_agreement:.0%}"
            )
    return None


__all__ = ["GuardrailLimits", "VersionRecord", "breach"]

"""Which unfinished jobs stand at deadline risk: the transitions, apart from their effects.

A job is raised at risk when its predicted finish passes ``deadline - margin`` (and the
deadline has not passed yet: after it, a late job is a miss, not a prediction). It is
cleared when the prediction recovers to ``deadline - margin - clear_s`` or earlier: the
band between the two thresholds is hysteresis, so a prediction hovering at the threshold
(it moves on every recomputation as running jobs age and others finish) does not raise
and clear an alert each time. A cleared job is raised again, as a new event, if its
prediction passes the threshold once more. After the deadline nothing changes: a risk
standing then is the one the miss is counted against.

Two options the replay (``tools/risk_replay.py``, session 20) tried and the server does
not use (both off by default): a margin that grows with the time left to the deadline
(``margin_fraction`` of it, added to ``margin_s``), and a persistence rule (``hold_s``: a
prediction must stand past the threshold that long, over successive recomputations,
before it is raised). Over the sixteen kept traces neither beat the plain margin held
out (docs/history/turnaround.md "Session 20").

:class:`RiskTracker` is plain state (its owner locks it) and says what changed; the owner
(:class:`radserve.service.turnaround.Turnaround`) audits, counts and alerts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from radserve.domain.priority import PriorityClass
from radserve.turnaround.eta import Eta


@dataclass(frozen=True)
class RiskEvent:
    """A job predicted to finish past ``deadline - margin`` (scheduler clock)."""

    job_id: str
    cls: PriorityClass
    raised_at: float
    deadline: float
    predicted_finish: float
    predicted_finish_late: float

    @property
    def lead_s(self) -> float:
        """How long before the deadline the alert came."""
        return self.deadline - self.raised_at


@dataclass(frozen=True)
class RiskCleared:
    """A standing risk whose prediction recovered (``cleared_at``, scheduler clock)."""

    risk: RiskEvent
    cleared_at: float
    predicted_finish: float
    predicted_finish_late: float

    @property
    def held_s(self) -> float:
        """How long the risk stood."""
        return self.cleared_at - self.risk.raised_at


class RiskTracker:
    """The standing risks, and the raise / clear transitions (module docstring)."""

    def __init__(
        self, margin_s: float, clear_s: float, *, margin_fraction: float = 0.0, hold_s: float = 0.0
    ) -> None:
        if margin_s < 0 or clear_s < 0 or hold_s < 0:
            raise ValueError("the risk margin, clearing band and hold are seconds >= 0")
        if not 0.0 <= margin_fraction < 1.0:
            raise ValueError("the margin's fraction of the time left is in [0, 1)")
        self.margin_s = margin_s
        self.clear_s = clear_s
        self.margin_fraction = margin_fraction
        self.hold_s = hold_s
        self._risks: dict[str, RiskEvent] = {}
        self._over_since: dict[str, float] = {}  # past the threshold, not yet held long
        self.raised = 0
        self.cleared = 0

    def update(
        self, etas: Iterable[Eta], classes: Mapping[str, PriorityClass], now: float
    ) -> tuple[list[RiskEvent], list[RiskCleared]]:
        """Apply one recomputation's ETAs (jobs not among them keep their state): the
        risks newly raised and those cleared."""
        raised: list[RiskEvent] = []
        cleared: list[RiskCleared] = []
        for eta in etas:
            risk = self._risks.get(eta.job_id)
            if risk is not None:
                # a re-prioritised job: its standing risk takes its current class and
                # deadline, so the cleared event, the miss's lead and the at-risk list
                # name them (the cleared event carried the class and deadline of the raise)
                risk = self._current(risk, classes.get(eta.job_id, risk.cls), eta.deadline)
            if now > eta.deadline:  # missed: a miss, no longer a prediction
                continue
            threshold = self.threshold(eta.deadline, now)
            if risk is None:
                if eta.finish <= threshold:
                    self._over_since.pop(eta.job_id, None)
                    continue
                since = self._over_since.setdefault(eta.job_id, now)
                if now - since >= self.hold_s:
                    del self._over_since[eta.job_id]
                    risk = RiskEvent(
                        eta.job_id,
                        classes[eta.job_id],
                        now,
                        eta.deadline,
                        eta.finish,
                        eta.finish_late,
                    )
                    self._risks[eta.job_id] = risk
                    raised.append(risk)
            elif eta.finish <= threshold - self.clear_s:
                del self._risks[eta.job_id]
                cleared.append(RiskCleared(risk, now, eta.finish, eta.finish_late))
        self.raised += len(raised)
        self.cleared += len(cleared)
        return raised, cleared

    def _current(self, risk: RiskEvent, cls: PriorityClass, deadline: float) -> RiskEvent:
        """``risk`` with the job's class and deadline as they are now (stored)."""
        if risk.cls is cls and risk.deadline == deadline:
            return risk
        risk = dataclasses.replace(risk, cls=cls, deadline=deadline)
        self._risks[risk.job_id] = risk
        return risk

    def threshold(self, deadline: float, now: float) -> float:
        """The predicted finish past which a job is at risk: ``deadline - margin_s``,
        less ``margin_fraction`` of the time left (none by default)."""
        return deadline - self.margin_s - self.margin_fraction * max(0.0, deadline - now)

    def forget(self, job_id: str) -> None:
        """The job ended: its risk, if any, goes without an event."""
        self._risks.pop(job_id, None)
        self._over_since.pop(job_id, None)

    def get(self, job_id: str) -> RiskEvent | None:
        return self._risks.get(job_id)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._risks

    def standing(self) -> list[RiskEvent]:
        return list(self._risks.values())


__all__ = ["RiskCleared", "RiskEvent", "RiskTracker"]

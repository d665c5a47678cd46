"""Who serves a pipeline step: one stable version, optionally a canary (a share of
studies) and a shadow (a sampled share, run after the result is delivered, never sent).

Routing is deterministic: a study's bucket is a hash of its routing key (the Study
Instance UID; the input fingerprint when there is none) and the step, so a re-sent study
gets the same version. URGENT studies stay on stable unless the canary asks for them.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from dataclasses import dataclass
from enum import StrEnum

from radserve.domain.priority import PriorityClass


class Role(StrEnum):
    STABLE = "stable"
    CANARY = "canary"
    SHADOW = "shadow"


class DeploymentAction(StrEnum):
    DEPLOY = "deploy"
    PROMOTE = "promote"
    ROLLBACK = "rollback"
    AUTO_ROLLBACK = "auto_rollback"
    UNDEPLOY = "undeploy"  # a shadow removed


@dataclass(frozen=True)
class StepDeployment:
    """A step's state after one change (one ``model_deployments`` row)."""

    step: str
    stable: str
    canary: str | None = None
    canary_percent: float = 0.0
    canary_urgent: bool = False
    shadow: str | None = None
    shadow_percent: float = 0.0
    # the change that led here
    id: int | None = None
    created: dt.datetime | None = None
    action: DeploymentAction = DeploymentAction.DEPLOY
    actor: str | None = None
    reason: str | None = None

    def versions(self) -> dict[str, Role]:
        """Every version this deployment serves or shadows, by role."""
        out = {self.stable: Role.STABLE}
        if self.canary:
            out[self.canary] = Role.CANARY
        if self.shadow:
            out.setdefault(self.shadow, Role.SHADOW)
        return out

    def same_serving(self, other: StepDeployment | None) -> bool:
        return other is not None and (
            self.stable,
            self.canary,
            self.canary_percent,
            self.canary_urgent,
            self.shadow,
            self.shadow_percent,
        ) == (
            other.stable,
            other.canary,
            other.canary_percent,
            other.canary_urgent,
            other.shadow,
            other.shadow_percent,
        )


def bucket(routing_key: str, step: str, salt: str = "canary") -> float:
    """The study's place in [0, 100) for ``step``: the same key always lands the same."""
    digest = hashlib.sha256(f"{salt}\0{step}\0{routing_key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % 10_000 / 100.0


def route(
    deployment: StepDeployment, routing_key: str, priority: PriorityClass | None
) -> tuple[str, Role]:
    """The version (and its role) that runs ``deployment.step`` for this study."""
    if deployment.canary and deployment.canary_percent > 0:
        urgent = priority is PriorityClass.URGENT
        if (not urgent or deployment.canary_urgent) and bucket(
            routing_key, deployment.step
        ) < deployment.canary_percent:
            return deployment.canary, Role.CANARY
    return deployment.stable, Role.STABLE


def shadow_for(deployment: StepDeployment, routing_key: str) -> str | None:
    """The shadow version to run afterwards on this study, or None (not sampled)."""
    if not deployment.shadow or deployment.shadow_percent <= 0:
        return None
    if bucket(routing_key, deployment.step, salt="shadow") < deployment.shadow_percent:
        return deployment.shadow
    return None


__all__ = ["DeploymentAction", "Role", "StepDeployment", "bucket", "route", "shadow_for"]

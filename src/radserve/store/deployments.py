"""The ``model_deployments`` table: each change of a step's serving versions is one row
(append-only) and one audit record, written in the same transaction."""

from __future__ import annotations

from sqlalchemy import func, select

from radserve.audit.chain import AuditEvent
from radserve.audit.events import Action
from radserve.domain.deployment import DeploymentAction, StepDeployment
from radserve.store import audit as audit_log
from radserve.store.base import StoreBase
from radserve.store.models import ModelDeployment
from radserve.store.records import utc_now


def _record(row: ModelDeployment) -> StepDeployment:
    return StepDeployment(
        step=row.step,
        stable=row.stable,
        canary=row.canary,
        canary_percent=row.canary_percent,
        canary_urgent=row.canary_urgent,
        shadow=row.shadow,
        shadow_percent=row.shadow_percent,
        id=row.id,
        created=row.created,
        action=DeploymentAction(row.action),
        actor=row.actor,
        reason=row.reason,
    )


class DeploymentStore(StoreBase):
    """Typed access to ``model_deployments`` over the main store's engine:
    ``DeploymentStore(store.engine, audit_key=store.audit_key)``. Thread-safe."""

    def record(
        self, deployment: StepDeployment, *, client_address: str | None = None
    ) -> StepDeployment:
        """Append ``deployment`` as the step's new state, with its audit record."""
        row = ModelDeployment(
            created=utc_now(),
            step=deployment.step,
            stable=deployment.stable,
            canary=deployment.canary,
            canary_percent=float(deployment.canary_percent),
            canary_urgent=bool(deployment.canary_urgent),
            shadow=deployment.shadow,
            shadow_percent=float(deployment.shadow_percent),
            action=deployment.action.value,
            actor=deployment.actor,
            reason=deployment.reason,
        )
        with self._write() as session:
            session.add(row)
            session.flush()
            saved = _record(row)
            audit_log.append(
                session,
                AuditEvent(
                    action=Action.MODEL_CHANGED,
                    subject=deployment.step,
                    payload={
                        "event": f"deployment.{deployment.action.value}",
                        "deployment_id": row.id,
                        "stable": row.stable,
                        "canary": row.canary,
                        "canary_percent": row.canary_percent,
                        "canary_urgent": row.canary_urgent,
                        "shadow": row.shadow,
                        "shadow_percent": row.shadow_percent,
                        "reason": row.reason or "",
                    },
                    actor_key_id=deployment.actor,
                    client_address=client_address,
                ),
            )
        return saved

    def current(self) -> dict[str, StepDeployment]:
        """Each step's newest row."""
        newest = (
            select(ModelDeployment.step, func.max(ModelDeployment.id).label("id"))
            .group_by(ModelDeployment.step)
            .subquery()
        )
        with self._read() as session:
            rows = session.scalars(
                select(ModelDeployment).join(newest, ModelDeployment.id == newest.c.id)
            ).all()
            return {row.step: _record(row) for row in rows}

    def history(self, step: str | None = None, limit: int = 100) -> list[StepDeployment]:
        """Changes, newest first."""
        query = select(ModelDeployment).order_by(ModelDeployment.id.desc()).limit(limit)
        if step is not None:
            query = query.where(ModelDeployment.step == step)
        with self._read() as session:
            return [_record(row) for row in session.scalars(query).all()]


__all__ = ["DeploymentStore"]

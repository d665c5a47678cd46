"""The options of a deployment that only some roles take, checked at every door that
deploys (``radserve models deploy``, ``POST /v1/models/{step}/deploy``) before anything
is loaded or recorded.

A share of studies (``percent``) is a canary's or a shadow's; a stable version serves
every study not routed to a canary. URGENT routing (``include_urgent``) is a canary's: a
stable version serves URGENT studies already, and a shadow runs after delivery. Before
2026-12-08 both were accepted with any role and ignored: ``radserve models deploy lesions
1.3.0 --percent 10 --reason trial`` (``--role`` left at its default, stable) deployed
1.3.0 to every study, where the operator meant a 10 % canary. The web console already
sent neither with a role that does not take it.
"""

from __future__ import annotations

from radserve.domain.deployment import Role
from radserve.errors import DeploymentError


def check_deploy_options(
    step: str, version: str, role: Role, percent: float, include_urgent: bool
) -> None:
    """Refuse (:class:`DeploymentError`) a ``percent`` for a stable version and
    ``include_urgent`` for anything but a canary, saying which role takes them."""
    if role is Role.STABLE and percent:
        raise DeploymentError(
            f"a stable version serves every study not routed to a canary and takes no "
            f"percent (got {percent:g}): to send {percent:g} % of the studies to {step} "
            f"{version}, deploy it with role canary (or shadow, to compare it after "
            "delivery); to make it stable, leave percent out"
        )
    if include_urgent and role is not Role.CANARY:
        raise DeploymentError(
            f"include_urgent routes URGENT studies to a canary; a {role.value} version "
            + (
                "serves them already"
                if role is Role.STABLE
                else "runs after delivery and never answers for them"
            )
            + ": leave include_urgent out, or deploy with role canary"
        )


__all__ = ["check_deploy_options"]

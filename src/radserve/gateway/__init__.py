"""DICOM network gateway: the storage SCP (studies in), the outbox SCU (results out).

Received studies reach the service through one callback, ``on_study(CompletedStudy)``,
called once a study has been quiet for the configured period; results leave through
:class:`Outbox` (``enqueue`` then ``deliver_pending`` / :class:`OutboxWorker`). The
conformance statement (``docs/conformance.md``) describes what each side negotiates.
"""

from radserve.gateway.completeness import (
    CompletedStudy,
    CompletionKind,
    LatePolicy,
    StudyCallback,
    StudyTracker,
)
from radserve.gateway.config import (
    Destination,
    Peer,
    ScpConfig,
    TlsSettings,
    destinations,
    scp_config_from_settings,
)
from radserve.gateway.conformance import UnwantedPolicy
from radserve.gateway.errors import GatewayConfigError, GatewayError
from radserve.gateway.outbox import DeliveryReport, Outbox, OutboxWorker, RetryPolicy
from radserve.gateway.scp import GatewaySCP
from radserve.gateway.scu import Outcome, SendResult, StoreSCU

__all__ = [
    "CompletedStudy",
    "CompletionKind",
    "DeliveryReport",
    "Destination",
    "GatewayConfigError",
    "GatewayError",
    "GatewaySCP",
    "LatePolicy",
    "Outbox",
    "OutboxWorker",
    "Outcome",
    "Peer",
    "RetryPolicy",
    "ScpConfig",
    "SendResult",
    "StoreSCU",
    "StudyCallback",
    "StudyTracker",
    "TlsSettings",
    "UnwantedPolicy",
    "destinations",
    "scp_config_from_settings",
]

"""DICOM network gateway: the storage SCP (studies in), the outbox SCU (results out).

Received studies reach the service through one callback, ``on_study(CompletedStudy)``,
called once a study has been quiet for the configured period; results leave through
:class:`Outbox` (``enqueue`` then ``deliver_pending`` / :class:`OutboxWorker`). The
conformance statement (``docs/conformance.md``) describes what each side negotiates.

The names below are imported on first use (PEP 562): the API imports
``radserve.gateway.dicomweb`` for STOW-RS, and the SCP's eager import here loaded
pynetdicom, highdicom and SciPy (its own-results check writes reports) into every
``radserve serve`` whether or not it runs a DICOM listener.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from radserve.lazy_exports import lazy_exports

if TYPE_CHECKING:
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

_EXPORTS = {
    "CompletedStudy": "completeness",
    "CompletionKind": "completeness",
    "DeliveryReport": "outbox",
    "Destination": "config",
    "GatewayConfigError": "errors",
    "GatewayError": "errors",
    "GatewaySCP": "scp",
    "LatePolicy": "completeness",
    "Outbox": "outbox",
    "OutboxWorker": "outbox",
    "Outcome": "scu",
    "Peer": "config",
    "RetryPolicy": "outbox",
    "ScpConfig": "config",
    "SendResult": "scu",
    "StoreSCU": "scu",
    "StudyCallback": "completeness",
    "StudyTracker": "completeness",
    "TlsSettings": "config",
    "UnwantedPolicy": "conformance",
    "destinations": "config",
    "scp_config_from_settings": "config",
}

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

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)

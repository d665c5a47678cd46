"""Gateway errors: configuration mistakes, unreachable or refusing peers, storage failures.

Each carries the stable ``code`` and ``retryable`` flag of :class:`RadserveError`, so the
outbox can tell "try again later" (PACS down, out of resources) from "fix the
configuration" (association rejected, no acceptable presentation context).
"""

from __future__ import annotations

from radserve.errors import RadserveError


class GatewayError(RadserveError):
    """Something in the DICOM network gateway failed."""

    code = "gateway_error"


class GatewayConfigError(GatewayError):
    """A gateway setting cannot work (bad AE title, unreadable TLS files, unknown host)."""

    code = "gateway_config_invalid"


class InstanceRejectedError(GatewayError):
    """A received instance cannot be filed (no or malformed UIDs); the SCP answers a
    failure status so the sender knows it was not stored."""

    # the code STOW-RS and ingest give the same rule (radserve.ingest.rules): one answer
    code = "instance_invalid"


class OutOfResourcesError(GatewayError):
    """The instance could not be made durable (disk full, write error): 0xA700."""

    code = "out_of_resources"
    retryable = True

"""This replica's destinations as digests, for the comparison between replicas
(radserve.store.replica_config): ``kind:name`` -> the first 16 hex of a SHA-256 over
where that destination's results go (DICOM: AE title, host, port, TLS or not; FHIR and
webhooks: the URL; syslog: host, port, transport). Secrets (tokens) are never part of
it, and neither are knobs that may differ between replicas (timeouts, retries). Only
destinations this replica sends to: the DICOM peers only when the gateway is enabled
(its outbox is the only DICOM sender; a disabled gateway's ``allowed_peers`` used to be
recorded and compared too)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from radserve.config import Settings
from radserve.gateway.config import destinations as dicom_destinations


def _digest(fields: dict[str, Any]) -> str:
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def destination_digests(settings: Settings) -> dict[str, str]:
    """``kind:name`` -> digest for every destination this replica sends to."""
    dicom = dicom_destinations(settings.gateway) if settings.gateway.enabled else []
    out = {
        f"dicom:{d.name}": _digest(
            {"ae_title": d.ae_title, "host": d.host, "port": d.port, "tls": d.tls is not None}
        )
        for d in dicom
    }
    if settings.fhir.url is not None:
        out["fhir:fhir"] = _digest({"url": settings.fhir.url})
    for r in settings.critical.receivers:
        if r.kind == "syslog":
            where: dict[str, Any] = {"host": r.host, "port": r.port, "transport": r.transport}
        else:
            where = {"url": r.url or settings.fhir.url}
        out[f"critical:{r.name}"] = _digest({"kind": r.kind, **where})
    return out


__all__ = ["destination_digests"]

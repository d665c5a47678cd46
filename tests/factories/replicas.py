"""Two ``radserve serve`` replicas on one database: their settings, and waiting on the store."""

from __future__ import annotations

from pathlib import Path

from tests.factories.service import config_file, make_models_slow


def replica_config(
    root: Path, name: str, url: str, fhir_url: str, *, job_lease_s: float, outbox_lease_s: float
) -> Path:
    """Settings of replica ``name`` (its own folder and slow models, the shared database
    ``url``, FHIR delivery to ``fhir_url``)."""
    folder = root / name
    folder.mkdir()
    config = config_file(
        folder,
        database_url=url,
        jobs={"lease_s": job_lease_s, "lease_poll_s": 0.5},
        outbox={"replicas": 2, "instance_id": f"replica-{name}", "lease_s": outbox_lease_s},
        fhir={"url": fhir_url, "timeout_s": 30},
    )
    make_models_slow(folder / "assets" / "models", layers=4, channels=32)
    return config

"""A server start deletes the temporaries that writers killed mid-write left in result
folders (report, DICOM results, FHIR Bundle, critical notice), and only those."""

from __future__ import annotations

from pathlib import Path

from tests.factories.service import settings_for
from tests.factories.writers import ended_and_running

from radserve import durable
from radserve.service import Service


def test_a_start_sweeps_dead_writers_temporaries_from_result_folders(tmp_path: Path) -> None:
    settings = settings_for(tmp_path)
    folder = settings.data_dir / "results" / "job-1"
    folder.mkdir(parents=True)
    with ended_and_running() as (ended, running):
        dead = [
            durable.temporary_path(folder / name, pid=ended)
            for name in ("report.json", "measurements-sr.dcm", "bundle-1.json")
        ]
        live = durable.temporary_path(folder / "critical-1.json", pid=running.pid)
        result = folder / "report.json"
        for path in (*dead, live, result):
            path.write_bytes(b"{}")
        service = Service(settings)
        service.start(warm_up=False)
        try:
            assert not any(path.exists() for path in dead)
            assert live.exists() and result.read_bytes() == b"{}"
        finally:
            service.stop()

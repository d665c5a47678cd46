"""A server start deletes the temporaries that writers killed mid-write left in result
folders (report, DICOM results, FHIR Bundle, critical notice, key images) and comparison
folders, and only those."""

from __future__ import annotations

import os
import time
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
        keyimages = folder / "keyimages"  # a job's key images, one folder down
        keyimages.mkdir()
        dead.append(durable.temporary_path(keyimages / "finding-001.png", pid=ended))
        compared = settings.data_dir / "comparisons" / "job-1"  # a comparison's figures
        compared.mkdir(parents=True)
        dead.append(durable.temporary_path(compared / "2.0.0.json", pid=ended))
        live = durable.temporary_path(folder / "critical-1.json", pid=running.pid)
        result = folder / "report.json"
        older = folder / ".measurements-sr.dcm.q7z1xw.tmp"  # an older version's, left
        recent = folder / "report.json.tmp"  # an older version's, maybe still written
        for path in (*dead, live, result, older, recent):
            path.write_bytes(b"{}")
        hour_ago = time.time() - 3600
        os.utime(older, (hour_ago, hour_ago))
        service = Service(settings)
        service.start(warm_up=False)
        try:
            assert not any(path.exists() for path in (*dead, older))
            assert live.exists() and recent.exists() and result.read_bytes() == b"{}"
        finally:
            service.stop()

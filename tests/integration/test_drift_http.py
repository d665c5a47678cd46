"""Drift monitoring over HTTP against a real running server (uvicorn on loopback): small
phantom studies submitted through ``POST /v1/studies``; the first five become each
model's reference, five more of the same population keep the state ``ok``, then a
shifted population (a +100 HU calibration offset) moves it to ``alert`` within the
window, seen in ``GET /v1/models/drift``, in the ``model.drift`` audit records and in
``radserve_model_drift_state`` on ``/metrics``."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from tests.factories.service import ServerThread, auth, config_file, create_key, upload, wait_job
from tests.factories.waits import WAIT_SCALE

from radserve.api import create_app
from radserve.config import load_settings
from radserve.phantom import PhantomSpec, generate_phantom, write_dicom_series
from radserve.service import Service

pytestmark = pytest.mark.slow

WINDOW = 5  # the smallest the settings allow: reference 5, window 5, judged when full
MODEL = "organs-test"


def phantom_study(folder: Path, seed: int, hu_offset: int = 0) -> list[Path]:
    """A small phantom (128 x 128 x 40-60) as a DICOM series; ``hu_offset`` shifts every
    pixel (a scanner whose HU calibration drifted)."""
    phantom = generate_phantom(PhantomSpec.random(seed, small=True))
    if hu_offset:
        shifted = np.clip(phantom.ct.array.astype(np.int32) + hu_offset, -1024, 3071)
        phantom = replace(phantom, ct=phantom.ct.with_array(shifted.astype(np.int16)))
    return write_dicom_series(phantom, folder, workers=1)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, Service, str]]:
    drift = {"reference_studies": WINDOW, "window": WINDOW, "min_window": WINDOW}
    config = config_file(tmp_path, lifecycle={"drift": drift})
    service = Service(load_settings(config, data_dir=tmp_path / "data"))
    token = create_key(service.store, "admin")
    with ServerThread(create_app(service)) as thread:
        service.wait_warm(60 * WAIT_SCALE)
        yield thread.url, service, token


def drift_of(c: httpx.Client, token: str, model: str) -> dict[str, Any]:
    r = c.get("/v1/models/drift", headers=auth(token))
    assert r.status_code == 200, r.text
    return next(m for m in r.json() if m["model"] == model)


def test_drift_moves_from_ok_to_alert_over_http(
    server: tuple[str, Service, str], tmp_path: Path
) -> None:
    url, service, token = server

    with httpx.Client(base_url=url, timeout=120) as c:

        def run(seed: int, hu_offset: int = 0) -> None:
            files = phantom_study(tmp_path / f"s{seed}", seed, hu_offset)
            r = c.post("/v1/studies", files=upload(files), headers=auth(token))
            assert r.status_code == 202, r.text
            job = wait_job(c, r.json()["id"], token, timeout=300)
            assert job["state"] == "succeeded", job

        for seed in range(WINDOW):  # the reference: the first studies served
            run(seed)
        first = drift_of(c, token, MODEL)
        assert first["reference"]["studies"] == WINDOW and not first["collecting_reference"]
        assert first["reference"]["source"] == f"first {WINDOW} studies served"

        for seed in range(WINDOW, 2 * WINDOW):  # the same population: no drift
            run(seed)
        normal = drift_of(c, token, MODEL)
        assert normal["window"]["studies"] == WINDOW
        assert normal["state"] == "ok", normal["features"]
        assert {"hu_body", "noise_hu", "slice_thickness_mm"} <= set(normal["features"])

        shifted_studies = 0
        for seed in range(2 * WINDOW, 3 * WINDOW):  # +100 HU: the calibration drifted
            run(seed, hu_offset=100)
            shifted_studies += 1
            if drift_of(c, token, MODEL)["state"] == "alert":
                break
        shifted = drift_of(c, token, MODEL)
        assert shifted["state"] == "alert", shifted["features"]
        alerts = {n for n, f in shifted["features"].items() if f["state"] == "alert"}
        assert "hu_body" in alerts, shifted["features"]
        assert shifted["features"]["hu_body"]["test"] == "psi"
        # both models of the pipeline saw the same inputs
        assert drift_of(c, token, "lesions-test")["state"] == "alert"

        metrics = c.get("/metrics").text
        overall = re.search(
            r'radserve_model_drift_state\{feature="overall",model="organs-test",'
            r'version="1\.0\.0"\} (\S+)',
            metrics,
        )
        assert overall is not None and float(overall.group(1)) == 2.0
        assert re.search(
            r'radserve_model_drift_reference_studies\{model="organs-test",version="1\.0\.0"\} 5',
            metrics,
        )

    events = [
        r.payload
        for r in service.store.iter_audit()
        if r.action == "model.drift" and r.subject == f"{MODEL}/1.0.0"
    ]
    overall_changes = [(e["from"], e["to"]) for e in events if e["feature"] is None]
    assert overall_changes and overall_changes[-1][1] == "alert", events
    assert overall_changes[0][0] == "ok"
    hu = [e for e in events if e["feature"] == "hu_body" and e["to"] == "alert"]
    assert hu and hu[0]["test"] == "psi" and hu[0]["statistic"] >= 0.25
    print(f"alert after {shifted_studies} shifted studies (window {WINDOW})")

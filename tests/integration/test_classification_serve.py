"""Issue 13: a classification step through the server (scheduler, batches, result
writers), not only through ``radserve run``: a pipeline of an organ model and a
classification model from YAML, a study submitted over the API; the job's report and
FHIR bundle carry the class and its probability (the SR is checked through
``radserve run`` in tests/e2e/test_pipeline_kinds.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.factories.bundles import write_classifier_bundle
from tests.factories.service import (
    auth,
    live_server,
    make_study,
    settings_for,
    upload,
    wait_job,
    write_assets,
)


def test_a_classification_step_runs_through_the_server(tmp_path: Path) -> None:
    assets = write_assets(tmp_path / "assets")
    models, pipelines = Path(assets["models__dirs"][0]), Path(assets["pipelines__dirs"][0])
    write_classifier_bundle(models, "dense-sign", 600.0)  # the 700 HU sphere: present
    (pipelines / "classify.yaml").write_text(yaml.safe_dump({
        "name": "classify", "version": "1.0.0",
        "series_selection": {"modalities": ["CT"], "min_slices": 3},
        "steps": [{"model": "organs-test"}, {"model": "dense-sign"}],
    }))  # fmt: skip
    settings = settings_for(tmp_path, pipelines__default="classify")
    with live_server(settings) as live:
        c, key = live["client"], live["submit"]
        r = c.post("/v1/studies", files=upload(make_study(tmp_path / "s")), headers=auth(key))
        assert r.status_code == 202, r.text
        job = wait_job(c, r.json()["id"], key)
        assert job["state"] == "succeeded", job
        report: dict[str, Any] = c.get(f"/v1/jobs/{job['id']}/report", headers=auth(key)).json()
        [classified] = report["classifications"]
        assert (classified["step"], classified["label"]) == ("dense-sign", "dense_sign")
        assert classified["positive"] and classified["probability"] == pytest.approx(
            0.881, abs=0.02
        )  # sigmoid(20 x (0.7 - 0.6)): the sphere's brightest slice
        assert [m["step"] for m in report["outputs"]["label_maps"]] == ["organs-test"]
        bundle = c.get(f"/v1/jobs/{job['id']}/fhir", headers=auth(key)).json()
        resources = [e["resource"] for e in bundle["entry"]]
        [observation] = [
            r for r in resources
            if r["resourceType"] == "Observation"
            and r["code"]["coding"][0]["display"] == "dense_sign"
        ]  # fmt: skip
        assert observation["valueQuantity"]["value"] == pytest.approx(
            classified["probability"], abs=1e-4
        )

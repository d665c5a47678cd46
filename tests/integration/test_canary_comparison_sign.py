"""Every comparison reads "the version under trial minus stable": a canary's as a
shadow's. A canary study is served by the canary and stable is re-run beside it; before
2026-12-07 the two results were compared the other way round from a shadow's, so a
canary's ``candidate_only`` lesions, ``mean_volume_diff_rel`` and latency difference
were stable's. And a canary's check runs against the stable version of when it runs,
not of when its study was routed (a comparison waits for an idle queue). On a real
service: the lesion test bundle 1.0.0 served the study, 1.1.0 (its threshold at 800
HU) misses the 700 HU lesion of its two."""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import yaml
from tests.factories.dicom_series import make_ct_series, new_uid
from tests.factories.onnx_models import threshold_model
from tests.factories.service import (
    GRID,
    ORIGIN,
    ServerThread,
    auth,
    create_key,
    settings_for,
    upload,
    wait_job,
)

from radserve.api import create_app
from radserve.domain.deployment import StepDeployment
from radserve.service import Service
from radserve.service.lifecycle import ComparisonTask

LESIONS = "lesions-test"


def _two_lesions(points: np.ndarray) -> np.ndarray:
    """A 100 HU 'liver' block in air with a 700 HU and a 1000 HU sphere (radius 4 mm)."""
    block = (np.abs(points - np.array([0.0, 0.0, 11.0])) < [15.0, 15.0, 40.0]).all(-1)
    out = np.where(block, 100.0, -1000.0)
    for centre, hu in (((-7.0, -5.0, 11.0), 700.0), ((7.0, 5.0, 11.0), 1000.0)):
        out = np.where(np.linalg.norm(points - np.asarray(centre), axis=-1) <= 4.0, hu, out)
    return out


def _version(models: Path, version: str, lesion_hu: float) -> None:
    folder = models / LESIONS / version
    shutil.copytree(models / LESIONS / "1.0.0", folder)
    manifest = yaml.safe_load((folder / "model.yaml").read_text())
    manifest["version"] = version
    (folder / "model.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False))
    threshold_model(folder / "model.onnx", in_channels=3, level=lesion_hu / 1000.0)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Service, Any]]:
    """A real server that ran one study on lesions-test 1.0.0; 1.1.0 put beside it."""
    service = Service(settings_for(tmp_path))
    token = create_key(service.store, "submit")
    files = make_ct_series(
        tmp_path / "study", **GRID, origin=ORIGIN, hu=_two_lesions, study_uid=new_uid()
    )
    with (
        ServerThread(create_app(service)) as thread,
        httpx.Client(base_url=thread.url, timeout=60) as c,
    ):
        r = c.post("/v1/studies", files=upload(files), headers=auth(token))
        assert r.status_code == 202, r.text
        assert wait_job(c, r.json()["id"], token, timeout=120)["state"] == "succeeded"
        assert service.wait_warm(120)
        _version(tmp_path / "assets" / "models", "1.1.0", 800.0)
        service.catalog.rescan()
        yield service, service.store.get_job(r.json()["id"])


def test_a_canary_comparison_has_the_sign_of_a_shadow_one(served) -> None:
    service, job = served
    # 1.1.0 as a shadow beside stable 1.0.0, which served the study
    shadow = service.lifecycle.run_comparison(
        ComparisonTask(job, LESIONS, "1.0.0", "1.1.0", "shadow", record_for="1.1.0")
    )
    # 1.0.0 as a canary that served the study, stable 1.1.0 re-run beside it
    canary = service.lifecycle.run_comparison(
        ComparisonTask(job, LESIONS, "1.0.0", "1.1.0", "stable", record_for="1.0.0")
    )
    # the shadow (1.1.0) misses a lesion stable (1.0.0) found: stable's only
    assert (shadow.serving_version, shadow.candidate_version) == ("1.0.0", "1.1.0")
    assert sum(s.serving_only for s in shadow.lesions.values()) == 1
    assert sum(s.candidate_only for s in shadow.lesions.values()) == 0
    # the canary (1.0.0) finds a lesion stable (1.1.0) misses: the candidate's own, as
    # the shadow's extra lesion would be. Before: filed as serving_only (stable's)
    assert (canary.serving_version, canary.candidate_version) == ("1.1.0", "1.0.0")
    assert canary.candidate_role == "canary"
    assert sum(s.candidate_only for s in canary.lesions.values()) == 1
    assert sum(s.serving_only for s in canary.lesions.values()) == 0
    assert canary.lesion_agreement == shadow.lesion_agreement == 0.5


def test_a_canary_check_runs_against_the_stable_version_of_now(served, monkeypatch) -> None:
    service, job = served
    lifecycle = service.lifecycle
    task = ComparisonTask(job, LESIONS, "1.0.0", "0.9.0", "stable", record_for="1.0.0")
    now = StepDeployment(step=LESIONS, stable="1.1.0", canary="1.0.0", canary_percent=50.0)
    monkeypatch.setattr(lifecycle, "active", lambda: {LESIONS: now})
    assert lifecycle.against_current_stable(task) == dataclasses.replace(
        task, candidate_version="1.1.0"
    )
    # the canary became stable: nothing to compare any more
    promoted = StepDeployment(step=LESIONS, stable="1.0.0")
    monkeypatch.setattr(lifecycle, "active", lambda: {LESIONS: promoted})
    assert lifecycle.against_current_stable(task) is None
    # a shadow's task is run as it is
    shadow = ComparisonTask(job, LESIONS, "1.0.0", "1.1.0", "shadow", record_for="1.1.0")
    assert lifecycle.against_current_stable(shadow) is shadow

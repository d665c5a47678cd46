"""A comparison run (shadow, or stable beside a canary) runs only the compared step and
the steps after it: the steps before it are read back from the serving result. Counted
on a real service (its scheduler runs the serving job) with a session pool that counts
every batch each model file runs; the comparison equals the one a full re-run gives."""

from __future__ import annotations

import dataclasses
import shutil
from collections import Counter
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
from radserve.inference.tasks import InferenceCancelledError
from radserve.models.registry import ModelBundle
from radserve.pipeline import SessionPool
from radserve.pipeline.reuse import ReuseUnavailableError, upstream_steps
from radserve.service import Service
from radserve.service.lifecycle import ComparisonTask

ORGANS, LESIONS = "organs-test", "lesions-test"


class _Counted:
    def __init__(self, session: Any, counts: Counter[str], key: str) -> None:
        self._session, self._counts, self._key = session, counts, key

    def run(self, batch: np.ndarray) -> np.ndarray:
        self._counts[self._key] += 1
        return self._session.run(batch)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)


class CountingPool(SessionPool):
    """Real sessions; every ``run`` (one batch) counted per model version."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: Counter[str] = Counter()

    def get(self, bundle: ModelBundle, precision: str):  # type: ignore[no-untyped-def]
        return _Counted(super().get(bundle, precision), self.batches, bundle.key)


def two_lesions(points: np.ndarray) -> np.ndarray:
    """A 100 HU 'liver' block in air with a 700 HU and a 1000 HU sphere (radius 4 mm)."""
    block = (np.abs(points - np.array([0.0, 0.0, 11.0])) < [15.0, 15.0, 40.0]).all(-1)
    out = np.where(block, 100.0, -1000.0)
    for centre, hu in (((-7.0, -5.0, 11.0), 700.0), ((7.0, 5.0, 11.0), 1000.0)):
        out = np.where(np.linalg.norm(points - np.asarray(centre), axis=-1) <= 4.0, hu, out)
    return out


def candidate(models: Path, version: str, lesion_hu: float) -> None:
    """The lesion test bundle as ``version`` with its threshold at ``lesion_hu`` (800 HU
    drops the 700 HU lesion: the comparison has something to find)."""
    folder = models / LESIONS / version
    shutil.copytree(models / LESIONS / "1.0.0", folder)
    manifest = yaml.safe_load((folder / "model.yaml").read_text())
    manifest["version"] = version
    (folder / "model.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False))
    threshold_model(folder / "model.onnx", in_channels=3, level=lesion_hu / 1000.0)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Service, CountingPool, Any]]:
    """A real server that ran one study on lesions-test 1.0.0; 1.1.0 put beside it."""
    pool = CountingPool()
    service = Service(settings_for(tmp_path), sessions=pool)
    token = create_key(service.store, "submit")
    files = make_ct_series(
        tmp_path / "study", **GRID, origin=ORIGIN, hu=two_lesions, study_uid=new_uid()
    )
    with (
        ServerThread(create_app(service)) as thread,
        httpx.Client(base_url=thread.url, timeout=60) as c,
    ):
        r = c.post("/v1/studies", files=upload(files), headers=auth(token))
        assert r.status_code == 202, r.text
        assert wait_job(c, r.json()["id"], token, timeout=120)["state"] == "succeeded"
        # the start's warm-up batches are not the comparison's: a warm-up that ends after
        # the job (its models probed first in a process of their own) was counted as an
        # upstream step run again
        assert service.wait_warm(120)
        candidate(tmp_path / "assets" / "models", "1.1.0", 800.0)  # after: 1.0.0 served
        service.catalog.rescan()
        yield service, pool, service.store.get_job(r.json()["id"])


def test_a_comparison_run_runs_only_the_compared_step_and_gives_the_same_comparison(
    served: tuple[Service, CountingPool, Any],
) -> None:
    service, pool, job = served
    serving = pool.batches.copy()
    assert serving[f"{ORGANS}/1.0.0"] > 0 and serving[f"{LESIONS}/1.0.0"] > 0, serving
    task = ComparisonTask(
        job=job,
        step=LESIONS,
        serving_version="1.0.0",
        candidate_version="1.1.0",
        candidate_role="shadow",
        record_for="1.1.0",
    )

    pool.batches.clear()
    reused = service.lifecycle.run_comparison(task)
    assert pool.batches[f"{ORGANS}/1.0.0"] == 0  # the upstream organ step did not run
    candidate_batches = pool.batches[f"{LESIONS}/1.1.0"]
    assert candidate_batches > 0 and set(pool.batches) == {f"{LESIONS}/1.1.0"}

    pool.batches.clear()  # the same comparison run the old way: every step
    full = service.lifecycle.run_comparison(task, reuse_upstream=False)
    assert pool.batches[f"{ORGANS}/1.0.0"] > 0
    assert pool.batches[f"{LESIONS}/1.1.0"] == candidate_batches

    # the same comparison, but for the latency of the two runs
    timing = {"serving_seconds": None, "candidate_seconds": None}
    assert dataclasses.replace(reused, **timing) == dataclasses.replace(full, **timing)
    assert reused.lesion_agreement == 0.5  # the 800 HU candidate misses the 700 HU lesion
    assert reused.dice["liver_lesion"] < 1.0


def test_upstream_steps_come_back_as_the_serving_run_made_them(
    served: tuple[Service, CountingPool, Any],
) -> None:
    service, _, job = served
    from radserve.pipeline.inputs import DicomInput
    from radserve.progress import StageTimer
    from radserve.report.nifti import read_nifti

    resolved = service.catalog.resolve(job.pipeline_name).pinned(job.model_versions, {})
    spec = resolved.spec
    ingested = DicomInput(Path(job.study_path)).ingest(spec, policy=None, timer=StageTimer())
    ct = ingested.loaded.volume
    result = Path(str(job.result_path))
    [organs] = upstream_steps(result, spec, service.catalog.registry, ct, LESIONS)
    assert organs.bundle.key == f"{ORGANS}/1.0.0" and organs.precision == "fp32"
    written = read_nifti(result / "organs.nii.gz").array
    assert np.array_equal(organs.labels.array, written) and organs.labels.shape == ct.shape
    assert [o.label for o in organs.organs] == ["liver"]
    assert upstream_steps(result, spec, service.catalog.registry, ct, ORGANS) == []

    # a result made by another version of the upstream model cannot stand in for it
    other = spec.model_copy(
        update={"steps": (spec.steps[0].model_copy(update={"version": "9.9.9"}), spec.steps[1])}
    )
    with pytest.raises(Exception, match=r"9\.9\.9"):
        upstream_steps(result, other, service.catalog.registry, ct, LESIONS)
    (result / "organs.nii.gz").unlink()
    with pytest.raises(ReuseUnavailableError, match=r"organs\.nii\.gz"):
        upstream_steps(result, spec, service.catalog.registry, ct, LESIONS)


def test_a_comparison_run_ends_when_the_server_stops(
    served: tuple[Service, CountingPool, Any],
) -> None:
    """A comparison run is the lowest-priority work: a server that stops ends it at its
    next batch boundary (and so stops a JPEG 2000 decode streaming into it) instead of
    running it to its end."""
    service, pool, job = served
    task = ComparisonTask(
        job=job,
        step=LESIONS,
        serving_version="1.0.0",
        candidate_version="1.1.0",
        candidate_role="shadow",
        record_for="1.1.0",
    )
    service.lifecycle.stop()
    pool.batches.clear()
    with pytest.raises(InferenceCancelledError):
        service.lifecycle.run_comparison(task, reuse_upstream=False)
    assert pool.batches[f"{LESIONS}/1.1.0"] == 0  # the candidate never ran

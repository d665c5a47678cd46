"""Model lifecycle against a real running server (uvicorn on loopback, the CLI in a
subprocess on the same data dir): install -> canary 20 % -> shadow -> promote ->
rollback under a steady load of submissions and status reads, with 0 failed requests
and 0 failed jobs and every change audited; a damaged canary (drops half the lesions)
is rolled back automatically, a good one is not."""

from __future__ import annotations

import shutil
import subprocess
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import yaml
from tests.factories.dicom_series import make_ct_series, new_uid
from tests.factories.onnx_models import threshold_model
from tests.factories.server_process import radserve_command
from tests.factories.service import GRID, ORIGIN, ServerThread, auth, config_file, create_key
from tests.factories.waits import until

from radserve.api import create_app
from radserve.config import load_settings
from radserve.domain.deployment import bucket
from radserve.errors import is_study_fault
from radserve.service import Service

STEP = "lesions-test"
LESIONS = (((-7.0, -5.0, 11.0), 700.0), ((7.0, 5.0, 11.0), 1000.0))


def two_lesions(points: np.ndarray) -> np.ndarray:
    """A 100 HU 'liver' block in air with a 700 HU and a 1000 HU sphere (radius 4 mm)."""
    block = (np.abs(points - np.array([0.0, 0.0, 11.0])) < [15.0, 15.0, 40.0]).all(-1)
    out = np.where(block, 100.0, -1000.0)
    for centre, hu in LESIONS:
        out = np.where(np.linalg.norm(points - np.asarray(centre), axis=-1) <= 4.0, hu, out)
    return out


def study(folder: Path, uid: str | None = None) -> list[Path]:
    return make_ct_series(folder, **GRID, origin=ORIGIN, hu=two_lesions, study_uid=uid or new_uid())


def uid_where(predicate: Any) -> str:
    while True:
        uid = new_uid()
        if predicate(uid):
            return uid


def candidate(root: Path, shipped: Path, version: str, lesion_hu: float) -> Path:
    """A copy of the shipped lesion test bundle as ``version`` with its threshold at
    ``lesion_hu`` (800 HU drops the 700 HU lesion: half the lesions)."""
    folder = root / STEP / version
    shutil.copytree(shipped / STEP / "1.0.0", folder)
    manifest = yaml.safe_load((folder / "model.yaml").read_text())
    manifest["version"] = version
    (folder / "model.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False))
    threshold_model(folder / "model.onnx", in_channels=3, level=lesion_hu / 1000.0)
    return folder


def zipped(folder: Path) -> bytes:
    target = folder.parent / f"{folder.name}.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in folder.rglob("*"):
            zf.write(path, f"{STEP}/{folder.name}/{path.relative_to(folder).as_posix()}")
    return target.read_bytes()


class Server:
    def __init__(self, tmp: Path, sections: dict[str, Any] | None = None, **lifecycle: Any) -> None:
        self.config = config_file(tmp, lifecycle={"poll_s": 0.2, **lifecycle}, **(sections or {}))
        self.data = tmp / "data"
        self.settings = load_settings(self.config, data_dir=self.data)
        self.service = Service(self.settings)
        self.admin = create_key(self.service.store, "admin")
        self.submit = create_key(self.service.store, "submit")
        self.thread = ServerThread(create_app(self.service))
        self.models = tmp / "assets" / "models"

    def cli(self, *args: str) -> str:
        done = subprocess.run(
            radserve_command(*args, "--config", str(self.config), "--data-dir", str(self.data)),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout


@pytest.fixture
def server(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Server]:
    s = Server(tmp_path, **getattr(request, "param", {}))
    with s.thread:
        s.service.wait_warm(60)
        yield s


def deployed(c: httpx.Client, token: str, version: str) -> list[str]:
    rows = c.get("/v1/models", headers=auth(token)).json()["versions"]
    return next(r["deployed"] for r in rows if r["name"] == STEP and r["version"] == version)


class Load:
    """Steady submissions and status reads until stopped; every answer that is not 2xx
    is kept."""

    def __init__(self, url: str, token: str, studies: list[list[Path]]) -> None:
        self.url, self.token, self.studies = url, token, studies
        self.failures: list[str] = []
        self.jobs: list[str] = []
        self.requests = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=60) as c:
            for files in self.studies:
                if self._stop.is_set():
                    return
                body = [("files", (p.name, p.read_bytes(), "application/dicom")) for p in files]
                r = c.post("/v1/studies", files=body, headers=auth(self.token))
                self.requests += 1
                if r.status_code != 202:
                    self.failures.append(f"submit {r.status_code} {r.text[:200]}")
                    continue
                self.jobs.append(r.json()["id"])
                for job in self.jobs[-3:]:
                    s = c.get(f"/v1/jobs/{job}", headers=auth(self.token))
                    self.requests += 1
                    if s.status_code != 200:
                        self.failures.append(f"status {s.status_code}")
                self._stop.wait(0.1)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(300)


def test_install_canary_shadow_promote_rollback_under_load(server: Server, tmp_path: Path) -> None:
    good = candidate(tmp_path / "cand", server.models, "1.1.0", 400.0)
    other = candidate(tmp_path / "cand", server.models, "1.3.0", 400.0)
    routine = [study(tmp_path / f"s{i}") for i in range(16)]
    # studies sent during the canary / the shadow, chosen so each role surely sees traffic
    canary_studies = [
        study(tmp_path / f"c{i}", uid_where(lambda u: bucket(u, STEP) < 20)) for i in range(2)
    ]
    shadow_studies = [
        study(tmp_path / f"h{i}", uid_where(lambda u: bucket(u, STEP, "shadow") < 50))
        for i in range(2)
    ]
    admin = auth(server.admin)
    own_jobs: list[str] = []

    def send(c: httpx.Client, files: list[Path]) -> None:
        body = [("files", (p.name, p.read_bytes(), "application/dicom")) for p in files]
        r = c.post("/v1/studies", files=body, headers=auth(server.submit))
        assert r.status_code == 202, r.text
        own_jobs.append(r.json()["id"])

    with (
        httpx.Client(base_url=server.thread.url, timeout=60) as c,
        Load(server.thread.url, server.submit, routine) as load,
    ):
        # install: API (zip) and CLI (folder)
        r = c.post("/v1/models", content=zipped(good), headers=admin)
        assert r.status_code == 201, r.text
        assert r.json()["files"]["model.onnx"]
        assert "installed lesions-test 1.3.0" in server.cli("models", "install", str(other))
        again = c.post("/v1/models", content=zipped(good), headers=admin)
        assert again.status_code == 409 and again.json()["error"]["code"] == "bundle_exists"
        refused = c.post("/v1/models", content=b"not a zip", headers=admin)
        assert refused.status_code == 422
        submit_only = c.post("/v1/models", content=zipped(good), headers=auth(server.submit))
        assert submit_only.status_code == 403
        assert deployed(c, server.admin, "1.1.0") == []  # installed is not deployed
        # canary 20 %
        r = c.post(
            f"/v1/models/{STEP}/deploy",
            json={"version": "1.1.0", "role": "canary", "percent": 20, "reason": "try 1.1"},
            headers=admin,
        )
        assert r.status_code == 200, r.text
        assert deployed(c, server.admin, "1.1.0") == ["canary"]
        metrics = c.get("/metrics").text
        assert (
            'radserve_model_deployment_info{role="canary",step="lesions-test",version="1.1.0"} 1.0'
            in metrics
        )
        for files in canary_studies:
            send(c, files)
        # shadow through the CLI: the running server picks it up from the store
        server.cli(
            "models", "deploy", STEP, "1.3.0", "--role", "shadow", "--percent", "50",
            "--reason", "compare 1.3",
        )  # fmt: skip
        until(lambda: deployed(c, server.admin, "1.3.0") == ["shadow"], "1.3.0 deployed as shadow")
        for files in shadow_studies:
            send(c, files)
        r = c.post(f"/v1/models/{STEP}/promote", json={"reason": "canary fine"}, headers=admin)
        assert r.status_code == 200 and r.json()["stable"] == "1.1.0"
        assert r.json()["canary"] is None
        r = c.post(f"/v1/models/{STEP}/rollback", json={"reason": "back"}, headers=admin)
        assert r.status_code == 200 and r.json()["stable"] == "1.0.0"
    assert load.failures == [] and load.requests > len(load.jobs) > 0
    jobs = load.jobs + own_jobs
    with httpx.Client(base_url=server.thread.url, timeout=60) as c:
        finals = [
            until(lambda j=j: _final(c, j, server.submit), f"job {j} to end", 120) for j in jobs
        ]
        assert [j["state"] for j in finals] == ["succeeded"] * len(jobs)
        ran = {}
        for job in finals:
            version = job["model_versions"][STEP]
            report = c.get(f"/v1/jobs/{job['id']}/report", headers=auth(server.submit)).json()
            # the report says exactly which version produced the result
            assert {(m["name"], m["version"]) for m in report["models"]} >= {(STEP, version)}
            meta = server.service.store.get_job(job["id"]).queue_meta
            ran[job["id"]] = (version, meta.get("deployment", {}).get(STEP))
        assert ("1.1.0", "canary") in ran.values()
        assert {v for v, _ in ran.values()} <= {"1.0.0", "1.1.0"}
        comparisons = until(
            lambda: [
                r
                for r in c.get("/v1/models/comparisons", headers=admin).json()
                if r["version"] == "1.3.0" and r["comparisons"]
            ],
            "the shadow comparisons of 1.3.0",
            120,
            state=lambda: _comparison_state(server, c, admin, jobs),
        )
        assert comparisons[0]["lesion_agreement"] == 1.0
    events = [
        (r.payload.get("event"), r.actor_key_id)
        for r in server.service.store.iter_audit()
        if r.action == "model.changed" and r.payload.get("event") != "loaded"
    ]
    names = [e for e, _ in events]
    assert names.count("installed") == 2
    assert names[-4:] == [
        "deployment.deploy",
        "deployment.deploy",
        "deployment.promote",
        "deployment.rollback",
    ]
    assert events[-1][1] is not None and events[-2][1] is not None  # who: the admin key


def _comparison_state(server: Server, c: httpx.Client, admin: dict, jobs: list[str]) -> dict:
    """What the comparison machinery holds, for a failure message: the records, the runs
    waiting, skipped and failed, whether the server is idle, and which jobs asked for a shadow
    run (and whether they were served from the cache, which asks for none)."""
    lifecycle = server.service.lifecycle
    shadows = {}
    for job_id in jobs:
        job = server.service.store.get_job(job_id)
        wanted = job.queue_meta.get("shadows")
        if wanted:
            shadows[job_id[:8]] = (wanted, job.state.value, job.cached_from is not None)
    return {
        "comparisons": c.get("/v1/models/comparisons", headers=admin).json(),
        "waiting": lifecycle._tasks.waiting(),
        "skipped": lifecycle.skipped_comparisons,
        "failed": lifecycle.failed_comparisons,
        "idle": lifecycle._idle(),
        "compare thread alive": [t.is_alive() for t in lifecycle._threads],
        "jobs with shadows": shadows,
    }


def _final(c: httpx.Client, job_id: str, token: str) -> dict[str, Any] | None:
    job: dict[str, Any] = c.get(f"/v1/jobs/{job_id}", headers=auth(token)).json()
    return job if job["state"] in ("succeeded", "failed", "cancelled") else None


GUARDRAILS = {"guardrails": {"min_studies": 2, "min_comparisons": 2}}


@pytest.mark.parametrize("server", [GUARDRAILS], indirect=True)
def test_damaged_canary_is_rolled_back_and_a_good_one_is_not(
    server: Server, tmp_path: Path
) -> None:
    damaged = candidate(tmp_path / "cand", server.models, "1.2.0", 800.0)
    good = candidate(tmp_path / "cand", server.models, "1.1.0", 400.0)
    admin = auth(server.admin)
    with httpx.Client(base_url=server.thread.url, timeout=60) as c:
        for bundle in (damaged, good):
            assert c.post("/v1/models", content=zipped(bundle), headers=admin).status_code == 201
        for version, label in (("1.2.0", "damaged"), ("1.1.0", "good")):
            r = c.post(
                f"/v1/models/{STEP}/deploy",
                json={"version": version, "role": "canary", "percent": 100, "reason": label},
                headers=admin,
            )
            assert r.status_code == 200, r.text
            for i in range(4):
                files = study(tmp_path / f"{version}-{i}")
                body = [("files", (p.name, p.read_bytes(), "application/dicom")) for p in files]
                job = c.post("/v1/studies", files=body, headers=auth(server.submit)).json()
                done = until(lambda j=job["id"]: _final(c, j, server.submit), "the job to end")
                assert done["state"] == "succeeded"
            record = until(
                lambda v=version: next(
                    (
                        r
                        for r in c.get("/v1/models/comparisons", headers=admin).json()
                        if r["version"] == v and r["comparisons"] >= 2
                    ),
                    None,
                ),
                f"two comparisons of {version}",
                120,
            )
            if label == "damaged":
                assert record["lesion_agreement"] == pytest.approx(0.5)
                # the record reads "canary minus stable": stable alone found them
                assert record["lesions_by_stratum"]["<10mm"]["serving_only"] >= 2
                history = until(
                    lambda: [
                        d
                        for d in c.get("/v1/models/deployments", headers=admin).json()
                        if d["action"] == "auto_rollback"
                    ],
                    "the guardrail's auto rollback",
                )
                assert history[0]["actor"] == "radserve-guardrail"
                assert "lesion agreement" in history[0]["reason"]
                assert deployed(c, server.admin, "1.2.0") == []
            else:
                assert record["lesion_agreement"] == 1.0 and record["mean_dice"] == 1.0
                assert deployed(c, server.admin, "1.1.0") == ["canary"]
        # counted after the rollback is recorded (and shown above): wait for the scrape
        counted = 'radserve_model_auto_rollbacks_total{step="lesions-test",version="1.2.0"} 1.0'
        until(lambda: counted in c.get("/metrics").text, "the auto rollback in /metrics")
    rollbacks = [
        r
        for r in server.service.store.iter_audit()
        if r.payload.get("event") == "deployment.auto_rollback"
    ]
    assert len(rollbacks) == 1 and rollbacks[0].actor_key_id == "radserve-guardrail"


@pytest.mark.parametrize(
    "server", [{"guardrails": {"min_studies": 2, "max_failure_rate": 0.2}}], indirect=True
)
def test_a_canary_is_not_rolled_back_for_studies_no_version_could_read(
    server: Server, tmp_path: Path
) -> None:
    """Cut-off files fail at ingest whichever version was chosen for them: counted as the
    canary's failures, a few of them rolled back a good version (a console test saw its
    canary vanish while some broken studies were in its worklist)."""
    good = candidate(tmp_path / "cand", server.models, "1.1.0", 400.0)
    admin = auth(server.admin)
    with httpx.Client(base_url=server.thread.url, timeout=60) as c:
        assert c.post("/v1/models", content=zipped(good), headers=admin).status_code == 201
        deploy = {"version": "1.1.0", "role": "canary", "percent": 100, "reason": "trial"}
        r = c.post(f"/v1/models/{STEP}/deploy", json=deploy, headers=admin)
        assert r.status_code == 200, r.text
        ends = []
        for i in range(4):
            cut = None if i == 3 else 900  # the last one whole: the canary serves it
            body = [
                ("files", (p.name, p.read_bytes()[:cut], "application/dicom"))
                for p in study(tmp_path / f"s{i}")
            ]
            job = c.post("/v1/studies", files=body, headers=auth(server.submit)).json()
            ends.append(until(lambda j=job["id"]: _final(c, j, server.submit), "the job to end"))
        assert [j["state"] for j in ends] == ["failed"] * 3 + ["succeeded"], ends
        assert all(is_study_fault(j["error"]["code"]) for j in ends[:3]), ends
        assert deployed(c, server.admin, "1.1.0") == ["canary"]
        history = c.get("/v1/models/deployments", headers=admin).json()
        assert not [d for d in history if d["action"] == "auto_rollback"]
        record = next(
            r
            for r in c.get("/v1/models/comparisons", headers=admin).json()
            if r["version"] == "1.1.0"
        )
        assert (record["finished"], record["failed"]) == (1, 0)


@pytest.mark.parametrize(
    "server",
    # one job at a time: a burst waits in the queue, as on a busy server
    [{"sections": {"scheduler": {"max_running": 1}}, "guardrails": {"min_studies": 3}}],
    indirect=True,
)
def test_a_good_canary_deployed_into_a_burst_is_not_rolled_back_for_the_queue(
    server: Server, tmp_path: Path
) -> None:
    """The p95 guardrail judged the canary's turnaround, which holds its wait in the
    queue, against stable's jobs of a quiet hour: a good version deployed into a burst
    looked several times slower and was rolled back. It judges the version's own step
    now, against stable's jobs of the same span or its latest ones."""
    admin, submit = auth(server.admin), auth(server.submit)
    with httpx.Client(base_url=server.thread.url, timeout=60) as c:
        serving = {"version": "1.0.0", "role": "stable", "reason": "the shipped version"}
        assert c.post(f"/v1/models/{STEP}/deploy", json=serving, headers=admin).is_success
        for i in range(3):  # stable's record: a quiet server, one study at a time
            body = [
                ("files", (p.name, p.read_bytes(), "application/dicom"))
                for p in study(tmp_path / f"q{i}")
            ]
            job = c.post("/v1/studies", files=body, headers=submit).json()
            done = until(lambda j=job["id"]: _final(c, j, server.submit), "the job to end")
            assert done["state"] == "succeeded", done
        good = candidate(tmp_path / "cand", server.models, "1.1.0", 400.0)
        assert c.post("/v1/models", content=zipped(good), headers=admin).status_code == 201
        deploy = {"version": "1.1.0", "role": "canary", "percent": 100, "reason": "trial"}
        assert c.post(f"/v1/models/{STEP}/deploy", json=deploy, headers=admin).status_code == 200
        burst = []  # eight studies in one request
        for i in range(8):
            burst += [
                (f"study-{i}", (p.name, p.read_bytes(), "application/dicom"))
                for p in study(tmp_path / f"b{i}")
            ]
        # they arrive while the server is busy (its hold: no unit handed out) and all
        # wait in the queue, whatever this host's speed
        server.service.scheduler.hold("test", "a busy server")
        try:
            r = c.post("/v1/studies/batch", files=burst, headers=submit)
        finally:
            server.service.scheduler.release()
        assert r.is_success and r.json()["accepted"] == 8, r.text
        for item in r.json()["items"]:
            done = until(lambda j=item["job"]["id"]: _final(c, j, server.submit), "the burst")
            assert done["state"] == "succeeded", done
        records = {
            r["version"]: r
            for r in c.get("/v1/models/comparisons", headers=admin).json()
            if r["step"] == STEP
        }
        canary, stable = records["1.1.0"], records["1.0.0"]
        assert canary["finished"] == 8 and stable["finished"] == 3
        # the turnaround rule's reading: over 3x (the setting) on the same model
        assert canary["p95_seconds"] > 3 * stable["p95_seconds"], records
        assert canary["p95_step_seconds"] < 3 * stable["p95_step_seconds"], records
        assert deployed(c, server.admin, "1.1.0") == ["canary"]
        history = c.get("/v1/models/deployments", headers=admin).json()
        assert not [d for d in history if d["action"] == "auto_rollback"], history


@pytest.mark.parametrize(
    "server",
    [{"sections": {"scheduler": {"breaker_threshold": 1}, "jobs": {"retry_backoff_s": 0.1}}}],
    indirect=True,
)
def test_the_first_deploy_rolls_back_and_a_new_stable_closes_the_breaker(
    server: Server, tmp_path: Path
) -> None:
    """A user trial (session 42): the step's first deployment could not be rolled back
    ("no canary and no earlier stable version": the version served before it was no
    deployment row), and once a bad version had opened the step's circuit breaker,
    deploying a good one left every study refused (503 ``model_unavailable``) until an
    administrator reset the breaker, which the lifecycle docs never mention."""
    from radserve.errors import InferenceError

    bad = candidate(tmp_path / "cand", server.models, "1.1.0", 400.0)
    admin = auth(server.admin)
    with httpx.Client(base_url=server.thread.url, timeout=60) as c:
        assert c.post("/v1/models", content=zipped(bad), headers=admin).status_code == 201
        r = c.post(
            f"/v1/models/{STEP}/deploy",
            json={"version": "1.1.0", "role": "stable", "reason": "first deployment"},
            headers=admin,
        )
        assert r.status_code == 200, r.text
        catalog = server.service.catalog
        session = catalog.sessions.get(catalog.registry.get(STEP, "1.1.0"), "fp32")

        def broken(batch: Any) -> Any:
            raise InferenceError("device lost (test)")

        session.run = broken  # its studies fail: the breaker opens
        files = study(tmp_path / "fails")
        body = [("files", (p.name, p.read_bytes(), "application/dicom")) for p in files]
        c.post("/v1/studies", files=body, headers=auth(server.submit))
        until(lambda: STEP in server.service.scheduler.open_models(), "the breaker open")
        refused = c.post("/v1/studies", files=body, headers=auth(server.submit))
        assert refused.status_code == 503, refused.text

        r = c.post(f"/v1/models/{STEP}/rollback", json={"reason": "bad"}, headers=admin)
        assert r.status_code == 200, r.text
        assert r.json()["stable"] == "1.0.0"
        until(lambda: deployed(c, server.admin, "1.0.0") == ["stable"], "1.0.0 serving")
        assert server.service.scheduler.open_models() == ()
        files = study(tmp_path / "after")
        body = [("files", (p.name, p.read_bytes(), "application/dicom")) for p in files]
        job = c.post("/v1/studies", files=body, headers=auth(server.submit))
        assert job.status_code == 202, job.text
        done = until(lambda: _final(c, job.json()["id"], server.submit), "the job to end")
        assert done["state"] == "succeeded"

"""``GET /v1/ops/doctor`` on a running server (uvicorn on loopback): the runtime lines
(ONNX Runtime build, OpenVINO, no CUDA provider on this host) and the memory of every
session the server has loaded (its warm-up loads the default pipeline's models)."""

from __future__ import annotations

from pathlib import Path

import httpx
from tests.factories.service import ServerThread, auth, create_key, settings_for
from tests.factories.waits import WAIT_SCALE

from radserve.api import create_app
from radserve.service import Service


def test_doctor_over_http_reports_runtime_and_loaded_sessions(tmp_path: Path) -> None:
    service = Service(settings_for(tmp_path))
    admin, reader = create_key(service.store, "admin"), create_key(service.store, "read")
    with ServerThread(create_app(service)) as thread:
        assert service.wait_warm(60 * WAIT_SCALE)
        with httpx.Client(base_url=thread.url, timeout=60) as c:
            assert c.get("/v1/ops/doctor", headers=auth(reader)).status_code == 403
            r = c.get("/v1/ops/doctor", headers=auth(admin))
    assert r.status_code == 200, r.text
    checks = {c["name"]: c for c in r.json()}
    assert checks["cuda"]["detail"].startswith("no CUDA provider")
    assert "http port" not in checks  # the server holds its ports
    sessions = {n: c["detail"] for n, c in checks.items() if n.startswith("session ")}
    loaded = {f"session {s.spec.key} {s.precision}" for s in service.catalog.sessions.loaded()}
    assert (
        set(sessions)
        == loaded
        >= {
            "session organs-test/1.0.0 fp32",
            "session lesions-test/1.0.0 fp32",
        }
    )
    assert all("MiB resident at load" in d for d in sessions.values()), sessions

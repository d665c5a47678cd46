"""``radserve doctor`` and the check ``radserve serve`` runs at start: a host that can
serve passes; a served model whose ``requires:`` this host cannot meet, or a taken port,
blocks serving with the reason (real subprocesses, real sockets)."""

from __future__ import annotations

import json
import re
import socket
import subprocess
from pathlib import Path

import yaml
from tests.factories.server_process import radserve_command
from tests.factories.service import config_file


def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(radserve_command(*args), capture_output=True, text=True, timeout=timeout)


def test_doctor_passes_on_a_host_that_can_serve(tmp_path: Path) -> None:
    config = config_file(tmp_path)
    done = run("doctor", "--json", "--no-ports", "--config", str(config),
               "--data-dir", str(tmp_path / "data"))  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    checks = {c["name"]: c for c in json.loads(done.stdout)}
    assert checks["model lesions-test 1.0.0"]["status"] == "ok"
    assert checks["database"]["status"] == "ok" and checks["onnxruntime"]["status"] == "ok"
    assert "CPUExecutionProvider" in checks["onnxruntime"]["detail"]
    assert checks["cuda"]["detail"].startswith("no CUDA provider")  # no GPU on this host
    assert "openvino" in checks
    assert not any(name.startswith("session ") for name in checks)  # none loaded


def test_doctor_sessions_loads_the_served_models_and_reports_their_memory(
    tmp_path: Path,
) -> None:
    config = config_file(tmp_path)
    done = run("doctor", "--json", "--no-ports", "--sessions", "--config", str(config),
               "--data-dir", str(tmp_path / "data"))  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    sessions = {
        c["name"]: c["detail"] for c in json.loads(done.stdout) if c["name"].startswith("session ")
    }
    assert set(sessions) == {"session organs-test/1.0.0 fp32", "session lesions-test/1.0.0 fp32"}
    for detail in sessions.values():
        assert re.search(
            r"ExecutionProvider: weights \d+\.\d MiB, \+\d+ MiB resident at load", detail
        )
    # the first session of the provider carries its libraries' start-up, and says so
    assert sum("one-time start-up" in d for d in sessions.values()) == 1


def test_serve_refuses_a_served_model_the_host_cannot_run_and_a_taken_port(
    tmp_path: Path,
) -> None:
    config = config_file(tmp_path)
    manifest_path = tmp_path / "assets" / "models" / "lesions-test" / "1.0.0" / "model.yaml"
    manifest = yaml.safe_load(manifest_path.read_text())
    manifest["requires"] = {"providers": ["TensorrtExecutionProvider"]}
    manifest_path.write_text(yaml.safe_dump(manifest))
    data = str(tmp_path / "data")
    doctor = run("doctor", "--json", "--no-ports", "--config", str(config), "--data-dir", data)
    assert doctor.returncode == 1
    failed = [c for c in json.loads(doctor.stdout) if c["status"] == "fail"]
    assert [c["name"] for c in failed] == ["model lesions-test 1.0.0"]
    assert "TensorrtExecutionProvider" in failed[0]["detail"] and failed[0]["blocking"]
    serve = run("serve", "--port", "0", "--config", str(config), "--data-dir", data)
    assert serve.returncode != 0
    assert "lesions-test/1.0.0 needs one of the execution providers" in serve.stderr
    # a taken port blocks too
    manifest.pop("requires")
    manifest_path.write_text(yaml.safe_dump(manifest))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        serve = run("serve", "--port", port, "--config", str(config), "--data-dir", data)
    assert serve.returncode != 0 and f"127.0.0.1:{port} not bindable" in serve.stderr

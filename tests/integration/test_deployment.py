"""The deployment files: the compose file parses (``docker compose config``), the image
recipe keeps its promises (multi-stage, non-root, health check, no baked secret), and
the container entrypoint starts the real server with the image's settings file.

No Docker engine runs here: the image is not built and the compose stack not started
(docs/deployment.md says so)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tests.factories.ports import free_port
from tests.factories.server_process import wait_healthy

from radserve.config import load_settings

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
ENTRYPOINT = DEPLOY / "docker-entrypoint.sh"
RADSERVE_SERVICES = ("ray-head", "ray-worker", "radserve-a", "radserve-b")


def compose_command() -> list[str] | None:
    docker = shutil.which("docker")
    if (
        docker
        and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0
    ):
        return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    return [legacy] if legacy else None


def test_compose_file_parses_and_hardens_every_radserve_container(tmp_path: Path) -> None:
    command = compose_command()
    if command is None:
        pytest.skip("neither `docker compose` nor docker-compose is installed")
    project = tmp_path / "deploy"
    shutil.copytree(DEPLOY, project)
    (project / "secrets").mkdir(exist_ok=True)
    (project / "secrets" / "audit_key").write_text("k" * 64)
    env = {**os.environ, "POSTGRES_PASSWORD": "pw-from-env", "RAY_AUTH_TOKEN": "token-from-env"}
    done = subprocess.run(
        [*command, "-f", str(project / "compose.yaml"), "config"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    config = yaml.safe_load(done.stdout)
    services = config["services"]
    assert {"postgres", "orthanc", *RADSERVE_SERVICES} <= set(services)
    for name in RADSERVE_SERVICES:
        service = services[name]
        assert service["read_only"] is True, name
        assert service["user"] == "10001:10001", name
        assert any(str(t).startswith("/tmp") for t in service["tmpfs"]), name
    for name in ("radserve-a", "radserve-b"):
        environment = services[name]["environment"]
        assert "pw-from-env" in environment["RADSERVE_DATABASE_URL"]  # from .env, not the file
        volume = services[name]["volumes"][0]  # long syntax (compose v2) or "data:/data:rw"
        target = volume["target"] if isinstance(volume, dict) else volume.split(":")[1]
        assert target == "/data"
    ids = {
        services[n]["environment"]["RADSERVE_OUTBOX__INSTANCE_ID"]
        for n in ("radserve-a", "radserve-b")
    }
    assert len(ids) == 2
    # without the secrets the file refuses to render instead of running with blanks
    bare = {k: v for k, v in env.items() if k not in ("POSTGRES_PASSWORD", "RAY_AUTH_TOKEN")}
    refused = subprocess.run(
        [*command, "-f", str(project / "compose.yaml"), "config"],
        capture_output=True,
        text=True,
        env=bare,
        timeout=60,
    )
    assert refused.returncode != 0 and "POSTGRES_PASSWORD" in refused.stderr


def test_dockerfile_is_multi_stage_non_root_with_health_check_and_no_secrets() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    stages = re.findall(r"^FROM\s+\S+\s+AS\s+(\w+)", text, re.MULTILINE)
    assert stages == ["build", "runtime"]
    runtime = text.split("AS runtime", 1)[1]
    users = re.findall(r"^USER\s+(\S+)", runtime, re.MULTILINE)
    assert users and not users[-1].startswith(("0", "root"))
    assert re.search(r"^HEALTHCHECK .*\n?.*/healthz", runtime, re.MULTILINE)
    assert 'VOLUME ["/data"]' in runtime
    for line in re.findall(r"^(?:ENV|ARG)\s.*$", text, re.MULTILINE):
        assert not re.search(r"(PASSWORD|TOKEN|SECRET|_KEY)\s*=", line, re.IGNORECASE), line


def test_the_image_settings_file_is_valid() -> None:
    settings = load_settings(DEPLOY / "radserve.yaml")
    assert settings.executor == "ray" and settings.ray.address == "ray-head:6379"
    assert settings.data_dir == Path("/data") and settings.database_url is None  # from env


def _entrypoint_env(data: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RADSERVE_")}
    env.update(
        {
            "PATH": f"{Path(sys.executable).parent}:{env.get('PATH', '')}",
            "HOME": str(data.parent / "home"),
            "RADSERVE_CONFIG": str(DEPLOY / "radserve.yaml"),
            "RADSERVE_DATA_DIR": str(data),
        }
    )
    return env


def test_entrypoint_refuses_root_and_an_unwritable_data_dir(tmp_path: Path) -> None:
    env = _entrypoint_env(tmp_path / "data")
    if os.geteuid() == 0:
        as_root = subprocess.run(
            ["sh", str(ENTRYPOINT), "serve"], env=env, capture_output=True, text=True
        )
        assert as_root.returncode == 64 and "refusing to run as root" in as_root.stderr
    blocker = tmp_path / "file"
    blocker.write_text("")
    env.update({"ENTRYPOINT_ALLOW_ROOT": "1", "RADSERVE_DATA_DIR": str(blocker / "data")})
    unwritable = subprocess.run(
        ["sh", str(ENTRYPOINT), "serve"], env=env, capture_output=True, text=True
    )
    assert unwritable.returncode == 64 and "is not writable" in unwritable.stderr


def test_entrypoint_serves_with_the_image_settings_on_a_local_ray(tmp_path: Path) -> None:
    """The image's own settings file and entrypoint, with the cluster addresses pointed
    at this machine: Ray local (one CPU worker), SQLite in the data dir, loopback ports."""
    pytest.importorskip("ray", reason="the ray extra is not installed")
    data = tmp_path / "data"
    data.mkdir()
    port = free_port()
    env = _entrypoint_env(data)
    env.update(
        {
            "ENTRYPOINT_ALLOW_ROOT": "1",
            "RADSERVE_SERVER__HOST": "127.0.0.1",
            "RADSERVE_RAY__ADDRESS": "local",
            "RADSERVE_RAY__NUM_CPUS": "1",
            "RADSERVE_RAY__DEVICES": json.dumps(["cpu:1"]),
            "RADSERVE_GATEWAY__HOST": "127.0.0.1",
            "RADSERVE_GATEWAY__PORT": "0",
            "RADSERVE_GATEWAY__ALLOWED_PEERS": "[]",
        }
    )
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            ["sh", str(ENTRYPOINT), "serve", "--port", str(port), "--cpu-workers", "1"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_healthy(process, f"http://127.0.0.1:{port}", log, timeout=120)
        assert "Ray executor started: ray-cpu0" in log.read_text()
        assert (data / "radserve.db").exists()  # everything written lands in the data dir
    finally:
        process.send_signal(signal.SIGTERM)
        # uvicorn re-raises the signal once it has stopped cleanly
        assert process.wait(timeout=60) in (0, -signal.SIGTERM), log.read_text()[-3000:]
    assert '"service stopped"' in log.read_text()  # a clean stop, not Ray's abort

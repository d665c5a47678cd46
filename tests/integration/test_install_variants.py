"""``models install --build-variants`` and ``POST /v1/models?build_variants=true``
against a real server: the variants are built and gated through the pipeline on small
phantoms, the gate state per variant is recorded (gate.json, install.json hashes),
shown by ``GET /v1/models`` and ``models list``, and a variant that failed its gate is
installed but refused for serving and deployment, with the gate's reason."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from tests.factories.onnx_models import threshold_model
from tests.factories.server_process import radserve_command
from tests.factories.service import ServerThread, auth, config_file, create_key
from tests.factories.waits import WAIT_SCALE, until
from tests.factories.writers import ended_and_running

from radserve import durable
from radserve.api import create_app
from radserve.config import load_settings
from radserve.errors import VariantRejectedError
from radserve.lifecycle.install import verify_install
from radserve.models.registry import ModelRegistry
from radserve.service import Service

STEP = "organs-test"
# Small phantoms, two held-out seeds, one calibration seed: seconds, not minutes.
VARIANTS = {"seeds": "0-1", "calibration_seeds": "1000", "small": True}


def candidate(root: Path, shipped: Path, version: str, *, fp16_fragile: bool) -> Path:
    """A copy of the organ test bundle as ``version``. ``fp16_fragile``: the same
    threshold (50 HU) with logits scaled by 1e5, beyond float16's range: its bias
    saturates at 65504 in the FP16 file, which then labels no organ at all (its gate
    must reject it); the INT8 file keeps the logits head in float and stays exact."""
    folder = root / STEP / version
    shutil.copytree(shipped / STEP / "1.0.0", folder)
    manifest = yaml.safe_load((folder / "model.yaml").read_text())
    manifest["version"] = version
    (folder / "model.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False))
    threshold_model(folder / "model.onnx", level=0.05, scale=2e6 if fp16_fragile else 20.0)
    return folder


def zipped(folder: Path) -> bytes:
    target = folder.parent / f"{folder.name}.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in folder.rglob("*"):
            zf.write(path, f"{STEP}/{folder.name}/{path.relative_to(folder).as_posix()}")
    return target.read_bytes()


def variants_config(tmp: Path) -> Path:
    return config_file(tmp, lifecycle={"poll_s": 0.2, "variants": VARIANTS})


class Server:
    def __init__(self, tmp: Path, config: Path | None = None) -> None:
        """``config``: a config file made already (the next server on the same data dir)."""
        self.config = config or variants_config(tmp)
        self.data = tmp / "data"
        self.service = Service(load_settings(self.config, data_dir=self.data))
        self.admin = create_key(self.service.store, "admin")
        self.thread = ServerThread(create_app(self.service))
        self.models = tmp / "assets" / "models"

    def cli(self, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            radserve_command(*args, "--config", str(self.config), "--data-dir", str(self.data)),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert (done.returncode == 0) == ok, done.stdout + done.stderr
        return done


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    s = Server(tmp_path)
    with s.thread:
        s.service.wait_warm(60 * WAIT_SCALE)
        yield s


def finished(c: httpx.Client, token: str, location: str) -> dict[str, object]:
    """The install's record once it ended (polled as a client would)."""
    deadline = time.monotonic() + 600 * WAIT_SCALE
    while time.monotonic() < deadline:
        r = c.get(location, headers=auth(token))
        assert r.status_code == 200, r.text
        if r.json()["state"] not in ("queued", "building"):
            return r.json()
        time.sleep(0.2)
    raise AssertionError(f"{location} still unfinished")


def version_row(c: httpx.Client, token: str, version: str) -> dict[str, object]:
    rows = c.get("/v1/models", headers=auth(token)).json()["versions"]
    return next(r for r in rows if r["name"] == STEP and r["version"] == version)


def test_install_builds_and_gates_variants_and_keeps_a_failed_one_off(
    server: Server, tmp_path: Path
) -> None:
    fragile = candidate(tmp_path / "cand", server.models, "1.1.0", fp16_fragile=True)
    good = candidate(tmp_path / "cand", server.models, "1.2.0", fp16_fragile=False)
    admin = auth(server.admin)
    with httpx.Client(base_url=server.thread.url, timeout=600) as c:
        refused = c.post("/v1/models?precisions=fp16", content=zipped(fragile), headers=admin)
        assert refused.status_code == 400, refused.text  # precisions without build_variants

        # the build runs after the answer: 202 and the install's record to poll
        r = c.post(
            "/v1/models?build_variants=true&precisions=fp16,int8",
            content=zipped(fragile),
            headers=admin,
        )
        assert r.status_code == 202, r.text
        accepted = r.json()
        assert accepted["state"] in ("queued", "building") and accepted["result"] is None
        assert accepted["precisions"] == ["fp16", "int8"]
        assert r.headers["location"] == f"/v1/models/installs/{accepted['id']}"
        task = finished(c, server.admin, r.headers["location"])
        assert task["state"] == "installed", task
        assert task["started"] and task["finished"] and task["error"] is None
        # an upload is recorded as such, not by its temporary file's name
        assert task["source"].startswith("HTTP upload (") and task["source"].endswith(" bytes)")
        answer = task["result"]
        assert answer["name"] == STEP and answer["version"] == "1.1.0"
        assert answer["variants"]["int8"] == {"accepted": True, "reasons": []}
        fp16 = answer["variants"]["fp16"]
        assert fp16["accepted"] is False
        assert any(why.startswith("mean Dice dropped") for why in fp16["reasons"]), fp16
        # what was built is part of what was installed (hashed, unchanged since)
        assert {"model.fp16.onnx", "model.int8.onnx", "gate.json"} <= set(answer["files"])

        row = version_row(c, server.admin, "1.1.0")
        assert row["servable"] == ["fp32", "int8"]
        gate = row["gate"]
        assert isinstance(gate, dict) and gate["int8"] == "accepted"
        assert "rejected by its accuracy gate: mean Dice dropped" in gate["fp16"]

        [event] = [
            e
            for e in server.service.store.iter_audit()
            if e.subject == f"{STEP}/1.1.0" and e.payload.get("event") == "installed"
        ]
        assert event.payload["variants"]["fp16"]["accepted"] is False

    directory = server.data / "models" / STEP / "1.1.0"
    assert verify_install(directory) == []
    assert json.loads((directory / "install.json").read_text())["source"] == task["source"]
    bundle = ModelRegistry([server.data / "models"]).get(STEP, "1.1.0")
    with pytest.raises(VariantRejectedError, match="mean Dice dropped"):
        bundle.onnx_path("fp16")
    gate_json = json.loads((directory / "gate.json").read_text())
    assert gate_json["seeds"] == [0, 1] and gate_json["calibration_seeds"] == [1000]

    # The CLI: a good bundle gets both variants accepted and `models list` shows them.
    out = server.cli("models", "install", str(good), "--build-variants", "--precision", "fp16")
    assert "installed organs-test 1.2.0" in out.stdout
    assert "fp16: accepted" in out.stdout and "int8" not in out.stdout
    listed = json.loads(server.cli("models", "list", "--json").stdout)
    row = next(r for r in listed if r["name"] == STEP and r["version"] == "1.2.0")
    assert row["gate"] == {"fp32": "accepted", "fp16": "accepted"}

    # A server (or CLI) configured to serve fp16 refuses to deploy the rejected variant.
    fp16_config = tmp_path / "fp16.yaml"
    settings = yaml.safe_load(server.config.read_text())
    fp16_config.write_text(
        yaml.safe_dump({**settings, "models": {**settings["models"], "precision": "fp16"}})
    )
    done = subprocess.run(
        radserve_command(
            "models",
            "deploy",
            STEP,
            "1.1.0",
            "--reason",
            "try fp16",
            "--config",
            str(fp16_config),
            "--data-dir",
            str(server.data),
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "may not serve at fp16" in done.stderr and "mean Dice dropped" in done.stderr


def test_install_refuses_variants_when_no_pipeline_runs_the_model(
    server: Server, tmp_path: Path
) -> None:
    stray = candidate(tmp_path / "cand", server.models, "1.3.0", fp16_fragile=False)
    manifest = yaml.safe_load((stray / "model.yaml").read_text())
    manifest["name"] = "unused-organs"
    target = tmp_path / "stray" / "unused-organs" / "1.3.0"
    shutil.copytree(stray, target)
    (target / "model.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False))
    done = server.cli("models", "install", str(target), "--build-variants", ok=False)
    assert "evaluated through a pipeline that runs it, and none does" in done.stderr
    assert not (server.data / "models" / "unused-organs").exists()
    # without --build-variants the same bundle installs; the CLI's install first sweeps what
    # a killed install left, never what the server beside it (this process) is staging
    staging = server.data / "models" / ".staging"
    with ended_and_running() as (ended, _running):
        killed = durable.temporary_path(staging / "install", pid=ended)
    serving = durable.temporary_path(staging / "install", pid=os.getpid())
    for folder in (killed, serving):
        (folder / "bundle").mkdir(parents=True)
    assert "installed unused-organs 1.3.0" in server.cli("models", "install", str(target)).stdout
    assert [p.name for p in staging.iterdir()] == [serving.name]


def stray_bundle(server: Server, tmp_path: Path, version: str) -> Path:
    """A good organ bundle under a name no pipeline runs: its variants cannot be gated."""
    source = candidate(tmp_path / "cand", server.models, version, fp16_fragile=False)
    manifest = yaml.safe_load((source / "model.yaml").read_text())
    manifest["name"] = "unused-organs"
    target = tmp_path / "stray" / "unused-organs" / version
    shutil.copytree(source, target)
    (target / "model.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False))
    return target


def zipped_as(folder: Path, name: str) -> bytes:
    target = folder.parent / f"{folder.name}.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in folder.rglob("*"):
            zf.write(path, f"{name}/{folder.name}/{path.relative_to(folder).as_posix()}")
    return target.read_bytes()


def test_build_runs_after_the_answer_in_order_and_says_how_each_ended(
    server: Server, tmp_path: Path
) -> None:
    admin = auth(server.admin)
    reader = create_key(server.service.store, "read")
    url = "/v1/models?build_variants=true&precisions=int8"
    good = candidate(tmp_path / "cand", server.models, "1.4.0", fp16_fragile=False)
    stray = stray_bundle(server, tmp_path, "1.5.0")
    with httpx.Client(base_url=server.thread.url, timeout=600) as c:
        # what refuses a bundle refuses it before the answer, as without build_variants
        shipped = c.post(url, content=zipped(server.models / STEP / "1.0.0"), headers=admin)
        assert shipped.status_code == 409, shipped.text
        assert "installed already" in shipped.json()["error"]["message"]
        broken = tmp_path / "broken" / STEP / "1.6.0"
        shutil.copytree(good, broken)
        (broken / "model.onnx").write_bytes(b"not onnx")
        refused = c.post(url, content=zipped(broken), headers=admin)
        assert refused.status_code == 422, refused.text
        assert c.get("/v1/models/installs", headers=admin).json() == []

        first = c.post(url, content=zipped(good), headers=admin)
        second = c.post(url, content=zipped_as(stray, "unused-organs"), headers=admin)
        assert (first.status_code, second.status_code) == (202, 202), second.text
        # one build at a time, in order: the second waits while the first builds
        assert c.get(second.headers["location"], headers=auth(reader)).json()["state"] == "queued"
        done = finished(c, reader, second.headers["location"])
        assert done["state"] == "rejected", done
        assert done["error"]["code"] == "bundle_rejected"
        assert (
            "evaluated through a pipeline that runs it, and none does" in (done["error"]["message"])
        )
        assert done["result"] is None
        ok = finished(c, reader, first.headers["location"])
        assert ok["state"] == "installed" and ok["finished"] <= done["started"]
        assert ok["result"]["variants"] == {"int8": {"accepted": True, "reasons": []}}

        listed = c.get("/v1/models/installs", headers=auth(reader)).json()
        assert [t["id"] for t in listed] == [second.json()["id"], first.json()["id"]]
        unknown = c.get(f"/v1/models/installs/{'0' * 32}", headers=auth(reader))
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == (
            "install_not_found"
        )
        for name in ("..%2F..%2Fsettings", "settings", first.json()["id"].upper()):
            assert c.get(f"/v1/models/installs/{name}", headers=auth(reader)).status_code == 404

        # a stopping server takes no new build, and one that had not started is left,
        # with its bundle, to the next start (test_installs_left_by_a_stop_or_a_crash_...);
        # the one building ends
        third = c.post(
            url,
            content=zipped(candidate(tmp_path / "c3", server.models, "1.7.0", fp16_fragile=False)),
            headers=admin,
        )
        fourth = c.post(
            url,
            content=zipped(candidate(tmp_path / "c4", server.models, "1.8.0", fp16_fragile=False)),
            headers=admin,
        )
        server.service.installs.stop()
        late = c.post(
            url, content=zipped(stray_bundle(server, tmp_path / "s2", "1.9.0")), headers=admin
        )
        assert late.status_code == 503 and late.json()["error"]["code"] == "stopping"
        assert finished(c, reader, third.headers["location"])["state"] == "installed"
        left = c.get(fourth.headers["location"], headers=auth(reader)).json()
        assert (left["state"], left["attempts"]) == ("queued", 0)

    models = server.data / "models"
    assert verify_install(models / STEP / "1.4.0") == []
    assert (models / STEP / "1.7.0").is_dir()
    assert not (models / STEP / "1.8.0").exists() and not (models / "unused-organs").exists()
    assert list((models / ".staging").iterdir()) == []

    def kept() -> list[str]:  # an ended install's bundle goes just after its record
        return [p.name for p in (models / ".installs").iterdir() if p.is_dir()]

    left_to_next = [f"{fourth.json()['id']}.bundle"]
    until(lambda: kept() == left_to_next, "the ended installs' bundles to go", 30 * WAIT_SCALE)
    # the CLI reads the same records from the data dir
    rows = json.loads(server.cli("models", "installs", "--json").stdout)
    assert [r["state"] for r in rows] == ["queued", "installed", "rejected", "installed"]


def test_installs_left_by_a_stop_or_a_crash_are_built_by_the_next_server(tmp_path: Path) -> None:
    """A server killed (-9) while it builds one install and holds another queued, and one
    stopped with an install queued: the next server started on the data dir builds each
    from the bundle kept with its record (the build cut short again from the start), as
    it resumes jobs; the operator sends nothing again."""
    from tests.factories.ports import free_port
    from tests.factories.server_process import create_key_cli, start_server, stop_servers

    config, data = variants_config(tmp_path), tmp_path / "data"
    shipped = tmp_path / "assets" / "models"
    port = free_port()
    process = start_server(config, data, port, tmp_path / "first.log")
    url = f"http://127.0.0.1:{port}/v1/models?build_variants=true&precisions=int8"
    try:
        admin = auth(create_key_cli(config, data, "admin"))
        bundles = [
            zipped(candidate(tmp_path / f"c{v}", shipped, v, fp16_fragile=False))
            for v in ("2.1.0", "2.2.0")
        ]
        with httpx.Client(timeout=600) as c:
            cut, waiting = (c.post(url, content=b, headers=admin) for b in bundles)
            assert (cut.status_code, waiting.status_code) == (202, 202), waiting.text
            where = f"http://127.0.0.1:{port}" + cut.headers["location"]

            def building() -> bool:
                return c.get(where, headers=admin).json()["state"] == "building"

            until(building, "the first install to build", 120 * WAIT_SCALE, step=0.02)
        process.kill()  # -9, mid-build
        process.wait(60)
    finally:
        stop_servers([process])
    ids = [cut.json()["id"], waiting.json()["id"]]
    models = data / "models"
    assert not (models / STEP / "2.1.0").exists()

    second = Server(tmp_path, config)
    with second.thread, httpx.Client(base_url=second.thread.url, timeout=600) as c:
        done = [finished(c, second.admin, f"/v1/models/installs/{i}") for i in ids]
        assert [(d["state"], d["attempts"]) for d in done] == [
            ("installed", 2),  # cut short by the kill, built again from the start
            ("installed", 1),
        ]
        assert done[0]["result"]["variants"] == {"int8": {"accepted": True, "reasons": []}}
        # stopped with one queued: left to the next start, which builds it
        third, fourth = (
            c.post(
                "/v1/models?build_variants=true",
                content=zipped(candidate(tmp_path / v, shipped, v, fp16_fragile=False)),
                headers=auth(second.admin),
            )
            for v in ("2.3.0", "2.4.0")
        )
        assert (third.status_code, fourth.status_code) == (202, 202), fourth.text
        second.service.installs.stop()
        assert finished(c, second.admin, third.headers["location"])["state"] == "installed"
    assert not (models / STEP / "2.4.0").exists()

    last_server = Server(tmp_path, config)
    with last_server.thread, httpx.Client(base_url=last_server.thread.url, timeout=600) as c:
        last = finished(c, last_server.admin, fourth.headers["location"])
        assert (last["state"], last["attempts"]) == ("installed", 1), last
    for version in ("2.1.0", "2.2.0", "2.3.0", "2.4.0"):
        assert verify_install(models / STEP / version) == [], version
    until(
        lambda: not [p for p in (models / ".installs").iterdir() if p.is_dir()],
        "every kept bundle to go once its install ended",
        30 * WAIT_SCALE,
    )

"""``radserve models build-variants`` on an installed version, SIGKILLed at every kind of
point: the version is afterwards either as it was or whole with the new variants, never
"changed since install", and ``radserve models deploy`` and ``radserve doctor`` accept
it, doctor (or the next start) saying which.

Before 2026-12-07 the build wrote the variant files and ``model.yaml`` into the version
and recorded them in ``install.json`` last: a build killed in between left the version
"changed since install" (``model.fp16.onnx was added after install``); its deploy was
refused, doctor flagged it, and the only way out was to install it again as a new
version. Now it builds in a staged copy and moves the files in after recording them
(:mod:`radserve.lifecycle.version_commit`).

The kills are real: the build runs in its own interpreter, killed from outside once its
first variant file exists (the long build phase), or by itself just before its k-th
rename into the version's folder (each step of the commit: ``os.replace`` and
``os.rename`` counted, nothing else changed), so every point between two visible
changes can be reached; the old code is killed by the same rule at its own writes.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from tests.factories.bundles import one_step_pipeline
from tests.factories.server_process import radserve_command, run_radserve
from tests.factories.service import config_file
from tests.factories.waits import WAIT_SCALE

from radserve.config import load_settings
from radserve.lifecycle.install import remove_interrupted_installs, verify_install
from radserve.service import Service

STEP = "organs-test"
VERSION = "1.0.1"
BUILD = ("--small", "--seeds", "0-1", "--calibration-seeds", "1000", "--precision", "fp16,int8")
VARIANT_FILES = {"model.fp16.onnx", "model.int8.onnx", "gate.json"}
# kills itself just before its k-th rename into the folder argv[1] names; then radserve
KILLER = """
import os, signal, sys
target, at, renames = os.path.realpath(sys.argv[1]), int(sys.argv[2]), 0
def counted(real):
    def rename(src, dst, *args, **kwargs):
        global renames
        if os.path.dirname(os.path.realpath(dst)) == target:
            renames += 1
            if renames == at:
                os.kill(os.getpid(), signal.SIGKILL)
        return real(src, dst, *args, **kwargs)
    return rename
os.replace, os.rename = counted(os.replace), counted(os.rename)
sys.argv = ["radserve", *sys.argv[3:]]
from radserve.cli import main
main()
"""


class Installed:
    """organs-test installed as 1.0.1 (fp32 only) on a server's data dir, and a
    one-step pipeline running it."""

    def __init__(self, tmp: Path) -> None:
        self.data = tmp / "data"
        self.config = config_file(tmp, data_dir=str(self.data))
        service = Service(load_settings(self.config))
        folder = tmp / "src" / STEP / VERSION
        shutil.copytree(tmp / "assets" / "models" / STEP / "1.0.0", folder)
        manifest = yaml.safe_load((folder / "model.yaml").read_text())
        (folder / "model.yaml").write_text(yaml.safe_dump({**manifest, "version": VERSION}))
        self.directory = service.lifecycle.install(folder, actor="test").directory
        service.store.close()
        self.names = {p.name for p in self.directory.iterdir()}
        self.record = (self.directory / "install.json").read_bytes()
        self.pipeline = one_step_pipeline(tmp, STEP)

    def build_args(self) -> tuple[str, ...]:
        return (
            "models", "build-variants", "--model", STEP, "--models-dir",
            str(self.directory.parent.parent), "--pipeline", str(self.pipeline), *BUILD,
        )  # fmt: skip

    def doctor_row(self) -> dict[str, str]:
        done = run_radserve("doctor", "--json", "--no-ports", "--config", str(self.config))
        checks = {c["name"]: c for c in json.loads(done.stdout)}
        return checks[f"model {STEP} {VERSION}"]

    def deploy(self) -> subprocess.CompletedProcess[str]:
        return run_radserve(
            "models", "deploy", STEP, VERSION, "--reason", "after a killed build",
            "--config", str(self.config),
        )  # fmt: skip

    def state(self) -> str:
        """ "before" (every file and install.json as installed) or "after" (whole with
        the variants, each recorded); anything else fails."""
        assert verify_install(self.directory) == []
        names = {p.name for p in self.directory.iterdir()}
        record = json.loads((self.directory / "install.json").read_text())
        assert "commit" not in record, record
        if names == self.names:
            assert (self.directory / "install.json").read_bytes() == self.record
            return "before"
        assert names == self.names | VARIANT_FILES
        gate = json.loads((self.directory / "gate.json").read_text())
        assert set(gate["variants"]) == {"fp16", "int8"}
        change = record["changes"][-1]
        assert set(change["files"]) == {"model.yaml"} | VARIANT_FILES
        assert "build-variants: fp16, int8 built and gated" in change["what"]
        return "after"

    def nothing_left(self) -> None:
        staging = self.data / "models" / ".staging"
        left = list(staging.glob(".variants-*")) if staging.is_dir() else []
        assert left == []


@pytest.fixture
def installed(tmp_path: Path) -> Installed:
    return Installed(tmp_path)


def _start(installed: Installed, caplog: pytest.LogCaptureFixture) -> str:
    """What the next ``radserve serve`` does first (Service.start): finish or remove
    what killed builds left; what it logged."""
    with caplog.at_level(logging.WARNING, logger="radserve.lifecycle"):
        remove_interrupted_installs(installed.data)
    return " ".join(caplog.text.split())


# (kill before the k-th rename into the version's folder, who reads the version first,
# the state it must then be in): 1 = after the copy was renamed for its commit, before
# install.json recorded it; 2 = recorded, nothing moved; 4 = both variant files moved,
# gate.json and model.yaml not; 6 = all moved, install.json not yet closed
POINTS = [(1, "doctor", "before"), (2, "start", "after"), (4, "deploy", "after"),
          (6, "doctor", "after")]  # fmt: skip


@pytest.mark.parametrize(("kill_at", "first", "expected"), POINTS)
def test_a_build_killed_at_its_commit_leaves_the_version_as_it_was_or_whole(
    installed: Installed, caplog, kill_at: int, first: str, expected: str
) -> None:
    killed = subprocess.run(
        [sys.executable, "-c", KILLER, str(installed.directory), str(kill_at),
         *installed.build_args()],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    # where the kill fell: the copy renamed for its commit, and recorded from 2 on
    record = json.loads((installed.directory / "install.json").read_text())
    recorded = "commit" in record
    renamed = list((installed.data / "models" / ".staging").glob(".variants-*.commit"))

    if first == "doctor":
        row = installed.doctor_row()
        assert row["status"] == "ok", row
        said = " ".join(row["detail"].split())
        if expected == "before":
            assert "was killed before it recorded its files" in said
            assert "the version is as it was" in said
            assert said.startswith("servable fp32;")
        else:
            moved = "model.fp16.onnx, model.int8.onnx, gate.json, model.yaml"
            assert "was cut short while its files were moved in; finished: the version " in said
            assert f"is whole with them ({moved})" in said
            assert said.startswith("servable fp32, fp16, int8")  # the row: as finished
    elif first == "start":
        said = _start(installed, caplog)
        assert "was cut short while its files were moved in; finished" in said
    else:
        deployed = installed.deploy()
        assert deployed.returncode == 0, deployed.stderr

    assert installed.state() == expected
    if first != "deploy":
        deployed = installed.deploy()
        assert deployed.returncode == 0, deployed.stderr
    if first != "doctor":
        assert installed.doctor_row()["status"] == "ok"
    remove_interrupted_installs(installed.data)
    installed.nothing_left()
    assert installed.state() == expected
    assert (recorded, len(renamed)) == (kill_at > 1, 1)


def test_a_build_killed_while_it_builds_leaves_the_version_as_it_was(
    installed: Installed, caplog
) -> None:
    """A kill -9 from outside once the first variant file exists (the build's long part:
    calibration, evaluation, timing still to come): the version is untouched; the next
    start says so and removes the copy; deploy accepts the version."""
    build = subprocess.Popen(
        radserve_command(*installed.build_args()),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    models = installed.data / "models"
    deadline = time.monotonic() + 300 * WAIT_SCALE
    try:
        while not any(models.rglob("model.fp16.onnx")):
            assert build.poll() is None, "the build ended before its first variant existed"
            assert time.monotonic() < deadline, "no variant file appeared"
            time.sleep(0.02)
    finally:
        os.kill(build.pid, signal.SIGKILL)
        build.wait(timeout=60)
    assert installed.deploy().returncode == 0
    assert installed.state() == "before"
    said = _start(installed, caplog)
    assert f"{STEP}/{VERSION}: a variant build was killed before it recorded its files" in said
    assert "the version is as it was" in said
    installed.nothing_left()

    # and the next build, not killed, goes through: whole with its variants
    done = run_radserve(*installed.build_args())
    assert done.returncode == 0, done.stderr
    assert installed.state() == "after"
    installed.nothing_left()

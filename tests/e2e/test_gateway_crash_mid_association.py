"""A gateway crash mid-association: ``kill -9`` a real ``radserve serve`` after part of a
study was stored, start it again, and the partial study is not taken as complete after
the usual quiet period; when the sender sends the study again, one job sees every
instance."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pydicom
import pytest
from pynetdicom import AE
from pynetdicom.sop_class import CTImageStorage
from tests.factories.dicom_net import free_port
from tests.factories.service import config_file, make_study
from tests.factories.waits import wait_until

from radserve.report.json_report import read_report
from radserve.store import JobState, init_store

pytestmark = pytest.mark.slow
QUIET_S = 1.0


def _serve(config: Path, data: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-c", "from radserve.cli import main; main()", "serve"]
    command += ["--host", "127.0.0.1", "--port", str(port), "--config", str(config)]
    command += ["--data-dir", str(data), "--cpu-workers", "1"]
    with open(log, "ab") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)

    def up() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"radserve serve exited: {log.read_text()[-3000:]}")
        try:
            return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    if not wait_until(up, 90, step=0.1):
        process.kill()
        raise RuntimeError("radserve serve did not answer /healthz")
    return process


def _associate(port: int):  # type: ignore[no-untyped-def]
    ae = AE("MODALITY")
    ae.add_requested_context(CTImageStorage, ["1.2.840.10008.1.2.1"])
    assoc = ae.associate("127.0.0.1", port, ae_title="RADSERVE")
    assert assoc.is_established
    return assoc


def _send(port: int, files: list[Path]) -> None:
    assoc = _associate(port)
    try:
        assert [int(assoc.send_c_store(str(p)).Status) for p in files] == [0] * len(files)
    finally:
        assoc.release()


def _jobs(data: Path) -> list:
    store = init_store(f"sqlite:///{data / 'radserve.db'}")
    try:
        return store.list_jobs(limit=20).items
    finally:
        store.close()


def _studies(data: Path) -> list[str]:
    """The Study Instance UID of every job, from its stored input."""
    uids = []
    for job in _jobs(data):
        first = next(Path(job.study_path).glob("*.dcm"))
        uids.append(str(pydicom.dcmread(first, stop_before_pixels=True).StudyInstanceUID))
    return uids


def _uid(path: Path) -> str:
    return str(pydicom.dcmread(path, stop_before_pixels=True).StudyInstanceUID)


def test_study_cut_off_by_a_crash_waits_for_its_sender_and_runs_whole(tmp_path: Path) -> None:
    data, log = tmp_path / "data", tmp_path / "serve.log"
    http_port, dicom_port = free_port(), free_port()
    config = config_file(
        tmp_path,
        gateway={
            "enabled": True,
            "port": dicom_port,
            "quiet_s": QUIET_S,
            "interrupted_quiet_s": 120,
        },
    )
    study = make_study(tmp_path / "a")
    other = make_study(tmp_path / "b")
    server = _serve(config, data, http_port, log)
    try:
        assoc = _associate(dicom_port)
        for path in study[:5]:  # each success means: fsynced on the server
            assert int(assoc.send_c_store(str(path)).Status) == 0
        os.kill(server.pid, signal.SIGKILL)  # mid-association: 5 of 12 instances
        server.wait(30)
        assoc.abort()
    finally:
        if server.poll() is None:
            server.kill()
    server = _serve(config, data, http_port, log)
    try:
        # another study after the restart: once its job exists, its quiet period (which
        # began after the restart) is over, so an ordinary partial study, waiting since
        # the restart, would have been handed over first (same poll, or an earlier one)
        _send(dicom_port, other)
        assert wait_until(lambda: _uid(other[0]) in _studies(data), 60)
        assert _uid(study[0]) not in _studies(data), "the cut-off study was taken as complete"
        # the sender sends the study again (all of it) and releases normally
        _send(dicom_port, study)

        def finished() -> bool:
            jobs = _jobs(data)
            return len(jobs) == 2 and all(j.terminal for j in jobs)

        assert wait_until(finished, 90), log.read_text()[-3000:]
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
    assert sorted(_studies(data)) == sorted([_uid(study[0]), _uid(other[0])])  # one job each
    [job] = [j for j, uid in zip(_jobs(data), _studies(data), strict=True) if uid == _uid(study[0])]
    assert job.state is JobState.SUCCEEDED
    report = read_report(Path(str(job.result_path)) / "report.json")
    assert len(report.geometry.source_sop_instance_uids) == len(study)  # all 12 slices

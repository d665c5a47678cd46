"""An instance a gateway door refused while the rest of its study was stored is named on
the job of that study: a warning ``instances_refused`` (how many, and each reason's
radserve code and the status answered; no patient data, no path) in ``GET
/v1/jobs/{id}`` and in the report, as ``study_maybe_incomplete`` is carried.

Until 2026-12-07 the refusal was answered to the sender only (a C-STORE failure status,
a STOW-RS Failed SOP Sequence item) and the job of the rest of the study said nothing of
it: a radiologist read a result computed on part of what the modality sent.

Real peers: dcmtk ``storescu`` (with ``--no-halt``, as a modality goes on after a failed
instance) and pynetdicom associations to radserve's SCP, ``dicomweb-client``'s STOW-RS
to a real server, each server stopped and started again between the refusal and the
hand-over (the refusals are counted in the study's received folder, not in memory). A
refused instance sent again is counted once; one stored later is not counted; past
:data:`~radserve.gateway.completeness.REFUSED_NAMED` refused instances the marker stops
growing and the warning says "up to"."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pydicom
import pytest
import requests
from dicomweb_client import DICOMwebClient
from pydicom.dataset import Dataset
from pydicom.uid import generate_uid
from pynetdicom import AE
from pynetdicom.sop_class import CTImageStorage
from tests.factories.dicom_net import Intake, dcmtk_tool, loopback_scp_config, storescu
from tests.factories.ports import free_port
from tests.factories.service import auth, live_server, make_study, settings_for
from tests.factories.waits import until

from radserve.config import StorageSettings
from radserve.gateway import GatewaySCP
from radserve.gateway.completeness import REFUSED_MARKER, REFUSED_NAMED
from radserve.report.json_report import read_report
from radserve.service.gateway import handover_warnings
from radserve.service.retention import Retention
from radserve.store import init_store

pytestmark = pytest.mark.filterwarnings("ignore:Invalid value for VR UI")  # BAD_UID, on purpose

# the first server's quiet period outlasts the test: only the restart ends it
LONG_QUIET_S = 3600.0
REFUSED = "instances_refused"
BAD_UID = "1.2.840.bad-uid"  # a Series Instance UID the SCP refuses: 0xC000 instance_invalid
REASON_CODE = "00091001"  # a failed STOW-RS item's radserve code (docs/conformance.md 4.1)


def _by_position(files: list[Path]) -> list[Path]:
    """The study's files from the first slice to the last (a refused edge slice leaves
    the rest one stack without a gap: the job runs on it)."""
    z = {
        p: float(pydicom.dcmread(p, stop_before_pixels=True).ImagePositionPatient[2]) for p in files
    }
    return sorted(files, key=z.__getitem__)


def _bad_series_uid(path: Path, folder: Path) -> Path:
    """``path`` with a Series Instance UID against the UID rules: the SCP refuses it
    (0xC000 instance_invalid); its Study and SOP Instance UID are unchanged."""
    folder.mkdir(parents=True, exist_ok=True)
    ds = pydicom.dcmread(path)
    ds.SeriesInstanceUID = BAD_UID
    out = folder / path.name
    ds.save_as(out, enforce_file_format=True)
    return out


def _truncated(path: Path) -> Dataset:
    """``path`` with its pixel data cut short: a damaged instance STOW-RS refuses."""
    ds = pydicom.dcmread(path)
    ds.PixelData = bytes(ds.PixelData)[:-200]
    return ds


def _gateway(tmp_path: Path, quiet_s: float) -> dict[str, Any]:
    return {
        "gateway__enabled": True,
        "gateway__port": free_port(),
        "gateway__quiet_s": quiet_s,
        "gateway__allowed_peers": [{"ae_title": "STORESCU", "host": "127.0.0.1"}],
    }


def _warnings(server: dict[str, Any], job_id: str) -> dict[str, str]:
    got = server["client"].get(f"/v1/jobs/{job_id}", headers=auth(server["read"]))
    assert got.status_code == 200, got.text
    return {w["code"]: w["message"] for w in got.json().get("warnings") or []}


def _only_job(server: dict[str, Any]) -> Any:
    store = server["service"].store

    def final() -> Any:
        jobs = store.list_jobs(limit=10).items
        return jobs[0] if len(jobs) == 1 and jobs[0].terminal else None

    job = until(final, "the study's job, finished", 180)
    assert job.state.value == "succeeded", (job.error_code, job.error_message)
    return job


def _report_warnings(job: Any) -> list[tuple[str, str]]:
    report = read_report(Path(str(job.result_path)) / "report.json")
    return [(w.code, w.message) for w in report.warnings]


@pytest.mark.slow
@pytest.mark.skipif(dcmtk_tool("storescu") is None, reason="dcmtk storescu is not installed")
def test_c_stores_refused_before_a_restart_are_named_on_the_job(tmp_path: Path) -> None:
    files = _by_position(make_study(tmp_path / "study"))
    bad = tmp_path / "bad"
    first, second, last = files[0], files[1], files[-1]
    with live_server(settings_for(tmp_path, **_gateway(tmp_path, LONG_QUIET_S)), warm=False) as s:
        port = s["service"].settings.gateway.port
        sent = [_bad_series_uid(first, bad), _bad_series_uid(second, bad), *files[2:-1]]
        sent.append(_bad_series_uid(last, bad))
        assert storescu("127.0.0.1", port, sent, extra=["--no-halt"]).returncode == 0
        # the sender tries again: the last slice is refused again (counted once), the
        # second is sent whole and stored (no longer missing: not counted)
        again = [_bad_series_uid(last, bad), second]
        assert storescu("127.0.0.1", port, again, extra=["--no-halt"]).returncode == 0
        assert s["service"].store.list_jobs(limit=10).items == []  # still quiet
    # a restart between the refusals and the hand-over
    with live_server(settings_for(tmp_path, **_gateway(tmp_path, 0.5))) as s:
        job = _only_job(s)
        message = _warnings(s, job.id)[REFUSED]
        assert message == (
            "2 instances of this study were refused at the gateway (not stored: 2 "
            "instance_invalid (0xC000)) and are not included in this result"
        )
        assert (REFUSED, message) in _report_warnings(job)
        study_path = Path(str(job.study_path))
        assert len(list(study_path.rglob("*.dcm"))) == len(files) - 2


@pytest.mark.slow
def test_a_stow_part_refused_before_a_restart_is_named_on_the_quiet_period_job(
    tmp_path: Path,
) -> None:
    files = _by_position(make_study(tmp_path / "study"))
    study = str(pydicom.dcmread(files[0], stop_before_pixels=True).StudyInstanceUID)
    quiet = {"dicomweb__completeness": "quiet"}
    with live_server(
        settings_for(tmp_path, dicomweb__quiet_s=LONG_QUIET_S, **quiet), warm=False
    ) as s:
        client = DICOMwebClient(f"{s['url']}/dicomweb", headers=auth(s["submit"]))
        datasets = [_truncated(files[0]), *map(pydicom.dcmread, files[1:-1])]
        datasets.append(_truncated(files[-1]))
        response = client.store_instances(datasets, study_instance_uid=study)
        failed = response.FailedSOPSequence
        assert len(failed) == 2 and {int(i.FailureReason) for i in failed} == {0xC000}
        code = str(failed[0].to_json_dict()[REASON_CODE]["Value"][0])
        # the sender sends the first slice whole (stored), the last one damaged again
        again = client.store_instances(
            [pydicom.dcmread(files[0]), _truncated(files[-1])], study_instance_uid=study
        )
        assert len(again.FailedSOPSequence) == 1
        with pytest.raises(requests.HTTPError) as refused:  # 409: nothing stored
            client.store_instances([_truncated(files[-1])], study_instance_uid=study)
        assert refused.value.response.status_code == 409
        assert s["service"].store.list_jobs(limit=10).items == []
    with live_server(settings_for(tmp_path, dicomweb__quiet_s=0.5, **quiet)) as s:
        job = _only_job(s)
        message = _warnings(s, job.id)[REFUSED]
        assert message == (
            f"1 instance of this study was refused at the gateway (not stored: 1 {code} "
            "(0xC000)) and is not included in this result"
        )
        assert (REFUSED, message) in _report_warnings(job)


def test_a_stow_request_s_refused_parts_are_named_on_the_job_it_makes(tmp_path: Path) -> None:
    """STOW-RS's default completeness (``request``): the job is made in the request from
    its stored parts, and names the image parts the same request refused (a part
    refused whose SOP Instance UID another part of the request stored is not missing)."""
    files = _by_position(make_study(tmp_path / "study"))
    study = str(pydicom.dcmread(files[0], stop_before_pixels=True).StudyInstanceUID)
    with live_server(settings_for(tmp_path)) as s:
        client = DICOMwebClient(f"{s['url']}/dicomweb", headers=auth(s["submit"]))
        datasets = [_truncated(files[0]), *map(pydicom.dcmread, files[1:-1])]
        datasets += [_truncated(files[-1]), pydicom.dcmread(files[-1])]  # refused, then whole
        response = client.store_instances(datasets, study_instance_uid=study)
        failed = response.FailedSOPSequence
        assert len(failed) == 2 and {int(i.FailureReason) for i in failed} == {0xC000}
        code = str(failed[0].to_json_dict()[REASON_CODE]["Value"][0])
        job = _only_job(s)
        message = _warnings(s, job.id)[REFUSED]
        assert message == (
            f"1 instance of this study was refused at the gateway (not stored: 1 {code} "
            "(0xC000)) and is not included in this result"
        )
        assert (REFUSED, message) in _report_warnings(job)


@contextmanager
def _association(port: int) -> Iterator[Any]:
    ae = AE("PYNETDICOM")
    ae.add_requested_context(CTImageStorage, ["1.2.840.10008.1.2.1"])
    assoc = ae.associate("127.0.0.1", port, ae_title="RADSERVE")
    assert assoc.is_established
    try:
        yield assoc
    finally:
        assoc.release()


def test_a_sender_refused_again_and_again_leaves_a_bounded_marker(tmp_path: Path) -> None:
    """Refused instances past the named ones are counted by reason only: the marker stays
    a few KB, and the warning says the count is at most (a resend counts again there)."""
    files = _by_position(make_study(tmp_path / "study"))
    good = pydicom.dcmread(files[0])
    refusals = 300
    intake = Intake()
    data = tmp_path / "data" / "gateway"
    with GatewaySCP(loopback_scp_config(data, 0.5), intake) as scp:
        with _association(scp.address[1]) as assoc:
            bad = pydicom.dcmread(files[1])
            bad.SeriesInstanceUID = BAD_UID
            statuses = []
            for _ in range(refusals):
                bad.SOPInstanceUID = bad.file_meta.MediaStorageSOPInstanceUID = generate_uid()
                statuses.append(int(assoc.send_c_store(bad).Status))
            assert statuses == [0xC000] * refusals
            assert int(assoc.send_c_store(good).Status) == 0
        marker = data / "incoming" / str(good.StudyInstanceUID) / REFUSED_MARKER
        assert len(json.loads(marker.read_text())["named"]) == REFUSED_NAMED
        assert marker.stat().st_size < 3000
        (study,) = until(lambda: list(intake.studies), "the study's hand-over", 60)
    assert study.refused is not None and study.refused.instances == refusals
    [(code, message)] = [(w["code"], w["message"]) for w in handover_warnings(study)]
    assert code == REFUSED
    assert message.startswith(f"up to {refusals} instances of this study were refused")
    assert f"{refusals} instance_invalid (0xC000)" in message


def test_refusals_in_two_receiving_processes_at_once_are_each_counted(tmp_path: Path) -> None:
    """``gateway.receivers: 2``: two associations, each run by its own receiving process,
    refuse instances of one study at the same time; the processes take turns at the
    study's marker (a lock on its folder), so no refusal is lost to the other's write."""
    files = _by_position(make_study(tmp_path / "study"))
    each = 40
    intake = Intake()
    config = loopback_scp_config(tmp_path / "gateway", 0.5, receivers=2)

    def send(assoc: Any, path: Path) -> list[int]:
        bad = pydicom.dcmread(path)
        bad.SeriesInstanceUID = BAD_UID
        statuses = []
        for _ in range(each):
            bad.SOPInstanceUID = bad.file_meta.MediaStorageSOPInstanceUID = generate_uid()
            statuses.append(int(assoc.send_c_store(bad).Status))
        return statuses

    with GatewaySCP(config, intake) as scp:
        with (
            _association(scp.address[1]) as one,
            _association(scp.address[1]) as two,
            ThreadPoolExecutor(2) as pool,
        ):
            sent = [pool.submit(send, one, files[1]), pool.submit(send, two, files[2])]
            assert [f.result() for f in sent] == [[0xC000] * each] * 2
            assert int(one.send_c_store(pydicom.dcmread(files[0])).Status) == 0
        (study,) = until(lambda: list(intake.studies), "the study's hand-over", 60)
    assert study.refused is not None and study.refused.instances == 2 * each


def test_a_study_whose_every_instance_was_refused_makes_no_job_and_is_swept(
    tmp_path: Path,
) -> None:
    """Its folder holds only markers, one of them a hand-over of nothing (generation 0):
    no hand-over, also after a restart, and retention removes it once old, as it removes
    a handed-over study's (it was kept for good as "not handed over")."""
    files = make_study(tmp_path / "study")
    data = tmp_path / "data"
    intake = Intake()
    config = loopback_scp_config(data / "gateway", 0.2)
    with GatewaySCP(config, intake) as scp, _association(scp.address[1]) as assoc:
        for path in files[:3]:
            ds = pydicom.dcmread(path)
            ds.SeriesInstanceUID = BAD_UID
            assert int(assoc.send_c_store(ds).Status) == 0xC000
    folder = data / "gateway" / "incoming" / str(ds.StudyInstanceUID)
    assert sorted(p.name for p in folder.iterdir()) == [".radserve-handover.json", REFUSED_MARKER]
    with GatewaySCP(config, intake) as restarted:  # a restart: no study to wait for
        assert restarted.tracker.pending() == []
    assert intake.studies == []
    store = init_store(f"sqlite:///{tmp_path / 'radserve.db'}")
    try:
        week = time.time() + 8 * 86_400.0
        swept = Retention(data, StorageSettings(), store, clock=lambda: week).sweep()
    finally:
        store.close()
    assert swept.removed["incoming"].folders == 1 and not folder.exists()

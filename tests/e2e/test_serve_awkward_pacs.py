"""`radserve serve` and a PACS that behaves like real ones, end to end: the PACS sends a
study holding, beside the CT, a localizer, a secondary capture and a radiation dose SR,
then takes the results back slowly (each answer after 1 s), refusing the first with
0xA700 (out of resources) and storing two with warnings (0xB000 coercion, 0xB006
elements discarded). The CT alone is analysed and every other series is named with its
reason; every result reaches the PACS, dciodvfy-clean, referencing the instances the PACS
sent; the warnings are kept on the delivered rows (``radserve outbox list``). The PACS
is a pynetdicom acceptor (neither Orthanc nor storescp can answer chosen statuses);
the study is sent by dcmtk's storescu as the PACS's AE."""

from __future__ import annotations

import json
from pathlib import Path

import pydicom
import pytest
from pydicom.dataset import Dataset
from tests.factories.awkward_peer import scripted_peer
from tests.factories.dciodvfy import dciodvfy_errors
from tests.factories.dicom_net import dcmtk_tool, free_port, storescu
from tests.factories.extra_series import dose_report, localizer, screen_capture
from tests.factories.serve import RadserveServe, listening
from tests.factories.server_process import run_radserve
from tests.factories.service import config_file, make_study
from tests.factories.waits import until

from radserve.gateway.conformance import COMPREHENSIVE_3D_SR, SEGMENTATION
from radserve.report.json_report import read_report
from radserve.store import JobState, init_store
from radserve.store.outbox import OutboxState, OutboxStore

pytestmark = [
    pytest.mark.slow,
    pytest.mark.tools,
    pytest.mark.skipif(dcmtk_tool("storescu") is None, reason="dcmtk is not installed"),
]


def _study_with_extra_series(folder: Path) -> tuple[list[Path], list[Path]]:
    """The CT's files, and the files of a localizer, a secondary capture and a dose SR
    of the same study."""
    ct = make_study(folder / "ct")
    others = [*localizer(folder / "localizer", ct[0]), *screen_capture(folder / "sc", ct[0])]
    return ct, [*others, dose_report(folder / "dose", ct[0])]


def _referenced_instances(dataset: Dataset) -> set[str]:
    """The source instances a SEG (Referenced Series Sequence) or an SR (Current
    Requested Procedure Evidence Sequence) names."""
    if "ReferencedSeriesSequence" in dataset:
        series = dataset.ReferencedSeriesSequence
        return {i.ReferencedSOPInstanceUID for s in series for i in s.ReferencedInstanceSequence}
    studies = dataset.CurrentRequestedProcedureEvidenceSequence
    series = [s for study in studies for s in study.ReferencedSeriesSequence]
    return {i.ReferencedSOPInstanceUID for s in series for i in s.ReferencedSOPSequence}


def test_a_slow_pacs_refusing_then_warning_gets_every_result_and_only_the_ct_is_analysed(
    tmp_path: Path,
) -> None:
    statuses = (0xA700, 0xB000, 0xB006, 0x0000)
    with scripted_peer(statuses=statuses, delay_s=1.0) as pacs:
        gateway = {
            "enabled": True,
            "port": (gateway_port := free_port()),
            "quiet_s": 0.5,
            "dimse_timeout_s": 10,  # the PACS's 1 s answers are slow, not dead
            "retry_first_s": 0.5,
            "retry_max_s": 1.0,
            "allowed_peers": [
                {"ae_title": "AWKWARD", "host": "127.0.0.1", "port": pacs.destination.port}
            ],
        }
        config, data = config_file(tmp_path, gateway=gateway), tmp_path / "data"
        with RadserveServe(config, data, free_port(), tmp_path / "serve.log"):
            until(lambda: listening("127.0.0.1", gateway_port), "the gateway to listen")
            ct, others = _study_with_extra_series(tmp_path / "study")
            sent = storescu("127.0.0.1", gateway_port, [*ct, *others], calling="AWKWARD")
            assert sent.returncode == 0, sent.stderr
            store = init_store(f"sqlite:///{data / 'radserve.db'}")
            try:
                job = until(
                    lambda: next((j for j in store.list_jobs(limit=5).items if j.terminal), None),
                    "the study's job to finish",
                    timeout=180,
                )
                rows = OutboxStore(store.engine)
                until(
                    lambda: (r := rows.items()) and {i.state for i in r} == {OutboxState.SENT},
                    "every result delivered to the slow PACS",
                    timeout=120,
                    state=rows.items,
                )
                items, jobs = rows.items(), store.list_jobs(limit=5).items
            finally:
                store.close()
            listed = run_radserve(
                "outbox", "list", "--json", "--config", str(config), "--data-dir", str(data)
            )
    assert job.state is JobState.SUCCEEDED, (job.error_code, job.error_message)
    assert len(jobs) == 1  # the extra series neither opened nor re-ran a job

    report = read_report(Path(str(job.result_path)) / "report.json")
    ct_series = pydicom.dcmread(ct[0], stop_before_pixels=True).SeriesInstanceUID
    assert report.series_selection.selected.series_instance_uid == ct_series
    rejected = {r.series_number: r.reason for r in report.series_selection.rejected}
    assert set(rejected) == {2, 3} and all(rejected.values()), rejected
    quarantined = list(data.rglob(f"quarantine/*/{pydicom.dcmread(others[-1]).SOPInstanceUID}*"))
    assert len(quarantined) == 1  # the dose SR kept aside, never analysed

    assert {i.sop_class_uid for i in items} == {SEGMENTATION, COMPREHENSIVE_3D_SR}
    refused = [i for i in items if i.attempts > 1]
    assert len(refused) == 1 and refused[0].last_error is None  # 0xA700, then stored
    warned = sorted(i.last_error or "" for i in items if i.last_error)
    assert [w[:21] for w in warned] == ["C-STORE status 0xB000", "C-STORE status 0xB006"]
    assert listed.returncode == 0, listed.stderr
    from_cli = [json.loads(line) for line in listed.stdout.splitlines()]
    assert sorted(r["last_error"] for r in from_cli if r["last_error"]) == warned

    stored = {d.SOPInstanceUID: d for d in pacs.received}
    assert set(stored) == {i.sop_instance_uid for i in items}
    source = {pydicom.dcmread(p, stop_before_pixels=True).SOPInstanceUID for p in ct}
    for uid, dataset in stored.items():
        path = tmp_path / "pacs" / f"{uid}.dcm"
        path.parent.mkdir(exist_ok=True)
        dataset.save_as(path, enforce_file_format=True)
        assert dciodvfy_errors(path) == [], uid
        referenced = _referenced_instances(dataset)
        assert referenced and referenced <= source | set(stored), uid  # the SR names the SEG
    segs = {u for u, d in stored.items() if d.SOPClassUID == SEGMENTATION}
    [sr] = [d for d in stored.values() if d.SOPClassUID == COMPREHENSIVE_3D_SR]
    assert segs and segs <= _referenced_instances(sr)

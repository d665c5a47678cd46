"""The storage SCP against real peers on loopback: dcmtk's echoscu/storescu and
pynetdicom associations. Studies are a dozen slices of a small phantom."""

from __future__ import annotations

import logging
import re
import socket
import subprocess
import threading
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pydicom
import pytest
from pydicom.pixels import pixel_array
from pydicom.uid import (
    DeflatedExplicitVRLittleEndian,
    HTJ2KLossless,
    ImplicitVRLittleEndian,
    JPEGExtended12Bit,
)
from pynetdicom import AE
from pynetdicom.sop_class import ComprehensiveSRStorage, CTImageStorage, Verification
from tests.factories.dicom_net import Intake, dcmtk_tool, loopback_scp_config, small_study, storescu
from tests.factories.dicom_series import dcmtk_compress
from tests.factories.results import relabel
from tests.factories.waits import WAIT_SCALE, wait_until

from radserve.gateway import GatewaySCP, Peer, ScpConfig, UnwantedPolicy
from radserve.gateway.conformance import (
    REFUSED_TRANSFER_SYNTAXES,
    SCP_TRANSFER_SYNTAXES,
    Status,
)
from radserve.ingest.discover import discover_series
from radserve.ingest.rules import uid_problem
from radserve.store.files import store_study_files

pytestmark = [
    pytest.mark.tools,
    pytest.mark.skipif(dcmtk_tool("storescu") is None, reason="dcmtk is not installed"),
]
QUIET_S = 1.5
STALL_S = 4 * WAIT_SCALE  # the ACSE timeout of the test whose connections stall


@pytest.fixture
def intake() -> Intake:
    return Intake()


@pytest.fixture
def scp(tmp_path: Path, intake: Intake) -> Iterator[GatewaySCP]:
    with GatewaySCP(loopback_scp_config(tmp_path / "gateway", QUIET_S), intake) as server:
        yield server


def _pixels(path: Path) -> bytes:
    return pydicom.dcmread(path).PixelData


def test_echoscu_gets_an_answer(scp: GatewaySCP) -> None:
    host, port = scp.address
    tool = dcmtk_tool("echoscu")
    assert tool is not None
    command = [tool, "-aet", "STORESCU", "-aec", "RADSERVE", host, str(port)]
    run = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
    assert run.returncode == 0, run.stderr


@pytest.mark.slow
@pytest.mark.parametrize("syntax", ["explicit", "jpeg2000", "rle"])
def test_storescu_study_arrives_whole_and_completes_once(
    scp: GatewaySCP, intake: Intake, tmp_path: Path, syntax: str
) -> None:
    files = small_study(tmp_path / "sent", transfer_syntax=syntax, slices=range(10, 18))
    run = storescu(*scp.address, files, transfer_syntax=syntax)
    assert run.returncode == 0, run.stderr
    assert wait_until(lambda: intake.studies, timeout=15)
    [study] = intake.studies
    sent = {pydicom.dcmread(p, stop_before_pixels=True).SOPInstanceUID: p for p in files}
    received = {p.stem: p for p in study.instances}
    assert received.keys() == sent.keys() and study.new_instances == len(files)
    for uid, path in received.items():
        assert _pixels(path) == _pixels(sent[uid])
    meta = pydicom.dcmread(study.instances[0], stop_before_pixels=True).file_meta
    assert meta.TransferSyntaxUID == pydicom.dcmread(files[0]).file_meta.TransferSyntaxUID
    assert study.calling_ae_titles == ("STORESCU",)


@pytest.mark.slow
def test_a_study_split_over_two_associations_completes_once(intake: Intake, tmp_path: Path) -> None:
    # the second association must start within the quiet time of the first: scaled, as a
    # loaded runner may take longer than QUIET_S to start the second storescu
    quiet_s = QUIET_S * WAIT_SCALE
    config = loopback_scp_config(tmp_path / "gateway", quiet_s)
    files = small_study(tmp_path / "sent", slices=range(10, 20))
    with GatewaySCP(config, intake) as scp:
        assert storescu(*scp.address, files[:1]).returncode == 0  # released after 1 instance
        assert intake.studies == []
        assert storescu(*scp.address, files[1:]).returncode == 0
        assert wait_until(lambda: intake.studies, timeout=15)
        assert not wait_until(lambda: len(intake.studies) > 1, timeout=QUIET_S)  # no second
    [study] = intake.studies
    assert len(study.instances) == len(files) and study.generation == 1


@pytest.mark.slow
def test_a_study_re_sent_with_corrected_headers_is_read_from_the_corrected_copies(
    scp: GatewaySCP, intake: Intake, tmp_path: Path
) -> None:
    """The PACS re-sends a handed-over study's instances (same SOP Instance UIDs) with a
    corrected Patient Name: the gateway keeps both copies (the second named by its
    content) and hands the study over again, and ingest reads every slice from the copy
    received last. Until 2026-12-03 it read whichever copy sorted first by file name: a
    mix of old and corrected headers (here 2 of 4 slices kept the old name). The job reads
    the copies stored from the gateway's folder, which until session 35 were as new as
    their writing, in the order of their names: the job failed as naming two patients."""
    files = small_study(tmp_path / "sent", seed=1, slices=range(10, 22))
    corrected = relabel(files, tmp_path / "corrected", "Corrected^Name")
    assert storescu(*scp.address, files).returncode == 0
    assert wait_until(lambda: intake.studies, timeout=15)
    assert storescu(*scp.address, corrected).returncode == 0
    assert wait_until(lambda: len(intake.studies) == 2, timeout=15)
    rerun = intake.studies[1]
    assert rerun.generation == 2 and len(rerun.instances) == 2 * len(files)
    stored = store_study_files(tmp_path / "data", list(rerun.instances))
    for folder in (rerun.folder, stored.path):
        (header,) = discover_series(folder)
        assert header.number_of_instances == len(files)
        read = [pydicom.dcmread(f.path, stop_before_pixels=True) for f in header.files]
        assert {str(ds.PatientName) for ds in read} == {"Corrected^Name"}, folder


def test_unknown_calling_ae_is_rejected_at_association(
    scp: GatewaySCP, intake: Intake, tmp_path: Path
) -> None:
    files = small_study(tmp_path / "sent", slices=range(10, 11))
    run = storescu(*scp.address, files, calling="INTRUDER")
    assert run.returncode != 0
    assert "Calling AE Title Not Recognized" in run.stdout + run.stderr
    assert not any(scp.instances.incoming.iterdir())


def test_a_wrong_called_ae_title_is_rejected_and_logged(
    scp: GatewaySCP, caplog: pytest.LogCaptureFixture
) -> None:
    """dcmtk's echoscu calls ANY-SCP unless told ``-aec``: rejected (reason 7), and the
    log names both titles (before, pynetdicom refused it without a word in radserve's
    log, so the engineer had only the sender's side)."""
    host, port = scp.address
    tool = dcmtk_tool("echoscu")
    assert tool is not None
    with caplog.at_level(logging.WARNING, logger="radserve.gateway.scp"):
        run = subprocess.run(
            [tool, "-aet", "STORESCU", host, str(port)],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    assert run.returncode != 0
    assert "Called AE Title Not Recognized" in run.stdout + run.stderr
    lines = [r.getMessage() for r in caplog.records if "rejected" in r.getMessage()]
    assert lines == [
        "association from AE 'STORESCU' at 127.0.0.1 rejected: it called AE 'ANY-SCP', "
        "this SCP is 'RADSERVE' (gateway.ae_title)"
    ]


def test_known_ae_from_another_host_is_rejected(tmp_path: Path, intake: Intake) -> None:
    config = ScpConfig(
        data_dir=tmp_path / "gw", port=0, allowed_peers=(Peer("STORESCU", "127.0.0.2"),)
    )
    with GatewaySCP(config, intake) as server:
        ae = AE("STORESCU")
        ae.add_requested_context(Verification)
        assoc = ae.associate(*server.address, ae_title="RADSERVE")
        assert assoc.is_rejected
        assert assoc.acceptor.primitive.reason_str == "Calling AE title not recognised"


def _pynetdicom_store(address: tuple[str, int], datasets: list[Path], sop_class) -> list[int]:
    ae = AE("PYNETDICOM")
    ae.add_requested_context(sop_class, ["1.2.840.10008.1.2.1"])
    assoc = ae.associate(*address, ae_title="RADSERVE")
    if not assoc.is_established:
        return []
    try:
        return [int(assoc.send_c_store(str(path)).Status) for path in datasets]
    finally:
        assoc.release()


def _sr_file(tmp_path: Path, study_uid: str) -> Path:
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.uid import generate_uid

    ds = Dataset()
    ds.SOPClassUID, ds.SOPInstanceUID = ComprehensiveSRStorage, generate_uid()
    ds.StudyInstanceUID, ds.SeriesInstanceUID, ds.Modality = study_uid, generate_uid(), "SR"
    ds.file_meta = FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = "1.2.840.10008.1.2.1"
    path = tmp_path / "sr.dcm"
    ds.save_as(path, enforce_file_format=True)
    return path


def test_non_image_objects_are_quarantined_not_handed_over(
    scp: GatewaySCP, intake: Intake, tmp_path: Path
) -> None:
    path = _sr_file(tmp_path, "1.2.3.4.5")
    assert _pynetdicom_store(scp.address, [path], ComprehensiveSRStorage) == [Status.SUCCESS]
    assert (scp.instances.quarantine / "1.2.3.4.5").is_dir()
    assert scp.tracker.pending() == []  # nothing waits to be handed to intake


def test_refuse_policy_rejects_the_presentation_context(tmp_path: Path, intake: Intake) -> None:
    config = ScpConfig(data_dir=tmp_path / "gw", port=0, unwanted=UnwantedPolicy.REFUSE)
    with GatewaySCP(config, intake) as server:
        ae = AE("PYNETDICOM")
        ae.add_requested_context(ComprehensiveSRStorage)
        ae.add_requested_context(CTImageStorage)
        assoc = ae.associate(*server.address, ae_title="RADSERVE")
        try:
            accepted = {str(cx.abstract_syntax) for cx in assoc.accepted_contexts}
        finally:
            assoc.release()
    assert accepted == {CTImageStorage}


def test_disk_below_reserve_answers_out_of_resources(tmp_path: Path, intake: Intake) -> None:
    # receivers=1: the reserve is lowered below in this process's store; receiving
    # processes (gateway.receivers > 1) would keep their own copy of it
    config = ScpConfig(data_dir=tmp_path / "gw", port=0, min_free_bytes=1 << 62, receivers=1)
    files = small_study(tmp_path / "sent", slices=range(10, 12))
    with GatewaySCP(config, intake) as server:
        statuses = _pynetdicom_store(server.address, files, CTImageStorage)
        assert statuses == [Status.OUT_OF_RESOURCES] * 2
        assert not any(server.instances.incoming.iterdir())
        server.instances.min_free_bytes = 0  # space freed: the sender's retry succeeds
        assert _pynetdicom_store(server.address, files, CTImageStorage) == [0, 0]


def _error_comment(storescu_debug: str) -> str:
    """The Error Comment (0000,0902) storescu -d printed for the store response."""
    found = re.search(r"\(0000,0902\) LO \[(.*)\]", storescu_debug)
    assert found is not None, storescu_debug[-2000:]
    return found.group(1)


@pytest.mark.filterwarnings("ignore:.*VR UI:UserWarning")  # the invalid UID, on purpose
def test_a_refused_instance_answers_radserve_s_code_and_reason(
    tmp_path: Path, intake: Intake
) -> None:
    """storescu reads radserve's error code and reason in a failure's Error Comment,
    ``<code>: <reason>`` in LO's 64 characters, the code and words a failed STOW-RS item
    carries; the rule's words, never the offending value."""
    files = small_study(tmp_path / "sent", slices=range(10, 11))
    ds = pydicom.dcmread(files[0])
    bad = "1.2.826.0.abc.1"
    ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = bad
    ds.save_as(files[0], enforce_file_format=True)
    reason = uid_problem(bad, "SOP Instance UID")
    assert reason is not None
    with GatewaySCP(loopback_scp_config(tmp_path / "gw", QUIET_S), intake) as server:
        run = storescu(*server.address, files, extra=["-d"])
    assert run.returncode != 0 and "0xc000" in run.stdout + run.stderr
    comment = _error_comment(run.stdout + run.stderr)
    assert comment == f"instance_invalid: {reason}"[:64] and "abc" not in comment
    # disk below the reserve: 0xA700, out_of_resources and the reason
    config = loopback_scp_config(tmp_path / "full", QUIET_S, min_free_bytes=1 << 62, receivers=1)
    good = small_study(tmp_path / "good", slices=range(10, 11))
    with GatewaySCP(config, intake) as server:
        run = storescu(*server.address, good, extra=["-d"])
    assert "0xa700" in run.stdout + run.stderr
    assert _error_comment(run.stdout + run.stderr).startswith("out_of_resources: ")


@pytest.mark.slow
def test_concurrent_associations_and_duplicates(
    scp: GatewaySCP, intake: Intake, tmp_path: Path
) -> None:
    studies = [small_study(tmp_path / f"s{k}", seed=k, slices=range(10, 14)) for k in (1, 2, 3)]
    results: dict[int, list[int]] = {}

    def send(k: int) -> None:
        results[k] = _pynetdicom_store(scp.address, studies[k % 3], CTImageStorage)

    threads = [threading.Thread(target=send, args=(k,)) for k in range(4)]  # study 1 twice
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert all(statuses == [0] * 4 for statuses in results.values()) and len(results) == 4
    assert wait_until(lambda: len(intake.studies) == 3, timeout=15)
    assert sorted(len(s.instances) for s in intake.studies) == [4, 4, 4]
    assert sorted(s.new_instances for s in intake.studies) == [4, 4, 4]


@pytest.mark.slow
def test_twenty_senders_at_once_past_the_limit_are_told_to_come_back_and_none_is_mixed(
    intake: Intake, tmp_path: Path
) -> None:
    """20 storescu at once from the allowed peer's address while its 8 connections are
    taken: each is answered A-ASSOCIATE-RJ rejected-transient, local limit exceeded,
    which a PACS retries (until 2026-12-03 the connection was closed unanswered and
    storescu said "Peer aborted Association (or never connected)"); sent again, retried
    while refused, every study completes once with exactly its own instances.

    A stalled connection keeps its slot until the ACSE timeout from its accept (pynetdicom's
    ARTIM timer), even once closed: here that timeout is STALL_S (scaled for loaded
    runners), not the default 30 s, which the wait for the slots to come back spent
    (30 of this test's 37 s)."""
    studies = [small_study(tmp_path / f"s{k}", seed=k, slices=range(10, 13)) for k in range(20)]
    config = loopback_scp_config(tmp_path / "gateway", QUIET_S, acse_timeout_s=STALL_S)
    with GatewaySCP(config, intake) as scp, ExitStack() as stack:
        for _ in range(8):  # the address's slots, held by connections stalled in a PDU
            sock = stack.enter_context(socket.create_connection(scp.address))
            sock.sendall(bytes.fromhex("0100000001000002"))
        assert wait_until(lambda: scp.admission.open_connections() == {"127.0.0.1": 8}, 10)
        refused = _store_at_once(scp, studies)
        assert len(refused) == 20
        for run in refused.values():
            assert "Rejected Transient" in run.stderr, run.stderr
            assert "Local Limit Exceeded" in run.stderr, run.stderr
        stack.close()  # the stalled connections go
        assert wait_until(lambda: not scp.admission.open_connections(), timeout=10)
        pending = studies
        for _ in range(10):  # as a PACS does: retry what was refused for a transient reason
            refused = _store_at_once(scp, pending)
            assert all("Rejected Transient" in run.stderr for run in refused.values()), refused
            pending = [pending[k] for k in sorted(refused)]
            if not pending:
                break
        assert not pending
        assert wait_until(lambda: len(intake.studies) == 20, timeout=30)
    sent = {}
    for files in studies:
        headers = [pydicom.dcmread(p, stop_before_pixels=True) for p in files]
        sent[headers[0].StudyInstanceUID] = {h.SOPInstanceUID for h in headers}
    received = {s.study_instance_uid: {p.stem for p in s.instances} for s in intake.studies}
    assert received == sent


def _store_at_once(
    scp: GatewaySCP, studies: list[list[Path]]
) -> dict[int, subprocess.CompletedProcess[str]]:
    """Each study by its own storescu, all started at once; the failed runs by index."""
    runs: dict[int, subprocess.CompletedProcess[str]] = {}

    def send(k: int) -> None:
        runs[k] = storescu(*scp.address, studies[k])

    threads = [threading.Thread(target=send, args=(k,)) for k in range(len(studies))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert len(runs) == len(studies)
    return {k: run for k, run in runs.items() if run.returncode != 0}


def test_htj2k_is_accepted_and_stored_as_received(
    scp: GatewaySCP, intake: Intake, tmp_path: Path
) -> None:
    """A JPEG 2000 codestream labelled HTJ2K Lossless (HTJ2K is a superset, so it decodes):
    negotiation and byte-exact pass-through without an HTJ2K encoder. Real HTJ2K
    (OpenJPH-encoded) is tested in test_htj2k.py when ojph_compress is installed."""
    [source] = small_study(tmp_path / "j2k", transfer_syntax="jpeg2000", slices=range(10, 11))
    ds = pydicom.dcmread(source)
    ds.file_meta.TransferSyntaxUID = HTJ2KLossless
    relabelled = tmp_path / "htj2k.dcm"
    ds.save_as(relabelled)
    ae = AE("PYNETDICOM")
    ae.add_requested_context(CTImageStorage, [HTJ2KLossless])
    assoc = ae.associate(*scp.address, ae_title="RADSERVE")
    try:
        assert int(assoc.send_c_store(str(relabelled)).Status) == Status.SUCCESS
    finally:
        assoc.release()
    stored = scp.instances.study_dir(ds.StudyInstanceUID) / f"{ds.SOPInstanceUID}.dcm"
    back = pydicom.dcmread(stored)
    assert back.file_meta.TransferSyntaxUID == HTJ2KLossless
    assert back.PixelData == ds.PixelData
    assert (back.pixel_array == pydicom.dcmread(source).pixel_array).all()


@pytest.mark.parametrize("syntax", [ImplicitVRLittleEndian, DeflatedExplicitVRLittleEndian])
def test_implicit_and_deflated_arrive_in_that_syntax(
    scp: GatewaySCP, tmp_path: Path, syntax: str
) -> None:
    [source] = small_study(tmp_path / "sent", slices=range(10, 11))
    ae = AE("PYNETDICOM")
    ae.add_requested_context(CTImageStorage, [syntax])
    assoc = ae.associate(*scp.address, ae_title="RADSERVE")
    try:
        assert int(assoc.send_c_store(str(source)).Status) == Status.SUCCESS
    finally:
        assoc.release()
    sent = pydicom.dcmread(source)
    back = pydicom.dcmread(
        scp.instances.study_dir(sent.StudyInstanceUID) / f"{sent.SOPInstanceUID}.dcm"
    )
    assert back.file_meta.TransferSyntaxUID == syntax
    assert back.PixelData == sent.PixelData and back.PatientName == sent.PatientName


DCMTK_SYNTAXES = {  # dcmtk_compress name -> (storescu proposal flag, transfer syntax UID)
    "jpeg-lossless-sv1": ("-xs", "1.2.840.10008.1.2.4.70"),
    "jpeg-ls": ("-xt", "1.2.840.10008.1.2.4.80"),
    "jpeg-ls-near": ("-xu", "1.2.840.10008.1.2.4.81"),
}


@pytest.mark.parametrize("name", sorted(DCMTK_SYNTAXES))
def test_jpeg_family_is_stored_as_sent(scp: GatewaySCP, tmp_path: Path, name: str) -> None:
    flag, uid = DCMTK_SYNTAXES[name]
    [plain] = small_study(tmp_path / "plain", slices=range(10, 11))
    compressed = dcmtk_compress(plain, tmp_path / f"{name}.dcm", name)
    tool = dcmtk_tool("storescu")
    assert tool is not None
    command = [tool, "-R", flag, "-aet", "STORESCU", "-aec", "RADSERVE", *map(str, scp.address)]
    run = subprocess.run([*command, str(compressed)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    sent = pydicom.dcmread(compressed)
    back = pydicom.dcmread(
        scp.instances.study_dir(sent.StudyInstanceUID) / f"{sent.SOPInstanceUID}.dcm"
    )
    assert sent.file_meta.TransferSyntaxUID == back.file_meta.TransferSyntaxUID == uid
    assert back.PixelData == sent.PixelData


def test_12_bit_jpeg_extended_is_refused_in_negotiation(
    scp: GatewaySCP, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 11, item 4: radserve cannot decode 12-bit JPEG Extended with a decoder it
    may ship, so it does not accept the syntax (it once answered success and failed the
    job later). A sender offering only that syntax gets no presentation context, and the
    server's log says why (it said nothing: the modality's "no presentation context" was
    the only trace)."""
    caplog.set_level(logging.WARNING, logger="radserve.gateway.scp")
    [plain] = small_study(tmp_path / "plain", slices=range(10, 11))
    compressed = dcmtk_compress(plain, tmp_path / "jpeg12.dcm", "jpeg-extended")
    sent = pydicom.dcmread(compressed)
    assert sent.file_meta.TransferSyntaxUID == JPEGExtended12Bit and sent.BitsStored == 12
    for plugin in ("gdcm", "pillow"):  # the premise: no licence-fit decoder reads it
        with pytest.raises(RuntimeError, match="12-bit"):
            pixel_array(sent, decoding_plugin=plugin)
    assert JPEGExtended12Bit not in SCP_TRANSFER_SYNTAXES
    assert "GPLv3" in REFUSED_TRANSFER_SYNTAXES[JPEGExtended12Bit]
    tool = dcmtk_tool("storescu")
    assert tool is not None
    command = [tool, "-R", "-xx", "-aet", "STORESCU", "-aec", "RADSERVE", *map(str, scp.address)]
    run = subprocess.run([*command, str(compressed)], capture_output=True, text=True, timeout=60)
    assert run.returncode != 0 or "no presentation context" in (run.stdout + run.stderr).lower()
    assert not (
        scp.instances.study_dir(sent.StudyInstanceUID) / f"{sent.SOPInstanceUID}.dcm"
    ).exists()
    [line] = [r.getMessage() for r in caplog.records if "presentation context" in r.getMessage()]
    assert "'STORESCU'" in line
    assert "CT Image Storage in JPEG Extended" in line and "transfer syntaxes not supported" in line
    assert REFUSED_TRANSFER_SYNTAXES[JPEGExtended12Bit] in line


def test_a_restart_before_the_quiet_period_loses_no_study(tmp_path: Path) -> None:
    files = small_study(tmp_path / "sent", slices=range(10, 12))
    config = ScpConfig(data_dir=tmp_path / "gw", port=0, quiet_s=60.0)
    first = Intake()
    with GatewaySCP(config, first) as server:
        assert _pynetdicom_store(server.address, files, CTImageStorage) == [0, 0]
    assert first.studies == []  # stopped (crashed) long before the study was quiet
    second = Intake()
    with GatewaySCP(config.model_copy(update={"quiet_s": 0.5}), second):
        assert wait_until(lambda: second.studies, timeout=10)
    [study] = second.studies
    assert len(study.instances) == 2 and study.generation == 1


@pytest.mark.parametrize("durability", ["group", "per_instance"])
def test_success_is_sent_only_for_durable_instances(
    tmp_path: Path, intake: Intake, durability: str
) -> None:
    """Four concurrent associations; every success a sender receives is for an instance
    the store had already reported durable (the hook runs before the handler answers),
    and the file under its final name is the instance sent, whole."""
    durable: set[Path] = set()
    lock = threading.Lock()

    def on_durable(paths: list[Path]) -> None:
        with lock:
            durable.update(paths)

    config = ScpConfig(
        data_dir=tmp_path / "gateway",
        port=0,
        quiet_s=60,
        durability=durability,
        allowed_peers=(Peer("PYNETDICOM"),),
        # receivers=1: this process's committer is read below, and on_durable runs before
        # the answer only where the instance is received; with receiving processes it is
        # relayed to this process and may run after the sender has its success
        receivers=1,
    )
    studies = [small_study(tmp_path / f"s{k}", seed=k, slices=range(10, 16)) for k in range(4)]
    unseen: list[Path] = []
    with GatewaySCP(config, intake, on_durable=on_durable) as server:

        def send(files: list[Path]) -> None:
            ae = AE("PYNETDICOM")
            ae.add_requested_context(CTImageStorage, ["1.2.840.10008.1.2.1"])
            assoc = ae.associate(*server.address, ae_title="RADSERVE")
            assert assoc.is_established
            try:
                for path in files:
                    ds = pydicom.dcmread(path)
                    assert int(assoc.send_c_store(ds).Status) == 0
                    target = (
                        server.instances.incoming / ds.StudyInstanceUID / f"{ds.SOPInstanceUID}.dcm"
                    )
                    with lock:
                        if target not in durable:
                            unseen.append(target)
            finally:
                assoc.release()

        threads = [threading.Thread(target=send, args=(files,)) for files in studies]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        committer = server.instances.committer
        if durability == "group":
            assert committer is not None and committer.committed == 24
    assert unseen == []
    assert len(durable) == 24
    for files in studies:
        for path in files:
            sent = pydicom.dcmread(path)
            kept = server.instances.incoming / sent.StudyInstanceUID / f"{sent.SOPInstanceUID}.dcm"
            assert _pixels(kept) == sent.PixelData


def test_a_data_set_that_contradicts_the_requests_sop_class_is_refused(
    scp: GatewaySCP, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Session 20: a CT slice sent as Comprehensive SR (the request's Affected SOP Class,
    from a File Meta that says so) was quarantined as a non-image and never run (its
    study one slice short), with success; PS3.4's answer is 0xA900, data set does not
    match the SOP Class."""
    from pynetdicom import _config

    # the file sent as it is, its request built from the File Meta (as storescu does)
    monkeypatch.setattr(_config, "STORE_SEND_CHUNKED_DATASET", True)
    (ct,) = small_study(tmp_path / "sent", slices=range(3, 4))
    from pydicom.filebase import DicomBytesIO
    from pydicom.filewriter import write_dataset, write_file_meta_info

    ds = pydicom.dcmread(ct)
    body = DicomBytesIO()
    body.is_little_endian, body.is_implicit_VR = True, False
    write_dataset(body, ds)
    ds.file_meta.MediaStorageSOPClassUID = ComprehensiveSRStorage  # save_as would reset it
    head = DicomBytesIO()
    head.write(b"\0" * 128 + b"DICM")
    write_file_meta_info(head, ds.file_meta, enforce_standard=True)
    sent = tmp_path / "as_sr.dcm"
    sent.write_bytes(head.getvalue() + body.getvalue())
    assert _pynetdicom_store(scp.address, [sent], ComprehensiveSRStorage) == [0xA900]
    assert not any(p.is_file() for p in scp.instances.quarantine.rglob("*"))
    # the same instance under its own class is stored
    assert _pynetdicom_store(scp.address, [ct], CTImageStorage) == [Status.SUCCESS]

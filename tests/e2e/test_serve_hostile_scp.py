"""The hostile-input suite over DICOM, against a real ``radserve serve`` (issue 12, "Kept
fixed"): the seeded mutants and the bombs of ``tests/factories/hostile.py`` (frame
counts, a Deflated file inflating past 256 MB, a plain file with a 256 MB private OB
element, an element claiming 2 GB; not the zip, which is no C-STORE payload) are sent
as stored, byte for byte (pynetdicom's chunked sending: truncated files too), over C-STORE
to the server's gateway, one association per case.

Per case: every C-STORE sent is answered (success or a failure status; pynetdicom's
DIMSE timeout is the hang detector, not a performance bound), the server then settles
(every study it received is handed over and every job is final, within a bounded
wait), stays alive and answers ``/healthz``, writes no traceback and only JSON lines to
its log, and its peak RSS (``VmHWM`` of the server and of each child process, reset
before each case through ``/proc/PID/clear_refs``, so a short spike is not missed) stays
within ``BOUND_MB`` of the peak a legitimate study reached on the warmed-up server.
After all cases, a legitimate study still becomes a succeeded job.

``RADSERVE_TEST_FUZZ_CASES`` sets the number of cases, as for the ingest suite (default
40 here: every bomb and 31 mutants, a couple of minutes on two cores);
``RADSERVE_TEST_FUZZ_SEED`` the seed.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydicom.errors import InvalidDicomError
from pydicom.uid import (
    DeflatedExplicitVRLittleEndian,
    ExplicitVRLittleEndian,
    ImplicitVRLittleEndian,
)
from pynetdicom import AE, _config
from pynetdicom.sop_class import CTImageStorage, EnhancedCTImageStorage
from tests.factories.dicom_net import free_port
from tests.factories.hostile import cases
from tests.factories.server_process import (
    gateway_pending,
    peak_rss_mb,
    reset_peak_rss,
    start_server,
)
from tests.factories.service import config_file, make_study
from tests.factories.waits import wait_until

from radserve.store import init_store

pytestmark = [pytest.mark.slow]

CASES = int(os.environ.get("RADSERVE_TEST_FUZZ_CASES", "40"))
SEED = int(os.environ.get("RADSERVE_TEST_FUZZ_SEED", "12"))
BOUND_MB = 96  # peak RSS over a legitimate study's peak on the warmed-up server
DIMSE_TIMEOUT_S = 120  # no answer within this: a hang (not a performance bound)
SETTLE_S = 180  # hand-over and jobs of one case; past it: a hang
CALLING = "HOSTILE"
FINAL = {"succeeded", "failed", "cancelled"}


class Server:
    """The running server's state as seen from outside: its jobs, the gateway's folders."""

    def __init__(self, data: Path, url: str, log: Path) -> None:
        self.data, self.url, self.log = data, url, log
        self.store = init_store(f"sqlite:///{data / 'radserve.db'}")

    def jobs(self) -> list[Any]:
        return _all_jobs(self.store)

    def pending_studies(self) -> list[Path]:
        """Study folders received but not yet turned into a job (no job marker)."""
        return gateway_pending(self.data)

    def settled(self) -> bool:
        return not self.pending_studies() and all(j.state.value in FINAL for j in self.jobs())

    def healthy(self) -> bool:
        try:
            return httpx.get(f"{self.url}/healthz", timeout=10).status_code == 200
        except httpx.TransportError:
            return False


def _ae() -> AE:
    ae = AE(CALLING)
    ae.acse_timeout = ae.network_timeout = 60
    ae.dimse_timeout = DIMSE_TIMEOUT_S
    for sop_class in (CTImageStorage, EnhancedCTImageStorage):
        for syntax in (ExplicitVRLittleEndian, ImplicitVRLittleEndian):
            ae.add_requested_context(sop_class, syntax)
        ae.add_requested_context(sop_class, DeflatedExplicitVRLittleEndian)
    return ae


def _send(ae: AE, port: int, folder: Path) -> dict[str, Any]:
    """Send every file of ``folder`` as stored; what the server answered."""
    outcome: dict[str, Any] = {"statuses": [], "unsendable": 0, "unanswered": 0}
    assoc = ae.associate("127.0.0.1", port, ae_title="RADSERVE")
    assert assoc.is_established, f"association refused: {folder.name}"
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        if not assoc.is_established:
            break
        try:
            status = assoc.send_c_store(path)
        except (AttributeError, ValueError, OSError, EOFError, InvalidDicomError) as exc:
            # the sender cannot read the file's meta (a file cut inside it): not sent
            outcome["unsendable"] += 1
            outcome.setdefault("why", []).append(type(exc).__name__)
            continue
        if status and "Status" in status:
            outcome["statuses"].append(int(status.Status))
        else:
            outcome["unanswered"] += 1
    outcome["aborted"] = assoc.is_aborted
    if assoc.is_established:
        assoc.release()
    return outcome


def _warm_study(ae: AE, port: int, server: Server, folder: Path) -> None:
    before = len(server.jobs())
    outcome = _send(ae, port, Path(folder))
    assert outcome["statuses"] and set(outcome["statuses"]) == {0}, outcome
    assert wait_until(lambda: len(server.jobs()) > before and server.settled(), SETTLE_S)
    newest = max(server.jobs(), key=lambda j: j.arrival)
    assert newest.state.value == "succeeded", (newest.error_code, newest.error_message)


def _log_lines(log: Path, start: int) -> list[str]:
    with open(log, "rb") as fh:
        fh.seek(start)
        return fh.read().decode("utf-8", "replace").splitlines()


def test_hostile_instances_over_c_store_to_a_running_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # send each file's bytes as stored: no decoding (and re-encoding) by the sender
    monkeypatch.setattr(_config, "STORE_SEND_CHUNKED_DATASET", True)
    gateway_port = free_port()
    gateway = {
        "enabled": True,
        "port": gateway_port,
        # each case is one association, and a study is not quiet while its association
        # is open: 0.2 s after the release hands it over (0.5 s cost 12 s over 40 cases)
        "quiet_s": 0.2,
        "interrupted_quiet_s": 1.0,
        "allowed_peers": [{"ae_title": CALLING, "host": "127.0.0.1"}],
    }
    config, data, log = config_file(tmp_path, gateway=gateway), tmp_path / "data", tmp_path / "log"
    port = free_port()
    process = start_server(config, data, port, log)
    server = Server(data, f"http://127.0.0.1:{port}", log)
    ae = _ae()
    try:
        assert wait_until(lambda: "listening on" in log.read_text(), 30)
        for k in range(2):  # warm up: models loaded, caches and allocator settled
            _warm_study(ae, gateway_port, server, make_study_folder(tmp_path / f"warm{k}"))
        reset_peak_rss(process.pid)
        _warm_study(ae, gateway_port, server, make_study_folder(tmp_path / "baseline"))
        baseline = peak_rss_mb(process.pid)

        results = []
        for case in cases(CASES, SEED):
            if case.name.startswith("zip"):
                continue  # an archive is no C-STORE payload
            name = f"#{case.number} {case.kind}: {case.name}"
            folder = tmp_path / f"case{case.number:05d}"
            folder.mkdir()
            case.write(folder)
            mark = log.stat().st_size
            reset_peak_rss(process.pid)
            outcome = _send(ae, gateway_port, folder)
            assert not outcome["unanswered"], (name, outcome)
            assert wait_until(server.settled, SETTLE_S), (name, server.pending_studies())
            assert process.poll() is None, (name, log.read_text()[-3000:])
            assert server.healthy(), name
            grown = peak_rss_mb(process.pid) - baseline
            lines = _log_lines(log, mark)
            assert not [x for x in lines if "Traceback" in x], (name, lines[-20:])
            for line in lines:
                json.loads(line)  # every log line is one JSON record
            assert grown <= BOUND_MB, f"{name}: peak RSS +{grown:.0f} MB, bound {BOUND_MB} MB"
            results.append((name, case.kind, outcome, grown))
            for path in folder.rglob("*"):  # the bombs' files are large: free the disk
                if path.is_file():
                    path.unlink()

        # a legitimate study after all of them still becomes a (succeeded) job
        _warm_study(ae, gateway_port, server, make_study_folder(tmp_path / "after"))
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        finally:
            if process.poll() is None:
                process.kill()
            server.store.close()

    for name, _, outcome, grown in results:
        print(f"{name}: statuses {sorted(set(outcome['statuses']))}, +{grown:.0f} MB")
    refused = sum(any(s != 0 for s in o["statuses"]) for _, _, o, _ in results)
    jobs = server_jobs_summary(data)
    worst = max(results, key=lambda r: r[3])
    print(
        f"{len(results)} cases over C-STORE ({sum(k == 'bomb' for _, k, _, _ in results)} bombs), "
        f"{refused} with a refused instance; jobs {jobs}; peak RSS at most +{worst[3]:.0f} MB "
        f"over {baseline:.0f} MB ({worst[0]})"
    )
    assert refused  # the server did refuse some of what it was sent


def make_study_folder(folder: Path) -> Path:
    make_study(folder)
    return folder


def _all_jobs(store: Any) -> list[Any]:
    jobs, cursor = [], None
    while True:
        page = store.list_jobs(limit=1000, cursor=cursor)
        jobs += page.items
        if page.next_cursor is None:
            return jobs
        cursor = page.next_cursor


def server_jobs_summary(data: Path) -> dict[str, int]:
    store = init_store(f"sqlite:///{data / 'radserve.db'}")
    try:
        counts: dict[str, int] = {}
        for job in _all_jobs(store):
            counts[job.state.value] = counts.get(job.state.value, 0) + 1
        return counts
    finally:
        store.close()

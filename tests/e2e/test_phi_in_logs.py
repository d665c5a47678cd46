"""A patient name planted in every text element of a header (PN, LO, SH, UI, DA, CS, ...,
file meta and sequences included) never reaches stdout, stderr or a log line: through
``radserve run`` (a study that runs, and one refused for its header), and through a real
``radserve serve`` receiving the study over C-STORE and answering reads of its results.
Library warnings arrive as JSON lines of the server's logger, redacted."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import httpx
import pydicom
import pytest
from pynetdicom import AE
from pynetdicom.sop_class import CTImageStorage
from tests.factories.bundles import write_test_bundles, write_test_pipeline
from tests.factories.dicom_net import free_port
from tests.factories.phi import MARKER, PROCESSABLE, UIDS, VALUE, leaks, plant
from tests.factories.server_process import wait_healthy
from tests.factories.service import auth, config_file, make_study, wait_job
from tests.factories.waits import until

from radserve.security.logs import (
    JsonFormatter,
    RedactingFilter,
    capture_warnings,
    redact,
    redact_names,
)

EXTRA = {"InstitutionName": "x", "StudyDescription": "x", "OperatorsName": "x^y"}


def _radserve(*args: str) -> list[str]:
    return [sys.executable, "-c", "from radserve.cli import main; main()", *args]


# --- the redaction itself ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "text",
    [
        "Invalid value for VR UI: 'Smith^Jane'.",
        'Invalid value for VR LO: "Jane Smith"',
        "Unknown encoding 'Jane' - using default",
        "patient Smith^Jane^^Dr seen",
        "born 19390412 and 1939-04-12",
        "id MRN-0048213 and 1.2.826.0.1.3680043.8.498.1",
    ],
)
def test_library_messages_lose_every_value(text: str) -> None:
    out = redact(text)
    for secret in ("Smith", "Jane", "1939", "0048213", "3680043"):
        assert secret not in out
    assert "<redacted>" in out


def test_job_ids_survive_and_radserve_messages_lose_only_names() -> None:
    job = "0f6b2c1e-8f0a-4a4b-9c1d-2e3f4a5b6c7d"
    assert redact(f"job {job}: '{VALUE}'") == f"job {job}: '<redacted>'"
    assert redact_names(f"job {job} failed on series 2 of Doe^Jane") == (
        f"job {job} failed on series 2 of <redacted>"
    )


def test_warnings_and_library_records_become_redacted_json_once() -> None:
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(self.format(record))

    handler = Collect()
    handler.setFormatter(JsonFormatter())
    handler.addFilter(RedactingFilter())
    root = logging.getLogger()
    saved_show = warnings.showwarning
    root.addHandler(handler)
    try:
        capture_warnings()
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            for _ in range(3):
                warnings.warn(f"Invalid value for VR UI: '{VALUE}'", UserWarning, stacklevel=1)
        logging.getLogger("pydicom").warning("Invalid value for VR UI: '%s'", VALUE)
        try:
            float(VALUE)
        except ValueError:
            logging.getLogger("radserve.test").exception("decoding failed")
    finally:
        root.removeHandler(handler)
        warnings.showwarning = saved_show
    records = [json.loads(line) for line in lines]
    assert not leaks("\n".join(lines))
    warned = [r for r in records if r["logger"] == "py.warnings"]
    assert len(warned) == 1 and warned[0]["msg"].startswith("UserWarning: Invalid value")
    assert not [r for r in records if r["logger"] == "pydicom"]  # same message as the warning
    failed = next(r for r in records if r["logger"] == "radserve.test")
    assert "<redacted>" in failed["exc"] and "ValueError" in failed["exc"]


def test_each_handler_gets_a_library_message_once_when_another_handler_redacted_it_first() -> None:
    """Two handlers with their own filters (a log file and the console, or a handler an
    embedding application added): the first redacts the record, and the second still drops
    the repeats instead of passing every copy through."""
    seen: dict[str, list[str]] = {"first": [], "second": []}

    class Collect(logging.Handler):
        def __init__(self, name: str) -> None:
            super().__init__()
            self.key = name
            self.addFilter(RedactingFilter())

        def emit(self, record: logging.LogRecord) -> None:
            seen[self.key].append(record.getMessage())

    library = logging.getLogger("pydicom.test_two_handlers")
    handlers = [Collect("first"), Collect("second")]
    for handler in handlers:
        library.addHandler(handler)
    try:
        for _ in range(3):
            library.warning("Invalid value for VR PN: '%s'", VALUE)
    finally:
        for handler in handlers:
            library.removeHandler(handler)
    assert seen["first"] == seen["second"] == ["Invalid value for VR PN: '<redacted>'"]


# --- radserve run -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("phi-assets")
    return write_test_bundles(root / "models"), write_test_pipeline(root)


# the study's own UIDs stay valid in the study that runs: every door refuses an invalid
# one (radserve.ingest.rules), as the C-STORE test below shows
@pytest.mark.parametrize(
    ("keep", "returncode"), [((*PROCESSABLE, *UIDS), 0), ((), 2)], ids=["runs", "refused"]
)
def test_radserve_run_prints_no_planted_value(
    assets: tuple[Path, Path], tmp_path: Path, keep: tuple[str, ...], returncode: int
) -> None:
    models, pipeline = assets
    files = make_study(tmp_path / "study", extra=EXTRA)
    assert plant(files, keep) > 15 * len(files)  # every text element but those kept
    out = tmp_path / "out"
    done = subprocess.run(
        _radserve(
            "-vv", "run", str(tmp_path / "study"), "--pipeline", str(pipeline),
            "--out", str(out), "--models-dir", str(models),
        ),
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == returncode, done.stderr[-3000:]
    assert not leaks(done.stdout + done.stderr)
    if returncode:  # its UIDs hold the name too: pydicom did warn, redacted
        assert "<redacted>" in done.stderr
    assert "UserWarning" not in done.stderr.replace("py.warnings: UserWarning", "")


# --- radserve serve, C-STORE in, results read back ---------------------------------------------
def _c_store(files: list[Path], port: int) -> list[int]:
    """Send ``files`` on one association; the C-STORE statuses."""
    ae = AE(ae_title="PACS")
    ae.add_requested_context(CTImageStorage)
    assoc = ae.associate("127.0.0.1", port, ae_title="RADSERVE")
    assert assoc.is_established
    statuses = []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for path in files:
                statuses.append(int(assoc.send_c_store(pydicom.dcmread(path)).Status))
    finally:
        assoc.release()
    return statuses


def test_server_logs_no_planted_value_over_c_store_and_reads(tmp_path: Path) -> None:
    gateway_port, port = free_port(), free_port()
    config = config_file(
        tmp_path,
        gateway={
            "enabled": True,
            "port": gateway_port,
            "allowed_peers": [{"ae_title": "PACS", "host": "127.0.0.1"}],
        },
        server={"read_processes": 2},  # the default on 2 cores: the readers log the reads
    )
    data, log = tmp_path / "data", tmp_path / "server.log"
    created = subprocess.run(
        _radserve("keys", "create", "--role", "admin", "--config", str(config),
                  "--data-dir", str(data)),
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    key = created.stdout.strip().splitlines()[-1]
    # every text element but the SOP class (it picks the presentation context); all but
    # what a pipeline needs; all but that and the UIDs
    studies = []
    variants = {
        "all": ("SOPClassUID", "MediaStorageSOPClassUID"),
        "run": PROCESSABLE,
        "uids": (*PROCESSABLE, *UIDS),
    }
    for name, keep in variants.items():
        studies.append(make_study(tmp_path / name, extra=EXTRA))
        plant(studies[-1], keep)
    with open(log, "wb") as out:
        server = subprocess.Popen(
            _radserve("serve", "--port", str(port), "--config", str(config), "--data-dir",
                      str(data), "--log-level", "debug", "--access-log", "--cpu-workers", "1"),
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(server, url, log)
        refused = _c_store(studies[0], gateway_port) + _c_store(studies[1], gateway_port)
        assert all(status != 0 for status in refused)  # not UIDs: refused, one by one
        assert set(_c_store(studies[2], gateway_port)) == {0}
        with httpx.Client(base_url=url, timeout=60) as c:
            items = until(
                lambda: c.get("/v1/jobs", headers=auth(key)).json()["items"],
                "the stored study's job",
                60,
                state=lambda: log.read_text()[-3000:],
            )
            job = wait_job(c, str(items[0]["id"]), key)
            assert job["state"] == "succeeded", job
            for path in ("report", "fhir", "labels"):
                assert c.get(f"/v1/jobs/{job['id']}/{path}", headers=auth(key)).status_code == 200
            # a QIDO-RS search names the patient in its query, which the access log
            # wrote in clear (a name without '^', an ID, a birth date: session 35)
            for query in (
                {"PatientName": f"{MARKER}*", "PatientBirthDate": "19560920"},
                {"PatientID": f"{MARKER}77"},
            ):
                found = c.get("/dicomweb/studies", params=query, headers=auth(key))
                assert found.status_code in (200, 204), found.text
            # a name or an ID typed into a path was logged in clear (session 43)
            for typed in (f"/v1/jobs/{MARKER}77", f"/v1/jobs/{VALUE}", "/dicomweb/19560920"):
                assert c.get(typed, headers=auth(key)).status_code in (404, 422)
        server.send_signal(signal.SIGTERM)
        server.wait(60)
    finally:
        if server.poll() is None:
            server.kill()
    text = log.read_text()
    assert not leaks(text), leaks(text)[:5]
    lines = [line for line in text.splitlines() if line.strip()]
    for line in lines:
        json.loads(line)  # every line is a structured record, no plain UserWarning
    assert any("<redacted>" in line for line in lines)
    assert "19560920" not in text
    searched = [line for line in lines if "GET /dicomweb/studies?" in line]
    assert searched and all(
        "PatientName=<redacted>" in s or "PatientID=<redacted>" in s for s in searched
    )

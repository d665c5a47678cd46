"""Real DICOM peers for gateway tests: dcmtk tools, a throw-away Orthanc, small studies.

Everything listens on 127.0.0.1 only (Orthanc also binds 0.0.0.0 for its DICOM port;
its HTTP server refuses remote clients with ``RemoteAccessAllowed: false``) and every
wait is bounded.

pynetdicom installs Python ``storescu``/``echoscu`` scripts into the virtual environment
that shadow dcmtk's; :func:`dcmtk_tool` returns the real (ELF) dcmtk binary.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from radserve.gateway import GatewaySCP
from radserve.gateway.completeness import CompletedStudy
from radserve.gateway.config import Peer, ScpConfig
from radserve.phantom import PhantomSpec, generate_phantom, write_dicom_series
from tests.factories.ports import free_port
from tests.factories.waits import wait_until

# storescu proposes only uncompressed syntaxes unless told; -R: only what the files need
STORESCU_SYNTAX_FLAGS = {"explicit": [], "jpeg2000": ["-xv"], "rle": ["-xr"]}


def dcmtk_tool(name: str) -> str | None:
    """The dcmtk binary ``name`` on PATH (not pynetdicom's Python script of that name)."""
    for folder in os.get_exec_path():
        candidate = Path(folder) / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            with open(candidate, "rb") as handle:
                if handle.read(4) == b"\x7fELF":
                    return str(candidate)
    return None


class Intake:
    """Collects completed studies (the service's callback in gateway tests)."""

    def __init__(self) -> None:
        self.studies: list[CompletedStudy] = []
        self.lock = threading.Lock()

    def __call__(self, study: CompletedStudy) -> None:
        with self.lock:
            self.studies.append(study)


def loopback_scp_config(data_dir: Path, quiet_s: float, **overrides: Any) -> ScpConfig:
    """The gateway tests' SCP: any free port, STORESCU@127.0.0.1 and PYNETDICOM allowed."""
    return ScpConfig(
        data_dir=data_dir,
        port=0,
        quiet_s=quiet_s,
        allowed_peers=(Peer("STORESCU", "127.0.0.1"), Peer("PYNETDICOM")),
        **overrides,
    )


@contextlib.contextmanager
def edge_scp(data_dir: Path) -> Iterator[GatewaySCP]:
    """A started SCP for the hostile-edge tests: peer EDGE at 127.0.0.1, any free port,
    a 60 s quiet period (no study is handed over during a test)."""
    config = ScpConfig(
        data_dir=data_dir, port=0, quiet_s=60.0, allowed_peers=(Peer("EDGE", "127.0.0.1"),)
    )
    studies: list[CompletedStudy] = []
    with GatewaySCP(config, studies.append) as server:
        yield server


def small_study(
    folder: Path, *, seed: int = 1, slices: range = range(10, 22), transfer_syntax: str = "explicit"
) -> list[Path]:
    """A few slices of a small phantom CT (about 32 KB each uncompressed)."""
    phantom = generate_phantom(PhantomSpec.random(seed, small=True), slices)
    return write_dicom_series(phantom, folder, transfer_syntax=transfer_syntax)


def storescu(
    host: str,
    port: int,
    files: list[Path],
    *,
    calling: str = "STORESCU",
    called: str = "RADSERVE",
    transfer_syntax: str = "explicit",
    timeout: float = 60.0,
    extra: list[str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """dcmtk's storescu; ``extra``: more options (e.g. ``+tls KEY CERT +cf CA``)."""
    tool = dcmtk_tool("storescu")
    assert tool is not None
    command = [tool, "-R", *STORESCU_SYNTAX_FLAGS[transfer_syntax], "-aet", calling, "-aec", called]
    command += extra or []
    command += ["-to", "10", "-ta", "10", "-td", "30", host, str(port), *map(str, files)]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)


class Orthanc:
    """A private Orthanc in ``folder`` on loopback ports; start/stop as often as needed."""

    def __init__(
        self,
        folder: Path,
        *,
        aet: str = "ORTHANC",
        peers: dict[str, Any] | None = None,
        options: dict[str, Any] | None = None,
    ):
        """``options``: more Orthanc configuration (e.g. ``AcceptedTransferSyntaxes``)."""
        self.binary = shutil.which("Orthanc")
        self.folder = folder
        self.aet = aet
        self.http_port = free_port()
        self.dicom_port = free_port()
        self._process: subprocess.Popen[bytes] | None = None
        folder.mkdir(parents=True, exist_ok=True)
        config = {
            "Name": "radserve-test",
            "StorageDirectory": str(folder / "db"),
            "IndexDirectory": str(folder / "db"),
            "HttpPort": self.http_port,
            "DicomPort": self.dicom_port,
            "DicomAet": aet,
            "RemoteAccessAllowed": False,
            "AuthenticationEnabled": False,
            "HttpServerEnabled": True,
            "DicomServerEnabled": True,
            "Plugins": [],
            "StableAge": 1,
            "DicomModalities": peers or {},
            **(options or {}),
        }
        self.config = folder / "config.json"
        self.config.write_text(json.dumps(config, indent=1))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def start(self, timeout: float = 20.0) -> None:
        assert self.binary is not None and self._process is None
        log = open(self.folder / "orthanc.log", "ab")  # noqa: SIM115 - owned by the process
        self._process = subprocess.Popen(
            [self.binary, str(self.config)], stdout=log, stderr=subprocess.STDOUT, cwd=self.folder
        )
        log.close()
        if not wait_until(self._up, timeout, step=0.1):
            self.stop()
            raise RuntimeError(f"Orthanc did not start; see {self.folder / 'orthanc.log'}")

    def stop(self, grace: float = 1.0) -> None:
        """SIGTERM, then SIGKILL after ``grace`` s (Orthanc takes ~3 s to stop cleanly;
        tests never reuse its database after a stop)."""
        if self._process is None:
            return
        self._process.terminate()
        try:
            self._process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(timeout=5)
        self._process = None

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=10) as response:
            return json.loads(response.read())

    def file(self, instance_id: str) -> bytes:
        """The DICOM file Orthanc stores for one instance (its Orthanc ID)."""
        with urllib.request.urlopen(f"{self.url}/instances/{instance_id}/file", timeout=10) as r:
            return bytes(r.read())

    def post(self, path: str, body: bytes | dict[str, Any], timeout: float = 120.0) -> Any:
        """POST raw bytes (``/instances``: a DICOM file) or JSON; the JSON answer."""
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method="POST")
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())

    def upload(self, files: list[Path]) -> str:
        """Store ``files`` (one study) over REST; the Orthanc ID of their study."""
        answers = [self.post("/instances", Path(f).read_bytes()) for f in files]
        studies = {a["ParentStudy"] for a in answers}
        assert len(studies) == 1, studies
        return studies.pop()

    def push(self, modality: str, resources: list[str]) -> Any:
        """``POST /modalities/{name}/store`` synchronously: every instance of
        ``resources`` is C-STOREd (and answered) when this returns."""
        return self.post(
            f"/modalities/{modality}/store", {"Resources": resources, "Synchronous": True}
        )

    def _up(self) -> bool:
        try:
            self.get("/system")
        except (urllib.error.URLError, ConnectionError, OSError):
            return False
        return True


def study_with_results(
    root: Path, *, seed: int = 3, key_images: bool = False
) -> tuple[list[Path], list[Path]]:
    """A small phantom CT study and radserve's SEG + SR (+ Secondary Capture key images)
    for it, from the pipeline run with tiny threshold models (about a second):
    ``(source files, result files)``."""
    from radserve.models.registry import ModelRegistry
    from radserve.pipeline.spec import load_pipeline
    from radserve.pipeline.study import run_study
    from radserve.report.dicom import write_dicom_results
    from tests.factories.bundles import write_test_bundles, write_test_pipeline

    phantom = generate_phantom(PhantomSpec.random(seed, small=True), range(10, 30))
    files = write_dicom_series(phantom, root / "study")
    result = run_study(
        root / "study",
        pipeline=load_pipeline(write_test_pipeline(root)),
        out_dir=root / "out",
        registry=ModelRegistry(write_test_bundles(root / "models", organ_hu=90, lesion_hu=140)),
        key_images=key_images,
    )
    return files, write_dicom_results(result.report, root / "out", files, key_images=key_images)


class FakePacs:
    """A C-STORE SCP on loopback (AE ``PACS``) that answers success to every storage
    class; ``keep``: hold what it receives in :attr:`received` (a memory measurement
    keeps nothing, only :attr:`stored`, the count)."""

    def __init__(self, *, keep: bool = True) -> None:
        from pynetdicom import AE
        from pynetdicom.sop_class import Verification

        from radserve.gateway.conformance import ALL_STORAGE

        self.keep = keep
        self.received: list[Any] = []
        self.stored = 0
        self._lock = threading.Lock()
        self.ae = AE(ae_title="PACS")
        self.ae.add_supported_context(Verification)
        for sop_class in ALL_STORAGE:
            self.ae.add_supported_context(sop_class)
        self.port = free_port()

    def _store(self, event: Any) -> int:
        with self._lock:
            self.stored += 1
            if self.keep:
                self.received.append(event.dataset)
        return 0x0000

    def __enter__(self) -> FakePacs:
        from pynetdicom import evt

        self.server = self.ae.start_server(
            ("127.0.0.1", self.port), block=False, evt_handlers=[(evt.EVT_C_STORE, self._store)]
        )
        return self

    def __exit__(self, *_: object) -> None:
        self.server.shutdown()

    def classes(self) -> list[str]:
        with self._lock:
            return sorted(str(ds.SOPClassUID) for ds in self.received)

"""Issue 11 (defect 1): ``radserve serve``'s DICOM gateway on a real network interface.

The test makes a network namespace joined to this one by a veth pair
(:class:`tests.factories.netns.VethLink`: a free /30 of 10.213.0.0/16, radserve's end
here, the modality's end inside the namespace) and binds the gateway to radserve's end
from the settings file alone. dcmtk's storescu, run inside the namespace (``ip netns exec``),
sends a study over the veth; the allow-list admits it by its address there; the job
runs; and the result comes back over the same link: the SEGs and the SR are C-STOREd
to a dcmtk storescp listening inside the namespace. The namespace and the veth pair are
always removed. Skips without root, ``ip``, network namespaces or dcmtk.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pydicom
import pytest
from tests.factories.dicom_net import dcmtk_tool, free_port
from tests.factories.netns import VethLink, netns_unavailable
from tests.factories.serve import RadserveServe, listening
from tests.factories.service import config_file, make_study
from tests.factories.waits import wait_until

from radserve.store import init_store

pytestmark = [
    pytest.mark.slow,
    pytest.mark.tools,
    pytest.mark.skipif(
        dcmtk_tool("storescu") is None or dcmtk_tool("storescp") is None,
        reason="dcmtk is not installed",
    ),
    pytest.mark.skipif(netns_unavailable() is not None, reason=str(netns_unavailable())),
]

SEG = "1.2.840.10008.5.1.4.1.1.66.4"
SR_3D = "1.2.840.10008.5.1.4.1.1.88.34"
GATEWAY_PORT = 11112  # the link's addresses are the test's own: any port is free there
PACS_PORT = 11113


@pytest.fixture
def link() -> Iterator[VethLink]:
    with VethLink("gw") as made:
        yield made


def test_serve_gateway_on_a_veth_address_round_trip_with_dcmtk_in_a_namespace(
    link: VethLink, tmp_path: Path
) -> None:
    received = tmp_path / "pacs"
    received.mkdir()
    storescp = subprocess.Popen(
        link.exec(str(dcmtk_tool("storescp")), "-aet", "MODALITY", "-od", str(received),
                  "+xa", str(PACS_PORT)),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    gateway = {
        "enabled": True,
        "host": link.host_ip,
        "port": GATEWAY_PORT,
        "quiet_s": 0.5,
        "allowed_peers": [{"ae_title": "MODALITY", "host": link.ns_ip, "port": PACS_PORT}],
    }
    config, data = config_file(tmp_path, gateway=gateway), tmp_path / "data"
    log = tmp_path / "serve.log"
    try:
        with RadserveServe(config, data, free_port(), log):
            assert wait_until(lambda: listening(link.host_ip, GATEWAY_PORT), timeout=30)
            assert not listening("127.0.0.1", GATEWAY_PORT)  # only where gateway.host says
            assert f"listening on {link.host_ip}:{GATEWAY_PORT}" in log.read_text()
            files = make_study(tmp_path / "study")
            sent = subprocess.run(
                link.exec(str(dcmtk_tool("storescu")), "-aet", "MODALITY", "-aec", "RADSERVE",
                          "-to", "10", "-ta", "10", "-td", "30", link.host_ip,
                          str(GATEWAY_PORT), *map(str, files)),
                capture_output=True, text=True, timeout=180, check=False,
            )  # fmt: skip
            assert sent.returncode == 0, sent.stderr

            store = init_store(f"sqlite:///{data / 'radserve.db'}")
            try:
                assert wait_until(
                    lambda: any(j.terminal for j in store.list_jobs(limit=5).items), timeout=120
                ), log.read_text()[-3000:]
                [job] = store.list_jobs(limit=5).items
                assert job.state.value == "succeeded", (job.error_code, job.error_message)
                assert job.queue_meta["source"] == "dicom" and job.client_address == "MODALITY"
            finally:
                store.close()

            def results() -> list[pydicom.Dataset]:
                return [pydicom.dcmread(p, stop_before_pixels=True) for p in received.iterdir()]

            # the result came back over the veth: 2 SEGs and the SR, into the source study
            assert wait_until(lambda: len(list(received.iterdir())) >= 3, timeout=120), (
                log.read_text()[-3000:]
            )
            classes = sorted(str(ds.SOPClassUID) for ds in results())
            assert classes.count(SEG) == 2 and classes.count(SR_3D) == 1, classes
            study_uid = pydicom.dcmread(files[0], stop_before_pixels=True).StudyInstanceUID
            assert {ds.StudyInstanceUID for ds in results()} == {study_uid}
    finally:
        storescp.terminate()
        try:
            storescp.wait(10)
        except subprocess.TimeoutExpired:
            storescp.kill()
            storescp.wait(10)
